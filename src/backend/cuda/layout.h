// The CUDA backend's own weight layout: Q6_K and Q8_0 blocks in groups of eight, field by field.
//
// Why: a Q6_K block (quant/blocks.h: [ql 128][qh 64][scales 16][d 2]) is 210 bytes and a Q8_0
// block ([d 2][qs 32]) 34, so in GGUF order their blocks and fields are only 2-byte aligned and a
// GEMV lane cannot load its bytes as 16-byte words straight from global memory; the kernels
// staged them through shared memory, and these were the slowest decode GEMVs per byte
// (docs/CUDA.md). Eight blocks are 1680 = 105 x 16 bytes (Q6_K) or 272 = 17 x 16 (Q8_0). Stored
// field-major within each run of eight blocks of a row,
//   Q6_K  [ql of blocks 0..7: 8 x 128][qh: 8 x 64][scales: 8 x 16][d: 8 x 2]
//         (ql of block b at 128 b, qh at 1024 + 64 b, scales at 1536 + 16 b, d at 1664 + 2 b)
//   Q8_0  [qs of blocks 0..7: 8 x 32][d: 8 x 2]   (qs of block b at 32 b, d at 256 + 2 b)
// every block's quants start on a 16-byte boundary, the size is unchanged and rows stay
// row_bytes apart. Only matrices whose rows are whole groups (cols a multiple of 2048 for Q6_K,
// 256 for Q8_0) take it.
//
// Who reads it: every CUDA kernel that reads these formats (the GEMVs, mmq, dequantize_to_f16)
// has a grouped variant, chosen by the weight view's `grouped` flag (backend.h). The backend's
// upload_weight groups the weights it keeps resident; streamed slots hold GGUF bytes as copied.
//
// Host-only header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

#include "core/status.h"
#include "quant/quant.h"

namespace sluice::backend::cuda {

inline constexpr int kGroupBlocks = 8;  // blocks per group, both formats
inline constexpr int kQ6kBlockBytes = 210;
inline constexpr int kQ6kGroupBytes = kGroupBlocks * kQ6kBlockBytes;  // 1680
// Field offsets within a Q6_K group (above).
inline constexpr int kQ6kGroupQh = 1024, kQ6kGroupScales = 1536, kQ6kGroupD = 1664;
inline constexpr int kQ8GroupBytes = kGroupBlocks * 34;  // 272
inline constexpr int kQ8GroupD = 256;

// Elements of one group of this format (0: the format has no grouped layout).
inline int64_t group_elems(quant::Type type) {
  if (type == quant::Type::kQ6_K) return 256 * kGroupBlocks;
  if (type == quant::Type::kQ8_0) return 32 * kGroupBlocks;
  return 0;
}
// True where the grouped layout exists for a matrix of this format and row length.
inline bool groupable(quant::Type type, int64_t cols) {
  const int64_t ge = group_elems(type);
  return ge > 0 && cols > 0 && cols % ge == 0;
}
// Bytes of one group of a groupable format.
inline int group_bytes(quant::Type type) { return type == quant::Type::kQ6_K ? kQ6kGroupBytes : kQ8GroupBytes; }

// The grouped layout of one group: `src` eight GGUF blocks, `dst` group_bytes(type) bytes (not
// overlapping). The reference the device kernel (group_weight_blocks) is tested against.
inline void group_blocks_host(quant::Type type, const uint8_t* src, uint8_t* dst) {
  for (int b = 0; b < kGroupBlocks; ++b) {
    if (type == quant::Type::kQ6_K) {
      const uint8_t* blk = src + b * kQ6kBlockBytes;
      std::memcpy(dst + 128 * b, blk, 128);
      std::memcpy(dst + kQ6kGroupQh + 64 * b, blk + 128, 64);
      std::memcpy(dst + kQ6kGroupScales + 16 * b, blk + 192, 16);
      std::memcpy(dst + kQ6kGroupD + 2 * b, blk + 208, 2);
    } else {
      const uint8_t* blk = src + b * 34;
      std::memcpy(dst + 32 * b, blk + 2, 32);
      std::memcpy(dst + kQ8GroupD + 2 * b, blk, 2);
    }
  }
}

// Whether upload_weight groups the matrices it can (default yes; SLUICE_CUDA_GROUPED=0 keeps
// GGUF order, for A/B runs). Read once per process.
bool groups_enabled();

// Rewrites `rows` rows of `cols` elements at device pointer w (GGUF bytes, 16-byte aligned) into
// the grouped layout, in place, on `stream`. Fails for a format or shape without one (groupable).
Status group_weight_blocks(quant::Type type, void* w, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace sluice::backend::cuda
