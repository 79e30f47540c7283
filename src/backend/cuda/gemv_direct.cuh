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

#include <cuda_fp16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_formats.cuh"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/rope.cuh"

namespace sluice::backend::cuda::gemv_detail {

inline constexpr int kDirectWarps = 4;  // warps per block

// The rope-and-store epilogue of a decode step's Q, K and V products (GemvRopeStore in gemv.h; the
// kernel parameters). A warp takes rows in pairs (2u, 2u + 1: one rotating pair of a head, in the
// adjacent-pair rotation of GGUF's Llama-family Q/K), so both outputs of a pair are in one warp's
// registers at the second row's end: the pair is rotated there (Q, K), written to y, and (K, V)
// converted to f16 into the cache row of the token's position. It replaces the separate
// rope_store_kv launch (and its load of q, k and v) with a few instructions at the end of a row.
struct RopeEpi {
  int kind[kMaxSegs];  // GemvRopeStore::kQ, kK, kV
  __half* cache[kMaxSegs];
  int64_t cache_stride[kMaxSegs];
  int head_dim;
  int half;  // rotating pairs per head (n_rot / 2)
  float theta_scale;
  float freq_scale;
  const float* freq_factors;
  int pos0;
  const int* pos_dev;  // non-null: the position of token 0 is *pos_dev (a replayed step)
  const int* row_map;  // paged cache: position p is cache row row_map[p] (nullptr: row p)
};
inline constexpr int kEpiQ = 1, kEpiK = 2, kEpiV = 3;

// A lane's activation offsets (elements of q, entries of ds) within a row step: pieces l, l + 32, ...
// unless the format maps its lanes otherwise (act_offsets of DirectQ4_KC, FmtQ6_KGC,
// FmtQ8_0GC).
template <class F>
__device__ __forceinline__ int2 lane_act_offsets(int lane) {
  if constexpr (requires { F::act_offsets(lane); }) {
    return F::act_offsets(lane);
  } else {
    return int2{lane * F::kPieceElems, lane * (F::kPieceElems / 32)};
  }
}

// F: a format with the lane API (DirectQ45_K, FmtQ6_KG, FmtQ8_0G; on rows of whole steps the
// coalesced maps DirectQ4_KC, FmtQ6_KGC, FmtQ8_0GC): Lane lane_of(lane) (the lane's constant
// offsets; .base: its first byte within a row step), Words (one row step's registers), load(p,
// lane, words) from p = step start + base, dot_direct<NT>(words, lane, xq, xds, cols, acc) with xq
// and xds at the step's activation + lane_act_offsets. npieces = nb * 4.
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
//
// kRope (epi non-null): rows in pairs, as RopeEpi says; every matrix's row count is even.
template <class F, int NT, int kDepth, bool kFull, bool kRope>
__device__ __forceinline__ void gemv_direct_body(const Segs& segs, int64_t row_bytes, int npieces,
                                                 const RopeEpi* epi) {
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
  const int gw = int(blockIdx.x) * kDirectWarps + int(threadIdx.x) / kWarpSize;
  // kRope: the warp's rows are 2gw, 2gw + 1, 2(gw + warps), 2(gw + warps) + 1, ...
  const int row0 = kRope ? 2 * gw : gw;
  auto next_row = [&](int r) { return kRope ? ((r & 1) ? r + 2 * warps - 1 : r + 1) : r + warps; };
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
        ld_row = next_row(ld_row);
        if constexpr (kRope) {
          if (ld_row < rows) {
            advance_seg(ld_row, ld_m);
            ld_ptr = lane_base(ld_row, ld_m);
          }
        } else if (ld_row < ld_end) {
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
  // kRope: lane i = ku * NT + t holds cos/sin of the warp's ku-th pair for token t, made while the
  // first weights are in flight (the position is final before the step's first kernel starts:
  // a host copy sets *pos_dev); pairs past the 32 / NT-th are made at their row's end.
  int pos = 0;
  float pc = 1.0f, ps = 0.0f;
  int unit = 0;  // pairs finished by this warp
  auto pair_index = [&](int r, int m) {  // the rotating pair of Q/K row r (even) of matrix m; -1: none
    const int kind = epi->kind[m];
    if (kind == kEpiV) return -1;
    const int j = (r - int(segs.row0[m])) % epi->head_dim / 2;
    return j < epi->half ? j : -1;
  };
  if constexpr (kRope) {
    pos = epi->pos_dev != nullptr ? *epi->pos_dev : epi->pos0;
    const int r = 2 * (gw + lane / NT * warps);
    if (r < rows) {
      const int j = pair_index(r, seg_of(segs, r));
      if (j >= 0) rope_cos_sin(epi->theta_scale, epi->freq_scale, epi->freq_factors, pos + lane % NT, j, pc, ps);
    }
  }
  pdl_wait();

  int row = row0, m = 0;
  advance_seg(row, m);
  int seg_begin = int(segs.row0[m]), seg_end = int(segs.row0[m + 1]);
  const int64_t cols = segs.a[0].cols;
  const int2 act_off = lane_act_offsets<F>(lane);
  const int8_t* xq = segs.a[m].q + act_off.x;
  const float2* xds = segs.a[m].ds + act_off.y;
  float acc[NT];
  float prev[NT];  // kRope: the even row's outputs until its pair's odd row ends
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = prev[t] = 0.0f;
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
          if constexpr (kRope) {
            if ((row & 1) == 0) {
#pragma unroll
              for (int t = 0; t < NT; ++t) {
                prev[t] = warp_sum(acc[t]);
                acc[t] = 0.0f;
              }
            } else {
              const int r0 = row - 1;  // the pair's even row, same matrix
              const int j = pair_index(r0, m);
              const int kind = epi->kind[m];
              const int64_t ldy = seg_end - seg_begin;
#pragma unroll
              for (int t = 0; t < NT; ++t) {
                float x0 = prev[t];
                float x1 = warp_sum(acc[t]);
                acc[t] = 0.0f;
                if (j >= 0) {  // warp-uniform
                  const int src = unit * NT + t;
                  float c = __shfl_sync(0xffffffffu, pc, src & (kWarpSize - 1));
                  float sn = __shfl_sync(0xffffffffu, ps, src & (kWarpSize - 1));
                  if (src >= kWarpSize) rope_cos_sin(epi->theta_scale, epi->freq_scale, epi->freq_factors, pos + t, j, c, sn);
                  rope_rotate(x0, x1, c, sn);
                }
                if (lane == 0) {
                  float* y = segs.y[m] + int64_t(t) * ldy + (r0 - seg_begin);
                  y[0] = x0;
                  y[1] = x1;
                  if (kind != kEpiQ) {
                    const int p = pos + t;
                    const int64_t crow = epi->row_map != nullptr ? int64_t(epi->row_map[p]) : int64_t(p);
                    __half* cr = epi->cache[m] + crow * epi->cache_stride[m] + (r0 - seg_begin);
                    cr[0] = __float2half_rn(x0);
                    cr[1] = __float2half_rn(x1);
                  }
                }
              }
              ++unit;
            }
          } else {
#pragma unroll
            for (int t = 0; t < NT; ++t) {
              const float sum = warp_sum(acc[t]);
              if (lane == 0) segs.y[m][int64_t(t) * (seg_end - seg_begin) + (row - seg_begin)] = sum;
              acc[t] = 0.0f;
            }
          }
          step = 0;
          row = next_row(row);
          xq -= act_rewind;
          xds -= act_rewind / 32;
          if (row >= seg_end && row < rows) {
            advance_seg(row, m);
            seg_begin = int(segs.row0[m]);
            seg_end = int(segs.row0[m + 1]);
            xq = segs.a[m].q + act_off.x;
            xds = segs.a[m].ds + act_off.y;
          }
        }
      }
    }
  }
}

template <class F, int NT, int kDepth, bool kFull>
__global__ void __launch_bounds__(kDirectWarps * kWarpSize) gemv_direct_kernel(const __grid_constant__ Segs segs,
                                                                              int64_t row_bytes, int npieces) {
  gemv_direct_body<F, NT, kDepth, kFull, false>(segs, row_bytes, npieces, nullptr);
}

template <class F, int NT, int kDepth, bool kFull>
__global__ void __launch_bounds__(kDirectWarps * kWarpSize)
    gemv_direct_rope_kernel(const __grid_constant__ Segs segs, int64_t row_bytes, int npieces,
                            const __grid_constant__ RopeEpi epi) {
  gemv_direct_body<F, NT, kDepth, kFull, true>(segs, row_bytes, npieces, &epi);
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
// The direct format for rows of whole row steps (kFull), where one exists with another lane map.
template <class D>
struct FullStepsOf {
  using type = D;
};
template <>
struct FullStepsOf<FmtQ8_0G> {
  using type = FmtQ8_0GC;
};
template <>
struct FullStepsOf<DirectQ45_K<false>> {
  using type = DirectQ4_KC;
};
template <>
struct FullStepsOf<FmtQ6_KG> {
  using type = FmtQ6_KGC;
};

}  // namespace sluice::backend::cuda::gemv_detail
