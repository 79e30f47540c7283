// The direct GEMV: for block formats whose pieces are 16-byte aligned (Q4_K 144 B, Q5_K 176 B
// blocks; Q6_K and Q8_0 in the grouped layout of layout.h) each lane loads its pieces' 16-byte
// words straight from global memory into registers, several pieces deep, and decodes them there
// (no shared-memory staging, no per-chunk warp sync).
//
// Why a second kernel: the staged kernel (gemv_kernel.cuh) keeps 2 chunks per warp in flight and
// each warp decodes a chunk before it issues the next copy, so on the 4096-column shapes, where a
// warp gets only a few rows, the decode latency is not hidden (Q4_K 50-60% of the copy bound).
// Here a lane keeps kDepth row steps' loads in flight in a ring of registers, refilled as each
// step is decoded, and nothing but occupancy bounds what is in flight. The depth is a trade of
// registers (occupancy) against loads in flight per warp; launch_direct picks it per shape.
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

// F: a format with the lane API (DirectQ45_K, FmtQ6_KG, FmtQ8_0G): Lane lane_of(lane) (the
// lane's constant offsets; .base: its first byte within a row step), Words (one row step's
// registers), load(p, lane, words) from p = step start + base, dot_direct<NT>(words, lane, xq,
// xds, cols, acc). npieces = nb * 4.
//
// A warp walks its items, (row, step) pairs in order (row g: steps 0..steps-1, then row g + G, ...),
// through a ring of kDepth register slots: the loads of item j + kDepth go into slot j % kDepth as
// soon as item j is decoded, so kDepth - 1 items' loads stay in flight across step and row
// boundaries (long rows, e.g. ffn_down's 14336 columns, have no bubble between groups of steps).
// A row's warp reduction and store follow its last step.
//
// The per-piece bookkeeping stays out of the loop. A lane's piece index within a row step is constant
// (pieces l, l + 32, ...: p % 4 == lane % 4, block (lane / 4) of the step), so its byte offsets
// within a step (F::lane_of), its scale-byte selectors (FmtQ45_K::dot_lane) and its activation
// offset (lane * 64 elements) are computed once; a step moves the weight and activation pointers by
// 8 blocks / 2048 elements; a warp's rows only grow, so the matrix a row belongs to is found by
// moving forward from the last one. kFull: every row step has 32 pieces (cols a multiple of
// 2048), no per-lane guard.
// Needs: row_bytes and every weight pointer 16-byte aligned, activations as in dot_lane, rows < 2^31.
template <class F, int NT, int kDepth, bool kFull>
__global__ void __launch_bounds__(kDirectWarps * kWarpSize) gemv_direct_kernel(const __grid_constant__ Segs segs,
                                                                              int64_t row_bytes, int npieces) {
  constexpr int kPiecesPerBlock = F::kBlockElems / F::kPieceElems;
  static_assert(kWarpSize % kPiecesPerBlock == 0);
  constexpr int kStepBytes = kWarpSize / kPiecesPerBlock * F::kBlockBytes;
  constexpr int kStepElems = kWarpSize * F::kPieceElems;
  const int lane = threadIdx.x % kWarpSize;
  const typename F::Lane L = F::lane_of(lane);
  // Row indices fit in int (launch_gemv checks).
  const int rows = int(segs.row0[segs.n]);
  const int warps = int(gridDim.x) * kDirectWarps;
  const int steps = (npieces + kWarpSize - 1) / kWarpSize;
  const int row0 = int(blockIdx.x) * kDirectWarps + int(threadIdx.x) / kWarpSize;
  if (row0 >= rows) {
    pdl_trigger();
    return;
  }
  // After a row's steps, the weight pointer moves on to the warp's next row of the same matrix by
  // row_skip bytes, the activation pointers back by `steps` steps.
  const int64_t row_skip = int64_t(warps) * row_bytes - int64_t(steps) * kStepBytes;
  const int64_t act_rewind = int64_t(steps) * kStepElems;
  // The matrix of a row, moving forward only (a warp's rows grow).
  auto advance_seg = [&](int r, int& m) {
    while (m + 1 < segs.n && r >= segs.row0[m + 1]) ++m;
  };
  auto lane_base = [&](int r, int m) { return segs.w[m] + (r - segs.row0[m]) * row_bytes + L.base; };

  typename F::Words w[kDepth];
  int ld_row = row0, ld_m = 0;
  advance_seg(ld_row, ld_m);
  int ld_end = int(segs.row0[ld_m + 1]);  // first row past the load cursor's matrix
  int ld_step = 0;
  const uint8_t* ld_ptr = lane_base(ld_row, ld_m);
  auto load_next = [&](int slot) {
    if (ld_row < rows) {
      if (kFull || ld_step * kWarpSize + lane < npieces) F::load(ld_ptr, L, w[slot]);
      ld_ptr += kStepBytes;
      if (++ld_step == steps) {
        ld_step = 0;
        ld_row += warps;
        if (ld_row < ld_end) {
          ld_ptr += row_skip;
        } else if (ld_row < rows) {
          advance_seg(ld_row, ld_m);
          ld_end = int(segs.row0[ld_m + 1]);
          ld_ptr = lane_base(ld_row, ld_m);
        }
      }
    }
  };

  pdl_trigger();
#pragma unroll
  for (int k = 0; k < kDepth; ++k) load_next(k);
  pdl_wait();

  int row = row0, m = 0;
  advance_seg(row, m);
  int seg_begin = int(segs.row0[m]), seg_end = int(segs.row0[m + 1]);
  const int64_t cols = segs.a[0].cols;
  const int8_t* xq = segs.a[m].q + lane * F::kPieceElems;
  const float2* xds = segs.a[m].ds + lane * (F::kPieceElems / 32);
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  int step = 0;
  while (row < rows) {
#pragma unroll
    for (int k = 0; k < kDepth; ++k) {
      if (row < rows) {  // warp-uniform
        if (kFull || step * kWarpSize + lane < npieces) F::template dot_direct<NT>(w[k], L, xq, xds, cols, acc);
        load_next(k);  // slot k is free again
        xq += kStepElems;
        xds += kStepElems / 32;
        if (++step == steps) {
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const float sum = warp_sum(acc[t]);
            if (lane == 0) segs.y[m][int64_t(t) * (seg_end - seg_begin) + (row - seg_begin)] = sum;
            acc[t] = 0.0f;
          }
          step = 0;
          row += warps;
          xq -= act_rewind;
          xds -= act_rewind / 32;
          if (row >= seg_end && row < rows) {
            advance_seg(row, m);
            seg_begin = int(segs.row0[m]);
            seg_end = int(segs.row0[m + 1]);
            xq = segs.a[m].q + lane * F::kPieceElems;
            xds = segs.a[m].ds + lane * (F::kPieceElems / 32);
          }
        }
      }
    }
  }
}

// The direct kernel's format for a GEMV format (void: none).
template <class F>
struct DirectOf {
  using type = void;
};
template <bool kFive>
struct DirectOf<FmtQ45_K<kFive>> {
  using type = DirectQ45_K<kFive>;
};
template <>
struct DirectOf<FmtQ6_KG> {
  using type = FmtQ6_KG;
};
template <>
struct DirectOf<FmtQ8_0G> {
  using type = FmtQ8_0G;
};

}  // namespace sluice::backend::cuda::gemv_detail
