// Elementwise and row-wise ops of the CUDA backend (ops.h): rms_norm, add_bias, add, swiglu, geglu, scale, rope,
// store_rows_f16, f32_to_f16. dequantize_to_f16 is in dequant.cu.
//
// Parity: the CPU backend (backend/cpu/cpu_backend.cpp) is the reference, and the model's logits
// amplify last-bit differences in norms and RoPE angles, so every value is computed with the same
// f32 operations in the same order as there. The _rn intrinsics keep nvcc from fusing a multiply
// and an add into an FMA (the CPU reference is built for baseline x86-64 and never fuses); where
// the CPU sums in double, so does the GPU.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/rope.cuh"

namespace sluice::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridX = 4096;   // grid-stride loops take the rest
constexpr int64_t kMaxGridY = 65535;  // the hardware limit of gridDim.y

bool aligned_to(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// ---- row-wise elementwise ops ---------------------------------------------------------------------
// One launch shape for every op over [rows][cols] with row strides: blockIdx.y walks rows,
// x-threads walk columns V elements at a time (V = 4: 16-byte f32 accesses, chosen by the host when
// every pointer, stride and cols allow it). Each element is read and written by one thread only,
// so in-place use (dst aliasing an input with the same stride) is safe; no pointer is __restrict__.
template <int V, class Op>
__global__ void __launch_bounds__(kThreads) rowwise_kernel(Op op, int64_t rows, int64_t cols) {
  pdl_wait();
  pdl_trigger();
  const int64_t col_step = int64_t(gridDim.x) * kThreads * V;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * V; c < cols; c += col_step) {
      op.template apply<V>(r, c);
    }
  }
}

template <class Op>
Status launch_rowwise(const Op& op, int64_t rows, int64_t cols, bool vec4, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return Status::ok();
  const int v = vec4 ? 4 : 1;
  const int64_t col_blocks = (cols + int64_t(kThreads) * v - 1) / (int64_t(kThreads) * v);
  const dim3 grid(unsigned(std::min(col_blocks, kMaxGridX)), unsigned(std::min(rows, kMaxGridY)));
  if (vec4) {
    SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(rowwise_kernel<4, Op>, grid, dim3(kThreads), 0, stream, op, rows, cols));
  } else {
    SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(rowwise_kernel<1, Op>, grid, dim3(kThreads), 0, stream, op, rows, cols));
  }
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("rowwise_kernel");
  return Status::ok();
}

template <int V>
__device__ __forceinline__ void load_v(const float* p, float (&v)[V]) {
  if constexpr (V == 4) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else {
    v[0] = *p;
  }
}
template <int V>
__device__ __forceinline__ void store_v(float* p, const float (&v)[V]) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    *p = v[0];
  }
}

struct AddBiasOp {  // y[r][c] += b[c]
  float* y;
  int64_t stride;
  const float* b;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    float a[V], d[V];
    load_v<V>(y + r * stride + c, a);
    load_v<V>(b + c, d);
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = __fadd_rn(a[k], d[k]);
    store_v<V>(y + r * stride + c, a);
  }
};

struct AddOp {  // dst[r][c] += src[r][c]
  float* dst;
  int64_t dst_stride;
  const float* src;
  int64_t src_stride;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    float a[V], d[V];
    load_v<V>(dst + r * dst_stride + c, a);
    load_v<V>(src + r * src_stride + c, d);
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = __fadd_rn(a[k], d[k]);
    store_v<V>(dst + r * dst_stride + c, a);
  }
};

// The gated activations' expressions, shared by the elementwise ops and the kernels that also
// write the int8 activation (so fused and unfused give the same bits).
// silu(g) * u = g / (1 + exp(-g)) * u, the CPU's expression and order.
__device__ __forceinline__ float silu_mul(float g, float u) { return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u); }
// gelu_tanh(g) * u: backend::gelu_tanh's expression and order (0.5 g (1 + tanh(k g (1 + a g^2)))
// left to right), without FMA contraction; tanhf is CUDA's (within 2 ulp of glibc's).
__device__ __forceinline__ float gelu_tanh_mul(float x, float u) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoef = 0.044715f;
  const float inner = __fmul_rn(__fmul_rn(kSqrt2OverPi, x), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(kCoef, x), x)));
  return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner))), u);
}
struct Silu {
  __device__ float operator()(float g, float u) const { return silu_mul(g, u); }
};
struct GeluTanh {
  __device__ float operator()(float g, float u) const { return gelu_tanh_mul(g, u); }
};

// dst = act(g) * u, Act one of the two above (SwigluOp: silu, GegluOp: gelu_tanh).
template <class Act>
struct GluOp {
  const float* gate;
  int64_t gate_stride;
  const float* up;
  int64_t up_stride;
  float* dst;
  int64_t dst_stride;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    float g[V], u[V];
    load_v<V>(gate + r * gate_stride + c, g);
    load_v<V>(up + r * up_stride + c, u);
#pragma unroll
    for (int k = 0; k < V; ++k) g[k] = Act()(g[k], u[k]);
    store_v<V>(dst + r * dst_stride + c, g);
  }
};
using SwigluOp = GluOp<Silu>;
using GegluOp = GluOp<GeluTanh>;

struct ScaleOp {  // x[r][c] *= s
  float* x;
  int64_t stride;
  float s;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    float a[V];
    load_v<V>(x + r * stride + c, a);
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = __fmul_rn(a[k], s);
    store_v<V>(x + r * stride + c, a);
  }
};

struct ToHalfOp {  // dst[r][c] = f16(src[r][c]), round to nearest even (as quant's fp32_to_fp16)
  const float* src;
  int64_t src_stride;
  __half* dst;
  int64_t dst_stride;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    float a[V];
    load_v<V>(src + r * src_stride + c, a);
    __half* d = dst + r * dst_stride + c;
    if constexpr (V == 4) {
      const uint32_t lo = uint32_t(__half_as_ushort(__float2half_rn(a[0]))) |
                          (uint32_t(__half_as_ushort(__float2half_rn(a[1]))) << 16);
      const uint32_t hi = uint32_t(__half_as_ushort(__float2half_rn(a[2]))) |
                          (uint32_t(__half_as_ushort(__float2half_rn(a[3]))) << 16);
      *reinterpret_cast<unsigned long long*>(d) = (static_cast<unsigned long long>(hi) << 32) | lo;  // one 8-byte store
    } else {
      *d = __float2half_rn(a[0]);
    }
  }
};

// Rows of f32 at p with `stride` can be read 4 at a time.
bool vec4_ok(const void* p, int64_t stride, uintptr_t align = 16) { return aligned_to(p, align) && stride % 4 == 0; }

Status check_rows(const char* op, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) {
    return invalid_argument(std::string(op) + ": negative shape " + std::to_string(rows) + " x " +
                            std::to_string(cols));
  }
  return Status::ok();
}
Status check_stride(const char* op, const char* name, const void* p, int64_t stride, int64_t cols) {
  if (p == nullptr) return invalid_argument(std::string(op) + ": " + name + " is null");
  if (stride < cols) {
    return invalid_argument(std::string(op) + ": " + name + " stride " + std::to_string(stride) + " < cols " +
                            std::to_string(cols));
  }
  return Status::ok();
}

// ---- rms_norm ---------------------------------------------------------------------------------------
// The CPU sums the f32 squares in double, then mean = f32(sum / group), scale = 1 / sqrtf(mean + eps)
// in f32, y = (x * scale) * w. The GPU does the same; only the order of the double additions
// differs, which changes the f32 mean only when the sum lands within ~1e-16 (relative) of an f32
// rounding boundary. FP64 adds are few (one per element) next to the memory traffic.

__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float rms_scale(double sum, int group, float eps) {
  const float mean = __double2float_rn(__ddiv_rn(sum, double(group)));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// Items are (row, group) pairs, item = row * groups_per_row + group index.
struct NormArgs {
  const float* x;
  int64_t x_stride;
  float* dst;
  int64_t dst_stride;
  int64_t items;
  int64_t groups_per_row;
  int group;
  const float* w;
  float eps;
  __device__ const float* src_of(int64_t item) const {
    return x + (item / groups_per_row) * x_stride + (item % groups_per_row) * group;
  }
  __device__ float* dst_of(int64_t item) const {
    return dst + (item / groups_per_row) * dst_stride + (item % groups_per_row) * group;
  }
};

// One group normed by one warp.
__device__ __forceinline__ void norm_group_warp(const NormArgs& a, int64_t item, int lane) {
  const float* xr = a.src_of(item);
  float* yr = a.dst_of(item);
  double sum = 0;
  for (int i = lane; i < a.group; i += kWarpSize) sum += double(__fmul_rn(xr[i], xr[i]));
  const float scale = rms_scale(warp_sum_double(sum), a.group, a.eps);
  // Every lane has read all its elements before any lane writes (the shuffle above joins the
  // warp), and each lane rewrites only elements it read: in-place (dst == x) is safe.
  for (int i = lane; i < a.group; i += kWarpSize) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), a.w[i]);
}

// Small groups (Q/K head norms, head_dim 64..256): one warp per group, 8 groups per block.
__global__ void __launch_bounds__(kThreads) rms_norm_warp_kernel(NormArgs a) {
  pdl_wait();
  pdl_trigger();
  constexpr int kWarps = kThreads / kWarpSize;
  const int64_t step = int64_t(gridDim.x) * kWarps;
  for (int64_t item = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize; item < a.items; item += step) {
    norm_group_warp(a, item, threadIdx.x % kWarpSize);
  }
}

// Two such norms in one launch (the Q and K head norms): a's groups, then b's.
__global__ void __launch_bounds__(kThreads) rms_norm_warp_pair_kernel(NormArgs a, NormArgs b) {
  pdl_wait();
  pdl_trigger();
  constexpr int kWarps = kThreads / kWarpSize;
  const int64_t step = int64_t(gridDim.x) * kWarps;
  for (int64_t item = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize; item < a.items + b.items;
       item += step) {
    if (item < a.items) {
      norm_group_warp(a, item, threadIdx.x % kWarpSize);
    } else {
      norm_group_warp(b, item - a.items, threadIdx.x % kWarpSize);
    }
  }
}

// Whole-row norms (group = n_embd, 576..8192): one block of 1024 threads per group, so a single
// decode row is spread over 32 warps and each thread issues its few loads back to back (with 256
// threads a 4096-row norm was a chain of 16 dependent-latency loads per thread: ~11 us).
constexpr int kNormThreads = 1024;

// Sum of squares of one group over the whole block (double, as the CPU); every thread gets it.
__device__ __forceinline__ double block_sum_squares(const float* xr, int group, double* partial) {
  constexpr int kWarps = kNormThreads / kWarpSize;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  double sum = 0;
#pragma unroll 4
  for (int i = threadIdx.x; i < group; i += kNormThreads) sum += double(__fmul_rn(xr[i], xr[i]));
  sum = warp_sum_double(sum);
  if (lane == 0) partial[warp] = sum;
  __syncthreads();
  double s = lane < kWarps ? partial[lane] : 0.0;
  s = warp_sum_double(s);
  __syncthreads();  // partial is reused by the next item; every thread has read its x
  return s;
}

__global__ void __launch_bounds__(kNormThreads) rms_norm_block_kernel(NormArgs a) {
  __shared__ double partial[kNormThreads / kWarpSize];
  for (int64_t item = blockIdx.x; item < a.items; item += gridDim.x) {
    const float* xr = a.src_of(item);
    float* yr = a.dst_of(item);
    const float scale = rms_scale(block_sum_squares(xr, a.group, partial), a.group, a.eps);
#pragma unroll 4
    for (int i = threadIdx.x; i < a.group; i += kNormThreads) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), a.w[i]);
  }
}

// The norm weight of a whole-row norm, loaded by each thread before pdl_wait (weights are not
// written by kernels, so the loads overlap the previous kernel's tail): element threadIdx.x +
// k * kNormThreads in w[k], for rows up to kNormPre * kNormThreads wide; wider rows read the rest
// in the loop.
constexpr int kNormPre = 8;
struct NormWeights {
  float w[kNormPre];
  __device__ void load(const float* src, int group) {
#pragma unroll
    for (int k = 0; k < kNormPre; ++k) {
      const int i = int(threadIdx.x) + k * kNormThreads;
      w[k] = i < group ? src[i] : 0.0f;
    }
  }
};

// y = (x * scale) * w over a whole row, stored to yr and as the dense activation's int8 blocks.
// Warps cover 32 consecutive elements per step: one q8 block each (group % 32 == 0, so a warp is
// wholly inside or outside the row).
__device__ __forceinline__ void norm_row_q8(const NormArgs& a, const NormWeights& nw, int64_t item, const float* xr,
                                            float scale, int8_t* q, float2* ds) {
  float* yr = a.dst_of(item);
  auto one = [&](int i, float w) {
    const float y = __fmul_rn(__fmul_rn(xr[i], scale), w);
    yr[i] = y;
    const int64_t e = item * a.group + i;  // element index in the dense activation
    q8_block(y, q + (e - threadIdx.x % kWarpSize), ds + e / 32);
  };
#pragma unroll
  for (int k = 0; k < kNormPre; ++k) {
    const int i = int(threadIdx.x) + k * kNormThreads;
    if (i < a.group) one(i, nw.w[k]);
  }
  for (int i = int(threadIdx.x) + kNormPre * kNormThreads; i < a.group; i += kNormThreads) one(i, a.w[i]);
}

// rms_norm of whole rows that also writes the rows' int8 activation (decode: the norm's output
// only feeds matrix products). group == cols, cols % 32 == 0, rows dense in the activation.
__global__ void __launch_bounds__(kNormThreads) rms_norm_q8_kernel(NormArgs a, int8_t* q, float2* ds) {
  NormWeights nw;
  nw.load(a.w, a.group);
  pdl_wait();
  pdl_trigger();  // the GEMVs reading this activation may start streaming their weights
  __shared__ double partial[kNormThreads / kWarpSize];
  for (int64_t item = blockIdx.x; item < a.items; item += gridDim.x) {
    const float* xr = a.src_of(item);
    const float scale = rms_scale(block_sum_squares(xr, a.group, partial), a.group, a.eps);
    norm_row_q8(a, nw, item, xr, scale, q, ds);
  }
}

// x += src (the residual), then rms_norm_q8 of x: add, norm and int8 activation in one launch.
// Each thread adds, squares and normalizes the same elements (i = threadIdx.x + k * kNormThreads,
// as block_sum_squares reads them), so it reads only its own writes; dst may alias src (src is
// read before the block's first barrier, dst written after it).
// With w_src (Gemma 3's post-attention norm): x += rms_norm(src) * w_src instead, the norm of src
// as rms_norm_q8_kernel computes it (same sums, same products), then the same.
template <bool kNormSrc>
__global__ void __launch_bounds__(kNormThreads) add_rms_norm_q8_kernel(NormArgs a, const float* src,
                                                                       int64_t src_stride, const float* w_src,
                                                                       int8_t* q, float2* ds) {
  NormWeights nw;
  nw.load(a.w, a.group);
  pdl_wait();
  pdl_trigger();  // the GEMVs reading this activation may start streaming their weights
  __shared__ double partial[kNormThreads / kWarpSize];
  for (int64_t item = blockIdx.x; item < a.items; item += gridDim.x) {
    float* xr = const_cast<float*>(a.src_of(item));
    const float* sr = src + item * src_stride;
    if constexpr (kNormSrc) {
      const float ss = rms_scale(block_sum_squares(sr, a.group, partial), a.group, a.eps);
#pragma unroll 4
      for (int i = threadIdx.x; i < a.group; i += kNormThreads) {
        xr[i] = __fadd_rn(xr[i], __fmul_rn(__fmul_rn(sr[i], ss), w_src[i]));
      }
    } else {
#pragma unroll 4
      for (int i = threadIdx.x; i < a.group; i += kNormThreads) xr[i] = __fadd_rn(xr[i], sr[i]);
    }
    const float scale = rms_scale(block_sum_squares(xr, a.group, partial), a.group, a.eps);
    norm_row_q8(a, nw, item, xr, scale, q, ds);
  }
}

// x += rms_norm(src) * w over whole rows (Gemma 3's post-FFN norm and residual add): a.x is src,
// a.dst is x, a.w the norm's weight; the norm as rms_norm_q8_kernel computes it.
__global__ void __launch_bounds__(kNormThreads) norm_add_kernel(NormArgs a) {
  NormWeights nw;
  nw.load(a.w, a.group);
  pdl_wait();
  pdl_trigger();
  __shared__ double partial[kNormThreads / kWarpSize];
  for (int64_t item = blockIdx.x; item < a.items; item += gridDim.x) {
    const float* sr = a.src_of(item);
    float* xr = a.dst_of(item);
    const float ss = rms_scale(block_sum_squares(sr, a.group, partial), a.group, a.eps);
#pragma unroll
    for (int k = 0; k < kNormPre; ++k) {
      const int i = int(threadIdx.x) + k * kNormThreads;
      if (i < a.group) xr[i] = __fadd_rn(xr[i], __fmul_rn(__fmul_rn(sr[i], ss), nw.w[k]));
    }
    for (int i = int(threadIdx.x) + kNormPre * kNormThreads; i < a.group; i += kNormThreads) {
      xr[i] = __fadd_rn(xr[i], __fmul_rn(__fmul_rn(sr[i], ss), a.w[i]));
    }
  }
}

// dst = act(gate) * up (Silu as SwigluOp, GeluTanh as GegluOp) and its int8 activation; rows
// dense, cols % 32 == 0.
template <class Act>
__global__ void __launch_bounds__(kThreads) glu_q8_kernel(const float* gate, int64_t gate_stride, const float* up,
                                                          int64_t up_stride, float* dst, int64_t dst_stride,
                                                          int64_t rows, int64_t cols, int8_t* q, float2* ds);

// ---- rope -----------------------------------------------------------------------------------------------
// Angles as the CPU computes them (rope_cos_sin, rope.cuh). One block per row: the block first
// fills the row's cos/sin table (n_rot / 2 entries, shared by all heads), then rotates every
// head's pairs.
struct RopeKernelArgs {
  float* x;
  int64_t stride;
  int64_t rows;
  int n_head;
  int head_dim;
  int half;  // n_rot / 2
  bool neox;
  float theta_scale;
  float freq_scale;
  const float* freq_factors;  // nullptr or [half]
  int64_t pos0;
  const int* pos_dev;  // non-null: the position of row 0 is *pos_dev (a replayed decode step)
  __device__ int64_t base() const { return pos_dev != nullptr ? int64_t(*pos_dev) : pos0; }
};

constexpr int kRopeThreads = 512;  // a decode row: 2048 pairs in 4 steps per thread

// The row's cos/sin table, as rope_kernel fills it (one entry per rotating pair of a head).
__device__ __forceinline__ void rope_table(const RopeKernelArgs& a, int64_t position, float* cs, float* sn) {
  for (int i = threadIdx.x; i < a.half; i += kRopeThreads) {
    rope_cos_sin(a.theta_scale, a.freq_scale, a.freq_factors, position, i, cs[i], sn[i]);
  }
}

__device__ __forceinline__ void rope_row(const RopeKernelArgs& a, float* xr, int n_head, const float* cs,
                                         const float* sn) {
  const int pairs = n_head * a.half;
  for (int p = threadIdx.x; p < pairs; p += kRopeThreads) {
    const int h = p / a.half, i = p % a.half;
    float* v = xr + int64_t(h) * a.head_dim;
    const int i0 = a.neox ? i : 2 * i;
    const int i1 = a.neox ? i + a.half : 2 * i + 1;
    float x0 = v[i0], x1 = v[i1];
    rope_rotate(x0, x1, cs[i], sn[i]);
    v[i0] = x0;
    v[i1] = x1;
  }
}

// rope of q and k (same table: same rope parameters but the head count), then k and v stored into
// the f16 caches at row pos0 + r: four launches of the layer in one. One block per token.
struct RopeStoreArgs {
  RopeKernelArgs q;  // x = q rows; q.n_head query heads
  float* k;
  int64_t k_stride;
  int n_head_k;
  const float* v;
  int64_t v_stride;
  int64_t v_cols;
  __half* k_cache;
  int64_t k_cache_stride;
  __half* v_cache;
  int64_t v_cache_stride;
  const int* row_map;  // paged cache: position p is row row_map[p] (nullptr: row p)
};

// Row r of q and k rotated with the block's cos/sin table (cs/sn: half entries each, filled by
// rope_table for the row's position), then its k and v stored at cache row map[pos] (or pos).
__device__ __forceinline__ void rope_store_rest(const RopeStoreArgs& a, int64_t r, int64_t pos, const int* map,
                                                float* cs, float* sn) {
  __syncthreads();  // the table is complete
  rope_row(a.q, a.q.x + r * a.q.stride, a.q.n_head, cs, sn);
  float* kr = a.k + r * a.k_stride;
  rope_row(a.q, kr, a.n_head_k, cs, sn);
  __syncthreads();  // k rotated (by other threads) before it is stored; the table is reused
  const int64_t row = map != nullptr ? int64_t(map[pos]) : pos;
  const int64_t k_cols = int64_t(a.n_head_k) * a.q.head_dim;
  __half* kc = a.k_cache + row * a.k_cache_stride;
  for (int64_t c = threadIdx.x; c < k_cols; c += kRopeThreads) kc[c] = __float2half_rn(kr[c]);
  const float* vr = a.v + r * a.v_stride;
  __half* vc = a.v_cache + row * a.v_cache_stride;
  for (int64_t c = threadIdx.x; c < a.v_cols; c += kRopeThreads) vc[c] = __float2half_rn(vr[c]);
}

__device__ __forceinline__ void rope_store_row(const RopeStoreArgs& a, int64_t r, int64_t pos, const int* map,
                                               float* cs, float* sn) {
  rope_table(a.q, pos, cs, sn);
  rope_store_rest(a, r, pos, map, cs, sn);
}

// The block's first table is filled before pdl_wait: it depends only on the position (a kernel
// argument, or *pos_dev, which a host copy sets before the step's first kernel, so it is final
// before any kernel of the step starts) and the rope weights; its serial angle products and
// sincos overlap the QKV product's tail.
__global__ void __launch_bounds__(kRopeThreads) rope_store_kernel(RopeStoreArgs a) {
  extern __shared__ float table[];
  float* cs = table;
  float* sn = table + a.q.half;
  const int64_t first = blockIdx.x;
  if (first < a.q.rows) rope_table(a.q, a.q.base() + first, cs, sn);
  pdl_wait();
  pdl_trigger();
  for (int64_t r = first; r < a.q.rows; r += gridDim.x) {
    const int64_t pos = a.q.base() + r;
    if (r != first) rope_table(a.q, pos, cs, sn);
    rope_store_rest(a, r, pos, a.row_map, cs, sn);
  }
}

// rope_store_kernel over several sequences' rows (rope_store_kv_seqs): pass row i of the launch is
// row j = i - cum[s] of sequence s (cum[s] <= i < cum[s + 1]), tensor row row0[s] + j, position
// pos0[s] + j, cache row map[s][pos] (or pos). One block per row, as above.
struct RopeSeqTable {
  int n = 0;
  int cum[kMaxRopeSeqs + 1] = {};
  int pos0[kMaxRopeSeqs] = {};
  int64_t row0[kMaxRopeSeqs] = {};
  const int* map[kMaxRopeSeqs] = {};
};

__global__ void __launch_bounds__(kRopeThreads) rope_store_seqs_kernel(RopeStoreArgs a,
                                                                      const __grid_constant__ RopeSeqTable t) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float table[];
  for (int i = int(blockIdx.x); i < t.cum[t.n]; i += int(gridDim.x)) {
    int s = 0;
    while (s + 1 < t.n && i >= t.cum[s + 1]) ++s;
    const int j = i - t.cum[s];
    rope_store_row(a, t.row0[s] + j, int64_t(t.pos0[s]) + j, t.map[s], table, table + a.q.half);
  }
}

__global__ void __launch_bounds__(kRopeThreads) rope_kernel(RopeKernelArgs a) {
  extern __shared__ float table[];  // cos [half], then sin [half]
  float* cs = table;
  float* sn = table + a.half;
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    rope_table(a, a.base() + r, cs, sn);
    __syncthreads();
    rope_row(a, a.x + r * a.stride, a.n_head, cs, sn);
    __syncthreads();  // the table is rewritten for the next row
  }
}

template <class Act>
__global__ void __launch_bounds__(kThreads) glu_q8_kernel(const float* gate, int64_t gate_stride, const float* up,
                                                          int64_t up_stride, float* dst, int64_t dst_stride,
                                                          int64_t rows, int64_t cols, int8_t* q, float2* ds) {
  pdl_wait();
  pdl_trigger();  // the down projection may start streaming its weights
  const int64_t n = rows * cols;
  const int64_t step = int64_t(gridDim.x) * kThreads;
  // n % 32 == 0 and the stride is a multiple of 32, so whole warps stay in one q8 block.
  for (int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x; e < n; e += step) {
    const int64_t r = e / cols, c = e % cols;
    const float y = Act{}(gate[r * gate_stride + c], up[r * up_stride + c]);
    dst[r * dst_stride + c] = y;
    q8_block(y, q + (e - threadIdx.x % kWarpSize), ds + e / 32);
  }
}

}  // namespace

Status rms_norm_q8(const float* x, int64_t x_stride, float* dst, int64_t dst_stride, int64_t rows, int64_t cols,
                   const float* w, float eps, const Q8Activation& out, cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("rms_norm_q8", rows, cols));
  if (cols % 32 != 0 || out.cols != cols || out.tokens != rows || !out.q || !out.ds) {
    return invalid_argument("rms_norm_q8: the activation must be [rows][cols] with cols % 32 == 0");
  }
  if (rows == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("rms_norm_q8", "x", x, x_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride("rms_norm_q8", "dst", dst, dst_stride, cols));
  if (w == nullptr) return invalid_argument("rms_norm_q8: w is null");
  NormArgs a{x, x_stride, dst, dst_stride, rows, 1, int(cols), w, eps};
  SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(rms_norm_q8_kernel, dim3(unsigned(std::min(rows, kMaxGridX))),
                                         dim3(kNormThreads), 0, stream, a, out.q, out.ds));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("rms_norm_q8_kernel");
  return Status::ok();
}

namespace {
template <class Act>
Status glu_q8(const char* op, const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* dst,
              int64_t dst_stride, int64_t rows, int64_t cols, const Q8Activation& out, cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows(op, rows, cols));
  if (cols % 32 != 0 || out.cols != cols || out.tokens != rows || !out.q || !out.ds) {
    return invalid_argument(std::string(op) + ": the activation must be [rows][cols] with cols % 32 == 0");
  }
  if (rows == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride(op, "gate", gate, gate_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride(op, "up", up, up_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride(op, "dst", dst, dst_stride, cols));
  const int64_t n = rows * cols;
  const int64_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxGridX);
  SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(glu_q8_kernel<Act>, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, gate,
                                         gate_stride, up, up_stride, dst, dst_stride, rows, cols, out.q, out.ds));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED(op);
  return Status::ok();
}
}  // namespace

Status swiglu_q8(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* dst,
                 int64_t dst_stride, int64_t rows, int64_t cols, const Q8Activation& out, cudaStream_t stream) {
  return glu_q8<Silu>("swiglu_q8", gate, gate_stride, up, up_stride, dst, dst_stride, rows, cols, out, stream);
}

Status geglu_q8(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* dst,
                int64_t dst_stride, int64_t rows, int64_t cols, const Q8Activation& out, cudaStream_t stream) {
  return glu_q8<GeluTanh>("geglu_q8", gate, gate_stride, up, up_stride, dst, dst_stride, rows, cols, out, stream);
}

Status rms_norm_pair(float* a, int64_t a_stride, int64_t a_cols, const float* wa, int64_t a_group, float* b,
                     int64_t b_stride, int64_t b_cols, const float* wb, int64_t b_group, int64_t rows, float eps,
                     cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("rms_norm_pair", rows, a_cols));
  SLUICE_RETURN_IF_ERROR(check_rows("rms_norm_pair", rows, b_cols));
  for (auto [cols, group] : {std::pair{a_cols, a_group}, std::pair{b_cols, b_group}}) {
    if (group <= 0 || group > 1024 || cols % group != 0) {
      return invalid_argument("rms_norm_pair: group " + std::to_string(group) + " must be in [1, 1024] and divide " +
                              std::to_string(cols));
    }
  }
  if (rows == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("rms_norm_pair", "a", a, a_stride, a_cols));
  SLUICE_RETURN_IF_ERROR(check_stride("rms_norm_pair", "b", b, b_stride, b_cols));
  if (wa == nullptr || wb == nullptr) return invalid_argument("rms_norm_pair: a weight is null");
  const NormArgs na{a, a_stride, a, a_stride, rows * (a_cols / a_group), a_cols / a_group, int(a_group), wa, eps};
  const NormArgs nb{b, b_stride, b, b_stride, rows * (b_cols / b_group), b_cols / b_group, int(b_group), wb, eps};
  constexpr int64_t kWarps = kThreads / kWarpSize;
  const int64_t blocks = std::min((na.items + nb.items + kWarps - 1) / kWarps, kMaxGridX * 4);
  SLUICE_CUDA_RETURN_IF_ERROR(
      launch_pdl(rms_norm_warp_pair_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, na, nb));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("rms_norm_warp_pair_kernel");
  return Status::ok();
}

Status norm_add(float* x, int64_t x_stride, const float* src, int64_t src_stride, int64_t rows, int64_t cols,
                const float* w, float eps, cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("norm_add", rows, cols));
  if (rows == 0 || cols == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("norm_add", "x", x, x_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride("norm_add", "src", src, src_stride, cols));
  if (w == nullptr) return invalid_argument("norm_add: w is null");
  NormArgs a{src, src_stride, x, x_stride, rows, 1, int(cols), w, eps};
  SLUICE_CUDA_RETURN_IF_ERROR(
      launch_pdl(norm_add_kernel, dim3(unsigned(std::min(rows, kMaxGridX))), dim3(kNormThreads), 0, stream, a));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("norm_add_kernel");
  return Status::ok();
}

Status rms_norm(const float* x, int64_t x_stride, float* dst, int64_t dst_stride, int64_t rows, int64_t cols,
                const float* w, int64_t group, float eps, cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("rms_norm", rows, cols));
  if (group <= 0 || group > (int64_t(1) << 30) || cols % group != 0) {
    return invalid_argument("rms_norm: group " + std::to_string(group) + " must be positive and divide cols " +
                            std::to_string(cols));
  }
  if (rows == 0 || cols == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("rms_norm", "x", x, x_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride("rms_norm", "dst", dst, dst_stride, cols));
  if (w == nullptr) return invalid_argument("rms_norm: w is null");
  NormArgs a{x, x_stride, dst, dst_stride, rows * (cols / group), cols / group, int(group), w, eps};
  // A warp per group while a group is at most 32 elements per lane; beyond, a block per group.
  if (group <= 1024) {
    constexpr int64_t kWarps = kThreads / kWarpSize;
    const int64_t blocks = std::min((a.items + kWarps - 1) / kWarps, kMaxGridX * 4);
    SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(rms_norm_warp_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, a));
    SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("rms_norm_warp_kernel");
  } else {
    const int64_t blocks = std::min(a.items, kMaxGridX * 4);
    rms_norm_block_kernel<<<unsigned(blocks), kNormThreads, 0, stream>>>(a);
    SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("rms_norm_block_kernel");
  }
  return Status::ok();
}

Status add_bias(float* y, int64_t stride, int64_t rows, int64_t cols, const float* b, cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("add_bias", rows, cols));
  if (rows == 0 || cols == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("add_bias", "y", y, stride, cols));
  if (b == nullptr) return invalid_argument("add_bias: b is null");
  const bool vec4 = cols % 4 == 0 && vec4_ok(y, stride) && aligned_to(b, 16);
  return launch_rowwise(AddBiasOp{y, stride, b}, rows, cols, vec4, stream);
}

Status add(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows, int64_t cols,
           cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("add", rows, cols));
  if (rows == 0 || cols == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("add", "dst", dst, dst_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride("add", "src", src, src_stride, cols));
  const bool vec4 = cols % 4 == 0 && vec4_ok(dst, dst_stride) && vec4_ok(src, src_stride);
  return launch_rowwise(AddOp{dst, dst_stride, src, src_stride}, rows, cols, vec4, stream);
}

namespace {

// Row lists travel in the kernel's parameters (kIndexChunk rows per launch), so gathers and
// scatters need no device buffer, no copy and no synchronization with the host's routing.
constexpr int kIndexChunk = 128;

struct GatherOp {  // dst[i][c] = src[rows[i]][c]
  float* dst;
  int64_t dst_stride;
  const float* src;
  int64_t src_stride;
  int32_t rows[kIndexChunk];
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    float a[V];
    load_v<V>(src + int64_t(rows[r]) * src_stride + c, a);
    store_v<V>(dst + r * dst_stride + c, a);
  }
};

struct ScatterAddOp {  // dst[rows[i]][c] += scale[i] * src[i][c]
  float* dst;
  int64_t dst_stride;
  const float* src;
  int64_t src_stride;
  int32_t rows[kIndexChunk];
  float scale[kIndexChunk];
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    float a[V], d[V];
    float* out = dst + int64_t(rows[r]) * dst_stride + c;
    load_v<V>(out, a);
    load_v<V>(src + r * src_stride + c, d);
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = __fadd_rn(a[k], __fmul_rn(scale[r], d[k]));
    store_v<V>(out, a);
  }
};

struct AddRowsScaledOp {  // dst[c] += scale[i] * src[i][c], i = 0 .. n-1 in turn (as ScatterAddOp, row by row)
  float* dst;
  const float* src;
  int64_t src_stride;
  int n;
  float scale[kIndexChunk];
  template <int V>
  __device__ void apply(int64_t, int64_t c) const {
    float a[V], d[V];
    load_v<V>(dst + c, a);
    for (int i = 0; i < n; ++i) {
      load_v<V>(src + i * src_stride + c, d);
#pragma unroll
      for (int k = 0; k < V; ++k) a[k] = __fadd_rn(a[k], __fmul_rn(scale[i], d[k]));
    }
    store_v<V>(dst + c, a);
  }
};

}  // namespace

Status add_rows_scaled(float* dst, const float* src, int64_t src_stride, const float* scale, int64_t n, int64_t cols,
                       cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("add_rows_scaled", n, cols));
  if (n == 0 || cols == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("add_rows_scaled", "src", src, src_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride("add_rows_scaled", "dst", dst, cols, cols));
  const bool vec4 = cols % 4 == 0 && vec4_ok(src, src_stride) && vec4_ok(dst, cols);
  for (int64_t i0 = 0; i0 < n; i0 += kIndexChunk) {
    AddRowsScaledOp op{dst, src + i0 * src_stride, src_stride, int(std::min<int64_t>(kIndexChunk, n - i0)), {}};
    for (int i = 0; i < op.n; ++i) op.scale[i] = scale[i0 + i];
    SLUICE_RETURN_IF_ERROR(launch_rowwise(op, 1, cols, vec4, stream));
  }
  return Status::ok();
}

Status gather_rows(const float* src, int64_t src_stride, int64_t src_rows, float* dst, int64_t dst_stride,
                   const int32_t* rows, int64_t n, int64_t cols, cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("gather_rows", n, cols));
  if (n == 0 || cols == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("gather_rows", "src", src, src_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride("gather_rows", "dst", dst, dst_stride, cols));
  const bool vec4 = cols % 4 == 0 && vec4_ok(src, src_stride) && vec4_ok(dst, dst_stride);
  for (int64_t i0 = 0; i0 < n; i0 += kIndexChunk) {
    const int64_t m = std::min<int64_t>(kIndexChunk, n - i0);
    GatherOp op{dst + i0 * dst_stride, dst_stride, src, src_stride, {}};
    for (int64_t i = 0; i < m; ++i) {
      if (rows[i0 + i] < 0 || rows[i0 + i] >= src_rows) {
        return invalid_argument("gather_rows: row " + std::to_string(rows[i0 + i]) + " outside [0, " +
                                std::to_string(src_rows) + ")");
      }
      op.rows[i] = rows[i0 + i];
    }
    SLUICE_RETURN_IF_ERROR(launch_rowwise(op, m, cols, vec4, stream));
  }
  return Status::ok();
}

Status scatter_add_rows(float* dst, int64_t dst_stride, int64_t dst_rows, const float* src, int64_t src_stride,
                        const int32_t* rows, const float* scale, int64_t n, int64_t cols, cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("scatter_add_rows", n, cols));
  if (n == 0 || cols == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("scatter_add_rows", "src", src, src_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride("scatter_add_rows", "dst", dst, dst_stride, cols));
  const bool vec4 = cols % 4 == 0 && vec4_ok(src, src_stride) && vec4_ok(dst, dst_stride);
  for (int64_t i0 = 0; i0 < n; i0 += kIndexChunk) {
    const int64_t m = std::min<int64_t>(kIndexChunk, n - i0);
    ScatterAddOp op{dst, dst_stride, src + i0 * src_stride, src_stride, {}, {}};
    for (int64_t i = 0; i < m; ++i) {
      if (rows[i0 + i] < 0 || rows[i0 + i] >= dst_rows) {
        return invalid_argument("scatter_add_rows: row " + std::to_string(rows[i0 + i]) + " outside [0, " +
                                std::to_string(dst_rows) + ")");
      }
      op.rows[i] = rows[i0 + i];
      op.scale[i] = scale[i0 + i];
    }
    SLUICE_RETURN_IF_ERROR(launch_rowwise(op, m, cols, vec4, stream));
  }
  return Status::ok();
}

namespace {
// dst = act(gate) * up (Op: SwigluOp or GegluOp) with the shape checks named after `op`.
template <class Op>
Status launch_gated(const char* op, const float* gate, int64_t gate_stride, const float* up, int64_t up_stride,
                    float* dst, int64_t dst_stride, int64_t rows, int64_t cols, cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows(op, rows, cols));
  if (rows == 0 || cols == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride(op, "gate", gate, gate_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride(op, "up", up, up_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride(op, "dst", dst, dst_stride, cols));
  const bool vec4 =
      cols % 4 == 0 && vec4_ok(gate, gate_stride) && vec4_ok(up, up_stride) && vec4_ok(dst, dst_stride);
  return launch_rowwise(Op{gate, gate_stride, up, up_stride, dst, dst_stride}, rows, cols, vec4, stream);
}
}  // namespace

Status swiglu(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* dst,
              int64_t dst_stride, int64_t rows, int64_t cols, cudaStream_t stream) {
  return launch_gated<SwigluOp>("swiglu", gate, gate_stride, up, up_stride, dst, dst_stride, rows, cols, stream);
}

Status geglu(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* dst,
             int64_t dst_stride, int64_t rows, int64_t cols, cudaStream_t stream) {
  return launch_gated<GegluOp>("geglu", gate, gate_stride, up, up_stride, dst, dst_stride, rows, cols, stream);
}

Status scale(float* x, int64_t stride, int64_t rows, int64_t cols, float s, cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("scale", rows, cols));
  if (rows == 0 || cols == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("scale", "x", x, stride, cols));
  const bool vec4 = cols % 4 == 0 && vec4_ok(x, stride);
  return launch_rowwise(ScaleOp{x, stride, s}, rows, cols, vec4, stream);
}

namespace {
Status check_rope(const RopeArgs& args) {
  if (args.n_head <= 0 || args.head_dim <= 0 || int64_t(args.n_head) * args.head_dim > (int64_t(1) << 30)) {
    return invalid_argument("rope: bad n_head " + std::to_string(args.n_head) + " / head_dim " +
                            std::to_string(args.head_dim));
  }
  // The CPU's limits, so both backends accept the same models (n_rot <= 2048: its angle table).
  if (args.n_rot <= 0 || args.n_rot % 2 != 0 || args.n_rot > args.head_dim || args.n_rot > 2048) {
    return invalid_argument("rope: n_rot " + std::to_string(args.n_rot) + " must be even, in (0, head_dim " +
                            std::to_string(args.head_dim) + "] and <= 2048");
  }
  return Status::ok();
}

// Host libm powf, the very call the CPU backend makes (std::pow on two floats).
float theta_scale_of(const RopeArgs& args) { return std::pow(args.freq_base, -2.0f / float(args.n_rot)); }

RopeKernelArgs rope_kernel_args(float* x, int64_t stride, int64_t rows, const RopeArgs& args, int pos0,
                                const int* pos_dev) {
  RopeKernelArgs a;
  a.x = x;
  a.stride = stride;
  a.rows = rows;
  a.n_head = args.n_head;
  a.head_dim = args.head_dim;
  a.half = args.n_rot / 2;
  a.neox = args.neox;
  a.theta_scale = theta_scale_of(args);
  a.freq_scale = args.freq_scale;
  a.freq_factors = args.freq_factors;
  a.pos0 = pos0;
  a.pos_dev = pos_dev;
  return a;
}
}  // namespace

Status rope_store_epilogue(const RopeArgs& args, GemvRopeStore& out) {
  SLUICE_RETURN_IF_ERROR(check_rope(args));
  if (args.neox) return unsupported("rope epilogue: the NeoX rotation pairs elements half a head apart");
  out.head_dim = args.head_dim;
  out.half = args.n_rot / 2;
  out.theta_scale = theta_scale_of(args);
  out.freq_scale = args.freq_scale;
  out.freq_factors = args.freq_factors;
  return Status::ok();
}

Status rope(float* x, int64_t stride, int64_t rows, const RopeArgs& args, int pos0, cudaStream_t stream,
            const int* pos_dev) {
  SLUICE_RETURN_IF_ERROR(check_rope(args));
  if (rows < 0) return invalid_argument("rope: negative rows");
  if (rows == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("rope", "x", x, stride, int64_t(args.n_head) * args.head_dim));
  const RopeKernelArgs a = rope_kernel_args(x, stride, rows, args, pos0, pos_dev);
  const unsigned grid = unsigned(std::min(rows, kMaxGridY));
  const size_t smem = size_t(a.half) * 2 * sizeof(float);  // <= 8 KB
  rope_kernel<<<grid, kRopeThreads, smem, stream>>>(a);
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("rope_kernel");
  return Status::ok();
}

namespace {
// The checks and kernel arguments rope_store_kv and rope_store_kv_seqs share (q rows and positions
// are the caller's).
Status rope_store_args(const char* what, float* q, int64_t q_stride, float* k, int64_t k_stride, int n_head_k,
                       const float* v, int64_t v_stride, int64_t v_cols, const RopeArgs& args, void* k_cache,
                       int64_t k_cache_stride, void* v_cache, int64_t v_cache_stride, RopeStoreArgs& a) {
  SLUICE_RETURN_IF_ERROR(check_rope(args));
  if (n_head_k <= 0 || v_cols <= 0) return invalid_argument(std::string(what) + ": bad k heads or v columns");
  if (k_cache == nullptr || v_cache == nullptr) return invalid_argument(std::string(what) + ": null cache");
  SLUICE_RETURN_IF_ERROR(check_stride(what, "q", q, q_stride, int64_t(args.n_head) * args.head_dim));
  SLUICE_RETURN_IF_ERROR(check_stride(what, "k", k, k_stride, int64_t(n_head_k) * args.head_dim));
  SLUICE_RETURN_IF_ERROR(check_stride(what, "v", v, v_stride, v_cols));
  a.q = rope_kernel_args(q, q_stride, 0, args, 0, nullptr);
  a.k = k;
  a.k_stride = k_stride;
  a.n_head_k = n_head_k;
  a.v = v;
  a.v_stride = v_stride;
  a.v_cols = v_cols;
  a.k_cache = static_cast<__half*>(k_cache);
  a.k_cache_stride = k_cache_stride;
  a.v_cache = static_cast<__half*>(v_cache);
  a.v_cache_stride = v_cache_stride;
  a.row_map = nullptr;
  return Status::ok();
}
}  // namespace

Status rope_store_kv(float* q, int64_t q_stride, float* k, int64_t k_stride, int n_head_k, const float* v,
                     int64_t v_stride, int64_t v_cols, int64_t rows, const RopeArgs& args, void* k_cache,
                     int64_t k_cache_stride, void* v_cache, int64_t v_cache_stride, int64_t pos0,
                     cudaStream_t stream, const int* pos_dev, const int* row_map) {
  if (rows < 0 || pos0 < 0) return invalid_argument("rope_store_kv: negative rows or pos0");
  RopeStoreArgs a;
  SLUICE_RETURN_IF_ERROR(rope_store_args("rope_store_kv", q, q_stride, k, k_stride, n_head_k, v, v_stride, v_cols, args,
                                         k_cache, k_cache_stride, v_cache, v_cache_stride, a));
  if (rows == 0) return Status::ok();
  a.q.rows = rows;
  a.q.pos0 = int(pos0);
  a.q.pos_dev = pos_dev;
  a.row_map = row_map;
  const unsigned grid = unsigned(std::min(rows, kMaxGridY));
  const size_t smem = size_t(a.q.half) * 2 * sizeof(float);
  SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(rope_store_kernel, dim3(grid), dim3(kRopeThreads), smem, stream, a));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("rope_store_kernel");
  return Status::ok();
}

Status rope_store_kv_seqs(float* q, int64_t q_stride, float* k, int64_t k_stride, int n_head_k, const float* v,
                          int64_t v_stride, int64_t v_cols, const RopeArgs& args, void* k_cache, int64_t k_cache_stride,
                          void* v_cache, int64_t v_cache_stride, std::span<const RopeSeq> seqs, cudaStream_t stream) {
  if (seqs.size() > size_t(kMaxRopeSeqs)) {
    return invalid_argument("rope_store_kv_seqs: " + std::to_string(seqs.size()) + " sequences, at most " +
                            std::to_string(kMaxRopeSeqs) + " per call");
  }
  RopeStoreArgs a;
  SLUICE_RETURN_IF_ERROR(rope_store_args("rope_store_kv_seqs", q, q_stride, k, k_stride, n_head_k, v, v_stride, v_cols,
                                         args, k_cache, k_cache_stride, v_cache, v_cache_stride, a));
  RopeSeqTable t;
  int64_t rows = 0;
  for (const RopeSeq& sq : seqs) {
    if (sq.n < 0 || sq.pos0 < 0 || sq.row0 < 0) return invalid_argument("rope_store_kv_seqs: negative rows or position");
    if (sq.n == 0) continue;
    t.row0[t.n] = sq.row0;
    t.pos0[t.n] = sq.pos0;
    t.map[t.n] = sq.row_map;
    rows += sq.n;
    if (rows > INT_MAX) return invalid_argument("rope_store_kv_seqs: too many rows");
    t.cum[++t.n] = int(rows);
  }
  if (rows == 0) return Status::ok();
  a.q.rows = rows;
  const unsigned grid = unsigned(std::min(rows, kMaxGridY));
  const size_t smem = size_t(a.q.half) * 2 * sizeof(float);
  SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(rope_store_seqs_kernel, dim3(grid), dim3(kRopeThreads), smem, stream, a, t));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("rope_store_seqs_kernel");
  return Status::ok();
}

Status add_rms_norm_q8(float* x, int64_t x_stride, const float* src, int64_t src_stride, float* dst,
                       int64_t dst_stride, int64_t rows, int64_t cols, const float* w, float eps,
                       const Q8Activation& out, cudaStream_t stream, const float* w_src) {
  SLUICE_RETURN_IF_ERROR(check_rows("add_rms_norm_q8", rows, cols));
  if (cols % 32 != 0 || out.cols != cols || out.tokens != rows || !out.q || !out.ds) {
    return invalid_argument("add_rms_norm_q8: the activation must be [rows][cols] with cols % 32 == 0");
  }
  if (rows == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("add_rms_norm_q8", "x", x, x_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride("add_rms_norm_q8", "src", src, src_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride("add_rms_norm_q8", "dst", dst, dst_stride, cols));
  if (w == nullptr) return invalid_argument("add_rms_norm_q8: w is null");
  NormArgs a{x, x_stride, dst, dst_stride, rows, 1, int(cols), w, eps};
  const dim3 grid(unsigned(std::min(rows, kMaxGridX)));
  if (w_src != nullptr) {
    SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(add_rms_norm_q8_kernel<true>, grid, dim3(kNormThreads), 0, stream, a, src,
                                           src_stride, w_src, out.q, out.ds));
  } else {
    SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(add_rms_norm_q8_kernel<false>, grid, dim3(kNormThreads), 0, stream, a,
                                           src, src_stride, w_src, out.q, out.ds));
  }
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("add_rms_norm_q8_kernel");
  return Status::ok();
}

Status f32_to_f16(const float* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows, int64_t cols,
                  cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_rows("f32_to_f16", rows, cols));
  if (rows == 0 || cols == 0) return Status::ok();
  SLUICE_RETURN_IF_ERROR(check_stride("f32_to_f16", "src", src, src_stride, cols));
  SLUICE_RETURN_IF_ERROR(check_stride("f32_to_f16", "dst", dst, dst_stride, cols));
  if (!aligned_to(dst, 2)) return invalid_argument("f32_to_f16: dst must be 2-byte aligned");
  const bool vec4 = cols % 4 == 0 && vec4_ok(src, src_stride) && vec4_ok(dst, dst_stride, 8);
  return launch_rowwise(ToHalfOp{src, src_stride, static_cast<__half*>(dst), dst_stride}, rows, cols, vec4, stream);
}

namespace {
// store_rows_f16 at the device-held position (a replayed decode step) or through a paged cache's
// row map: one block per row.
__global__ void __launch_bounds__(kThreads) store_rows_dev_kernel(const float* src, int64_t src_stride, int64_t rows,
                                                                  int64_t cols, __half* cache, int64_t cache_stride,
                                                                  int64_t pos0, const int* pos_dev,
                                                                  const int* row_map) {
  pdl_wait();
  pdl_trigger();
  const int64_t base = pos_dev != nullptr ? int64_t(*pos_dev) : pos0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t row = row_map != nullptr ? int64_t(row_map[base + r]) : base + r;
    __half* dst = cache + row * cache_stride;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) dst[c] = __float2half_rn(src[r * src_stride + c]);
  }
}
}  // namespace

Status store_rows_f16(const float* src, int64_t src_stride, int64_t rows, int64_t cols, void* cache,
                      int64_t cache_stride, int64_t pos0, cudaStream_t stream, const int* pos_dev,
                      const int* row_map) {
  if (pos_dev != nullptr || row_map != nullptr) {
    if (pos0 < 0) return invalid_argument("store_rows_f16: negative pos0 " + std::to_string(pos0));
    SLUICE_RETURN_IF_ERROR(check_rows("store_rows_f16", rows, cols));
    if (rows == 0 || cols == 0) return Status::ok();
    if (cache == nullptr) return invalid_argument("store_rows_f16: cache is null");
    SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(store_rows_dev_kernel, dim3(unsigned(std::min(rows, kMaxGridX))),
                                           dim3(kThreads), 0, stream, src, src_stride, rows, cols,
                                           static_cast<__half*>(cache), cache_stride, pos0, pos_dev, row_map));
    SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("store_rows_dev_kernel");
    return Status::ok();
  }
  if (pos0 < 0) return invalid_argument("store_rows_f16: negative pos0 " + std::to_string(pos0));
  if (cache == nullptr) return invalid_argument("store_rows_f16: cache is null");
  // Row pos0 of the cache; the caller guarantees the cache holds pos0 + rows rows.
  void* first = static_cast<__half*>(cache) + pos0 * cache_stride;
  return f32_to_f16(src, src_stride, first, cache_stride, rows, cols, stream);
}

}  // namespace sluice::backend::cuda
