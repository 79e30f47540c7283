// Small-batch int8 tensor-core matrix products on quantized weights (mmq.h says what and why).
//
// Block: kWarps warps, a tile of 16 kMT kWarps rows (each warp kMT m-tiles of 16 rows; kMT per
// format, as shared memory allows), all the launch's tokens (NT n-tiles of 8; tokens past the
// last are copies of it whose sums are dropped). Per pipeline step the block copies, with
// cp.async, one 256-column unit (one K-quant block, eight Q8_0 blocks) of its rows and the
// same columns of the int8 activation (and its per-32 scales) into one of kStages shared-memory
// stages, then every warp multiplies its rows by every token with
//   mma.sync m16n8k32 (Q4_K, Q8_0: a scale per 32 weights) or m16n8k16 (Q6_K: a scale per 16)
// and folds the int32 sums into f32 accumulators with the block scales.
//
// mma fragment layouts (PTX ISA, mma.m16n8k32 / m16n8k16 with .s8): lane = 4 g + q,
//   C (16 x 8):  c0, c1 -> row g, columns 2q, 2q+1;  c2, c3 -> row g + 8, same columns
//   k32 A (16 x 32, 4 regs of 4 int8): a0 row g, k 4q..4q+3; a1 row g+8, same k; a2 row g,
//       k 16+4q..; a3 row g+8, k 16+4q..;  B (32 x 8, 2 regs): b0 k 4q.., column g; b1 k 16+4q..
//   k16 A (2 regs): a0 row g, k 4q..4q+3; a1 row g+8;  B (1 reg): k 4q.., column g
// A dot product does not care in which order its k terms come, as long as A and B agree, so the
// k32 formats let mma index k = 16 h + 4 q + j stand for element 8 q + 4 h + j of the 32: each lane
// reads 8 consecutive weight bytes and 8 consecutive activation bytes (one 64-bit shared load).
#include "backend/cuda/mmq.h"

#include <algorithm>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_formats.cuh"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/layout.h"

namespace sluice::backend::cuda {
const char* gemv_type_name(quant::Type type);  // gemv.cu
}  // namespace sluice::backend::cuda

namespace sluice::backend::cuda::mmq_detail {

using gemv_detail::cp_async_16;
using gemv_detail::cp_async_commit;
using gemv_detail::cp_async_wait;
using gemv_detail::k_scale_min;

constexpr int kStages = 3;

__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}

__device__ __forceinline__ void mma_k32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
}
__device__ __forceinline__ uint2 lds_u64(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }

// What one warp multiplies per stage: rows[mt][0] / rows[mt][1] point at the stage bytes of rows
// g and g + 8 of m-tile mt; act at the stage's activation ([token][kActStride] int8, token n of
// n-tile nt at row 8 nt + n); ds at its scales ([token][8] float2: d, d * sum q).
// acc[mt][nt][i] is C element i of (m-tile mt, n-tile nt).
//
// Q4_K (144 B): [d][dmin][scales 12][qs 128]; sub-block 2p: low nibbles of qs[32p..32p+31],
// 2p+1: high nibbles. w = d sc q - dmin mn, so sum w x = d sc dx sum(q xq) - dmin mn (dx sum xq).
// Measured on an H100 (8B batched passes, 2026-11-25): 4 warps of two m-tiles beat 8 warps of
// one (128 registers at most) and 4 warps of one (3 blocks per SM) at 16..32 tokens.
struct MmqQ4_K {
  static constexpr int kWarps = 4, kMT = 2, kMinBlocks = 1;
  static constexpr int kUnitBytes = 144, kCopyBytes = 16;
  static constexpr int kRowStride = 160;  // 8 g apart mod 32 banks: conflict-free 64-bit loads
  static constexpr int kActStride = 288;
  static constexpr int kFieldCopies = 0;  // the unit's bytes are copied as they lie
  template <int NT>
  __device__ static void mul(const uint8_t* const (&rows)[kMT][2], const uint8_t* act, const float2* ds, int g, int q,
                             int64_t /*unit*/, float (&acc)[kMT][NT][4]) {
    uint4 hd[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      hd[mt][0] = lds_u128(rows[mt][0]);
      hd[mt][1] = lds_u128(rows[mt][1]);
    }
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      uint2 wq[kMT][2];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        wq[mt][0] = lds_u64(rows[mt][0] + 16 + 32 * p + 8 * q);
        wq[mt][1] = lds_u64(rows[mt][1] + 16 + 32 * p + 8 * q);
      }
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int sb = 2 * p + hi;
        uint32_t a[kMT][4];
        float dw[kMT][2], mw[kMT][2];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          a[mt][0] = (wq[mt][0].x >> (4 * hi)) & 0x0F0F0F0Fu;
          a[mt][1] = (wq[mt][1].x >> (4 * hi)) & 0x0F0F0F0Fu;
          a[mt][2] = (wq[mt][0].y >> (4 * hi)) & 0x0F0F0F0Fu;
          a[mt][3] = (wq[mt][1].y >> (4 * hi)) & 0x0F0F0F0Fu;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            int sc, mn;
            k_scale_min(hd[mt][r].y, hd[mt][r].z, hd[mt][r].w, sb, &sc, &mn);
            dw[mt][r] = half_bits_to_float(hd[mt][r].x & 0xFFFFu) * float(sc);
            mw[mt][r] = half_bits_to_float(hd[mt][r].x >> 16) * float(mn);
          }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint2 b = lds_u64(act + (8 * nt + g) * kActStride + 32 * sb + 8 * q);
          const float2 x0 = ds[(8 * nt + 2 * q) * 8 + sb], x1 = ds[(8 * nt + 2 * q + 1) * 8 + sb];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            int c[4] = {0, 0, 0, 0};
            mma_k32(c, a[mt][0], a[mt][1], a[mt][2], a[mt][3], b.x, b.y);
            acc[mt][nt][0] += dw[mt][0] * (x0.x * float(c[0])) - mw[mt][0] * x0.y;
            acc[mt][nt][1] += dw[mt][0] * (x1.x * float(c[1])) - mw[mt][0] * x1.y;
            acc[mt][nt][2] += dw[mt][1] * (x0.x * float(c[2])) - mw[mt][1] * x0.y;
            acc[mt][nt][3] += dw[mt][1] * (x1.x * float(c[3])) - mw[mt][1] * x1.y;
          }
        }
      }
    }
  }
};

// Q8_0 (34 B): [d][qs 32]; a 256-column unit is 8 blocks (272 B, 16-byte multiple). kGrouped:
// the unit is one group of the CUDA backend's grouped layout (layout.h: [qs 8 x 32][d 8 x 2]),
// copied the same way; its quants are then read with aligned loads.
template <bool kGrouped>
struct MmqQ8_0T {
  static constexpr int kWarps = 4, kMT = 1, kMinBlocks = 1;
  static constexpr int kUnitBytes = 272, kCopyBytes = 16;
  static constexpr int kRowStride = 288;
  static constexpr int kActStride = 288;
  static constexpr int kFieldCopies = 0;  // the unit's bytes are copied as they lie
  template <int NT>
  __device__ static void mul(const uint8_t* const (&rows)[kMT][2], const uint8_t* act, const float2* ds, int g, int q,
                             int64_t /*unit*/, float (&acc)[kMT][NT][4]) {
#pragma unroll
    for (int sb = 0; sb < 8; ++sb) {
      uint32_t a[kMT][4];
      float dw[kMT][2];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if constexpr (kGrouped) {
            const uint8_t* qs = rows[mt][r] + 32 * sb;
            dw[mt][r] = half_bits_to_float(lds_u16(rows[mt][r] + kQ8GroupD + 2 * sb));
            a[mt][r] = lds_u32(qs + 8 * q);
            a[mt][2 + r] = lds_u32(qs + 8 * q + 4);
          } else {
            const uint8_t* blk = rows[mt][r] + 34 * sb;
            dw[mt][r] = half_bits_to_float(lds_u16(blk));
            a[mt][r] = lds_u32_a2(blk + 2 + 8 * q);
            a[mt][2 + r] = lds_u32_a2(blk + 2 + 8 * q + 4);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint2 b = lds_u64(act + (8 * nt + g) * kActStride + 32 * sb + 8 * q);
        const float x0 = ds[(8 * nt + 2 * q) * 8 + sb].x, x1 = ds[(8 * nt + 2 * q + 1) * 8 + sb].x;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          int c[4] = {0, 0, 0, 0};
          mma_k32(c, a[mt][0], a[mt][1], a[mt][2], a[mt][3], b.x, b.y);
          acc[mt][nt][0] += dw[mt][0] * (x0 * float(c[0]));
          acc[mt][nt][1] += dw[mt][0] * (x1 * float(c[1]));
          acc[mt][nt][2] += dw[mt][1] * (x0 * float(c[2]));
          acc[mt][nt][3] += dw[mt][1] * (x1 * float(c[3]));
        }
      }
    }
  }
};

// Q6_K (210 B, quant/blocks.h): [ql 128][qh 64][scales 16 (int8)][d]; element 128 h + 32 k + l:
// low 4 bits in ql[64h + 32(k&1) + l] (nibble k>>1), high 2 bits in qh[32h + l] bits 2k; the scale
// is per 16 elements, so each 16-element half of a 32-element group is its own k16 mma, and the
// two int32 sums are scaled and added as integers before the one f32 multiply. A block is only
// 2-byte aligned: the copy takes 212 bytes in 4-byte pieces starting 2 bytes early for the odd
// blocks of a row (kLead) and ending 2 bytes late for the even ones, which stays inside the row
// because a row has an even number of blocks (mmq_supported).
//
// kGrouped: the CUDA backend's grouped layout (layout.h). A unit's fields are then 16-byte runs of
// its group: 14 16-byte copies place them as in a GGUF block ([ql 128][qh 64][scales 16]) and
// add the group's 16-byte run of eight d values at 208 (d of the unit at 208 + 2 (unit % 8));
// every load is then 4-byte aligned.
template <bool kGrouped>
struct MmqQ6_KT {
  static constexpr int kWarps = 4, kMT = 1, kMinBlocks = 1;
  static constexpr int kUnitBytes = 210, kCopyBytes = kGrouped ? 16 : 4;
  // 60 words apart (grouped) or 53: the eight rows of a fragment fall in distinct banks.
  static constexpr int kRowStride = kGrouped ? 240 : 212;
  static constexpr int kActStride = 272;  // 4 g apart mod 32 banks: conflict-free 32-bit loads
  // Grouped: 16-byte copies per unit, from its group's field runs (group_src); GGUF order: 0, the
  // unit's bytes are copied as they lie.
  static constexpr int kFieldCopies = kGrouped ? 14 : 0;
  // Grouped: source of copy c (0..13) of block b of a group, from the group's start.
  __device__ static int group_src(int b, int c) {
    if (c < 8) return 128 * b + 16 * c;
    if (c < 12) return kQ6kGroupQh + 64 * b + 16 * (c - 8);
    return c == 12 ? kQ6kGroupScales + 16 * b : kQ6kGroupD;
  }
  __device__ static uint32_t ld32(const uint8_t* p) {
    if constexpr (kGrouped) {
      return lds_u32(p);
    } else {
      return lds_u32_a2(p);
    }
  }
  template <int NT>
  __device__ static void mul(const uint8_t* const (&rows)[kMT][2], const uint8_t* act, const float2* ds, int g, int q,
                             int64_t unit, float (&acc)[kMT][NT][4]) {
    const int d_off = kGrouped ? 208 + 2 * int(unit % 8) : 208;
    float d[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      d[mt][0] = half_bits_to_float(lds_u16(rows[mt][0] + d_off));
      d[mt][1] = half_bits_to_float(lds_u16(rows[mt][1] + d_off));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t qh[kMT][2][2];  // [mt][row][half of the 32]
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          qh[mt][r][0] = ld32(rows[mt][r] + 128 + 32 * h + 4 * q);
          qh[mt][r][1] = ld32(rows[mt][r] + 128 + 32 * h + 16 + 4 * q);
        }
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int sb = 4 * h + k;  // 32-column group of the block
        uint32_t a[kMT][2][2];     // [mt][half][row]
        int sc[kMT][2][2];         // [mt][row][half]
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint8_t* b = rows[mt][r];
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const uint32_t ql = ld32(b + 64 * h + 32 * (k & 1) + 16 * hf + 4 * q);
              const uint32_t v = ((ql >> (4 * (k >> 1))) & 0x0F0F0F0Fu) | (((qh[mt][r][hf] >> (2 * k)) & 0x03030303u) << 4);
              a[mt][hf][r] = uint32_t(sub_bytes(v, 0x20202020u));
            }
            const uint32_t s2 = lds_u16(b + 192 + 8 * h + 2 * k);
            sc[mt][r][0] = int(int8_t(s2 & 0xFF));
            sc[mt][r][1] = int(int8_t(s2 >> 8));
          }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint8_t* xb = act + (8 * nt + g) * kActStride + 32 * sb + 4 * q;
          const uint32_t b0 = lds_u32(xb), b1 = lds_u32(xb + 16);
          const float x0 = ds[(8 * nt + 2 * q) * 8 + sb].x, x1 = ds[(8 * nt + 2 * q + 1) * 8 + sb].x;
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            int c0[4] = {0, 0, 0, 0}, c1[4] = {0, 0, 0, 0};
            mma_k16(c0, a[mt][0][0], a[mt][0][1], b0);
            mma_k16(c1, a[mt][1][0], a[mt][1][1], b1);
            acc[mt][nt][0] += (d[mt][0] * x0) * float(sc[mt][0][0] * c0[0] + sc[mt][0][1] * c1[0]);
            acc[mt][nt][1] += (d[mt][0] * x1) * float(sc[mt][0][0] * c0[1] + sc[mt][0][1] * c1[1]);
            acc[mt][nt][2] += (d[mt][1] * x0) * float(sc[mt][1][0] * c0[2] + sc[mt][1][1] * c1[2]);
            acc[mt][nt][3] += (d[mt][1] * x1) * float(sc[mt][1][0] * c0[3] + sc[mt][1][1] * c1[3]);
          }
        }
      }
    }
  }
};

using MmqQ6_K = MmqQ6_KT<false>;
using MmqQ6_KG = MmqQ6_KT<true>;
using MmqQ8_0 = MmqQ8_0T<false>;
using MmqQ8_0G = MmqQ8_0T<true>;

// The matrices of a launch: matrix m owns row tiles [tile0[m], tile0[m+1]).
struct Mats {
  int n = 0;
  int tile0[kMaxGemvMatrices + 1] = {};
  int64_t rows[kMaxGemvMatrices] = {};
  const uint8_t* w[kMaxGemvMatrices] = {};
  const int8_t* xq[kMaxGemvMatrices] = {};
  const float2* xds[kMaxGemvMatrices] = {};
  float* y[kMaxGemvMatrices] = {};
};

template <class F>
__host__ __device__ constexpr int tile_rows() {
  return F::kMT * 16 * F::kWarps;
}
template <class F>
__host__ __device__ constexpr int threads() {
  return F::kWarps * kWarpSize;
}

template <class F, int NT>
struct Smem {
  static constexpr int kW = tile_rows<F>() * F::kRowStride;
  static constexpr int kA = NT * 8 * F::kActStride;
  static constexpr int kDs = NT * 8 * 8 * 8;  // 8 float2 per token
  static constexpr int kStage = kW + kA + kDs;
  static constexpr int kBytes = kStages * kStage;
  static_assert(kW % 16 == 0 && kA % 16 == 0 && kDs % 16 == 0);
};

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
}

// Q6_K blocks are copied from 2 bytes before their start when that is not 4-byte aligned.
template <class F>
__device__ __forceinline__ int copy_lead(int64_t unit) {
  return F::kCopyBytes == 4 ? int((unit * F::kUnitBytes) & 3) : 0;
}

// Shapes (host-checked): cols = 256 * units, splits <= units.
template <class F, int NT>
__global__ void __launch_bounds__(threads<F>(), F::kMinBlocks) mmq_kernel(const __grid_constant__ Mats mats, int64_t row_bytes, int64_t cols,
                                                       int tokens, int splits, float* partials, int* counters) {
  extern __shared__ __align__(16) uint8_t smem[];
  using S = Smem<F, NT>;
  constexpr int kMT = F::kMT, kRows = tile_rows<F>(), kThreads = threads<F>();
  // 16-byte formats: the unit's bytes; Q6_K: 212 bytes (2 before or after the 210, copy_lead);
  // grouped Q6_K: the unit's fields and its group's d run (MmqQ6_KT).
  constexpr bool kG = F::kFieldCopies > 0;
  constexpr int kCopies = kG ? F::kFieldCopies : F::kCopyBytes == 16 ? F::kUnitBytes / 16 : (F::kUnitBytes + 2) / 4;
  static_assert(kG ? kCopies * 16 <= F::kRowStride
                   : F::kCopyBytes == 16 ? F::kUnitBytes % 16 == 0 : kCopies * 4 <= F::kRowStride);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, q = lane % 4;

  const int tile = blockIdx.x;
  int m = 0;
  while (m + 1 < mats.n && tile >= mats.tile0[m + 1]) ++m;
  const int64_t row0 = int64_t(tile - mats.tile0[m]) * kRows;
  const int64_t mrows = mats.rows[m];
  const uint8_t* w = mats.w[m];
  const int units = int(cols / 256);
  const int split = blockIdx.y;
  const int u_begin = int(int64_t(split) * units / splits), u_end = int(int64_t(split + 1) * units / splits);
  const int nsteps = u_end - u_begin;

  auto issue_w = [&](int i) {
    uint8_t* dst = smem + (i % kStages) * S::kStage;
    const int64_t unit = u_begin + i;
    const int64_t c0 = unit * F::kUnitBytes - copy_lead<F>(unit);
    for (int idx = threadIdx.x; idx < kRows * kCopies; idx += kThreads) {
      const int r = idx / kCopies, c = idx % kCopies;
      const int64_t row = min(row0 + r, mrows - 1);
      if constexpr (kG) {
        const uint8_t* grp = w + row * row_bytes + (unit / 8) * kQ6kGroupBytes;
        cp_async_16(dst + r * F::kRowStride + c * 16, grp + F::group_src(int(unit % 8), c));
        continue;
      }
      const uint8_t* src = w + row * row_bytes + c0 + c * F::kCopyBytes;
      if constexpr (F::kCopyBytes == 16) {
        cp_async_16(dst + r * F::kRowStride + c * 16, src);
      } else {
        cp_async_4(dst + r * F::kRowStride + c * 4, src);
      }
    }
  };
  auto issue_x = [&](int i) {
    uint8_t* dst = smem + (i % kStages) * S::kStage + S::kW;
    const int64_t e0 = int64_t(u_begin + i) * 256;
    constexpr int kXc = 256 / 16;  // 16-byte copies per token
    for (int idx = threadIdx.x; idx < NT * 8 * kXc; idx += kThreads) {
      const int t = idx / kXc, c = idx % kXc;
      cp_async_16(dst + t * F::kActStride + c * 16, mats.xq[m] + int64_t(min(t, tokens - 1)) * cols + e0 + c * 16);
    }
    constexpr int kDc = 8 * 8 / 16;  // 16-byte copies of the 8 float2 scales per token
    for (int idx = threadIdx.x; idx < NT * 8 * kDc; idx += kThreads) {
      const int t = idx / kDc, c = idx % kDc;
      cp_async_16(dst + S::kA + (t * kDc + c) * 16,
                  reinterpret_cast<const uint8_t*>(mats.xds[m] + int64_t(min(t, tokens - 1)) * (cols / 32) + e0 / 32) +
                      c * 16);
    }
  };

  pdl_trigger();
  // Weights are never written by an earlier kernel: the first stages are on their way while the
  // kernel before this one finishes; the activation and the outputs only after pdl_wait.
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nsteps) issue_w(s);
  }
  pdl_wait();
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nsteps) issue_x(s);
    cp_async_commit();
  }

  float acc[kMT][NT][4];
  zero(acc);

  for (int i = 0; i < nsteps; ++i) {
    if (i + kStages - 1 < nsteps) {
      issue_w(i + kStages - 1);
      issue_x(i + kStages - 1);
    }
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const uint8_t* st = smem + (i % kStages) * S::kStage;
    const int lead = copy_lead<F>(u_begin + i);
    const uint8_t* rows[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const int r = (warp * kMT + mt) * 16 + g;
      rows[mt][0] = st + r * F::kRowStride + lead;
      rows[mt][1] = st + (r + 8) * F::kRowStride + lead;
    }
    F::template mul<NT>(rows, st + S::kW, reinterpret_cast<const float2*>(st + S::kW + S::kA), g, q, u_begin + i, acc);
    __syncthreads();
  }
  cp_async_wait<0>();

  constexpr int kAcc = kMT * NT * 4;
  if (splits > 1) {
    // Partial sums of this split, laid out by thread; the last split of the tile to arrive adds
    // all of them in split order (so the sum does not depend on the arrival order).
    __shared__ int arrived;
    float* mine = partials + ((int64_t(tile) * splits + split) * kThreads + threadIdx.x) * kAcc;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) mine[(mt * NT + nt) * 4 + i] = acc[mt][nt][i];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) arrived = atomicAdd(counters + tile, 1);
    __syncthreads();
    if (arrived != splits - 1) return;
    __threadfence();
    zero(acc);
    for (int s = 0; s < splits; ++s) {
      const float* p = partials + ((int64_t(tile) * splits + s) * kThreads + threadIdx.x) * kAcc;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[mt][nt][i] += __ldcg(p + (mt * NT + nt) * 4 + i);
    }
    if (threadIdx.x == 0) counters[tile] = 0;  // ready for the next launch
  }
  float* y = mats.y[m];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = row0 + (warp * kMT + mt) * 16 + g + (i >= 2 ? 8 : 0);
        const int t = 8 * nt + 2 * q + (i & 1);
        if (row < mrows && t < tokens) y[int64_t(t) * mrows + row] = acc[mt][nt][i];
      }
    }
  }
}

template <class F, int NT>
int blocks_per_sm() {
  // Per instantiation and architecture: asked once (see gemv_launch.cuh).
  static const int v = [] {
    auto* kernel = mmq_kernel<F, NT>;
    int n = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<F, NT>::kBytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads<F>(), Smem<F, NT>::kBytes) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return v;
}

// A launch's row tiles and column splits.
struct Plan {
  Mats mats;
  int tiles = 0;
  int splits = 1;
  int accs = 0;  // accumulators per thread
  int threads = 0;
  int64_t partial_bytes() const { return splits > 1 ? int64_t(tiles) * splits * threads * accs * 4 : 0; }
};

template <class F, int NT>
Plan plan_nt(const DeviceInfo& dev, const GemvGroupArgs& g) {
  Plan p;
  for (int i = 0; i < g.n; ++i) {
    p.mats.rows[i] = g.m[i].rows;
    p.mats.w[i] = static_cast<const uint8_t*>(g.m[i].w);
    p.mats.xq[i] = g.m[i].xq.q;
    p.mats.xds[i] = g.m[i].xq.ds;
    p.mats.y[i] = g.m[i].y;
    p.mats.tile0[i + 1] = p.mats.tile0[i] + int((g.m[i].rows + tile_rows<F>() - 1) / tile_rows<F>());
  }
  p.mats.n = g.n;
  p.tiles = p.mats.tile0[g.n];
  p.accs = F::kMT * NT * 4;
  p.threads = threads<F>();
  if (p.tiles == 0) return p;
  // Columns are split only until the launch has half as many blocks as the GPU holds at once
  // (each split at least two pipeline steps long): measured on an H100, filling it once cost
  // more in partial sums than it gained (8B, 32 tokens: 15.7 ms per pass vs 12.3; a quarter:
  // 13.4 ms).
  const int resident = dev.sm_count * std::max(1, blocks_per_sm<F, NT>());
  const int units = int(g.cols / 256);
  const int want = (resident / 2 + p.tiles - 1) / p.tiles;
  p.splits = std::clamp(want, 1, std::max(1, units / 2));
  return p;
}

template <class F, int NT>
Status launch(const DeviceInfo& dev, const GemvGroupArgs& g, const MmqScratch* s, Plan* out, cudaStream_t stream) {
  const Plan p = plan_nt<F, NT>(dev, g);
  if (out) *out = p;
  if (!s || p.tiles == 0) return Status::ok();  // sizing only
  if (blocks_per_sm<F, NT>() < 1) return internal_error("mmq: kernel does not fit on this GPU");
  if (p.splits > 1 && (s->partials == nullptr || s->counters == nullptr || s->counters_n < p.tiles ||
                       s->partial_bytes < p.partial_bytes())) {
    return invalid_argument("mmq: scratch smaller than mmq_scratch_needed");
  }
  SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(mmq_kernel<F, NT>, dim3(unsigned(p.tiles), unsigned(p.splits)), dim3(unsigned(threads<F>())),
                                         size_t(Smem<F, NT>::kBytes), stream, p.mats,
                                         quant::row_bytes(g.type, g.cols), g.cols, g.tokens, p.splits,
                                         static_cast<float*>(s->partials), s->counters));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("mmq_kernel");
  return Status::ok();
}

// Plans (s == nullptr) or launches the kernel of g's format and token count.
template <class F>
Status dispatch_nt(const DeviceInfo& dev, const GemvGroupArgs& g, const MmqScratch* s, Plan* out, cudaStream_t stream) {
  static_assert(kMaxMmqTokens == 32);
  switch ((g.tokens + 7) / 8) {
    case 1: return launch<F, 1>(dev, g, s, out, stream);
    case 2: return launch<F, 2>(dev, g, s, out, stream);
    case 3: return launch<F, 3>(dev, g, s, out, stream);
    default: return launch<F, 4>(dev, g, s, out, stream);
  }
}

Status dispatch(const DeviceInfo& dev, const GemvGroupArgs& g, const MmqScratch* s, Plan* out, cudaStream_t stream) {
  switch (g.type) {
    case quant::Type::kQ4_K: return dispatch_nt<MmqQ4_K>(dev, g, s, out, stream);
    case quant::Type::kQ6_K:
      return g.grouped ? dispatch_nt<MmqQ6_KG>(dev, g, s, out, stream) : dispatch_nt<MmqQ6_K>(dev, g, s, out, stream);
    case quant::Type::kQ8_0:
      return g.grouped ? dispatch_nt<MmqQ8_0G>(dev, g, s, out, stream) : dispatch_nt<MmqQ8_0>(dev, g, s, out, stream);
    default: return invalid_argument("mmq: unsupported format");
  }
}

}  // namespace sluice::backend::cuda::mmq_detail

namespace sluice::backend::cuda {

bool mmq_supported(quant::Type type, int64_t cols) {
  if (type != quant::Type::kQ4_K && type != quant::Type::kQ6_K && type != quant::Type::kQ8_0) return false;
  return cols > 0 && cols % (type == quant::Type::kQ6_K ? 512 : 256) == 0;
}

MmqScratch mmq_scratch_needed(const DeviceInfo& dev, const GemvGroupArgs& g) {
  MmqScratch s;
  if (g.n < 1 || g.n > kMaxGemvMatrices || g.tokens < 1 || g.tokens > kMaxMmqTokens || !mmq_supported(g.type, g.cols)) {
    return s;
  }
  mmq_detail::Plan p;
  if (!mmq_detail::dispatch(dev, g, nullptr, &p, nullptr).is_ok() || p.splits <= 1) return s;
  s.partial_bytes = p.partial_bytes();
  s.counters_n = p.tiles;
  return s;
}

namespace {

// A launch splits columns only while it has fewer than half the blocks the GPU holds at once
// (plan_nt), so tiles x splits stays below those blocks and the tiles below half of them.
template <class F, int NT>
MmqScratch bound_nt(const DeviceInfo& dev) {
  const int per_sm = dev.sm_count > 0 ? std::max(1, mmq_detail::blocks_per_sm<F, NT>()) : 2048 / mmq_detail::threads<F>();
  const int64_t resident = int64_t(dev.sm_count > 0 ? dev.sm_count : 256) * per_sm;
  MmqScratch s;
  s.partial_bytes = resident * mmq_detail::threads<F>() * (F::kMT * NT * 4) * int64_t(sizeof(float));
  s.counters_n = resident;
  return s;
}

// The largest over the formats F and every token count (NT = 1..4 groups of 8 tokens).
template <class... F>
MmqScratch bound_of(const DeviceInfo& dev) {
  static_assert(kMaxMmqTokens == 32);
  MmqScratch s;
  for (const MmqScratch& b : {bound_nt<F, 1>(dev)..., bound_nt<F, 2>(dev)..., bound_nt<F, 3>(dev)..., bound_nt<F, 4>(dev)...}) {
    s.partial_bytes = std::max(s.partial_bytes, b.partial_bytes);
    s.counters_n = std::max(s.counters_n, b.counters_n);
  }
  return s;
}

}  // namespace

MmqScratch mmq_scratch_bound(const DeviceInfo& dev) {
  using namespace mmq_detail;
  return bound_of<MmqQ4_K, MmqQ6_K, MmqQ6_KG, MmqQ8_0, MmqQ8_0G>(dev);
}

Status mmq(const DeviceInfo& dev, const GemvGroupArgs& g, const MmqScratch& scratch, cudaStream_t stream) {
  const std::string name = std::string("mmq ") + gemv_type_name(g.type);
  if (!mmq_supported(g.type, g.cols)) {
    return invalid_argument(name + ": no kernel for " + std::to_string(g.cols) + " columns of this format");
  }
  if (g.n < 1 || g.n > kMaxGemvMatrices) return invalid_argument(name + ": bad matrix count");
  if (g.tokens < 1 || g.tokens > kMaxMmqTokens) {
    return invalid_argument(name + ": tokens " + std::to_string(g.tokens) + " outside 1.." +
                            std::to_string(kMaxMmqTokens));
  }
  if (g.grouped && !groupable(g.type, g.cols)) return invalid_argument(name + ": no grouped layout for this shape");
  const int copy_align = g.type == quant::Type::kQ6_K && !g.grouped ? 4 : 16;
  if (quant::row_bytes(g.type, g.cols) % copy_align != 0) {
    return invalid_argument(name + ": row bytes not aligned for the copies");
  }
  for (int i = 0; i < g.n; ++i) {
    const GemvMatrix& mx = g.m[i];
    if (mx.rows < 0) return invalid_argument(name + ": negative row count");
    if (mx.w == nullptr || mx.y == nullptr || mx.xq.q == nullptr || mx.xq.ds == nullptr) {
      return invalid_argument(name + ": null weight, activation or output");
    }
    if (mx.xq.cols != g.cols || mx.xq.tokens < g.tokens) return invalid_argument(name + ": activation of the wrong shape");
    if (reinterpret_cast<uintptr_t>(mx.w) % copy_align != 0 || reinterpret_cast<uintptr_t>(mx.xq.q) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(mx.xq.ds) % 16 != 0) {
      return invalid_argument(name + ": weight or activation not aligned");
    }
  }
  return mmq_detail::dispatch(dev, g, &scratch, nullptr, stream);
}

}  // namespace sluice::backend::cuda
