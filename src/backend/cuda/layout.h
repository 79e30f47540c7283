// The CUDA backend's own weight layout: Q6_K blocks in groups of eight, field by field.
//
// Why: a Q6_K block (quant/blocks.h: [ql 128][qh 64][scales 16][d 2]) is 210 bytes, so in GGUF
// order a block and its fields are only 2-byte aligned and a GEMV lane cannot load its bytes as
// 16-byte words straight from global memory; the kernels stage them through shared memory, and
// Q6_K matrices were the slowest decode GEMVs per byte (docs/CUDA.md). Eight blocks are 1680 =
// 105 x 16 bytes. Stored field-major within each run of eight blocks of a row,
//   [ql of blocks 0..7: 8 x 128][qh: 8 x 64][scales: 8 x 16][d: 8 x 2]
// every block's ql, qh and scales start on a 16-byte boundary (ql of block b at 128 b, qh at
// 1024 + 64 b, scales at 1536 + 16 b, d at 1664 + 2 b), the size is unchanged and rows stay
// row_bytes apart. Only matrices whose rows are whole groups (cols a multiple of 2048) take it.
//
// Who reads it: every CUDA kernel that reads Q6_K weights (the GEMVs, mmq, dequantize_to_f16)
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

inline constexpr int kQ6kGroupBlocks = 8;
inline constexpr int kQ6kBlockBytes = 210;
inline constexpr int kQ6kGroupBytes = kQ6kGroupBlocks * kQ6kBlockBytes;  // 1680
// Field offsets within a group (above).
inline constexpr int kQ6kGroupQh = 1024, kQ6kGroupScales = 1536, kQ6kGroupD = 1664;

// True where the grouped layout exists for a matrix of this format and row length.
inline bool groupable(quant::Type type, int64_t cols) {
  return type == quant::Type::kQ6_K && cols > 0 && cols % (256 * kQ6kGroupBlocks) == 0;
}

// The grouped layout of one group: `src` eight GGUF blocks, `dst` 1680 bytes (not overlapping).
// The reference the device kernel (group_weight_blocks) is tested against.
inline void group_q6k_host(const uint8_t* src, uint8_t* dst) {
  for (int b = 0; b < kQ6kGroupBlocks; ++b) {
    const uint8_t* blk = src + b * kQ6kBlockBytes;
    std::memcpy(dst + 128 * b, blk, 128);
    std::memcpy(dst + kQ6kGroupQh + 64 * b, blk + 128, 64);
    std::memcpy(dst + kQ6kGroupScales + 16 * b, blk + 192, 16);
    std::memcpy(dst + kQ6kGroupD + 2 * b, blk + 208, 2);
  }
}

// Whether upload_weight groups the matrices it can (default yes; SLUICE_CUDA_Q6K_GROUPED=0 keeps
// GGUF order, for A/B runs). Read once per process.
bool q6k_groups_enabled();

// Rewrites `rows` rows of `cols` elements at device pointer w (GGUF bytes, 16-byte aligned) into
// the grouped layout, in place, on `stream`. Fails for a format or shape without one (groupable).
Status group_weight_blocks(quant::Type type, void* w, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace sluice::backend::cuda
