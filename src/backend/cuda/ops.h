// Elementwise and row-wise ops of the CUDA backend (everything but matrix products and
// attention): the device counterparts of the CPU backend's rms_norm, add_bias, add, swiglu, rope,
// store_rows, plus the conversions the prefill GEMM needs (f32 -> f16 activations, any weight
// format -> f16 rows). Semantics are those of backend.h; the CPU backend is the reference the
// GPU tests compare with.
//
// Host-only header: plain C++ may include it. All pointers are device pointers, all work is
// enqueued on `stream`, nothing synchronizes. Strides are in elements between row starts.
// Returns launch errors as a Status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "backend/cuda/gemv.h"
#include "core/status.h"
#include "quant/quant.h"

namespace sluice::backend::cuda {

// dst = x / rms(x) * w over groups of `group` consecutive elements of each row (group == cols for a
// layer norm, head_dim for Q/K norms; cols % group == 0). w: `group` floats. dst may alias x.
Status rms_norm(const float* x, int64_t x_stride, float* dst, int64_t dst_stride, int64_t rows, int64_t cols,
                const float* w, int64_t group, float eps, cudaStream_t stream);

// rms_norm of whole rows (group == cols) that also writes the int8 activation of dst into `out`
// ([rows][cols], as quantize_activation_q8 would make it from dst): one launch instead of two on
// the decode path, where a norm's output only feeds matrix products. cols % 32 == 0.
Status rms_norm_q8(const float* x, int64_t x_stride, float* dst, int64_t dst_stride, int64_t rows, int64_t cols,
                   const float* w, float eps, const Q8Activation& out, cudaStream_t stream);

// x += src, then rms_norm_q8 of x into dst (the residual add and the next norm in one launch).
// With w_src: x += rms_norm(src) * w_src instead (src's own norm first, as rms_norm_q8 computes
// it; src is left as it was). dst may alias src.
Status add_rms_norm_q8(float* x, int64_t x_stride, const float* src, int64_t src_stride, float* dst,
                       int64_t dst_stride, int64_t rows, int64_t cols, const float* w, float eps,
                       const Q8Activation& out, cudaStream_t stream, const float* w_src = nullptr);

// x += rms_norm(src) * w over whole rows (w has cols entries), the norm as rms_norm_q8 computes it.
Status norm_add(float* x, int64_t x_stride, const float* src, int64_t src_stride, int64_t rows, int64_t cols,
                const float* w, float eps, cudaStream_t stream);

// rms_norm (below) of a and of b in place, in one launch: the Q and K head norms. Groups (heads)
// of at most 1024 elements, normed as rms_norm does them.
Status rms_norm_pair(float* a, int64_t a_stride, int64_t a_cols, const float* wa, int64_t a_group, float* b,
                     int64_t b_stride, int64_t b_cols, const float* wb, int64_t b_group, int64_t rows, float eps,
                     cudaStream_t stream);

// swiglu / geglu (below) that also write dst's int8 activation into `out` (the down projection's
// input).
Status swiglu_q8(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* dst,
                 int64_t dst_stride, int64_t rows, int64_t cols, const Q8Activation& out, cudaStream_t stream);
Status geglu_q8(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* dst,
                int64_t dst_stride, int64_t rows, int64_t cols, const Q8Activation& out, cudaStream_t stream);

// y[r][c] += b[c].
Status add_bias(float* y, int64_t stride, int64_t rows, int64_t cols, const float* b, cudaStream_t stream);

// dst[r][c] += src[r][c].
Status add(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows, int64_t cols,
           cudaStream_t stream);

// dst[i] = src[rows[i]] for i < n (rows: host array, values in [0, src_rows)).
Status gather_rows(const float* src, int64_t src_stride, int64_t src_rows, float* dst, int64_t dst_stride,
                   const int32_t* rows, int64_t n, int64_t cols, cudaStream_t stream);
// dst[rows[i]] += scale[i] * src[i] for i < n (rows, scale: host arrays; rows distinct).
Status scatter_add_rows(float* dst, int64_t dst_stride, int64_t dst_rows, const float* src, int64_t src_stride,
                        const int32_t* rows, const float* scale, int64_t n, int64_t cols, cudaStream_t stream);

// dst[c] += scale[i] * src[i][c] for i = 0 .. n-1 in turn (scale: host array): one row of dst
// gets n rows of src, as n scatter_add_rows calls would add them.
Status add_rows_scaled(float* dst, const float* src, int64_t src_stride, const float* scale, int64_t n, int64_t cols,
                       cudaStream_t stream);

// dst = silu(gate) * up, elementwise. dst may alias gate or up.
Status swiglu(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* dst,
              int64_t dst_stride, int64_t rows, int64_t cols, cudaStream_t stream);

// dst = gelu_tanh(gate) * up, elementwise (backend::gelu_tanh). dst may alias gate or up.
Status geglu(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* dst,
             int64_t dst_stride, int64_t rows, int64_t cols, cudaStream_t stream);

// x[r][c] *= s.
Status scale(float* x, int64_t stride, int64_t rows, int64_t cols, float s, cudaStream_t stream);

struct RopeArgs {
  bool neox = false;                  // false: adjacent pairs (x[2i], x[2i+1]); true: halves
  int n_head = 0;                     // heads per row; row = n_head * head_dim
  int head_dim = 0;
  int n_rot = 0;                      // leading dims of each head that rotate (even, <= head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  const float* freq_factors = nullptr;  // optional device array of n_rot / 2 divisors
};
// Rotates x in place; row t is at position pos0 + t. pos_dev (optional): pos0 is read from this
// device int when the kernel runs instead (a recorded decode step replayed at later positions).
Status rope(float* x, int64_t stride, int64_t rows, const RopeArgs& args, int pos0, cudaStream_t stream,
            const int* pos_dev = nullptr);

// The rotation of `args` as the Q/K/V GEMV's rope-and-store epilogue takes it (gemv.h,
// GemvRopeStore: head_dim, half, theta_scale, freq_scale, freq_factors; the rest is the caller's),
// with the angles rope_store_kv uses. kUnsupported for the NeoX (halves) rotation.
Status rope_store_epilogue(const RopeArgs& args, GemvRopeStore& out);

// rope(q) and rope(k) with the same parameters (k has n_head_k heads), then k and v rows stored
// as f16 into the caches at rows [pos0, pos0 + rows): the four calls of a layer in one launch.
Status rope_store_kv(float* q, int64_t q_stride, float* k, int64_t k_stride, int n_head_k, const float* v,
                     int64_t v_stride, int64_t v_cols, int64_t rows, const RopeArgs& args, void* k_cache,
                     int64_t k_cache_stride, void* v_cache, int64_t v_cache_stride, int64_t pos0,
                     cudaStream_t stream, const int* pos_dev = nullptr, const int* row_map = nullptr);

// One sequence of rope_store_kv_seqs: rows [row0, row0 + n) of q/k/v, at positions [pos0, pos0 +
// n), stored at cache rows row_map[p] (device memory; nullptr: row p).
struct RopeSeq {
  int64_t row0 = 0;
  int n = 0;
  int pos0 = 0;
  const int* row_map = nullptr;
};
inline constexpr int kMaxRopeSeqs = 32;
// rope_store_kv of several sequences' rows (at most kMaxRopeSeqs) in one launch: the results of
// one rope_store_kv per sequence, bit for bit.
Status rope_store_kv_seqs(float* q, int64_t q_stride, float* k, int64_t k_stride, int n_head_k, const float* v,
                          int64_t v_stride, int64_t v_cols, const RopeArgs& args, void* k_cache, int64_t k_cache_stride,
                          void* v_cache, int64_t v_cache_stride, std::span<const RopeSeq> seqs, cudaStream_t stream);

// cache rows [pos0, pos0 + rows) = f16(src rows); cache is f16 with cache_stride elements per row.
// pos_dev (optional): pos0 read from device memory when the kernel runs (as for rope). row_map
// (optional, device memory; a paged cache, Tensor::row_map): position p goes to row row_map[p]
// (also in rope_store_kv).
Status store_rows_f16(const float* src, int64_t src_stride, int64_t rows, int64_t cols, void* cache,
                      int64_t cache_stride, int64_t pos0, cudaStream_t stream, const int* pos_dev = nullptr,
                      const int* row_map = nullptr);

// dst (f16, [rows][dst_stride]) = f16(src) for the first `cols` elements of each row.
Status f32_to_f16(const float* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows, int64_t cols,
                  cudaStream_t stream);

// True where dequantize_to_f16 supports the format (every weight format of quant/).
bool dequantize_supported(quant::Type type);
// dst (f16, [rows][cols] contiguous) = the weight rows w[0 .. rows) of `cols` elements each
// (GGUF bytes as they are: row r at r * row_bytes(type, cols); with `grouped`, Q6_K / Q8_0 rows
// in the grouped layout of layout.h, 16-byte aligned), dequantized exactly as quant's scalar reference
// does, then rounded to f16.
Status dequantize_to_f16(quant::Type type, const void* w, int64_t rows, int64_t cols, void* dst,
                         cudaStream_t stream, bool grouped = false);

}  // namespace sluice::backend::cuda
