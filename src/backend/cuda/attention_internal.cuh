// Shared pieces of the attention kernels (attention.h): the decode split plan, the launchers of
// the decode and prefill instantiations (each in its own .cu so they compile in parallel) and the
// small device helpers both use. Included by attention*.cu only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"

namespace sluice::backend::cuda::attn {

// Calls with at most this many query rows take the decode path (split keys + combine); more rows
// take the tiled prefill kernel. Each decode query row is its own set of blocks, so beyond a few
// rows the prefill kernel, which shares every K/V tile among 32 rows, reads far fewer bytes.
inline constexpr int kDecodeMaxTokens = 4;

// Decode blocks: 8 warps; one block = one query row x up to 2 query heads of one KV head x one
// key split. The heads of a block share each K/V row it reads (the other head pairs of a GQA
// group read it again, from L2). Decode at batch 1 is a chain of small kernels whose latency the
// GPU waits for, so blocks are cut short rather than to read each K/V row from DRAM only once:
// more, shorter blocks (2 heads, 8 warps, splits from 64 keys, where it was 4 heads, 4 warps,
// 128 keys) made decode 4-7% faster on the H200 for the Llama shapes and 26% for Gemma 3 270M's
// (docs/CUDA.md, "Decode attention").
inline constexpr int kDecodeThreads = 256;
inline constexpr int kMaxHeadsPerBlock = 2;
// Keys scored per step of a decode block: scores and probabilities of one tile live in shared
// memory, the softmax max/sum are updated once per tile.
inline constexpr int kDecodeTile = 64;
// A split covers at least this many keys (one tile; shorter splits would not shorten a block's
// chain), and there are at most kMaxSplits (which bounds the workspace and the combine's shared
// array). 131072 positions -> 256 splits of 512 keys.
inline constexpr int kMinSplitKeys = 64;
inline constexpr int kMaxSplits = 256;
// Decode grids aim for this many blocks per SM: with ~16 KB of loads in flight per block that is
// enough outstanding memory traffic to keep HBM busy, and all blocks run in one wave.
inline constexpr int kDecodeBlocksPerSm = 4;
// A call whose keys (the plan's context) are at most this many is not split: one block per (row,
// KV head, head group) walks every tile and writes the normalized output and its int8 activation
// itself, with no combine launch. At a short context the combine is one more link in the decode
// step's chain of dependent kernels; the tiles it would have spread over blocks are few.
// SLUICE_CUDA_ATTN_SINGLE_KEYS overrides it (0: always split; A/B runs), read once per process.
inline constexpr int kSinglePassKeys = 256;
int single_pass_keys();

// Prefill blocks: 4 warps x 8 query rows = 32 rows per block; each warp owns its rows end to end
// (scores, softmax, output), so the softmax needs no cross-warp exchange.
inline constexpr int kPrefillWarps = 4;
inline constexpr int kPrefillThreads = kPrefillWarps * kWarpSize;
inline constexpr int kPrefillRowsPerWarp = 8;
inline constexpr int kPrefillRows = kPrefillWarps * kPrefillRowsPerWarp;

inline constexpr float kLog2e = 1.4426950408889634f;

// head_dim values with kernel instantiations: multiples of 32 from 32 to 256.
inline bool head_dim_supported(int head_dim) { return head_dim >= 32 && head_dim <= 256 && head_dim % 32 == 0; }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Most splits a call over `positions` keys may use (what the workspace is sized for).
inline int64_t max_splits(int64_t positions) {
  const int64_t s = ceil_div(positions, kMinSplitKeys);
  return s < 1 ? 1 : (s > kMaxSplits ? kMaxSplits : s);
}

// How a decode call is cut into blocks.
struct DecodePlan {
  int group = 1;            // query heads per KV head (n_head / n_head_kv)
  int n_hgroups = 1;        // blocks per (row, KV head, split) along the heads of one group
  int heads_per_block = 1;  // <= kMaxHeadsPerBlock; the last head group may hold fewer
  int n_splits = 1;         // key splits; every split but possibly the last spans split_keys keys
  int split_keys = kDecodeTile;  // a multiple of kDecodeTile
  // n_splits == 1: the split kernel normalizes and writes the output (no combine launch).
  int64_t blocks() const { return int64_t(n_hgroups) * n_splits; }
};

// Workspace of a decode call: the unnormalized partial outputs [rows][head_dim] f32 followed by
// (max, sum) [rows] float2, rows = n_tokens * n_head * n_splits, row ((t * n_head + h) * n_splits
// + s). The max is in log2 units (scores are pre-multiplied by log2(e)).
inline int64_t decode_workspace_bytes(int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_splits) {
  return n_tokens * n_head * n_splits * (head_dim * int64_t(sizeof(float)) + int64_t(sizeof(float2)));
}

Status launch_decode(const AttentionArgs& a, const DecodePlan& plan, void* workspace, cudaStream_t stream);
Status launch_prefill(const AttentionArgs& a, cudaStream_t stream);

// ---- device helpers -------------------------------------------------------------------------

// 16 bytes (8 f16) of a K/V row through the read-only path; callers guarantee 16-byte alignment.
__device__ __forceinline__ uint4 load_row16(const __half* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// The cache row of position j: through a paged cache's map (AttentionArgs::row_map), or j.
__device__ __forceinline__ int64_t cache_row(const int* row_map, int j) {
  return row_map != nullptr ? int64_t(__ldg(row_map + j)) : int64_t(j);
}

__device__ __forceinline__ void halves8_to_float(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = half_bits_to_float(w[i] & 0xFFFFu);
    f[2 * i + 1] = half_bits_to_float(w[i] >> 16);
  }
}

}  // namespace sluice::backend::cuda::attn
