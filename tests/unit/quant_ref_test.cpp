// The scalar reference: traits, exact 16-bit float conversions, quantization quality, the dot
// products' integer math, bit-exact activation quantizers, and bad input.
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "quant/ref.h"
#include "test_util.h"

namespace sluice::quant {
namespace {

using test::normalized_error;
using test::random_floats;

std::vector<uint8_t> quantize(Type t, const std::vector<float>& x, Isa isa = Isa::kRef) {
  std::vector<uint8_t> q(size_t(row_bytes(t, int64_t(x.size()))));
  kernels_for(t, isa)->quantize_row(x.data(), q.data(), int64_t(x.size()));
  return q;
}
std::vector<float> dequantize(Type t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  kernels_for(t, Isa::kRef)->dequantize_row(q.data(), x.data(), n);
  return x;
}

TEST(QuantTraits, SizesAndNames) {
  EXPECT_EQ(row_bytes(Type::kQ4_K, 512), 288);
  EXPECT_EQ(row_bytes(Type::kQ8_0, 64), 68);
  EXPECT_EQ(row_bytes(Type::kBF16, 3), 6);
  EXPECT_EQ(row_bytes(Type::kQ4_0, 33), -1);
  EXPECT_EQ(type_from_name("Q6_K"), Type::kQ6_K);
  EXPECT_EQ(type_from_name("q7_k"), std::nullopt);
  EXPECT_EQ(type_traits(4), nullptr);  // ids 4, 5 (old Q4_2/Q4_3) are not formats
  EXPECT_EQ(type_traits(99), nullptr);
  ASSERT_NE(type_traits(14), nullptr);
  EXPECT_EQ(type_traits(14)->block_bytes, 210);
}

TEST(QuantTraits, BadRowLengthIsAnError) {
  EXPECT_TRUE(validate_row(Type::kQ4_K, 256).is_ok());
  const Status st = validate_row(Type::kQ4_K, 300);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("256"), std::string::npos) << st.message();
  EXPECT_FALSE(validate_row(Type::kQ8_0, -32).is_ok());
  EXPECT_FALSE(validate_row(Type(5), 32).is_ok());
}

TEST(QuantTraitsDeathTest, KernelsRejectBadLength) {
  std::vector<float> x(300), y(300);
  std::vector<uint8_t> q(4096);
  EXPECT_DEATH(ref::quantize_row_q4_k(x.data(), q.data(), 300), "multiple of 256");
  EXPECT_DEATH(ref::dequantize_row_q4_0(q.data(), y.data(), 33), "multiple");
}

// ---- 16-bit floats: exhaustive against a straightforward definition ---------------------------

// fp16 value by its definition: (-1)^s * 2^(e-15) * (1 + m/1024), subnormals 2^-14 * m/1024.
double fp16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -v : v;
}

TEST(QuantHalf, Fp16ToFp32Exhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(uint16_t(h));
    if (((h >> 10) & 31) == 31) {
      EXPECT_TRUE((h & 1023) ? std::isnan(f) : std::isinf(f)) << h;
      continue;
    }
    ASSERT_EQ(double(f), fp16_value(uint16_t(h))) << "h=" << h;
    ASSERT_EQ(std::signbit(f), bool(h >> 15)) << h;
  }
}

// Nearest fp16 to v, ties to the even encoding, by search over all finite encodings (v finite).
uint16_t fp16_nearest(double v) {
  uint16_t best = 0;
  double best_d = INFINITY;
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double d = std::fabs(std::fabs(v) - fp16_value(uint16_t(h)));
    if (d < best_d || (d == best_d && (h & 1) == 0)) {
      best_d = d;
      best = uint16_t(h);
    }
  }
  if (std::fabs(v) >= 65520.0) best = 0x7C00;  // beyond max + half ulp: infinity
  return uint16_t(best | (std::signbit(v) ? 0x8000 : 0));
}

TEST(QuantHalf, Fp32ToFp16RoundTripAndTies) {
  // Every fp16 value and the exact midpoints to its neighbour (ties to even), from a binary
  // search-free definition on a sample; plus every fp16 round-trips exactly.
  for (uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 31) == 31) continue;
    ASSERT_EQ(fp32_to_fp16(fp16_to_fp32(uint16_t(h))), uint16_t(h)) << h;
  }
  for (uint32_t h = 0; h < 0x7BFF; h += 37) {
    const double mid = (fp16_value(uint16_t(h)) + fp16_value(uint16_t(h + 1))) / 2;
    ASSERT_EQ(fp32_to_fp16(float(mid)), fp16_nearest(mid)) << "midpoint after " << h;
    ASSERT_EQ(fp32_to_fp16(-float(mid)), fp16_nearest(-mid)) << "midpoint after " << h;
  }
  const auto xs = random_floats(2000, 1.0f, 1);
  for (size_t i = 0; i < xs.size(); ++i) {
    const float v = xs[i] * std::ldexp(1.0f, int(i % 44) - 28);
    ASSERT_EQ(fp32_to_fp16(v), fp16_nearest(double(v))) << v;
  }
  EXPECT_EQ(fp32_to_fp16(70000.0f), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-INFINITY), 0xFC00);
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7BFF);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(NAN))));
}

TEST(QuantHalf, Bf16Exhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_fp32(uint16_t(h));
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    ASSERT_EQ(bits, h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(fp32_to_bf16(f), h) << h;
    }
    // Midpoint between h and h+1 (same sign, both finite): ties go to the even encoding.
    if ((h & 0x7F80) != 0x7F80 && (h & 0x7FFF) != 0x7F7F) {
      const uint32_t mid = (h << 16) | 0x8000;
      float m;
      std::memcpy(&m, &mid, 4);
      ASSERT_EQ(fp32_to_bf16(m), (h & 1) ? h + 1 : h) << h;
      const uint32_t above = mid + 1;
      std::memcpy(&m, &above, 4);
      ASSERT_EQ(fp32_to_bf16(m), h + 1) << h;
    }
  }
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
}

// ---- quantization quality: normalized error of dequantize(quantize(x)) on N(0,1) data --------

struct Bound {
  Type type;
  double max_error;  // measured: f16 .00021, bf16 .0017, q4_0 .086, q4_1 .078, q5_0 .043,
                     // q5_1 .038, q8_0 .0054, q2_k .27, q3_k .14, q4_k .071, q5_k .036,
                     // q6_k .017, q8_k .0069; bounds add 10-25% margin
};
constexpr Bound kBounds[] = {
    {Type::kF32, 0},        {Type::kF16, 4e-4},     {Type::kBF16, 3e-3},    {Type::kQ4_0, 0.11},
    {Type::kQ4_1, 0.095},   {Type::kQ5_0, 0.055},   {Type::kQ5_1, 0.047},   {Type::kQ8_0, 0.0065},
    {Type::kQ8_1, 0.0065},  {Type::kQ2_K, 0.30},    {Type::kQ3_K, 0.18},    {Type::kQ4_K, 0.08},
    {Type::kQ5_K, 0.04},    {Type::kQ6_K, 0.021},   {Type::kQ8_K, 0.008},
};

TEST(QuantRef, RoundTripError) {
  const int64_t n = 256 * 128;
  for (const Bound& b : kBounds) {
    const auto x = random_floats(size_t(n), 1.0f, uint64_t(b.type) + 10);
    const auto y = dequantize(b.type, quantize(b.type, x), n);
    const double err = normalized_error(y.data(), x.data(), size_t(n));
    EXPECT_LE(err, b.max_error) << type_name(b.type) << " seed " << test::test_seed();
    std::printf("  %-5s round-trip normalized error %.5f (bound %.4f)\n", type_name(b.type), err, b.max_error);
  }
}

// Non-Gaussian rows: a constant, all zeros, one outlier, strictly positive values. Errors must stay
// bounded (no NaN, no blow-up) for every format.
TEST(QuantRef, RoundTripAwkwardRows) {
  const int64_t n = 512;
  std::vector<std::vector<float>> rows(4, std::vector<float>(size_t(n)));
  auto rnd = random_floats(size_t(n), 1.0f, 77);
  for (int64_t i = 0; i < n; ++i) {
    rows[0][size_t(i)] = 0.75f;
    rows[1][size_t(i)] = 0.0f;
    rows[2][size_t(i)] = rnd[size_t(i)] * 0.01f + (i == 100 ? 50.0f : 0.0f);
    rows[3][size_t(i)] = std::fabs(rnd[size_t(i)]) + 1.0f;
  }
  for (const Bound& b : kBounds) {
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto y = dequantize(b.type, quantize(b.type, rows[r]), n);
      for (float v : y) ASSERT_TRUE(std::isfinite(v)) << type_name(b.type) << " row " << r;
      if (r == 1) {
        for (float v : y) ASSERT_EQ(v, 0.0f) << type_name(b.type);
      } else {
        EXPECT_LE(normalized_error(y.data(), rows[r].data(), size_t(n)), std::max(2 * b.max_error, 1e-6))
            << type_name(b.type) << " row " << r;
      }
    }
  }
}

// ---- vec_dot: the block-integer math equals the dot of the dequantized operands --------------

constexpr Type kWeightTypes[] = {Type::kF32,  Type::kF16,  Type::kBF16, Type::kQ4_0, Type::kQ4_1,
                                 Type::kQ5_0, Type::kQ5_1, Type::kQ8_0, Type::kQ2_K, Type::kQ3_K,
                                 Type::kQ4_K, Type::kQ5_K, Type::kQ6_K};

TEST(QuantRef, VecDotEqualsDotOfDequantized) {
  const int64_t n = 256 * 16;
  for (Type t : kWeightTypes) {
    const Kernels* k = kernels_for(t, Isa::kRef);
    ASSERT_NE(k->vec_dot, nullptr) << type_name(t);
    for (int rep = 0; rep < 8; ++rep) {
      const auto w = quantize(t, random_floats(size_t(n), 1.0f, 100 + rep));
      const auto a = quantize(k->vec_dot_type, random_floats(size_t(n), 3.0f, 200 + rep));
      const auto wf = dequantize(t, w, n);
      const auto af = dequantize(k->vec_dot_type, a, n);
      double exact = 0, ww = 0, aa = 0;
      for (int64_t i = 0; i < n; ++i) {
        exact += double(wf[size_t(i)]) * af[size_t(i)];
        ww += double(wf[size_t(i)]) * wf[size_t(i)];
        aa += double(af[size_t(i)]) * af[size_t(i)];
      }
      if (k->vec_dot_type == Type::kQ8_1) {
        // Q8_1's s = f16(d * sum q) is part of the format: the min term uses it, not the exact sum.
        const auto* ab = reinterpret_cast<const BlockQ8_1*>(a.data());
        for (int64_t i = 0; i < n / 32; ++i) {
          double exact_sum = 0;
          for (int l = 0; l < 32; ++l) exact_sum += af[size_t(32 * i + l)];
          const float m = t == Type::kQ4_1 ? fp16_to_fp32(reinterpret_cast<const BlockQ4_1*>(w.data())[i].m)
                                            : fp16_to_fp32(reinterpret_cast<const BlockQ5_1*>(w.data())[i].m);
          exact += double(m) * (double(fp16_to_fp32(ab[i].s)) - exact_sum);
        }
      }
      float got = 0;
      k->vec_dot(n, w.data(), a.data(), &got);
      // Error relative to |w||a| (the dot's natural scale): only f32 rounding of per-block sums.
      EXPECT_LE(std::fabs(got - exact) / std::sqrt(ww * aa), 2e-6) << type_name(t) << " got " << got << " exact " << exact;
    }
  }
}

TEST(QuantRef, ActivationFormatsPairAsGgmlCpu) {
  EXPECT_EQ(kernels(Type::kQ4_0).vec_dot_type, Type::kQ8_0);
  EXPECT_EQ(kernels(Type::kQ5_0).vec_dot_type, Type::kQ8_0);
  EXPECT_EQ(kernels(Type::kQ8_0).vec_dot_type, Type::kQ8_0);
  EXPECT_EQ(kernels(Type::kQ4_1).vec_dot_type, Type::kQ8_1);
  EXPECT_EQ(kernels(Type::kQ5_1).vec_dot_type, Type::kQ8_1);
  for (Type t : {Type::kQ2_K, Type::kQ3_K, Type::kQ4_K, Type::kQ5_K, Type::kQ6_K})
    EXPECT_EQ(kernels(t).vec_dot_type, Type::kQ8_K);
  EXPECT_EQ(kernels(Type::kF32).vec_dot_type, Type::kF32);
  EXPECT_EQ(kernels(Type::kF16).vec_dot_type, Type::kF16);
  EXPECT_EQ(kernels(Type::kBF16).vec_dot_type, Type::kBF16);
  EXPECT_EQ(kernels(Type::kQ8_K).vec_dot, nullptr);
}

// ---- activation quantizers: bit-identical to bytes produced by ggml ---------------------------

struct Fixture {
  std::vector<float> x;
  std::vector<uint8_t> q8_0_ref, q8_1_ref, q8_k_ref, q8_0_x86, q8_1_x86;
};

Fixture load_fixture() {
  Fixture f;
  std::ifstream in(test::fixture_path("quant/q8_activations.bin"), std::ios::binary);
  char magic[4];
  uint32_t n = 0;
  in.read(magic, 4);
  in.read(reinterpret_cast<char*>(&n), 4);
  if (!in || std::memcmp(magic, "SQ8F", 4) != 0 || n == 0 || n % 256 != 0) return f;
  f.x.resize(n);
  in.read(reinterpret_cast<char*>(f.x.data()), std::streamsize(4 * n));
  for (auto [vec, t] : {std::pair{&f.q8_0_ref, Type::kQ8_0}, {&f.q8_1_ref, Type::kQ8_1}, {&f.q8_k_ref, Type::kQ8_K},
                        {&f.q8_0_x86, Type::kQ8_0}, {&f.q8_1_x86, Type::kQ8_1}}) {
    vec->resize(size_t(row_bytes(t, n)));
    in.read(reinterpret_cast<char*>(vec->data()), std::streamsize(vec->size()));
  }
  if (!in) f.x.clear();
  return f;
}

TEST(QuantActivation, ReferenceQuantizersAreBitIdenticalToGgml) {
  const Fixture f = load_fixture();
  ASSERT_FALSE(f.x.empty()) << "missing or short fixture tests/fixtures/quant/q8_activations.bin";
  EXPECT_EQ(quantize(Type::kQ8_0, f.x), f.q8_0_ref);
  EXPECT_EQ(quantize(Type::kQ8_1, f.x), f.q8_1_ref);
  EXPECT_EQ(quantize(Type::kQ8_K, f.x), f.q8_k_ref);
  // The fixture contains exact .5 ties, where the two rounding rules must differ.
  EXPECT_NE(f.q8_0_ref, f.q8_0_x86);
  std::vector<uint8_t> q(f.q8_0_x86.size()), q1(f.q8_1_x86.size());
  ref::quantize_row_q8_0_rne(f.x.data(), q.data(), int64_t(f.x.size()));
  ref::quantize_row_q8_1_rne(f.x.data(), q1.data(), int64_t(f.x.size()));
  EXPECT_EQ(q, f.q8_0_x86);
  EXPECT_EQ(q1, f.q8_1_x86);
}

TEST(QuantActivation, Q8KSumsAndScale) {
  const int64_t n = 256 * 8;
  const auto x = random_floats(size_t(n), 2.0f, 5);
  const auto q = quantize(Type::kQ8_K, x);
  const auto* b = reinterpret_cast<const BlockQ8_K*>(q.data());
  for (int64_t i = 0; i < n / 256; ++i) {
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += b[i].qs[16 * g + l];
      EXPECT_EQ(b[i].bsums[g], s);
    }
    int extreme = 0;
    for (int l = 0; l < 256; ++l) extreme = std::max(extreme, std::abs(int(b[i].qs[l])));
    EXPECT_EQ(extreme, 127);
  }
}

}  // namespace
}  // namespace sluice::quant
