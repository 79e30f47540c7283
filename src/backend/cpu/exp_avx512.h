// e^t on 16 f32 lanes, computed as llama.cpp's CPU backend computes it when built for AVX-512
// (F + DQ): its SwiGLU and softmax use this approximation, and reproducing it makes our
// activations and attention weights equal to its bit for bit on such machines (libm's expf
// differs in the last bit for about a third of the inputs).
// exp(t) = 2^k * e^r with k = round(t / ln 2) (by adding and subtracting 1.5 * 2^23), r = t - k ln 2
// in two FMA steps (ln 2 split into a high and a low part), e^r by a degree-5 polynomial in
// Horner-Estrin form (maximum error about 1.5 ulp), 2^k applied with vscalefps; |k| > 192
// saturates to 0 (t < 0) or +inf, which also maps t = -inf to 0.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>

namespace sluice::backend::cpu {

__attribute__((target("avx512f,avx512dq"))) inline __m512 exp_avx512(__m512 t) {
  const __m512 shifter = _mm512_set1_ps(0x1.8p23f);
  const __m512 k = _mm512_sub_ps(_mm512_fmadd_ps(t, _mm512_set1_ps(0x1.715476p+0f), shifter), shifter);
  const __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(k, _mm512_set1_ps(0x1.62e4p-1f), t));
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 hi = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), r, _mm512_set1_ps(0x1.573e2ep-5f)), r2,
                                    _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), r, _mm512_set1_ps(0x1.fffdb6p-2f)));
  const __m512 poly = _mm512_fmadd_ps(hi, r2, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), r, _mm512_set1_ps(1.0f)));
  const __m512 e = _mm512_scalef_ps(poly, k);
  const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(k), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
  if (!big) return e;
  const __mmask16 neg = _mm512_cmp_ps_mask(k, _mm512_setzero_ps(), _CMP_LE_OQ);
  const __m512 sat = _mm512_mask_blend_ps(neg, _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(big, e, sat);
}

inline bool cpu_has_avx512_exp() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"); }

}  // namespace sluice::backend::cpu
#endif
