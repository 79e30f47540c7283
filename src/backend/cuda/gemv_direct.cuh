// The direct GEMV: for block formats whose blocks are 16-byte aligned (Q4_K 144 B, Q5_K 176 B)
// each lane loads its pieces' 16-byte words straight from global memory into registers, several
// pieces deep, and decodes them there (no shared-memory staging, no per-chunk warp sync).
//
// Why a second kernel: the staged kernel (gemv_kernel.cuh) keeps 2 chunks per warp in flight and
// each warp decodes a chunk before it issues the next copy, so on the 4096-column shapes, where a
// warp gets only a few rows, the decode latency is not hidden (Q4_K 50-60% of the copy bound).
// Here a lane issues every load of kDirectDepth row steps before it decodes any of them, and nothing but
// occupancy bounds what is in flight.
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
inline constexpr int kDirectDepth = 4;  // row steps (32 pieces each) whose loads are issued together

__device__ __forceinline__ uint4 ldg_stream_u128(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// F: a format with kPieceWords / piece_word_offset / dot_words (FmtQ45_K). npieces = nb * 4.
template <class F, int NT>
__global__ void __launch_bounds__(kDirectWarps * kWarpSize) gemv_direct_kernel(const __grid_constant__ Segs segs,
                                                                                int64_t row_bytes, int npieces) {
  constexpr int kW = F::kPieceWords;
  constexpr int kPiecesPerBlock = F::kBlockElems / F::kPieceElems;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t rows = segs.row0[segs.n];
  const int64_t warps = int64_t(gridDim.x) * kDirectWarps;
  const int steps = (npieces + kWarpSize - 1) / kWarpSize;  // row steps of 32 pieces
  int64_t row = int64_t(blockIdx.x) * kDirectWarps + threadIdx.x / kWarpSize;

  uint4 w[kDirectDepth][kW];
  // Loads of steps [s0, s0 + kDirectDepth) of `row` (pieces past the row's end are not loaded).
  auto load = [&](int64_t r, int s0) {
    const int m = seg_of(segs, r);
    const uint8_t* base = segs.w[m] + (r - segs.row0[m]) * row_bytes;
#pragma unroll
    for (int k = 0; k < kDirectDepth; ++k) {
      const int p = (s0 + k) * kWarpSize + lane;
      if (p < npieces) {  // (implies s0 + k < steps)
        const uint8_t* b = base + int64_t(p / kPiecesPerBlock) * F::kBlockBytes;
#pragma unroll
        for (int i = 0; i < kW; ++i) w[k][i] = ldg_stream_u128(b + F::piece_word_offset(p % kPiecesPerBlock, i));
      }
    }
  };

  pdl_trigger();
  // The first row's first loads go out before the wait: weights are never written by kernels.
  if (row < rows) load(row, 0);
  pdl_wait();

  for (; row < rows; row += warps) {
    const int m = seg_of(segs, row);
    const ActRef& a = segs.a[m];
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
    for (int s0 = 0; s0 < steps; s0 += kDirectDepth) {
      if (s0 > 0) load(row, s0);
#pragma unroll
      for (int k = 0; k < kDirectDepth; ++k) {
        const int p = (s0 + k) * kWarpSize + lane;
        if (p < npieces) {
          const int pp = p % kPiecesPerBlock;
          F::template dot_words<NT>(w[k], pp, int64_t(p) * F::kPieceElems, a, acc);
        }
      }
    }
    // The next row's first loads go out before this row's reduction.
    if (row + warps < rows) load(row + warps, 0);
    const int64_t seg_rows = segs.row0[m + 1] - segs.row0[m];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float sum = warp_sum(acc[t]);
      if (lane == 0) segs.y[m][int64_t(t) * seg_rows + (row - segs.row0[m])] = sum;
    }
  }
}

// Formats with a direct kernel.
template <class F>
struct HasDirectGemv : std::false_type {};
template <bool kFive>
struct HasDirectGemv<FmtQ45_K<kFive>> : std::true_type {};

}  // namespace sluice::backend::cuda::gemv_detail
