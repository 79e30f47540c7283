// Decode-time matrix-vector products on the GPU: y[t][r] = sum_c W[r][c] * x[t][c] for a weight
// matrix W of `rows` rows of `cols` elements in any weight format of quant/ (the GGUF bytes as
// they are: row r starts at r * row_bytes(type, cols)), and 1..8 activation vectors x (tokens).
//
// Activations: F32/F16/BF16 weights multiply f32 activations. Every block-quantized format
// multiplies int8 activations quantized once per vector by quantize_activation_q8() (32-element
// blocks; per block a float scale d and d * sum(q), which folds the weights' min/offset terms
// into one multiply per block; dp4a does the int8 products). One quantized activation serves
// every matrix that multiplies the same x (Q, K and V; gate and up).
//
// Host-only header: plain C++ may include it. All pointers are device pointers; all work is
// enqueued on `stream`; nothing synchronizes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"
#include "quant/quant.h"

namespace sluice::backend::cuda {

inline constexpr int kMaxGemvTokens = 8;  // the small-batch (speculative / multi-sequence) limit

// What the launches need to know about the device; read once (query_device) and passed along.
struct DeviceInfo {
  int device = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  int64_t global_mem_bytes = 0;
  int64_t l2_bytes = 0;
};
Result<DeviceInfo> query_device(int device);

// Activation of `tokens` vectors of `cols` elements (cols a multiple of 32), int8 per element.
struct Q8Activation {
  int8_t* q = nullptr;    // [tokens][cols]
  float2* ds = nullptr;   // [tokens][cols / 32]: (d, d * sum of the block's q)
  int64_t cols = 0;
  int tokens = 0;
};
// Device bytes a Q8Activation of this size needs (q then ds, ds 16-byte aligned).
int64_t q8_activation_bytes(int64_t cols, int tokens);
// Lays a Q8Activation over `buffer` (q8_activation_bytes long, 16-byte aligned).
Q8Activation q8_activation_view(void* buffer, int64_t cols, int tokens);

// x: [tokens][cols] f32. d = max|x| / 127 per 32-block, q = round-to-nearest-even(x * 127 / max|x|)
// (the rounding the CPU path's q8 activations use).
Status quantize_activation_q8(const float* x, const Q8Activation& out, cudaStream_t stream);

// True for the formats whose gemv reads a Q8Activation (every block-quantized weight format).
bool gemv_needs_q8(quant::Type type);
// True where a gemv kernel exists for this weight format.
bool gemv_supported(quant::Type type);

// Launch shape of a gemv: -1 = chosen by format and rows (default: the direct kernel for Q4_K,
// Q5_K, grouped Q6_K and grouped Q8_0 at 1..2 tokens unless SLUICE_CUDA_GEMV_DIRECT=0, else 0
// or 1 by rows); 0 = 8 warps x 2 KB stages, 1 = 4 warps x 4 KB stages (see gemv_kernel.cuh);
// 2 = the direct kernel (gemv_direct.cuh: Q4_K, Q5_K, grouped Q6_K / Q8_0, 1 or 2 tokens; other
// calls: the shape -1 would pick); on rows of whole 2048-element steps it reads Q4_K, grouped
// Q6_K and Q8_0 with their coalesced lane maps unless SLUICE_CUDA_GEMV_COALESCED=0; 3 = the direct
// kernel with the one-piece-per-lane maps everywhere (what =0 gives). 0..3 are for benchmarks and
// tests; 4..5 act as -1. Results are identical up to f32 summation order.
inline constexpr int kGemvVariants = 6;
inline constexpr int kGemvDirect = 2;
inline constexpr int kGemvDirectPieceLanes = 3;

struct GemvArgs {
  quant::Type type = quant::Type::kF32;
  const void* w = nullptr;     // [rows][row_bytes(type, cols)]
  int64_t rows = 0;
  int64_t cols = 0;            // multiple of the format's block size
  int tokens = 1;              // 1..kMaxGemvTokens
  const float* x = nullptr;    // [tokens][cols] f32, read for F32/F16/BF16 weights
  Q8Activation xq;             // read for block-quantized weights
  float* y = nullptr;          // [tokens][rows]
  int variant = -1;            // launch shape (above)
  bool grouped = false;        // w in the grouped Q6_K / Q8_0 layout (layout.h)
};

// Enqueues y = W x. Fast path: W 16-byte aligned and row_bytes a multiple of 16 (every GGUF
// tensor of the usual model shapes); otherwise a correct, slower path that loads bytes one by one.
Status gemv(const DeviceInfo& dev, const GemvArgs& args, cudaStream_t stream);

// Several matrices of one format and one column count, each with its own activation and output,
// multiplied in one launch: Q, K and V (or gate and up) of a layer, which share their input, or
// the experts of a mixture-of-experts layer, each on its own input. The rows of all of them are
// spread over the GPU as the rows of one matrix would be, so small matrices no longer pay a
// launch, a ramp-up and a tail each.
inline constexpr int kMaxGemvMatrices = 16;
struct GemvMatrix {
  const void* w = nullptr;   // [rows][row_bytes(type, cols)]
  int64_t rows = 0;
  const float* x = nullptr;  // [tokens][cols] f32 (F32/F16/BF16 weights)
  Q8Activation xq;           // block-quantized weights
  float* y = nullptr;        // [tokens][rows]
};
// The decode step's Q, K and V products with RoPE and the KV store in their epilogue
// (Backend::matmul_rope_store_kv): matrix i of the group is a Q (rotated, written to y), a K
// (rotated, written to y and as f16 to cache row pos of `cache`) or a V (written to y and to the
// cache) for tokens t = 0, 1 at positions pos0 + t (or *pos_dev + t), cache row row_map[pos] where
// row_map is set. The rotation is the adjacent-pair one (pairs 2j, 2j + 1 of a head, j < half),
// bit-identical to rope_store_kv (ops.h). Only the direct kernel has this epilogue: a call it does
// not take (another format, more than 2 tokens, odd row counts, Q/K rows not whole heads) fails
// with kUnsupported before anything is launched.
struct GemvRopeStore {
  static constexpr int kQ = 1, kK = 2, kV = 3;
  int kind[kMaxGemvMatrices] = {};
  void* cache[kMaxGemvMatrices] = {};  // f16 [positions][cache_stride] (K and V)
  int64_t cache_stride[kMaxGemvMatrices] = {};
  int head_dim = 0;
  int half = 0;  // rotating pairs per head: n_rot / 2
  float theta_scale = 1.0f;
  float freq_scale = 1.0f;
  const float* freq_factors = nullptr;  // device [half] or nullptr
  int pos0 = 0;
  const int* pos_dev = nullptr;
  const int* row_map = nullptr;
};

struct GemvGroupArgs {
  quant::Type type = quant::Type::kF32;
  int64_t cols = 0;
  int tokens = 1;
  int variant = -1;
  bool grouped = false;                  // every w in the grouped Q6_K / Q8_0 layout (layout.h)
  int n = 0;                             // matrices, 1..kMaxGemvMatrices
  GemvMatrix m[kMaxGemvMatrices];
  const GemvRopeStore* rope = nullptr;   // non-null: the rope-and-store epilogue (above)
  bool check_only = false;               // with rope: only whether the call would be taken (no launch)
};
Status gemv_group(const DeviceInfo& dev, const GemvGroupArgs& args, cudaStream_t stream);

}  // namespace sluice::backend::cuda
