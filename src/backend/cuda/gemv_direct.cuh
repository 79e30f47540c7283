// The direct GEMV: for block formats whose blocks are 16-byte aligned (Q4_K 144 B, Q5_K 176 B)
// each lane loads its pieces' 16-byte words straight from global memory into registers, several
// pieces deep, and decodes them there (no shared-memory staging, no per-chunk warp sync).
//
// Why a second kernel: the staged kernel (gemv_kernel.cuh) keeps 2 chunks per warp in flight and
// each warp decodes a chunk before it issues the next copy, so on the 4096-column shapes, where a
// warp gets only a few rows, the decode latency is not hidden (Q4_K 50-60% of the copy bound).
// Here a lane keeps kDirectDepth row steps' loads in flight in a ring of registers, refilled as
// each step is decoded, and nothing but occupancy bounds what is in flight.
//
// Work split: a persistent grid; warp g of G takes rows g, g + G, ... of all the launch's matrices
// (Segs, as in gemv_kernel.cuh); lane l decodes pieces l, l + 32, ... of a row. Weight loads bypass
// L1 (ld.global.nc.L1::no_allocate) so the activation, read by every warp, stays there.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_formats.cuh"
#include "backend/cuda/gemv_kernel.cuh"

namespace sluice::backend::cuda::gemv_detail {

inline constexpr int kDirectWarps = 4;  // warps per block
inline constexpr int kDirectDepth = 4;  // row steps (32 pieces each) in flight per warp

__device__ __forceinline__ uint4 ldg_stream_u128(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// F: a format with kPieceWords / piece_word_offset / dot_words (FmtQ45_K). npieces = nb * 4.
//
// A warp walks its items, (row, step) pairs in order (row g: steps 0..steps-1, then row g + G, ...),
// through a ring of kDirectDepth register slots: the loads of item j + kDirectDepth go into slot
// j % kDirectDepth as soon as item j is decoded, so kDirectDepth - 1 items' loads stay in flight
// across step and row boundaries (long rows, e.g. ffn_down's 14336 columns, have no bubble
// between groups of steps). A row's warp reduction and store follow its last step.
template <class F, int NT>
__global__ void __launch_bounds__(kDirectWarps * kWarpSize) gemv_direct_kernel(const __grid_constant__ Segs segs,
                                                                                int64_t row_bytes, int npieces) {
  constexpr int kW = F::kPieceWords;
  constexpr int kPiecesPerBlock = F::kBlockElems / F::kPieceElems;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t rows = segs.row0[segs.n];
  const int64_t warps = int64_t(gridDim.x) * kDirectWarps;
  const int steps = (npieces + kWarpSize - 1) / kWarpSize;  // row steps of 32 pieces
  const int64_t row0 = int64_t(blockIdx.x) * kDirectWarps + threadIdx.x / kWarpSize;

  uint4 w[kDirectDepth][kW];
  // The load cursor: the next item to load (row ld_row, step ld_step); rows >= `rows` load nothing.
  int64_t ld_row = row0;
  int ld_step = 0;
  auto load_next = [&](int slot) {
    if (ld_row < rows) {
      const int p = ld_step * kWarpSize + lane;
      if (p < npieces) {
        const int m = seg_of(segs, ld_row);
        const uint8_t* b =
            segs.w[m] + (ld_row - segs.row0[m]) * row_bytes + int64_t(p / kPiecesPerBlock) * F::kBlockBytes;
#pragma unroll
        for (int i = 0; i < kW; ++i) w[slot][i] = ldg_stream_u128(b + F::piece_word_offset(p % kPiecesPerBlock, i));
      }
      if (++ld_step == steps) {
        ld_step = 0;
        ld_row += warps;
      }
    }
  };

  pdl_trigger();
  // The first items' loads go out before the wait: weights are never written by kernels.
#pragma unroll
  for (int k = 0; k < kDirectDepth; ++k) load_next(k);
  pdl_wait();

  // The decode cursor.
  int64_t row = row0;
  int step = 0;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  while (row < rows) {
#pragma unroll
    for (int k = 0; k < kDirectDepth; ++k) {
      if (row < rows) {  // warp-uniform
        const int m = seg_of(segs, row);
        const int p = step * kWarpSize + lane;
        if (p < npieces) {
          F::template dot_words<NT>(w[k], p % kPiecesPerBlock, int64_t(p) * F::kPieceElems, segs.a[m], acc);
        }
        load_next(k);  // slot k is free again
        if (++step == steps) {
          const int64_t seg_rows = segs.row0[m + 1] - segs.row0[m];
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const float sum = warp_sum(acc[t]);
            if (lane == 0) segs.y[m][int64_t(t) * seg_rows + (row - segs.row0[m])] = sum;
            acc[t] = 0.0f;
          }
          step = 0;
          row += warps;
        }
      }
    }
  }
}

// Formats with a direct kernel.
template <class F>
struct HasDirectGemv : std::false_type {};
template <bool kFive>
struct HasDirectGemv<FmtQ45_K<kFive>> : std::true_type {};

}  // namespace sluice::backend::cuda::gemv_detail
