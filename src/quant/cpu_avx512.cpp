// AVX-512 kernels (F, BW, VL, DQ, VNNI, BF16; the registry checks each before choosing this
// table). Like the AVX2 file, each kernel forms the reference's per-block integer sums exactly
// and differs from ref_*.cpp only in the order of f32 additions.
//
// What is here, per format (everything else keeps the AVX2 kernel; Kernels::vec_dot_isa says which):
//   F32, F16 (vcvtph2ps zmm), BF16 (vdpbf16ps)                     vec_dot
//   Q4_0, Q5_0, Q5_1, Q8_0 (vpdpbusd, two blocks per zmm)            vec_dot, vec_dot_cols
//   Q4_1 (vpdpbusd on ymm, in llama.cpp's x86 order: ExactQ4_1)      vec_dot, vec_dot_cols
//   Q4_K, Q5_K, Q6_K (vpmaddubsw + vpdpwssd, 64 elements per zmm)    vec_dot, vec_dot_cols
//   Q2_K, Q3_K: AVX2 (their 16-element sub-blocks gain little from wider vectors; not done yet).
// Activation quantizers (Q8_0/Q8_1/Q8_K) stay the AVX2 ones, so every table above AVX2 produces
// the same activation bytes as ggml-cpu's x86 build.
#include "quant/simd.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__) && defined(__AVX512BF16__)

#include <cmath>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/simd_x86.h"

// GCC 12's AVX-512 headers give some intrinsics (lane extracts behind the reductions) a
// don't-care operand made from a self-initialised variable, and -Wuninitialized then flags every
// caller; the operand is never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // clang has no such group and would warn about the pragma
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace sluice::quant::detail {
namespace {

using namespace x86;  // NOLINT(google-build-using-namespace): helper intrinsics

inline __m256i ld256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m512i ld512(const void* p) { return _mm512_loadu_si512(p); }
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// 16 f32 lanes: lanes 0-7 = f16 a, lanes 8-15 = f16 b (the scales of two 32-element blocks).
inline __m512 f16_pair(uint16_t a, uint16_t b) {
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(short(a))),
                                                 _mm_set1_epi16(short(b)), 1));
}

// ---- float formats ----------------------------------------------------------------------------
// Four accumulators hide the FMA latency; the tail (n not a multiple of the step) uses masked
// loads, whose zero lanes add nothing.

void vec_dot_f32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * k), _mm512_loadu_ps(y + i + 16 * k), acc[k]);
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    acc[0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), acc[0]);
  }
  *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

void vec_dot_f16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  auto ld = [](const uint16_t* p) { return _mm512_cvtph_ps(ld256(p)); };
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int k = 0; k < 4; ++k) acc[k] = _mm512_fmadd_ps(ld(x + i + 16 * k), ld(y + i + 16 * k), acc[k]);
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    acc[0] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)),
                             _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, y + i)), acc[0]);
  }
  *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// vdpbf16ps multiplies bf16 pairs exactly (8-bit x 8-bit significands fit f32) and adds both
// products to the f32 lane. It treats denormal inputs as zero and flushes denormal results, which
// the reference does not: only rows with |x| < 2^-126 can tell the difference.
void vec_dot_bf16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  auto bh = [](__m512i v) { return (__m512bh)v; };
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 128 <= n; i += 128)
    for (int k = 0; k < 4; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], bh(ld512(x + i + 32 * k)), bh(ld512(y + i + 32 * k)));
  for (; i < n; i += 32) {
    const __mmask32 m = n - i >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << (n - i)) - 1);
    acc[0] = _mm512_dpbf16_ps(acc[0], bh(_mm512_maskz_loadu_epi16(m, x + i)), bh(_mm512_maskz_loadu_epi16(m, y + i)));
  }
  *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// ---- legacy formats x Q8_0 / Q8_1 -------------------------------------------------------------
// Two 32-element blocks per zmm, in element order: bytes 0-31 block i, 32-63 block i+1, so the
// activation side is two plain 32-byte loads. vpdpbusd multiplies unsigned by signed bytes into
// i32 lanes without the i16 saturation of vpmaddubsw: lanes 0-7 hold block i's partial sums,
// lanes 8-15 block i+1's, and one f32 vector of scales (d_x*d_y per half) turns both into f32.
// An odd last block is paired with itself and given scale 0 in the upper half.
//
// A decoded pair: w = the weight bytes as vpdpbusd's unsigned operand, neg = bytes whose signed
// weight is negative (w holds |q| there; the activation byte is negated instead, which costs one
// op per column and keeps the decode shared by all columns). neg = 0 for the unsigned formats.
struct Pair {
  __m512i w;
  __mmask64 neg;
};

// 32 nibbles of each of two blocks in element order (low nibbles = elements 0..15).
inline __m512i nibbles_64(const uint8_t* qs0, const uint8_t* qs1) {
  const __m256i two = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)), 1);
  const __m512i dup = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(two));
  const __m512i sh = _mm512_srlv_epi64(dup, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
  return _mm512_and_si512(sh, _mm512_set1_epi8(0x0F));
}

// Bit j of each block's qh as a byte mask over the pair (element order matches nibbles_64).
inline __mmask64 high_bits(const uint8_t* qh0, const uint8_t* qh1) {
  uint32_t a, b;
  std::memcpy(&a, qh0, 4);
  std::memcpy(&b, qh1, 4);
  return __mmask64(a) | __mmask64(b) << 32;
}

inline Pair signed_pair(__m512i q) { return {_mm512_abs_epi8(q), _mm512_movepi8_mask(q)}; }

struct LegacyQ4_0 {
  using W = BlockQ4_0;
  using A = BlockQ8_0;
  static constexpr bool kMin = false;
  static Pair decode(const W& x0, const W& x1) {
    return signed_pair(_mm512_sub_epi8(nibbles_64(x0.qs, x1.qs), _mm512_set1_epi8(8)));
  }
};
struct LegacyQ5_0 {
  using W = BlockQ5_0;
  using A = BlockQ8_0;
  static constexpr bool kMin = false;
  static Pair decode(const W& x0, const W& x1) {
    const __m512i nib = nibbles_64(x0.qs, x1.qs);
    const __m512i q = _mm512_mask_add_epi8(nib, high_bits(x0.qh, x1.qh), nib, _mm512_set1_epi8(16));
    return signed_pair(_mm512_sub_epi8(q, _mm512_set1_epi8(16)));
  }
};
struct LegacyQ5_1 {
  using W = BlockQ5_1;
  using A = BlockQ8_1;
  static constexpr bool kMin = true;
  static Pair decode(const W& x0, const W& x1) {
    const __m512i nib = nibbles_64(x0.qs, x1.qs);
    return {_mm512_mask_add_epi8(nib, high_bits(x0.qh, x1.qh), nib, _mm512_set1_epi8(16)), 0};
  }
};
// Q8_0 weights may hold -128 (raw files; our quantizer never emits it): |-128| is 0x80, which
// vpdpbusd reads as unsigned 128, so the product stays exact.
struct LegacyQ8_0 {
  using W = BlockQ8_0;
  using A = BlockQ8_0;
  static constexpr bool kMin = false;
  static Pair decode(const W& x0, const W& x1) { return signed_pair(join(ld256(x0.qs), ld256(x1.qs))); }
};

template <class F>
struct Legacy {
  template <int NC>
  static void run(int64_t n, const void* w, const uint8_t* a, int64_t a_stride, float* out) {
    using W = typename F::W;
    using A = typename F::A;
    const auto* x = static_cast<const W*>(w);
    const int64_t nb = blocks_of(n, kQK);
    __m512 acc[NC];
    float mins[NC];
    for (int c = 0; c < NC; ++c) {
      acc[c] = _mm512_setzero_ps();
      mins[c] = 0;
    }
    const __m512i zero = _mm512_setzero_si512();
    auto step = [&](int64_t i, auto pair) {
      const W& x1 = pair ? x[i + 1] : x[i];
      const Pair p = F::decode(x[i], x1);
      const __m512 dx = f16_pair(x[i].d, pair ? x1.d : uint16_t(0));
      for (int c = 0; c < NC; ++c) {
        const A* y = reinterpret_cast<const A*>(a + c * a_stride) + i;
        const A& y1 = pair ? y[1] : y[0];
        __m512i yv = join(ld256(y[0].qs), ld256(y1.qs));
        if constexpr (!F::kMin) yv = _mm512_mask_sub_epi8(yv, p.neg, zero, yv);
        const __m512i s = _mm512_dpbusd_epi32(zero, p.w, yv);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dx, f16_pair(y[0].d, y1.d)), acc[c]);
        if constexpr (F::kMin) {
          mins[c] += f16(x[i].m) * f16(y[0].s);
          if (pair) mins[c] += f16(x1.m) * f16(y1.s);
        }
      }
    };
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) step(i, std::true_type{});
    if (i < nb) step(i, std::false_type{});
    for (int c = 0; c < NC; ++c) out[c] = _mm512_reduce_add_ps(acc[c]) + mins[c];
  }
};

// Q4_1 x Q8_1 in llama.cpp's x86 order instead (the AVX2 file's vec_dot_q4_1 says which), so
// that Q4_1 models reproduce llama.cpp bit for bit: one 8-lane accumulator per column, one block
// per ymm (vpdpbusd forms the same i32 sums of four products per lane as ggml-cpu's kernel), the
// min terms as a scalar FMA chain per column. The columns are independent chains, so prefill
// keeps the FMA units busy; decode (one column) waits on one FMA per block.
struct ExactQ4_1 {
  template <int NC>
  static void run(int64_t n, const void* w, const uint8_t* a, int64_t a_stride, float* out) {
    const auto* x = static_cast<const BlockQ4_1*>(w);
    const int64_t nb = blocks_of(n, kQK);
    __m256 acc[NC];
    float mins[NC];
    for (int c = 0; c < NC; ++c) {
      acc[c] = _mm256_setzero_ps();
      mins[c] = 0;
    }
    const __m256i zero = _mm256_setzero_si256();
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i q = nibbles_32(x[i].qs);
      const float dx = f16(x[i].d), mx = f16(x[i].m);
      for (int c = 0; c < NC; ++c) {
        const BlockQ8_1& y = reinterpret_cast<const BlockQ8_1*>(a + c * a_stride)[i];
        const __m256i s = _mm256_dpbusd_epi32(zero, q, ld256(y.qs));
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16(y.d)), _mm256_cvtepi32_ps(s), acc[c]);
        mins[c] = std::fma(mx, f16(y.s), mins[c]);
      }
    }
    for (int c = 0; c < NC; ++c) out[c] = hsum(acc[c]) + mins[c];
  }
};

// ---- K-quants x Q8_K --------------------------------------------------------------------------
// 64 elements per zmm in element order, so each activation operand is one 64-byte load. The
// weight bytes (< 64) times activation bytes go through vpmaddubsw (pairs into i16; |sum| <=
// 2*63*127, no saturation), then vpdpwssd multiplies each i16 by its sub-block scale and adds
// pairs into the i32 accumulator. The super-block's i32 sum is exact, as in the reference.

// i16 lanes 0-15 <- lane j0 of v, lanes 16-31 <- lane j1 (v's 8 scales are in its low 128 bits,
// broadcast to every 128-bit lane, so an in-lane byte shuffle can pick them).
inline __m512i scale_halves(__m512i v, int j0, int j1) {
  const __m256i i0 = _mm256_set1_epi16(short((2 * j0) | (2 * j0 + 1) << 8));
  const __m256i i1 = _mm256_set1_epi16(short((2 * j1) | (2 * j1 + 1) << 8));
  return _mm512_shuffle_epi8(v, join(i0, i1));
}

// Q4_K/Q5_K 6-bit scales and mins, as the AVX2 file unpacks them (layout in blocks.h): returns
// the 8 scales as u8 in the low 8 bytes; mins as 16 i16 with each min twice, to multiply the 16
// bsums (two per 32-element sub-block) in one vpmaddwd.
inline uint64_t k_scales(const uint8_t* s, __m256i* mins_dup) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint64_t sc = uint64_t(a & 0x3F3F3F3Fu) | uint64_t((c & 0x0F0F0F0Fu) | ((a >> 6) & 0x03030303u) << 4) << 32;
  const uint64_t mn = uint64_t(b & 0x3F3F3F3Fu) | uint64_t(((c >> 4) & 0x0F0F0F0Fu) | ((b >> 6) & 0x03030303u) << 4) << 32;
  const __m128i m = _mm_cvtsi64_si128(int64_t(mn));
  *mins_dup = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
  return sc;
}

// Q4_K and Q5_K share everything but the fifth bit.
template <bool kFive>
struct KQ45 {
  using W = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  template <int NC>
  static void run(int64_t n, const void* w, const uint8_t* a, int64_t a_stride, float* out) {
    const auto* x = static_cast<const W*>(w);
    const int64_t nb = blocks_of(n, kQK_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
    __m512 acc[NC];
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      __m256i mins_dup;
      const __m512i sc = _mm512_broadcast_i32x4(
          _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(k_scales(x[i].scales, &mins_dup)))));
      // qs[32p + l] holds element 64p + l (low nibble) and 64p + 32 + l (high nibble): split the
      // nibbles of 64 bytes, then gather the 128-bit lanes back into element order.
      __m512i q[4];
      for (int h = 0; h < 2; ++h) {
        const __m512i raw = ld512(x[i].qs + 64 * h);
        const __m512i lo = _mm512_and_si512(raw, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        q[2 * h] = _mm512_shuffle_i64x2(lo, hi, 0x44);
        q[2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, 0xEE);
      }
      if constexpr (kFive) {
        // Bit 2p (first 32 elements of q[p]) or 2p+1 (last 32) of qh[l], moved to bit 4.
        const __m256i qh = ld256(x[i].qh);
        const __m512i hb = join(qh, _mm256_srli_epi16(qh, 1));
        const __m512i h4[4] = {_mm512_slli_epi16(hb, 4), _mm512_slli_epi16(hb, 2), hb, _mm512_srli_epi16(hb, 2)};
        for (int p = 0; p < 4; ++p) q[p] = _mm512_ternarylogic_epi64(q[p], h4[p], bit4, 0xF8);  // q | (h & bit4)
      }
      const __m512i s[4] = {scale_halves(sc, 0, 1), scale_halves(sc, 2, 3), scale_halves(sc, 4, 5),
                            scale_halves(sc, 6, 7)};
      const float dx = f16(x[i].d), dmx = f16(x[i].dmin);
      for (int c = 0; c < NC; ++c) {
        const auto* y = reinterpret_cast<const BlockQ8_K*>(a + c * a_stride) + i;
        __m512i isum = _mm512_setzero_si512();
        for (int p = 0; p < 4; ++p)
          isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(q[p], ld512(y->qs + 64 * p)), s[p]);
        const __m512i msum = _mm512_zextsi256_si512(_mm256_madd_epi16(mins_dup, ld256(y->bsums)));
        acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(dx * y->d), _mm512_cvtepi32_ps(isum), acc[c]);
        acc[c] = _mm512_fnmadd_ps(_mm512_set1_ps(dmx * y->d), _mm512_cvtepi32_ps(msum), acc[c]);
      }
    }
    for (int c = 0; c < NC; ++c) out[c] = _mm512_reduce_add_ps(acc[c]);
  }
};

// Q6_K: u = low4 | high2 << 4 in [0, 63], q = u - 32; the -32 is folded in through bsums
// (sum q*y = sum u*y - 32 * sum y per 16-element sub-block), started in the i32 accumulator.
struct KQ6 {
  template <int NC>
  static void run(int64_t n, const void* w, const uint8_t* a, int64_t a_stride, float* out) {
    const auto* x = static_cast<const BlockQ6_K*>(w);
    const int64_t nb = blocks_of(n, kQK_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[NC];
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
      const __m512i corr = _mm512_zextsi256_si512(_mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32)));
      // u[g] holds elements 64g..64g+63 = sub-blocks 4g..4g+3; s[g] their scales, 8 i16 lanes each.
      __m512i u[4], s[4];
      for (int h = 0; h < 2; ++h) {
        const __m512i ql = ld512(x[i].ql + 64 * h);
        const __m256i qh = ld256(x[i].qh + 32 * h);
        const __m512i hb = join(qh, _mm256_srli_epi16(qh, 2));  // high bits of k=0 | k=1 in bits 0-1
        // Bitwise select (imm 0xE4): bits under m4 from the first operand, others from the second.
        u[2 * h] = _mm512_ternarylogic_epi64(ql, _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30), m4, 0xE4);
        u[2 * h + 1] = _mm512_ternarylogic_epi64(_mm512_srli_epi16(ql, 4), _mm512_and_si512(hb, m30), m4, 0xE4);
      }
      const __m512i scz = _mm512_zextsi256_si512(sc16);
      for (int g = 0; g < 4; ++g) {
        const __m512i idx = join(_mm256_setr_m128i(_mm_set1_epi16(short(4 * g)), _mm_set1_epi16(short(4 * g + 1))),
                                 _mm256_setr_m128i(_mm_set1_epi16(short(4 * g + 2)), _mm_set1_epi16(short(4 * g + 3))));
        s[g] = _mm512_permutexvar_epi16(idx, scz);
      }
      const float dx = f16(x[i].d);
      for (int c = 0; c < NC; ++c) {
        const auto* y = reinterpret_cast<const BlockQ8_K*>(a + c * a_stride) + i;
        __m512i isum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), corr, _mm512_zextsi256_si512(ld256(y->bsums)));
        for (int g = 0; g < 4; ++g)
          isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(u[g], ld512(y->qs + 64 * g)), s[g]);
        acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(dx * y->d), _mm512_cvtepi32_ps(isum), acc[c]);
      }
    }
    for (int c = 0; c < NC; ++c) out[c] = _mm512_reduce_add_ps(acc[c]);
  }
};

}  // namespace

void install_avx512(Kernels* t) {
  t[int(Type::kF32)].vec_dot = vec_dot_f32;
  t[int(Type::kF16)].vec_dot = vec_dot_f16;
  t[int(Type::kBF16)].vec_dot = vec_dot_bf16;
  // 8 columns: 8 accumulators + the decoded weights + temporaries stay within 32 zmm registers.
  auto both = [t](Type ty, auto k) {
    using K = decltype(k);
    t[int(ty)].vec_dot = vec_dot_of<K>;
    t[int(ty)].vec_dot_cols = vec_dot_cols_of<K, 8>;
  };
  both(Type::kQ4_0, Legacy<LegacyQ4_0>{});
  both(Type::kQ4_1, ExactQ4_1{});
  both(Type::kQ5_0, Legacy<LegacyQ5_0>{});
  both(Type::kQ5_1, Legacy<LegacyQ5_1>{});
  both(Type::kQ8_0, Legacy<LegacyQ8_0>{});
  both(Type::kQ4_K, KQ45<false>{});
  both(Type::kQ5_K, KQ45<true>{});
  both(Type::kQ6_K, KQ6{});
}

}  // namespace sluice::quant::detail

#else  // not compiled for AVX-512: never installed (best_isa() cannot pick it)

namespace sluice::quant::detail {
void install_avx512(Kernels*) {}
}  // namespace sluice::quant::detail

#endif
