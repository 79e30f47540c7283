// Every ISA's kernels against the scalar reference, on fresh random data. Tolerances:
//  - vec_dot and vec_dot_cols: normalized error (test_util.h) over a vector of dot results
//    <= 1e-5; the kernels compute the same per-block integer sums, so only f32 summation order
//    differs (F32/F16/BF16: f32 lanes against the reference's double);
//  - quantize_row of activations and F16, and every dequantize_row: bit-identical.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "quant/ref.h"
#include "test_util.h"

namespace sluice::quant {
namespace {

constexpr Type kWeightTypes[] = {Type::kF32,  Type::kF16,  Type::kBF16, Type::kQ4_0, Type::kQ4_1,
                                 Type::kQ5_0, Type::kQ5_1, Type::kQ8_0, Type::kQ2_K, Type::kQ3_K,
                                 Type::kQ4_K, Type::kQ5_K, Type::kQ6_K};
constexpr Type kAllTypes[] = {Type::kF32,  Type::kF16,  Type::kBF16, Type::kQ4_0, Type::kQ4_1,
                              Type::kQ5_0, Type::kQ5_1, Type::kQ8_0, Type::kQ8_1, Type::kQ2_K,
                              Type::kQ3_K, Type::kQ4_K, Type::kQ5_K, Type::kQ6_K, Type::kQ8_K};

class QuantSimd : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (kernels_for(Type::kF32, GetParam()) == nullptr)
      GTEST_SKIP() << "this CPU lacks " << isa_name(GetParam()) << "; its kernels are not tested here";
  }
};

// Byte offsets of the f16 scale fields of a block (forced finite in raw random blocks).
std::vector<int> f16_fields(Type t) {
  switch (t) {
    case Type::kQ4_0: case Type::kQ5_0: case Type::kQ8_0: return {0};
    case Type::kQ4_1: case Type::kQ5_1: case Type::kQ8_1: case Type::kQ4_K: case Type::kQ5_K: return {0, 2};
    case Type::kQ2_K: return {80, 82};
    case Type::kQ3_K: return {108};
    case Type::kQ6_K: return {208};
    default: return {};
  }
}

// A row of raw random blocks (every bit pattern the format allows, not only what our quantizer
// emits), with finite scales of moderate size. Float formats get random finite values.
std::vector<uint8_t> random_raw_row(Type t, int64_t n, uint64_t salt) {
  std::mt19937_64 rng(test::test_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  std::vector<uint8_t> raw(size_t(row_bytes(t, n)));
  if (t == Type::kF32 || t == Type::kF16 || t == Type::kBF16) {
    const auto v = test::random_floats(size_t(n), 1.0f, salt);
    kernels_for(t, Isa::kRef)->quantize_row(v.data(), raw.data(), n);
    return raw;
  }
  for (auto& b : raw) b = uint8_t(rng());
  std::normal_distribution<float> g(0.0f, 0.05f);
  const int64_t bb = traits(t).block_bytes;
  for (int64_t off = 0; off < int64_t(raw.size()); off += bb)
    for (int f : f16_fields(t)) {
      const uint16_t h = fp32_to_fp16(g(rng));
      std::memcpy(&raw[size_t(off + f)], &h, 2);
    }
  return raw;
}

// Row lengths for a dot test: whole super-blocks, plus odd block counts (the AVX-512 legacy
// kernels take blocks in pairs) and, for float formats, lengths that end in a partial vector.
std::vector<int64_t> test_lengths(Type t) {
  const int64_t be = traits(t).block_elems;
  std::vector<int64_t> ns;
  for (int64_t blocks : {1, 2, 3, 7, 64}) ns.push_back(blocks * std::max<int64_t>(256, be));
  if (be == 32)
    for (int64_t blocks : {1, 3, 5, 9}) ns.push_back(blocks * be);
  if (be == 1)
    for (int64_t n : {1, 15, 17, 33, 100, 129, 300}) ns.push_back(n);
  return ns;
}

// A weight row for dot tests: even reps from our quantizer, odd reps raw random blocks.
std::vector<uint8_t> test_weights(Type t, int64_t n, int rep) {
  if (rep % 2) return random_raw_row(t, n, 1000 + uint64_t(rep));
  std::vector<uint8_t> w(size_t(row_bytes(t, n)));
  const auto wf = test::random_floats(size_t(n), 0.5f, 2000 + uint64_t(rep));
  kernels_for(t, Isa::kRef)->quantize_row(wf.data(), w.data(), n);
  return w;
}

TEST_P(QuantSimd, VecDotMatchesReference) {
  const Isa isa = GetParam();
  for (Type t : kWeightTypes) {
    const Kernels* ref_k = kernels_for(t, Isa::kRef);
    const Kernels* k = kernels_for(t, isa);
    ASSERT_EQ(k->vec_dot_type, ref_k->vec_dot_type);
    const Type at = ref_k->vec_dot_type;
    for (int64_t n : test_lengths(t)) {
      std::vector<float> got, want;
      for (int rep = 0; rep < 16; ++rep) {
        // Half the rows from our quantizer, half raw random blocks.
        const std::vector<uint8_t> w = test_weights(t, n, rep);
        const auto af = test::random_floats(size_t(n), 2.0f, 3000 + rep);
        std::vector<uint8_t> act(size_t(row_bytes(at, n)));
        kernels_for(at, isa)->quantize_row(af.data(), act.data(), n);
        float g = NAN, r = NAN;
        k->vec_dot(n, w.data(), act.data(), &g);
        ref_k->vec_dot(n, w.data(), act.data(), &r);
        got.push_back(g);
        want.push_back(r);
      }
      const double err = test::normalized_error(got.data(), want.data(), got.size());
      EXPECT_LE(err, 1e-5) << isa_name(isa) << " " << type_name(t) << " n=" << n << " seed " << test::test_seed();
    }
  }
}

// vec_dot_cols against the reference vec_dot of each column, for column counts around the
// kernels' group widths (4, 8) and an activation stride with padding between rows. Tolerance as
// vec_dot: normalized error <= 1e-5 over all outputs of one (format, n).
TEST_P(QuantSimd, VecDotColsMatchesReference) {
  const Isa isa = GetParam();
  int tested = 0;
  for (Type t : kWeightTypes) {
    const Kernels* k = kernels_for(t, isa);
    const Kernels* ref_k = kernels_for(t, Isa::kRef);
    if (k->vec_dot_cols == nullptr) continue;
    ++tested;
    const Type at = ref_k->vec_dot_type;
    for (int64_t n : test_lengths(t)) {
      const int64_t stride = row_bytes(at, n) + 64 + 4;  // padded, and not a multiple of 64
      std::vector<float> got, want;
      for (int n_cols : {0, 1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 19}) {
        const auto w = test_weights(t, n, n_cols);
        std::vector<uint8_t> act(size_t(stride * std::max(n_cols, 1)));
        for (int c = 0; c < n_cols; ++c) {
          const auto af = test::random_floats(size_t(n), 2.0f, 3000 + uint64_t(100 * n_cols + c));
          kernels_for(at, isa)->quantize_row(af.data(), act.data() + c * stride, n);
        }
        std::vector<float> out(size_t(n_cols) + 1, NAN);
        out[size_t(n_cols)] = 12345.0f;  // must stay untouched
        k->vec_dot_cols(n, w.data(), act.data(), stride, n_cols, out.data());
        EXPECT_EQ(out[size_t(n_cols)], 12345.0f) << isa_name(isa) << " " << type_name(t) << " wrote past n_cols";
        for (int c = 0; c < n_cols; ++c) {
          float r = NAN;
          ref_k->vec_dot(n, w.data(), act.data() + c * stride, &r);
          got.push_back(out[size_t(c)]);
          want.push_back(r);
        }
      }
      const double err = test::normalized_error(got.data(), want.data(), got.size());
      EXPECT_LE(err, 1e-5) << isa_name(isa) << " " << type_name(t) << " n=" << n << " seed " << test::test_seed();
    }
  }
  // The formats prefill needs most have a multi-column kernel in every table.
  EXPECT_GE(tested, isa == Isa::kRef ? 13 : 5) << isa_name(isa);
  for (Type t : {Type::kQ4_0, Type::kQ4_1, Type::kQ8_0, Type::kQ4_K, Type::kQ6_K}) {
    EXPECT_NE(kernels_for(t, isa)->vec_dot_cols, nullptr) << isa_name(isa) << " " << type_name(t);
    EXPECT_EQ(kernels_for(t, isa)->vec_dot_cols_isa, isa) << isa_name(isa) << " " << type_name(t);
  }
}

// The ISA label of each entry names the code behind it (bench rows and docs rely on it).
TEST_P(QuantSimd, IsaLabelsNameTheCode) {
  const Isa isa = GetParam();
  for (Type t : kWeightTypes) {
    const Kernels* k = kernels_for(t, isa);
    EXPECT_LE(int(k->vec_dot_isa), int(isa)) << type_name(t);
    const Kernels* own = kernels_for(t, k->vec_dot_isa);
    ASSERT_NE(own, nullptr);
    EXPECT_EQ(own->vec_dot, k->vec_dot) << isa_name(isa) << " " << type_name(t) << " labelled "
                                        << isa_name(k->vec_dot_isa);
    if (isa != Isa::kRef) {
      EXPECT_NE(k->vec_dot, kernels_for(t, Isa::kRef)->vec_dot) << type_name(t);
    }
  }
  if (isa == Isa::kAvx512) {
    for (Type t : {Type::kF32, Type::kF16, Type::kBF16, Type::kQ4_0, Type::kQ4_1, Type::kQ5_0, Type::kQ5_1,
                   Type::kQ8_0, Type::kQ4_K, Type::kQ5_K, Type::kQ6_K})
      EXPECT_EQ(kernels_for(t, isa)->vec_dot_isa, Isa::kAvx512) << type_name(t);
  }
}

TEST_P(QuantSimd, ActivationQuantizersBitIdentical) {
  const Isa isa = GetParam();
  const int64_t n = 256 * 32;
  auto x = test::random_floats(size_t(n), 1.0f, 7);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] *= std::ldexp(1.0f, int(i / 256) % 20 - 10);
  for (int i = 0; i < 32; ++i) x[size_t(256 + i)] = 0;  // an all-zero Q8_0 block
  for (int i = 0; i < 256; ++i) x[size_t(512 + i)] = float(i % 7) - 3.5f;  // exact ties
  for (int i = 0; i < 256; ++i) x[size_t(1024 + i)] = 0;  // an all-zero Q8_K block
  x[2048 + 5] = -1000.0f;  // negative extreme; the later +1000 must not win
  x[2048 + 9] = 1000.0f;
  struct Case {
    Type t;
    void (*spec)(const float*, void*, int64_t);
  };
  for (const Case& c : {Case{Type::kQ8_0, ref::quantize_row_q8_0_rne}, Case{Type::kQ8_1, ref::quantize_row_q8_1_rne},
                        Case{Type::kQ8_K, ref::quantize_row_q8_k}, Case{Type::kF16, ref::quantize_row_f16},
                        Case{Type::kBF16, ref::quantize_row_bf16}}) {
    std::vector<uint8_t> want(size_t(row_bytes(c.t, n))), got(want.size());
    // The ISA tables follow ggml-cpu's x86 quantizers (see quant.h); the ref table follows ggml's
    // reference, which the ref test checks against ggml's own bytes.
    (isa == Isa::kRef && (c.t == Type::kQ8_0 || c.t == Type::kQ8_1) ? kernels_for(c.t, Isa::kRef)->quantize_row
                                                                      : c.spec)(x.data(), want.data(), n);
    kernels_for(c.t, isa)->quantize_row(x.data(), got.data(), n);
    EXPECT_EQ(got, want) << isa_name(isa) << " " << type_name(c.t);
  }
}

TEST_P(QuantSimd, DequantizeBitIdentical) {
  const Isa isa = GetParam();
  for (Type t : kAllTypes) {
    const int64_t n = 256 * 8;
    const auto raw = random_raw_row(t, n, 50 + uint64_t(t));
    std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    kernels_for(t, Isa::kRef)->dequantize_row(raw.data(), want.data(), n);
    kernels_for(t, isa)->dequantize_row(raw.data(), got.data(), n);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << isa_name(isa) << " " << type_name(t);
  }
}

// F16 through the ISA's conversion instructions, all 65536 inputs (NaNs must stay NaN; F16C
// quiets signalling NaNs, which is allowed) and fp32 -> fp16 on every fp16 value and midpoint.
TEST_P(QuantSimd, F16ExhaustiveThroughIsa) {
  const Isa isa = GetParam();
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = uint16_t(h);
  std::vector<float> f(65536);
  kernels_for(Type::kF16, isa)->dequantize_row(all.data(), f.data(), 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = fp16_to_fp32(uint16_t(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f[h])) << h;
    } else {
      ASSERT_EQ(std::memcmp(&f[h], &want, 4), 0) << h;
    }
  }
  std::vector<float> mids;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float v = fp16_to_fp32(uint16_t(h));
    if (!std::isfinite(v)) continue;
    mids.push_back(v);
    const float nxt = fp16_to_fp32(uint16_t(h + 1));
    if ((h & 0x7FFF) < 0x7BFF) mids.push_back(float((double(v) + double(nxt)) / 2));
  }
  mids.resize(mids.size() / 8 * 8);
  std::vector<uint16_t> got(mids.size()), want(mids.size());
  kernels_for(Type::kF16, isa)->quantize_row(mids.data(), got.data(), int64_t(mids.size()));
  ref::quantize_row_f16(mids.data(), want.data(), int64_t(mids.size()));
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, QuantSimd, ::testing::Values(Isa::kRef, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

TEST(QuantDispatch, BestIsaIsAvailable) {
  EXPECT_NE(kernels_for(Type::kQ4_K, best_isa()), nullptr);
  EXPECT_EQ(&kernels(Type::kQ4_K), kernels_for(Type::kQ4_K, best_isa()));
  std::printf("  best_isa = %s\n", isa_name(best_isa()));
}

}  // namespace
}  // namespace sluice::quant
