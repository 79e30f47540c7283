// RoPE arithmetic shared by the rope kernels (ops.cu) and the decode attention's fused RoPE
// (attention_decode.cu), so that both give the same bits.
//
// Angles exactly as the CPU computes them: theta_i = pos * ts^i built by i successive f32
// multiplies (ts = powf(base, -2 / n_rot), computed on the host with the same libm call), then
// th = freq_scale * (theta_i / factor_i). At position 1e5 one f32 ulp of th is ~0.008 rad, so the
// angle must be bit-identical, not merely close. cos/sin are evaluated in double and rounded to
// f32: correctly rounded (up to double rounding, ~1e-9 of cases), like glibc's cosf/sinf nearly
// always are.
#pragma once

#include <cstdint>

namespace sluice::backend::cuda {

// cos and sin of pair i's angle at `position`.
__device__ __forceinline__ void rope_angle(int64_t position, int i, float theta_scale, float freq_scale,
                                           const float* freq_factors, float& c, float& s) {
  float theta = float(position);
  for (int k = 0; k < i; ++k) theta = __fmul_rn(theta, theta_scale);
  const float th = __fmul_rn(freq_scale, freq_factors ? __fdiv_rn(theta, freq_factors[i]) : theta);
  double sv, cv;
  sincos(double(th), &sv, &cv);
  c = __double2float_rn(cv);
  s = __double2float_rn(sv);
}

// The rotated pair (x0, x1) = (v[i0], v[i1]) of pair i (i0 = i, i1 = i + half for NeoX, else 2i and
// 2i + 1): the first and the second output.
__device__ __forceinline__ float rope_first(float x0, float x1, float c, float s) {
  return __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
}
__device__ __forceinline__ float rope_second(float x0, float x1, float c, float s) {
  return __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// Element d of head vector v after RoPE (half pairs; elements from 2 * half on do not rotate), from
// the unrotated v: the same value rope_first/rope_second give for d's pair.
__device__ __forceinline__ float rope_element(const float* v, int d, int half, bool neox, const float* cs,
                                             const float* sn) {
  if (d >= 2 * half) return v[d];
  const int i = neox ? (d < half ? d : d - half) : d / 2;
  const bool first = neox ? d < half : d % 2 == 0;
  const int i0 = neox ? i : 2 * i;
  const int i1 = neox ? i + half : 2 * i + 1;
  return first ? rope_first(v[i0], v[i1], cs[i], sn[i]) : rope_second(v[i0], v[i1], cs[i], sn[i]);
}

}  // namespace sluice::backend::cuda
