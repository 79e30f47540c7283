// The scalar specification of every format: dequantize, quantize and vec_dot. SIMD kernels are
// tested against these. All row functions require n to be a multiple of the format's block size
// (SLUICE_CHECK: callers validate lengths from files with validate_row() first).
#pragma once

#include <cstdint>

namespace sluice::quant::ref {

#define SLUICE_QUANT_REF_DECL(fmt)                                     \
  void dequantize_row_##fmt(const void* src, float* dst, int64_t n);   \
  void quantize_row_##fmt(const float* src, void* dst, int64_t n);

SLUICE_QUANT_REF_DECL(f32)
SLUICE_QUANT_REF_DECL(f16)
SLUICE_QUANT_REF_DECL(bf16)
SLUICE_QUANT_REF_DECL(q4_0)
SLUICE_QUANT_REF_DECL(q4_1)
SLUICE_QUANT_REF_DECL(q5_0)
SLUICE_QUANT_REF_DECL(q5_1)
SLUICE_QUANT_REF_DECL(q8_0)
SLUICE_QUANT_REF_DECL(q8_1)
SLUICE_QUANT_REF_DECL(q2_k)
SLUICE_QUANT_REF_DECL(q3_k)
SLUICE_QUANT_REF_DECL(q4_k)
SLUICE_QUANT_REF_DECL(q5_k)
SLUICE_QUANT_REF_DECL(q6_k)
SLUICE_QUANT_REF_DECL(q8_k)
#undef SLUICE_QUANT_REF_DECL

// Activation quantizers as ggml-cpu's x86 (AVX/AVX2) build computes them, which is what a
// llama.cpp CPU run on x86 feeds its dot products: the multiplier is 127/amax (not 1/d) and
// rounding is to nearest-even (not half away from zero). d and the layout equal the reference
// above; a q may differ by 1 where the product lands on or next to a .5 tie. The SIMD tables use
// these; the SIMD kernels are bit-identical to them.
void quantize_row_q8_0_rne(const float* src, void* dst, int64_t n);
void quantize_row_q8_1_rne(const float* src, void* dst, int64_t n);

// vec_dot: *out = sum w[i]*a[i], w in the weight format, a in its activation format.
void vec_dot_f32(int64_t n, const void* w, const void* a, float* out);    // a: F32
void vec_dot_f16(int64_t n, const void* w, const void* a, float* out);    // a: F16
void vec_dot_bf16(int64_t n, const void* w, const void* a, float* out);   // a: BF16
void vec_dot_q4_0(int64_t n, const void* w, const void* a, float* out);   // a: Q8_0
void vec_dot_q4_1(int64_t n, const void* w, const void* a, float* out);   // a: Q8_1
void vec_dot_q5_0(int64_t n, const void* w, const void* a, float* out);   // a: Q8_0
void vec_dot_q5_1(int64_t n, const void* w, const void* a, float* out);   // a: Q8_1
void vec_dot_q8_0(int64_t n, const void* w, const void* a, float* out);   // a: Q8_0
void vec_dot_q2_k(int64_t n, const void* w, const void* a, float* out);   // a: Q8_K
void vec_dot_q3_k(int64_t n, const void* w, const void* a, float* out);   // a: Q8_K
void vec_dot_q4_k(int64_t n, const void* w, const void* a, float* out);   // a: Q8_K
void vec_dot_q5_k(int64_t n, const void* w, const void* a, float* out);   // a: Q8_K
void vec_dot_q6_k(int64_t n, const void* w, const void* a, float* out);   // a: Q8_K

// Specification of Kernels::vec_dot_cols: out[c] = Dot(n, w, a + c * a_stride) for each column.
template <void (*Dot)(int64_t, const void*, const void*, float*)>
void vec_dot_cols(int64_t n, const void* w, const void* a, int64_t a_stride, int n_cols, float* out) {
  for (int c = 0; c < n_cols; ++c) Dot(n, w, static_cast<const unsigned char*>(a) + c * a_stride, out + c);
}

// Specification of Kernels::vec_dot_tile: out[c * out_stride + r] = Dot(row r, column c).
template <void (*Dot)(int64_t, const void*, const void*, float*)>
void vec_dot_tile(int64_t n, const void* w, int64_t w_stride, int n_rows, const void* a, int64_t a_stride, int n_cols,
                  float* out, int64_t out_stride) {
  for (int c = 0; c < n_cols; ++c)
    for (int r = 0; r < n_rows; ++r)
      Dot(n, static_cast<const unsigned char*>(w) + r * w_stride, static_cast<const unsigned char*>(a) + c * a_stride,
          out + c * out_stride + r);
}

}  // namespace sluice::quant::ref
