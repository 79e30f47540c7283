// The RoPE angle of one rotating pair, shared by the rope kernels (ops.cu) and the Q/K/V GEMV's
// rope-and-store epilogue (gemv_direct.cuh), so both rotate by bit-identical cos/sin.
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

__device__ __forceinline__ void rope_cos_sin(float theta_scale, float freq_scale, const float* freq_factors,
                                             int64_t position, int i, float& c, float& s) {
  float theta = float(position);
  for (int k = 0; k < i; ++k) theta = __fmul_rn(theta, theta_scale);
  const float th = __fmul_rn(freq_scale, freq_factors ? __fdiv_rn(theta, freq_factors[i]) : theta);
  double sv, cv;
  sincos(double(th), &sv, &cv);
  c = __double2float_rn(cv);
  s = __double2float_rn(sv);
}

// (x0, x1) rotated by (c, s), as rope_row rotates a pair.
__device__ __forceinline__ void rope_rotate(float& x0, float& x1, float c, float s) {
  const float a = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  const float b = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  x0 = a;
  x1 = b;
}

}  // namespace sluice::backend::cuda
