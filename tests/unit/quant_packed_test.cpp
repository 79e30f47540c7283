// Packed (row-interleaved) layouts: Kernels::pack_rows and every ISA's vec_dot_packed against the
// scalar reference vec_dot on the plain rows, on fresh random data.
//  - The kRef table's vec_dot_packed does the reference's arithmetic on the packed bytes, so it
//    must equal the plain reference bit for bit: this tests the packing itself exactly.
//  - SIMD kernels: normalized error (test_util.h) <= 1e-5 over all outputs of one case (exact
//    integer sums, other f32 summation order). Group counts 1..5, token counts at, below and above
//    the kernels' 8-token tile, padded activation strides and an output stride wider than the
//    rows; outputs outside the rows x tokens block must stay untouched.
//  - A planted bug (one output taken from the wrong token) must fail the same check.
//  - AMX (Q8_0; 16-token tiles, the rest through AVX-512): its f32 steps are the AVX-512
//    kernel's, so its outputs must equal the AVX-512 kernel's bit for bit, at token counts below,
//    at and above one and two tiles.
#include <cmath>
#include <vector>

#include "quant/quant.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace sluice::quant {
namespace {

constexpr float kSentinel = 12345.0f;
constexpr Type kWeightTypes[] = {Type::kF32,  Type::kF16,  Type::kBF16, Type::kQ4_0, Type::kQ4_1,
                                 Type::kQ5_0, Type::kQ5_1, Type::kQ8_0, Type::kQ2_K, Type::kQ3_K,
                                 Type::kQ4_K, Type::kQ5_K, Type::kQ6_K};

using PackedFn = void (*)(int64_t, const void*, int, const void*, int64_t, int, float*, int64_t);

class QuantPacked : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (kernels_for(Type::kF32, GetParam()) == nullptr)
      GTEST_SKIP() << "this CPU lacks " << isa_name(GetParam()) << "; its kernels are not tested here";
  }
};

struct Case {
  int64_t n;
  int groups, cols;
};

struct Outcome {
  double err = 0;           // normalized error against the plain reference vec_dot
  bool bit_equal = true;    // every output equal to the reference's, bit for bit
  bool wrote_outside = false;
};

Outcome run_case(const Kernels& k, Type t, Isa isa, const Case& tc, uint64_t salt, PackedFn fn,
                 PackedFn bit_reference = nullptr) {
  const int rows = tc.groups * k.packed_rows;
  const int64_t rb = row_bytes(t, tc.n);
  const auto w = weight_rows(t, tc.n, rows, rb, salt);
  const int64_t gb = k.packed_bytes(tc.n);
  std::vector<uint8_t> packed(size_t(gb * std::max(tc.groups, 1)), 0x5A);
  for (int g = 0; g < tc.groups; ++g) k.pack_rows(w.data() + g * k.packed_rows * rb, rb, packed.data() + g * gb, tc.n);

  const Type at = k.vec_dot_type;
  const int64_t a_stride = row_bytes(at, tc.n) + 68;  // padded, not a multiple of 64
  std::vector<uint8_t> act(size_t(a_stride * std::max(tc.cols, 1)));
  for (int c = 0; c < tc.cols; ++c) {
    const auto af = test::random_floats(size_t(tc.n), 2.0f, salt * 977 + uint64_t(c));
    kernels_for(at, isa)->quantize_row(af.data(), act.data() + c * a_stride, tc.n);
  }
  const int64_t out_stride = rows + 5;
  std::vector<float> out(size_t(out_stride * (tc.cols + 1)), kSentinel);
  fn(tc.n, packed.data(), tc.groups, act.data(), a_stride, tc.cols, out.data(), out_stride);
  std::vector<float> bit_ref;
  if (bit_reference != nullptr) {
    bit_ref.assign(out.size(), kSentinel);
    bit_reference(tc.n, packed.data(), tc.groups, act.data(), a_stride, tc.cols, bit_ref.data(), out_stride);
  }

  Outcome o;
  std::vector<float> got, want;
  for (int c = 0; c <= tc.cols; ++c)
    for (int64_t r = 0; r < out_stride; ++r) {
      const float v = out[size_t(c * out_stride + r)];
      if (c == tc.cols || r >= rows) {
        o.wrote_outside |= v != kSentinel;
        continue;
      }
      float ref = NAN;
      if (bit_reference != nullptr) ref = bit_ref[size_t(c * out_stride + r)];
      else kernels_for(t, Isa::kRef)->vec_dot(tc.n, w.data() + r * rb, act.data() + c * a_stride, &ref);
      o.bit_equal &= std::memcmp(&v, &ref, sizeof v) == 0;
      got.push_back(v);
      want.push_back(ref);
    }
  o.err = got.empty() ? 0.0 : test::normalized_error(got.data(), want.data(), got.size());
  return o;
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  for (int64_t n : {256, 768, 2048})
    for (auto [g, c] : {std::pair{1, 1}, {1, 8}, {2, 3}, {1, 2}, {3, 9}, {2, 16}, {5, 13}, {1, 4}, {2, 0}, {0, 3},
                        {1, 15}, {2, 32}, {3, 17}, {1, 35}})
      cs.push_back({n, g, c});
  return cs;
}

TEST_P(QuantPacked, VecDotPackedMatchesReference) {
  const Isa isa = GetParam();
  int tested = 0;
  for (Type t : kWeightTypes) {
    const Kernels* k = kernels_for(t, isa);
    if (k->vec_dot_packed == nullptr) continue;
    ASSERT_GT(k->packed_rows, 0) << type_name(t);
    ASSERT_NE(k->pack_rows, nullptr) << type_name(t);
    ++tested;
    uint64_t salt = 1;
    for (const Case& tc : cases()) {
      const Outcome o = run_case(*k, t, isa, tc, salt++, k->vec_dot_packed);
      const std::string what = std::string(isa_name(isa)) + " " + type_name(t) + " n=" + std::to_string(tc.n) +
                               " groups=" + std::to_string(tc.groups) + " cols=" + std::to_string(tc.cols) +
                               " seed " + std::to_string(test::test_seed());
      if (isa == Isa::kRef) {
        EXPECT_TRUE(o.bit_equal) << what << ": the reference on packed rows must equal the plain reference";
      } else {
        EXPECT_LE(o.err, 1e-5) << what;
      }
      EXPECT_FALSE(o.wrote_outside) << what << ": wrote outside the rows x tokens block";
    }
  }
  // The reference specifies the packed layouts of Q4_K, Q6_K (the formats of Q4_K_M files) and
  // Q8_0; AVX-512 has kernels for all three, AVX2 none (yet); the AMX table has its own for Q8_0
  // and keeps AVX-512's for the others (cpu_amx_packed.cpp says why).
  EXPECT_EQ(tested, isa == Isa::kAvx2 ? 0 : 3) << isa_name(isa);
  if (isa != Isa::kAvx2)
    for (Type t : {Type::kQ4_K, Type::kQ6_K, Type::kQ8_0}) {
      const Isa want = isa == Isa::kAmx && t != Type::kQ8_0 ? Isa::kAvx512 : isa;
      EXPECT_EQ(kernels_for(t, isa)->vec_dot_packed_isa, want) << type_name(t);
    }
}

// The ISA's kernel with a planted bug: the last row's output for the last token is that row's
// output for the token before it.
template <Isa kIsa, Type kType>
void planted_bug(int64_t n, const void* w, int n_groups, const void* a, int64_t a_stride, int n_cols, float* out,
                 int64_t out_stride) {
  const Kernels* k = kernels_for(kType, kIsa);
  k->vec_dot_packed(n, w, n_groups, a, a_stride, n_cols, out, out_stride);
  const int64_t r = int64_t(n_groups) * k->packed_rows - 1;
  if (r >= 0 && n_cols > 1) out[(n_cols - 1) * out_stride + r] = out[(n_cols - 2) * out_stride + r];
}

TEST_P(QuantPacked, PlantedBugIsCaught) {
  const Isa isa = GetParam();
  if (kernels_for(Type::kQ4_K, isa)->vec_dot_packed == nullptr) GTEST_SKIP() << "no packed kernels for " << isa_name(isa);
  for (Type t : {Type::kQ4_K, Type::kQ6_K, Type::kQ8_0}) {
    const Kernels* k = kernels_for(t, isa);
    auto pick = [t](PackedFn q4, PackedFn q6, PackedFn q8) { return t == Type::kQ4_K ? q4 : t == Type::kQ6_K ? q6 : q8; };
    const PackedFn bugged =
        isa == Isa::kRef   ? pick(planted_bug<Isa::kRef, Type::kQ4_K>, planted_bug<Isa::kRef, Type::kQ6_K>,
                                  planted_bug<Isa::kRef, Type::kQ8_0>)
        : isa == Isa::kAmx ? pick(planted_bug<Isa::kAmx, Type::kQ4_K>, planted_bug<Isa::kAmx, Type::kQ6_K>,
                                  planted_bug<Isa::kAmx, Type::kQ8_0>)
                           : pick(planted_bug<Isa::kAvx512, Type::kQ4_K>, planted_bug<Isa::kAvx512, Type::kQ6_K>,
                                  planted_bug<Isa::kAvx512, Type::kQ8_0>);
    // The largest case of the main test (the wrong output is diluted most), with 32 tokens on AMX
    // so that the bug lands in a tile product.
    const Case tc{2048, 5, isa == Isa::kAmx ? 32 : 13};
    const Outcome o = run_case(*k, t, isa, tc, 99, bugged);
    EXPECT_GT(o.err, 1e-5) << isa_name(isa) << " " << type_name(t);
    EXPECT_FALSE(o.bit_equal) << isa_name(isa) << " " << type_name(t);
  }
}

// AMX against AVX-512, bit for bit (file comment).
TEST(QuantPackedAmx, EqualsAvx512BitForBit) {
  if (kernels_for(Type::kQ4_K, Isa::kAmx) == nullptr) GTEST_SKIP() << "this CPU lacks AMX-INT8; its kernels are not tested here";
  for (Type t : {Type::kQ8_0}) {
    const Kernels* k = kernels_for(t, Isa::kAmx);
    ASSERT_EQ(k->vec_dot_packed_isa, Isa::kAmx) << type_name(t);
    uint64_t salt = 1000;
    for (const Case& tc : cases()) {
      const Outcome o = run_case(*k, t, Isa::kAmx, tc, salt++, k->vec_dot_packed, kernels_for(t, Isa::kAvx512)->vec_dot_packed);
      const std::string what = std::string(type_name(t)) + " n=" + std::to_string(tc.n) + " groups=" +
                               std::to_string(tc.groups) + " cols=" + std::to_string(tc.cols) + " seed " +
                               std::to_string(test::test_seed());
      EXPECT_TRUE(o.bit_equal) << what << " (normalized error " << o.err << ")";
      EXPECT_FALSE(o.wrote_outside) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, QuantPacked, ::testing::Values(Isa::kRef, Isa::kAvx2, Isa::kAvx512, Isa::kAmx),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace sluice::quant
