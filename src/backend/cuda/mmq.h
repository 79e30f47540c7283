// Small-batch matrix products on int8 tensor cores, straight from the quantized weights:
// y[t][r] = sum_c W[r][c] * x[t][c] for 9..kMaxMmqTokens activation vectors (the passes of a
// server's continuous batch, a speculative verification of 8+ drafted tokens).
//
// Why: the GEMV (gemv.h) keeps one dp4a accumulator chain per token, so its cost grows with the
// tokens (8 tokens cost ~3x one), and the prefill path dequantizes every weight to f16 for
// cuBLAS (~4x the bytes of the quantized file). Here a block streams a tile of weight rows and
// the activation tile of the same 256 columns into shared memory (cp.async), unpacks each row's
// quants to int8 in registers (a nibble mask per four weights for Q4_K), and multiplies them with
// the int8 activation of quantize_activation_q8 on mma.sync tensor cores (exact int32 sums per
// 16 or 32 elements); the block scales are applied in f32 per sub-block. The weight bytes are
// read once per launch for all the tokens.
//
// Formats: Q4_K, Q6_K and Q8_0 (mmq_supported), Q6_K and Q8_0 also in the backend's grouped
// layout (g.grouped; layout.h); the others take the prefill path.
// Work split: a block owns a tile of 64 or 128 rows of one matrix; where there are fewer tiles
// than the GPU holds blocks, the columns are split too (grid.y), each split writes its partial
// sums to a workspace and the last split of a tile to arrive adds them in split order: results
// do not depend on which block finishes first.
//
// Host-only header. All pointers are device pointers; all work is enqueued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/gemv.h"
#include "core/status.h"
#include "quant/quant.h"

namespace sluice::backend::cuda {

inline constexpr int kMaxMmqTokens = 32;
// Below this many tokens the GEMV is faster (measured on an H100, docs/CUDA.md).
inline constexpr int kMmqFromTokens = 3;

// True where an mmq kernel exists for this format and column count (cols a multiple of 256, and
// of 512 for Q6_K: its 210-byte blocks are copied in 4-byte pieces reaching 2 bytes into the
// neighbouring block of the row).
bool mmq_supported(quant::Type type, int64_t cols);

// Scratch of a launch with split columns: partial sums and one arrival counter per row tile.
// The counters must be zero before the first launch; every launch leaves them zero.
struct MmqScratch {
  void* partials = nullptr;
  int64_t partial_bytes = 0;
  int* counters = nullptr;
  int64_t counters_n = 0;
};
// What a launch of `g` needs (partial_bytes and counters_n; pointers null). Both 0 when the
// launch does not split columns.
MmqScratch mmq_scratch_needed(const DeviceInfo& dev, const GemvGroupArgs& g);
// The most any launch on `dev` needs (every format, token count and shape); dev.sm_count 0: a
// bound for any GPU of up to 256 SMs.
MmqScratch mmq_scratch_bound(const DeviceInfo& dev);

// The matrices of `g` (one format, g.tokens in 1..kMaxMmqTokens, each with its own Q8Activation,
// 16-byte aligned; weights 16-byte aligned, row bytes a multiple of 16 (4 for Q6_K in GGUF order); outputs
// [tokens][rows]). g.variant is ignored. `scratch` at least what mmq_scratch_needed says.
Status mmq(const DeviceInfo& dev, const GemvGroupArgs& g, const MmqScratch& scratch, cudaStream_t stream);

}  // namespace sluice::backend::cuda
