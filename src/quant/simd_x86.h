// Small AVX2 helpers shared by the x86 kernel files. Include only from files compiled with at
// least -mavx2 -mfma -mf16c (cpu_avx2.cpp, cpu_avx512.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "core/status.h"

namespace sluice::quant::x86 {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline float f16(uint16_t h) { return _cvtsh_ss(h); }

// 32 nibbles of a 16-byte legacy block in element order: low nibbles are elements 0..15, high
// nibbles 16..31 (blocks.h).
inline __m256i nibbles_32(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 0xFF in byte j where bit j of the little-endian u32 at qh is set.
inline __m256i bits_to_bytes(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(bits)), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2,
                                                     2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i sel = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
}

// Sum of products of 32 unsigned bytes u (< 128) and 32 signed bytes s, as 8 i32 lanes.
inline __m256i dot_u8_s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// Sum of products of two vectors of signed bytes in [-127, 127], as 8 i32 lanes (sign moved to
// the second operand so maddubs' unsigned first operand sees |x|).
inline __m256i dot_s8_s8(__m256i x, __m256i y) {
  return dot_u8_s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

// ---- multi-column drivers --------------------------------------------------------------------
// A kernel K is a struct with `template <int NC> static void run(int64_t n, const void* w,
// const uint8_t* a, int64_t a_stride, float* out)` computing NC columns with NC accumulators kept
// in registers. vec_dot is its one-column instance; vec_dot_cols splits n_cols into groups of at
// most kMax (the most columns whose accumulators fit the register file next to the decoded
// weights) and runs the exact-width instance for the remainder.

template <class K>
void vec_dot_of(int64_t n, const void* w, const void* a, float* out) {
  K::template run<1>(n, w, static_cast<const uint8_t*>(a), 0, out);
}

template <class K, int kMax>
void vec_dot_cols_of(int64_t n, const void* w, const void* a, int64_t a_stride, int n_cols, float* out) {
  SLUICE_CHECK(n_cols >= 0, "vec_dot_cols: negative column count");
  const auto* act = static_cast<const uint8_t*>(a);
  int c = 0;
  for (; c + kMax <= n_cols; c += kMax) K::template run<kMax>(n, w, act + c * a_stride, a_stride, out + c);
  const int rest = n_cols - c;
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((rest == I + 1 ? K::template run<I + 1>(n, w, act + c * a_stride, a_stride, out + c) : void()), ...);
  }(std::make_integer_sequence<int, kMax - 1>{});
}

inline int64_t blocks_of(int64_t n, int64_t block) {
  SLUICE_CHECK(n >= 0 && n % block == 0, "row length must be a non-negative multiple of the block size");
  return n / block;
}

}  // namespace sluice::quant::x86
