// Per-format block decoding for the streaming GEMV (gemv_kernel.cuh). Layouts and bit diagrams:
// quant/blocks.h (the definition; this file only re-reads them).
//
// Each format is a struct with
//   kBlockElems, kBlockBytes   the on-disk block
//   kPieceElems                the elements one lane decodes at a time (a piece never straddles a
//                              quantized block; for F32/F16/BF16 a piece is 16 bytes)
//   dot<NT>(chunk, p, e_chunk, a, acc)
//       adds piece p of a shared-memory chunk (whole blocks; first element e_chunk of the row)
//       times each of NT activation vectors to acc[t]. Weights are decoded once into registers,
//       then reused for every token.
// Quantized formats multiply int8 weights by int8 activations with dp4a (exact int32 sums per
// 16 or 32 elements), then apply the float block scales: d_w * d_x * sum(q_w q_x), with the
// weights' offset or min terms folded in through the activation block sums (ActRef::ds.y).
#pragma once

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/layout.h"

namespace sluice::backend::cuda::gemv_detail {

// Activation vectors as the kernels read them; tokens are `cols` apart (ds: cols / 32 apart).
struct ActRef {
  const float* x;      // f32, for F32/F16/BF16 weights
  const int8_t* q;     // int8, for quantized weights
  const float2* ds;    // per 32 elements: (d, d * sum q)
  int64_t cols;
};

__device__ __forceinline__ void load_x32(const ActRef& a, int t, int64_t e, int (&xi)[8]) {
  const int4* p = reinterpret_cast<const int4*>(a.q + t * a.cols + e);  // e % 32 == 0: 16-B aligned
  const int4 v0 = __ldg(p), v1 = __ldg(p + 1);
  xi[0] = v0.x; xi[1] = v0.y; xi[2] = v0.z; xi[3] = v0.w;
  xi[4] = v1.x; xi[5] = v1.y; xi[6] = v1.z; xi[7] = v1.w;
}
__device__ __forceinline__ float2 load_ds(const ActRef& a, int t, int64_t e) {
  return __ldg(a.ds + t * (a.cols / 32) + e / 32);
}
__device__ __forceinline__ float4 load_xf4(const ActRef& a, int t, int64_t e) {
  return __ldg(reinterpret_cast<const float4*>(a.x + t * a.cols + e));
}

// Byte n of a little-endian word array (n a compile-time constant after unrolling).
__device__ __forceinline__ uint32_t ub(const uint32_t* w, int n) {
  return (w[n / 4] >> (8 * (n % 4))) & 0xFFu;
}
// Four bits t0..t3 moved to bit 4 of bytes 0..3 (the fifth bit of Q5 weights): the multiply
// places copies of t at bits 0, 7, 14, 21, which do not overlap, so no carries.
__device__ __forceinline__ uint32_t spread4_to_bit4(uint32_t t) { return (((t & 0xFu) * 0x00204081u) & 0x01010101u) << 4; }
// dp4a of unsigned bytes a by signed bytes b, added to c.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Weight loads of the direct GEMV (gemv_direct.cuh): read-only, past L1 (ld.global.nc.L1::no_allocate),
// so the activation, read by every warp, stays there.
__device__ __forceinline__ uint4 ldg_stream_u128(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldg_stream_u64(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ldg_stream_u32(const uint8_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ldg_stream_u16(const uint8_t* p) {
  unsigned short v;
  asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];\n" : "=h"(v) : "l"(p));
  return v;
}

// ---- float formats ----------------------------------------------------------------------------

struct FmtF32 {
  static constexpr int kBlockElems = 1, kBlockBytes = 4, kPieceElems = 4;
  static constexpr bool kQ8 = false;
  template <int NT>
  __device__ static void dot(const uint8_t* chunk, int p, int64_t e_chunk, const ActRef& a, float (&acc)[NT]) {
    const uint4 r = lds_u128(chunk + 16 * p);
    const float w0 = __uint_as_float(r.x), w1 = __uint_as_float(r.y), w2 = __uint_as_float(r.z), w3 = __uint_as_float(r.w);
    const int64_t e = e_chunk + 4 * p;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4 x = load_xf4(a, t, e);
      acc[t] += w0 * x.x + w1 * x.y + w2 * x.z + w3 * x.w;
    }
  }
};

template <bool kBf16>
struct FmtHalfLike {
  static constexpr int kBlockElems = 1, kBlockBytes = 2, kPieceElems = 8;
  static constexpr bool kQ8 = false;
  __device__ static float cvt(uint32_t bits) { return kBf16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits); }
  template <int NT>
  __device__ static void dot(const uint8_t* chunk, int p, int64_t e_chunk, const ActRef& a, float (&acc)[NT]) {
    const uint4 r = lds_u128(chunk + 16 * p);
    const uint32_t u[4] = {r.x, r.y, r.z, r.w};
    float w[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = cvt(u[j] & 0xFFFFu);
      w[2 * j + 1] = cvt(u[j] >> 16);
    }
    const int64_t e = e_chunk + 8 * p;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4 x0 = load_xf4(a, t, e), x1 = load_xf4(a, t, e + 4);
      acc[t] += w[0] * x0.x + w[1] * x0.y + w[2] * x0.z + w[3] * x0.w + w[4] * x1.x + w[5] * x1.y + w[6] * x1.z +
                w[7] * x1.w;
    }
  }
};
using FmtF16 = FmtHalfLike<false>;
using FmtBF16 = FmtHalfLike<true>;

// ---- 32-element formats: one piece per block ----------------------------------------------------

// Q8_0 (34 B, 2-byte aligned): [d:f16][qs:32 x i8].
struct FmtQ8_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 34, kPieceElems = 32;
  static constexpr bool kQ8 = true;
  template <int NT>
  __device__ static void dot(const uint8_t* chunk, int p, int64_t e_chunk, const ActRef& a, float (&acc)[NT]) {
    const uint8_t* b = chunk + p * kBlockBytes;
    const float d = half_bits_to_float(lds_u16(b));
    uint32_t qw[8];
    lds_run32_a2(b + 2, qw);  // the 32 qs bytes (2-byte aligned)
    int wq[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) wq[j] = int(qw[j]);
    const int64_t e = e_chunk + 32 * p;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      int xi[8];
      load_x32(a, t, e, xi);
      int s = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) s = __dp4a(wq[j], xi[j], s);
      acc[t] += d * load_ds(a, t, e).x * float(s);
    }
  }
};

// Q8_0 in the CUDA backend's grouped layout (layout.h: 8 blocks per 272-byte group, [qs 8 x 32][d
// 8 x 2]). A "block" here is a whole group (256 elements); piece pp (64 elements) is its blocks
// 2pp and 2pp + 1: 64 qs bytes at 64 pp (16-byte aligned), their two d at 256 + 4 pp. Per block
// the same sum and the same f32 expression as FmtQ8_0.
struct FmtQ8_0G {
  static constexpr int kBlockElems = 256, kBlockBytes = kQ8GroupBytes, kPieceElems = 64;
  static constexpr bool kQ8 = true;
  static constexpr bool kGrouped = true;
  static constexpr int kGroupElems = 256;
  // acc += the piece (64 weights: words q, d pair dd) times NT activations: load_x(t, x) gives
  // token t's 64 int8 values, load_d(t, x0, x1) the scales of its two 32-element blocks.
  template <int NT, class LoadX, class LoadD>
  __device__ static void piece_dot(const uint4 (&q)[4], uint32_t dd, LoadX&& load_x, LoadD&& load_d, float (&acc)[NT]) {
    const int w[16] = {int(q[0].x), int(q[0].y), int(q[0].z), int(q[0].w), int(q[1].x), int(q[1].y),
                       int(q[1].z), int(q[1].w), int(q[2].x), int(q[2].y), int(q[2].z), int(q[2].w),
                       int(q[3].x), int(q[3].y), int(q[3].z), int(q[3].w)};
    const float d0 = half_bits_to_float(dd & 0xFFFFu), d1 = half_bits_to_float(dd >> 16);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      int x[16];
      load_x(t, x);
      int s0 = 0, s1 = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s0 = __dp4a(w[j], x[j], s0);
        s1 = __dp4a(w[8 + j], x[8 + j], s1);
      }
      float x0, x1;
      load_d(t, x0, x1);
      acc[t] += d0 * x0 * float(s0);
      acc[t] += d1 * x1 * float(s1);
    }
  }
  template <int NT>
  __device__ static void dot(const uint8_t* chunk, int p, int64_t e_chunk, const ActRef& a, float (&acc)[NT]) {
    const int g = p >> 2, pp = p & 3;
    const uint8_t* b = chunk + g * kBlockBytes;
    const uint4 q[4] = {lds_u128(b + 64 * pp), lds_u128(b + 64 * pp + 16), lds_u128(b + 64 * pp + 32),
                        lds_u128(b + 64 * pp + 48)};
    const int64_t e = e_chunk + int64_t(g) * 256 + 64 * pp;
    piece_dot<NT>(
        q, lds_u32(b + kQ8GroupD + 4 * pp),
        [&](int t, int(&x)[16]) {
          int lo[8], hi[8];
          load_x32(a, t, e, lo);
          load_x32(a, t, e + 32, hi);
#pragma unroll
          for (int j = 0; j < 8; ++j) x[j] = lo[j], x[8 + j] = hi[j];
        },
        [&](int t, float& x0, float& x1) {
          x0 = load_ds(a, t, e).x;
          x1 = load_ds(a, t, e + 32).x;
        },
        acc);
  }

  // The direct kernel's lane API (gemv_direct.cuh): lane l decodes piece l % 4 of group l / 4 of
  // each row step (8 groups, 2048 elements): its 64 qs bytes and its d pair.
  static constexpr int kDirectLongDepth = 4;
  struct Lane {
    int base;  // the lane's qs within a row step
    int d;     // its d pair, from base
  };
  __device__ static Lane lane_of(int l) {
    const int pp = l % 4, base = l / 4 * kBlockBytes + 64 * pp;
    return Lane{base, kQ8GroupD + 4 * pp - 64 * pp};
  }
  struct Words {
    uint4 q[4];
    uint32_t d;
  };
  __device__ static void load(const uint8_t* p, const Lane& L, Words& w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w.q[i] = ldg_stream_u128(p + 16 * i);
    w.d = ldg_stream_u32(p + L.d);
  }
  template <int NT>
  __device__ static void dot_direct(const Words& w, const Lane&, const int8_t* xq, const float2* xds, int64_t cols,
                                    float (&acc)[NT]) {
    piece_dot<NT>(
        w.q, w.d,
        [&](int t, int(&x)[16]) {
          const int4* xp = reinterpret_cast<const int4*>(xq + t * cols);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int4 v = __ldg(xp + i);
            x[4 * i] = v.x, x[4 * i + 1] = v.y, x[4 * i + 2] = v.z, x[4 * i + 3] = v.w;
          }
        },
        [&](int t, float& x0, float& x1) {
          const float4 ds = __ldg(reinterpret_cast<const float4*>(xds + t * (cols / 32)));
          x0 = ds.x;
          x1 = ds.z;
        },
        acc);
  }
};

// Grouped Q8_0 for the direct kernel on rows of whole 2048-element steps (kFull; launch_direct
// picks it there, FmtQ8_0G elsewhere): the same bytes, another lane map. FmtQ8_0G's lane reads its
// 64 contiguous qs bytes in four 16-byte loads, so each load instruction of the warp takes 16 bytes
// from every other 32-byte sector, and each sector crosses from L2 twice (the loads bypass L1).
// Here load i of lane l reads 16 bytes of group 2i + l / 16: lanes 0-15 group 2i's 256 qs bytes in
// order, lanes 16-31 group 2i + 1's, so one instruction takes 512 contiguous qs bytes (17 sectors
// instead of 32). Word i of lane l is half l % 2 of block 16i + l / 2 of the step, whose activation
// is elements 512i + 16l.. (one 16-byte load) and scale ds[16i + l / 2]. The d pairs are loaded as
// in FmtQ8_0G (lane l: pair l % 4 of group l / 4, one word a lane, coalesced) and reach the lane
// that needs them by a shuffle. A block's exact int sum is split in two halves of 16 elements
// (in two lanes), each added as d_w * d_x * s: the same terms as FmtQ8_0G, summed in another order.
struct FmtQ8_0GC : FmtQ8_0G {
  // Ring depth on short rows at one token: 2 steps (72 registers, 7 blocks an SM) measured 0.4-1.3%
  // faster than 3 on the 8B Q8_0 decode (H100); long rows keep FmtQ8_0G's 4.
  static constexpr int kDirectShortDepth1 = 2, kDirectLongDepth1 = kDirectLongDepth;
  struct Lane {
    int base;  // word 0's offset within a row step (word i: + 2 * kBlockBytes * i)
    int d;     // the lane's own d pair, from base
    int src;   // word i's d pair is in lane src + 8 i
    int half;  // its half of that pair
  };
  __device__ static Lane lane_of(int l) {
    const int base = 16 * l + (l >= 16 ? 16 : 0);
    const int d = l / 4 * kBlockBytes + kQ8GroupD + 4 * (l % 4);
    return Lane{base, d - base, 4 * (l / 16) + (l % 16) / 4, (l / 2) % 2};
  }
  // The lane's activation offsets (elements of q, entries of ds) within a row step.
  __device__ static int2 act_offsets(int l) { return int2{16 * l, l / 2}; }
  __device__ static void load(const uint8_t* p, const Lane& L, Words& w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w.q[i] = ldg_stream_u128(p + 2 * kBlockBytes * i);
    w.d = ldg_stream_u32(p + L.d);
  }
  // Every lane of the warp must call it (the shuffles): kFull only.
  template <int NT>
  __device__ static void dot_direct(const Words& w, const Lane& L, const int8_t* xq, const float2* xds, int64_t cols,
                                    float (&acc)[NT]) {
    float dw[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t pair = __shfl_sync(0xffffffffu, w.d, L.src + 8 * i);
      dw[i] = half_bits_to_float(L.half ? pair >> 16 : pair & 0xFFFFu);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int4 x = __ldg(reinterpret_cast<const int4*>(xq + t * cols + 512 * i));
        const uint4& q = w.q[i];
        int s = __dp4a(int(q.x), x.x, 0);
        s = __dp4a(int(q.y), x.y, s);
        s = __dp4a(int(q.z), x.z, s);
        s = __dp4a(int(q.w), x.w, s);
        acc[t] += dw[i] * __ldg(&xds[t * (cols / 32) + 16 * i].x) * float(s);
      }
    }
  }
};

// Q4_0 / Q4_1 / Q5_0 / Q5_1 share the nibble order: byte j holds elements j (low) and j+16 (high).
// kHasMin: x = d*q + m (Q4_1, Q5_1); else x = d*(q - kOffset).
template <int kBytes, int kQhOff, int kQsOff, bool kHasMin, int kOffset>
struct FmtLegacy {
  static constexpr int kBlockElems = 32, kBlockBytes = kBytes, kPieceElems = 32;
  static constexpr bool kQ8 = true;
  static constexpr bool kFiveBit = kQhOff >= 0;
  template <int NT>
  __device__ static void dot(const uint8_t* chunk, int p, int64_t e_chunk, const ActRef& a, float (&acc)[NT]) {
    const uint8_t* b = chunk + p * kBlockBytes;
    const float d = half_bits_to_float(lds_u16(b));
    const float m = kHasMin ? half_bits_to_float(lds_u16(b + 2)) : 0.0f;
    uint32_t qh = 0;
    if constexpr (kFiveBit) qh = lds_u32_a2(b + kQhOff);
    int lo[4], hi[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t q4 = lds_u32_a2(b + kQsOff + 4 * j);
      uint32_t l = q4 & 0x0F0F0F0Fu, h = (q4 >> 4) & 0x0F0F0F0Fu;
      if constexpr (kFiveBit) {
        l |= spread4_to_bit4(qh >> (4 * j));
        h |= spread4_to_bit4(qh >> (16 + 4 * j));
      }
      lo[j] = int(l);
      hi[j] = int(h);
    }
    const int64_t e = e_chunk + 32 * p;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      int xi[8];
      load_x32(a, t, e, xi);
      int s = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) s = __dp4a(hi[j], xi[4 + j], __dp4a(lo[j], xi[j], s));
      const float2 ds = load_ds(a, t, e);
      if constexpr (kHasMin) {
        acc[t] += d * ds.x * float(s) + m * ds.y;
      } else {
        acc[t] += d * (ds.x * float(s) - float(kOffset) * ds.y);
      }
    }
  }
};
using FmtQ4_0 = FmtLegacy<18, -1, 2, false, 8>;
using FmtQ4_1 = FmtLegacy<20, -1, 4, true, 0>;
using FmtQ5_0 = FmtLegacy<22, 2, 6, false, 16>;
using FmtQ5_1 = FmtLegacy<24, 4, 8, true, 0>;

// ---- K-quants (256-element super-blocks) --------------------------------------------------------

// Q2_K (84 B, 4-byte aligned): piece = half h (128 elements) = 4 groups k of 32, each two
// 16-element sub-blocks with 4-bit scale and min. x = d*sc*q - dmin*mn, q in [0,3]; the min term
// needs the activation sum per 16, taken with a dp4a against ones.
struct FmtQ2_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 84, kPieceElems = 128;
  static constexpr bool kQ8 = true;
  template <int NT>
  __device__ static void dot(const uint8_t* chunk, int p, int64_t e_chunk, const ActRef& a, float (&acc)[NT]) {
    const int blk = p >> 1, h = p & 1;
    const uint8_t* b = chunk + blk * kBlockBytes;
    const float d = half_bits_to_float(lds_u16(b + 80)), dmin = half_bits_to_float(lds_u16(b + 82));
    const uint32_t sc[2] = {lds_u32(b + 8 * h), lds_u32(b + 8 * h + 4)};  // scales of sub-blocks 8h..8h+7
    uint32_t qw[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) qw[j] = lds_u32(b + 16 + 32 * h + 4 * j);
    const int64_t e0 = e_chunk + int64_t(blk) * 256 + 128 * h;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        int xi[8];
        load_x32(a, t, e0 + 32 * k, xi);
        int sq0 = 0, sq1 = 0, sa0 = 0, sa1 = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          sq0 = __dp4a(int((qw[j] >> (2 * k)) & 0x03030303u), xi[j], sq0);
          sa0 = __dp4a(0x01010101, xi[j], sa0);
          sq1 = __dp4a(int((qw[4 + j] >> (2 * k)) & 0x03030303u), xi[4 + j], sq1);
          sa1 = __dp4a(0x01010101, xi[4 + j], sa1);
        }
        const int s0 = int(ub(sc, 2 * k)), s1 = int(ub(sc, 2 * k + 1));
        const float dx = load_ds(a, t, e0 + 32 * k).x;
        sum += dx * (d * float((s0 & 0xF) * sq0 + (s1 & 0xF) * sq1) - dmin * float((s0 >> 4) * sa0 + (s1 >> 4) * sa1));
      }
      acc[t] += sum;
    }
  }
};

// Q3_K (110 B, 2-byte aligned): piece = half h. q = low2 + 4*hmask_bit - 4 in [-4,3], made
// signed per byte with sub_bytes; 6-bit scales (biased by 32) of the 8 sub-blocks 8h..8h+7.
struct FmtQ3_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 110, kPieceElems = 128;
  static constexpr bool kQ8 = true;
  template <int NT>
  __device__ static void dot(const uint8_t* chunk, int p, int64_t e_chunk, const ActRef& a, float (&acc)[NT]) {
    const int blk = p >> 1, h = p & 1;
    const uint8_t* b = chunk + blk * kBlockBytes;
    const float d = half_bits_to_float(lds_u16(b + 108));
    const uint32_t sw[3] = {lds_u32_a2(b + 96), lds_u32_a2(b + 100), lds_u32_a2(b + 104)};
    int sc[8];  // sub-block 8h + i: low 4 bits from byte i (nibble h), high 2 from byte 8 + i%4
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t lo = (ub(sw, i) >> (4 * h)) & 0xF;
      const uint32_t hi = (ub(sw, 8 + i % 4) >> (4 * h + 2 * (i / 4))) & 3;
      sc[i] = int(lo | hi << 4) - 32;
    }
    int wq[4][8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t q2 = lds_u32_a2(b + 32 + 32 * h + 4 * j);
      const uint32_t hm = lds_u32_a2(b + 4 * j);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t q = ((q2 >> (2 * k)) & 0x03030303u) | (((hm >> (4 * h + k)) & 0x01010101u) << 2);
        wq[k][j] = sub_bytes(q, 0x04040404u);
      }
    }
    const int64_t e0 = e_chunk + int64_t(blk) * 256 + 128 * h;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        int xi[8];
        load_x32(a, t, e0 + 32 * k, xi);
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          s0 = __dp4a(wq[k][j], xi[j], s0);
          s1 = __dp4a(wq[k][4 + j], xi[4 + j], s1);
        }
        sum += load_ds(a, t, e0 + 32 * k).x * float(sc[2 * k] * s0 + sc[2 * k + 1] * s1);
      }
      acc[t] += d * sum;
    }
  }
};

// 6-bit scale and min of sub-block j of Q4_K/Q5_K from the 12 scale bytes (words s0..s2). j is
// a run-time value: bytes are picked with selects, not by indexing an array, which would put the
// array in local memory.
__device__ __forceinline__ uint32_t byte_of3(uint32_t s0, uint32_t s1, uint32_t s2, int n) {
  const uint32_t w = n < 4 ? s0 : (n < 8 ? s1 : s2);
  return (w >> (8 * (n & 3))) & 0xFFu;
}
__device__ __forceinline__ void k_scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = int(byte_of3(s0, s1, s2, j) & 63);
    *mn = int(byte_of3(s0, s1, s2, j + 4) & 63);
  } else {
    const uint32_t hi = byte_of3(s0, s1, s2, j + 4);
    *sc = int((hi & 0xF) | ((byte_of3(s0, s1, s2, j - 4) >> 6) << 4));
    *mn = int((hi >> 4) | ((byte_of3(s0, s1, s2, j) >> 6) << 4));
  }
}

// Q4_K (144 B) and Q5_K (176 B), both 16-byte aligned: piece = pair pp (64 elements, sub-blocks
// 2pp (low nibbles) and 2pp+1 (high nibbles) of the same 32 qs bytes). x = d*sc*q - dmin*mn.
template <bool kFive>
struct FmtQ45_K {
  static constexpr int kBlockElems = 256, kBlockBytes = kFive ? 176 : 144, kPieceElems = 64;
  static constexpr int kQsOff = kFive ? 48 : 16;
  static constexpr bool kQ8 = true;
  // The 16-byte words one piece reads: the header (d, dmin, scales), Q5_K's two qh words, the
  // piece's two qs words. Blocks are 16-byte aligned, so the direct GEMV (gemv_direct.cuh) loads
  // them straight from global memory into registers.
  static constexpr int kPieceWords = kFive ? 5 : 3;
  __device__ static int piece_word_offset(int pp, int i) {
    if (i == 0) return 0;
    if (kFive && i < 3) return 16 * i;
    return kQsOff + 32 * pp + 16 * (i - (kFive ? 3 : 1));
  }
  // Q5_K: the fifth bits of the piece's values, from its two qh words, into bit 4 of each byte:
  // sub-block 2pp into lo, 2pp + 1 into hi.
  __device__ static void add_fifth_bits(const uint4 (&w)[kPieceWords], int pp, int (&lo)[8], int (&hi)[8]) {
    const uint4 h0 = w[1], h1 = w[2];
    const uint32_t qh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      lo[j] |= int(((qh[j] >> (2 * pp)) & 0x01010101u) << 4);
      hi[j] |= int(((qh[j] >> (2 * pp + 1)) & 0x01010101u) << 4);
    }
  }
  template <int NT>
  __device__ static void dot(const uint8_t* chunk, int p, int64_t e_chunk, const ActRef& a, float (&acc)[NT]) {
    const int blk = p >> 2, pp = p & 3;
    const uint8_t* b = chunk + blk * kBlockBytes;
    uint4 w[kPieceWords];
#pragma unroll
    for (int i = 0; i < kPieceWords; ++i) w[i] = lds_u128(b + piece_word_offset(pp, i));
    dot_words<NT>(w, pp, e_chunk + int64_t(blk) * 256 + 64 * pp, a, acc);
  }
  // Piece pp of a block from its words (above); e0: the piece's first element in the row.
  template <int NT>
  __device__ static void dot_words(const uint4 (&w)[kPieceWords], int pp, int64_t e0, const ActRef& a,
                                   float (&acc)[NT]) {
    const uint4 hd = w[0];  // d, dmin, scales[12]
    const float d = half_bits_to_float(hd.x & 0xFFFFu), dmin = half_bits_to_float(hd.x >> 16);
    int sc0, mn0, sc1, mn1;
    k_scale_min(hd.y, hd.z, hd.w, 2 * pp, &sc0, &mn0);
    k_scale_min(hd.y, hd.z, hd.w, 2 * pp + 1, &sc1, &mn1);
    const uint4 q0 = w[kPieceWords - 2], q1 = w[kPieceWords - 1];
    const uint32_t qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    int lo[8], hi[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      lo[j] = int(qw[j] & 0x0F0F0F0Fu);
      hi[j] = int((qw[j] >> 4) & 0x0F0F0F0Fu);
    }
    if constexpr (kFive) add_fifth_bits(w, pp, lo, hi);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      int x0[8], x1[8];
      load_x32(a, t, e0, x0);
      load_x32(a, t, e0 + 32, x1);
      int s0 = 0, s1 = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s0 = __dp4a(lo[j], x0[j], s0);
        s1 = __dp4a(hi[j], x1[j], s1);
      }
      const float2 ds0 = load_ds(a, t, e0), ds1 = load_ds(a, t, e0 + 32);
      acc[t] += d * (float(sc0 * s0) * ds0.x + float(sc1 * s1) * ds1.x) - dmin * (float(mn0) * ds0.y + float(mn1) * ds1.y);
    }
  }
  // The 6-bit scales (sc) and mins (mn) of sub-blocks 2c and 2c + 1 (low and high byte), from the
  // header word hd (d, dmin, scales[12]; quant/blocks.h): for c < 2 bytes 2c, 2c + 1 of scales[0..3]
  // and scales[4..7]; for c >= 2 the low 4 bits from scales[8..11] and the top 2 bits from bits 6..7
  // of scales[2c - 4..] and scales[2c..]. Both pairs sit at byte 2 (c & 1) of their word, so a
  // lane-constant c takes them with shifts, masks and selects, no branches.
  __device__ static void scale_min_pair(const uint4& hd, int c, uint32_t& sc, uint32_t& mn) {
    const int sh = 16 * (c & 1);
    const bool hi = c >= 2;
    const uint32_t A = (hd.y >> sh) & 0xFFFFu, B = (hd.z >> sh) & 0xFFFFu, C = (hd.w >> sh) & 0xFFFFu;
    const uint32_t mask = hi ? 0x0F0Fu : 0x3F3Fu, top = hi ? 0x3030u : 0u;
    sc = ((hi ? C : A) & mask) | ((A >> 2) & top);
    mn = ((hi ? (C >> 4) : B) & mask) | ((B >> 2) & top);
  }
  // Piece pp of a block for the direct GEMV (gemv_direct.cuh): the same arithmetic as
  // dot_words (bit-identical sums), with fewer instructions. pp is the lane's constant piece
  // index (lane & 3), so the scale bytes come from lane-constant shifts and selects (no branches
  // on j); xq: the piece's 64 int8 activations of token 0 (64-byte aligned), xds: its two
  // (d, d * sum) pairs (16-byte aligned); token t at xq + t * cols, xds + t * cols / 32. Q4_K's
  // high nibbles enter dp4a in place (bytes 16 * q, unsigned) and the sum is shifted back: exact.
  template <int NT>
  __device__ static void dot_lane(const uint4 (&w)[kPieceWords], int pp, const int8_t* xq, const float2* xds,
                                  int64_t cols, float (&acc)[NT]) {
    const uint4 hd = w[0];
    const float d = half_bits_to_float(hd.x & 0xFFFFu), dmin = half_bits_to_float(hd.x >> 16);
    uint32_t sc, mn;
    scale_min_pair(hd, pp, sc, mn);
    const int sc0 = int(sc & 0xFFu), sc1 = int(sc >> 8), mn0 = int(mn & 0xFFu), mn1 = int(mn >> 8);
    const uint4 q0 = w[kPieceWords - 2], q1 = w[kPieceWords - 1];
    const uint32_t qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    int lo[8], hi4[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      lo[j] = int(qw[j] & 0x0F0F0F0Fu);
      if constexpr (kFive) {
        hi4[j] = int((qw[j] >> 4) & 0x0F0F0F0Fu);
      } else {
        hi4[j] = int(qw[j] & 0xF0F0F0F0u);  // 16 * the high nibbles
      }
    }
    if constexpr (kFive) add_fifth_bits(w, pp, lo, hi4);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int4* xp = reinterpret_cast<const int4*>(xq + t * cols);
      const int4 a0 = __ldg(xp), a1 = __ldg(xp + 1), b0 = __ldg(xp + 2), b1 = __ldg(xp + 3);
      const float4 ds = __ldg(reinterpret_cast<const float4*>(xds + t * (cols / 32)));
      const int x0[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const int x1[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
      int s0 = 0, s1 = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s0 = __dp4a(lo[j], x0[j], s0);
        if constexpr (kFive) {
          s1 = __dp4a(hi4[j], x1[j], s1);
        } else {
          s1 = dp4a_us(uint32_t(hi4[j]), x1[j], s1);
        }
      }
      if constexpr (!kFive) s1 >>= 4;  // exact: a multiple of 16
      acc[t] += d * (float(sc0 * s0) * ds.x + float(sc1 * s1) * ds.z) - dmin * (float(mn0) * ds.y + float(mn1) * ds.w);
    }
  }
};

// The direct kernel's lane API (gemv_direct.cuh) for Q4_K / Q5_K: lane l decodes piece pp = l % 4
// of block l / 4 of each row step; its header words sit at fixed offsets from its block, its
// two qs words at a lane-constant offset.
template <bool kFive>
struct DirectQ45_K : FmtQ45_K<kFive> {
  using B = FmtQ45_K<kFive>;
  static constexpr int kW = B::kPieceWords;
  static constexpr int kDirectLongDepth = kFive ? 4 : 6;  // ring depth on long rows (launch_direct)
  struct Lane {
    int base;  // the lane's block within a row step
    int qs;    // its qs words, from base
    int pp;
  };
  __device__ static Lane lane_of(int l) {
    const int pp = l % 4;
    return Lane{l / 4 * B::kBlockBytes, B::piece_word_offset(pp, kW - 2), pp};
  }
  struct Words {
    uint4 w[kW];
  };
  __device__ static void load(const uint8_t* p, const Lane& L, Words& w) {
#pragma unroll
    for (int i = 0; i < kW - 2; ++i) w.w[i] = ldg_stream_u128(p + B::piece_word_offset(0, i));
    w.w[kW - 2] = ldg_stream_u128(p + L.qs);
    w.w[kW - 1] = ldg_stream_u128(p + L.qs + 16);
  }
  template <int NT>
  __device__ static void dot_direct(const Words& w, const Lane& L, const int8_t* xq, const float2* xds, int64_t cols,
                                    float (&acc)[NT]) {
    B::template dot_lane<NT>(w.w, L.pp, xq, xds, cols, acc);
  }
};

using FmtQ4_K = FmtQ45_K<false>;
using FmtQ5_K = FmtQ45_K<true>;

// Q4_K for the direct kernel on rows of whole steps (launch_direct; DirectQ45_K elsewhere), the
// coalesced lane map of FmtQ8_0GC: lane l (block l / 4, p = l % 4) reads qs words p and 4 + p of
// its block (bytes 16 p.. and 64 + 16 p.. of the 128), so one load instruction of the warp takes 64
// contiguous qs bytes of each block (2-3 sectors) where DirectQ45_K's took 16 bytes from each of 4
// sectors (each sector crossing from L2 twice). qs word w holds elements 64 (w / 2) + 16 (w % 2)
// + [0, 16) of sub-block 2 (w / 2) (low nibbles) and the same + 32 of sub-block 2 (w / 2) + 1
// (high nibbles): the lane has 16 elements of each sub-block of pair c = p / 2 (6-bit scales) and
// of pair c = 2 + p / 2 (split scales), all at the same byte offset 2 (p / 2) of the scale words.
// A sub-block's min term (its 32-element activation sum) is added by its lane of even p. The same
// exact int sums per 16 elements, scaled and summed in another order than DirectQ45_K.
struct DirectQ4_KC : FmtQ45_K<false> {
  using B = FmtQ45_K<false>;
  // Ring depths at one token measured on the 8B Q4_K_M decode (H100; short / long rows): 4 / 5
  // gave 420-421 tok/s, 3 / 6 (DirectQ45_K's) 404-405, 3 / 5 412, 4 / 6 413. Two tokens: 3 / 6.
  static constexpr int kDirectLongDepth = 6, kDirectShortDepth1 = 4, kDirectLongDepth1 = 5;
  struct Lane {
    int base;  // the lane's block within a row step
    int p;
  };
  __device__ static Lane lane_of(int l) { return Lane{l / 4 * B::kBlockBytes, l % 4}; }
  __device__ static int2 act_offsets(int l) {
    const int p = l % 4;
    return int2{l / 4 * 256 + 64 * (p / 2) + 16 * (p % 2), l / 4 * 8 + 2 * (p / 2)};
  }
  struct Words {
    uint4 hd, q0, q1;
  };
  __device__ static void load(const uint8_t* p, const Lane& L, Words& w) {
    w.hd = ldg_stream_u128(p);
    w.q0 = ldg_stream_u128(p + B::kQsOff + 16 * L.p);
    w.q1 = ldg_stream_u128(p + B::kQsOff + 64 + 16 * L.p);
  }
  template <int NT>
  __device__ static void dot_direct(const Words& w, const Lane& L, const int8_t* xq, const float2* xds, int64_t cols,
                                    float (&acc)[NT]) {
    const uint4 hd = w.hd;
    const float d = half_bits_to_float(hd.x & 0xFFFFu), dmin = half_bits_to_float(hd.x >> 16);
    const float min_on = L.p % 2 == 0 ? 1.0f : 0.0f;
    uint32_t sc_a, mn_a, sc_b, mn_b;
    B::scale_min_pair(hd, L.p / 2, sc_a, mn_a);      // sub-blocks 2 (p / 2), + 1
    B::scale_min_pair(hd, 2 + L.p / 2, sc_b, mn_b);  // sub-blocks 4 + 2 (p / 2), + 1
    const int sa0 = int(sc_a & 0xFFu), sa1 = int(sc_a >> 8), sb0 = int(sc_b & 0xFFu), sb1 = int(sc_b >> 8);
    const float ma0 = float(mn_a & 0xFFu), ma1 = float(mn_a >> 8), mb0 = float(mn_b & 0xFFu), mb1 = float(mn_b >> 8);
    const uint32_t qa[4] = {w.q0.x, w.q0.y, w.q0.z, w.q0.w}, qb[4] = {w.q1.x, w.q1.y, w.q1.z, w.q1.w};
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int8_t* x = xq + t * cols;
      const int4 xa0 = __ldg(reinterpret_cast<const int4*>(x)), xa1 = __ldg(reinterpret_cast<const int4*>(x + 32));
      const int4 xb0 = __ldg(reinterpret_cast<const int4*>(x + 128)), xb1 = __ldg(reinterpret_cast<const int4*>(x + 160));
      const float4 da = __ldg(reinterpret_cast<const float4*>(xds + t * (cols / 32)));
      const float4 db = __ldg(reinterpret_cast<const float4*>(xds + t * (cols / 32) + 4));
      const int va0[4] = {xa0.x, xa0.y, xa0.z, xa0.w}, va1[4] = {xa1.x, xa1.y, xa1.z, xa1.w};
      const int vb0[4] = {xb0.x, xb0.y, xb0.z, xb0.w}, vb1[4] = {xb1.x, xb1.y, xb1.z, xb1.w};
      int s_a0 = 0, s_a1 = 0, s_b0 = 0, s_b1 = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s_a0 = __dp4a(int(qa[j] & 0x0F0F0F0Fu), va0[j], s_a0);
        s_a1 = dp4a_us(qa[j] & 0xF0F0F0F0u, va1[j], s_a1);  // 16 * the high nibbles
        s_b0 = __dp4a(int(qb[j] & 0x0F0F0F0Fu), vb0[j], s_b0);
        s_b1 = dp4a_us(qb[j] & 0xF0F0F0F0u, vb1[j], s_b1);
      }
      s_a1 >>= 4;  // exact: a multiple of 16
      s_b1 >>= 4;
      acc[t] += d * (float(sa0 * s_a0) * da.x + float(sa1 * s_a1) * da.z + float(sb0 * s_b0) * db.x +
                     float(sb1 * s_b1) * db.z) -
                min_on * dmin * (ma0 * da.y + ma1 * da.w + mb0 * db.y + mb1 * db.w);
    }
  }
};

// Q6_K (210 B, 2-byte aligned): piece = (half h, pair kp) = 64 elements: groups k = kp and
// kp + 2 of half h share their 32 ql bytes (low / high nibbles); all four groups share the 32 qh
// bytes. q = low4 | high2 << 4 in [0,63], made signed (q - 32) per byte with sub_bytes. Four
// pieces per block, so 8 blocks (1680 B) give one piece per lane.
struct FmtQ6_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 210, kPieceElems = 64;
  static constexpr bool kQ8 = true;
  // The piece's signed 6-bit values from its 32 ql bytes and its half's 32 qh bytes (N = 8), or
  // from any run of N ql words and the qh words of the same positions.
  template <int N>
  __device__ static void unpack(const uint32_t (&lw)[N], const uint32_t (&hw)[N], int kp, int (&wl)[N], int (&wh)[N]) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const uint32_t ql = lw[j];
      const uint32_t hq = hw[j] >> (2 * kp);
      wl[j] = sub_bytes((ql & 0x0F0F0F0Fu) | ((hq << 4) & 0x30303030u), 0x20202020u);
      wh[j] = sub_bytes(((ql >> 4) & 0x0F0F0F0Fu) | (hq & 0x30303030u), 0x20202020u);
    }
  }
  // acc += the piece times NT activations: load_x(t, x0, x1) gives token t's int8 values of
  // groups kp / kp + 2 (32 each), load_d(t, d0, d1) their activation scales.
  template <int NT, class LoadX, class LoadD>
  __device__ static void piece_dot(const int (&wl)[8], const int (&wh)[8], uint32_t s_lo, uint32_t s_hi, float d,
                                   LoadX&& load_x, LoadD&& load_d, float (&acc)[NT]) {
    const int sc00 = int(int8_t(s_lo & 0xFF)), sc01 = int(int8_t(s_lo >> 8));
    const int sc20 = int(int8_t(s_hi & 0xFF)), sc21 = int(int8_t(s_hi >> 8));
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      int x0[8], x1[8];
      load_x(t, x0, x1);
      int s00 = 0, s01 = 0, s20 = 0, s21 = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s00 = __dp4a(wl[j], x0[j], s00);
        s01 = __dp4a(wl[4 + j], x0[4 + j], s01);
        s20 = __dp4a(wh[j], x1[j], s20);
        s21 = __dp4a(wh[4 + j], x1[4 + j], s21);
      }
      float d0, d1;
      load_d(t, d0, d1);
      acc[t] += d * (d0 * float(sc00 * s00 + sc01 * s01) + d1 * float(sc20 * s20 + sc21 * s21));
    }
  }
  // piece_dot with the activation of a staged kernel: groups kp / kp + 2 at row elements e_lo / e_lo + 64.
  template <int NT>
  __device__ static void piece_dot_act(const int (&wl)[8], const int (&wh)[8], uint32_t s_lo, uint32_t s_hi, float d,
                                       int64_t e_lo, const ActRef& a, float (&acc)[NT]) {
    const int64_t e_hi = e_lo + 64;
    piece_dot<NT>(
        wl, wh, s_lo, s_hi, d,
        [&](int t, int(&x0)[8], int(&x1)[8]) {
          load_x32(a, t, e_lo, x0);
          load_x32(a, t, e_hi, x1);
        },
        [&](int t, float& d0, float& d1) {
          d0 = load_ds(a, t, e_lo).x;
          d1 = load_ds(a, t, e_hi).x;
        },
        acc);
  }
  template <int NT>
  __device__ static void dot(const uint8_t* chunk, int p, int64_t e_chunk, const ActRef& a, float (&acc)[NT]) {
    const int blk = p >> 2, h = (p >> 1) & 1, kp = p & 1;
    const uint8_t* b = chunk + blk * kBlockBytes;
    const float d = half_bits_to_float(lds_u16(b + 208));
    // scales of sub-blocks 8h + 2k + {0,1} for k = kp and kp + 2
    const uint32_t s_lo = lds_u16(b + 192 + 8 * h + 2 * kp), s_hi = lds_u16(b + 192 + 8 * h + 2 * kp + 4);
    // The piece's 32 ql bytes and the half's 32 qh bytes (2-byte aligned: blocks are 210 B).
    uint32_t lw[8], hw[8];
    lds_run32_a2(b + 64 * h + 32 * kp, lw);
    lds_run32_a2(b + 128 + 32 * h, hw);
    int wl[8], wh[8];  // group k = kp (low nibbles), k = kp + 2 (high nibbles)
    unpack(lw, hw, kp, wl, wh);
    const int64_t e_lo = e_chunk + int64_t(blk) * 256 + 128 * h + 32 * kp;  // group k = kp
    piece_dot_act<NT>(wl, wh, s_lo, s_hi, d, e_lo, a, acc);
  }
};

// Q6_K in the CUDA backend's grouped layout (layout.h: 8 blocks per 1680-byte group, field by
// field, every ql / qh / scales run 16-byte aligned). Same pieces and the same arithmetic as
// FmtQ6_K (bit-identical sums), read with aligned loads: from a shared-memory chunk of whole
// groups (dot, the staged kernel) or straight from global memory (the direct kernel, lane API).
struct FmtQ6_KG : FmtQ6_K {
  static constexpr bool kGrouped = true;
  static constexpr int kGroupElems = 2048;
  static constexpr int kGroupBytes = kQ6kGroupBytes, kQh = kQ6kGroupQh, kScales = kQ6kGroupScales, kD = kQ6kGroupD;
  template <int NT>
  __device__ static void dot(const uint8_t* chunk, int p, int64_t e_chunk, const ActRef& a, float (&acc)[NT]) {
    const int blk = p >> 2, h = (p >> 1) & 1, kp = p & 1, bi = blk & 7;
    const uint8_t* g = chunk + (blk >> 3) * kGroupBytes;
    const float d = half_bits_to_float(lds_u16(g + kD + 2 * bi));
    const uint32_t s_lo = lds_u16(g + kScales + 16 * bi + 8 * h + 2 * kp);
    const uint32_t s_hi = lds_u16(g + kScales + 16 * bi + 8 * h + 2 * kp + 4);
    const uint4 l0 = lds_u128(g + 128 * bi + 64 * h + 32 * kp), l1 = lds_u128(g + 128 * bi + 64 * h + 32 * kp + 16);
    const uint4 h0 = lds_u128(g + kQh + 64 * bi + 32 * h), h1 = lds_u128(g + kQh + 64 * bi + 32 * h + 16);
    const uint32_t lw[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
    const uint32_t hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
    int wl[8], wh[8];
    unpack(lw, hw, kp, wl, wh);
    const int64_t e_lo = e_chunk + int64_t(blk) * 256 + 128 * h + 32 * kp;
    piece_dot_act<NT>(wl, wh, s_lo, s_hi, d, e_lo, a, acc);
  }

  // The direct kernel's lane API (gemv_direct.cuh): a row step is one group; lane l decodes piece
  // pp = l % 4 (h = pp / 2, kp = pp % 2) of block b = l / 4. Its 32 ql bytes start at 32 l, its
  // half's 32 qh bytes at 1024 + 32 (l / 2) (shared with the lane of the other kp: one load of the
  // warp), its scale pairs in the 8 bytes at 1536 + 16 b + 8 h, its d at 1664 + 2 b.
  static constexpr int kDirectLongDepth = 4;
  struct Lane {
    int base;        // 32 l: the lane's ql
    int qh, sc, d;   // from base
    int kp;
  };
  __device__ static Lane lane_of(int l) {
    const int b = l / 4, h = (l / 2) & 1, base = 32 * l;
    return Lane{base, kQh + 32 * (l / 2) - base, kScales + 16 * b + 8 * h - base, kD + 2 * b - base, l & 1};
  }
  struct Words {
    uint4 l0, l1, h0, h1;
    uint2 sc;
    uint32_t d;
  };
  __device__ static void load(const uint8_t* p, const Lane& L, Words& w) {
    w.l0 = ldg_stream_u128(p);
    w.l1 = ldg_stream_u128(p + 16);
    w.h0 = ldg_stream_u128(p + L.qh);
    w.h1 = ldg_stream_u128(p + L.qh + 16);
    w.sc = ldg_stream_u64(p + L.sc);
    w.d = ldg_stream_u16(p + L.d);
  }
  // xq / xds: the kernel's activation pointers for piece l (element 64 l of the step, token 0);
  // this piece's groups kp and kp + 2 start 32 kp before it and 64 elements later.
  template <int NT>
  __device__ static void dot_direct(const Words& w, const Lane& L, const int8_t* xq, const float2* xds, int64_t cols,
                                    float (&acc)[NT]) {
    const uint32_t lw[8] = {w.l0.x, w.l0.y, w.l0.z, w.l0.w, w.l1.x, w.l1.y, w.l1.z, w.l1.w};
    const uint32_t hw[8] = {w.h0.x, w.h0.y, w.h0.z, w.h0.w, w.h1.x, w.h1.y, w.h1.z, w.h1.w};
    int wl[8], wh[8];
    unpack(lw, hw, L.kp, wl, wh);
    const int sh = 16 * L.kp;
    const int8_t* x0p = xq - 32 * L.kp;
    const float2* d0p = xds - L.kp;
    piece_dot<NT>(
        wl, wh, (w.sc.x >> sh) & 0xFFFFu, (w.sc.y >> sh) & 0xFFFFu, half_bits_to_float(w.d),
        [&](int t, int(&x0)[8], int(&x1)[8]) {
          const int4* a = reinterpret_cast<const int4*>(x0p + t * cols);
          const int4 a0 = __ldg(a), a1 = __ldg(a + 1), b0 = __ldg(a + 4), b1 = __ldg(a + 5);
          x0[0] = a0.x; x0[1] = a0.y; x0[2] = a0.z; x0[3] = a0.w; x0[4] = a1.x; x0[5] = a1.y; x0[6] = a1.z; x0[7] = a1.w;
          x1[0] = b0.x; x1[1] = b0.y; x1[2] = b0.z; x1[3] = b0.w; x1[4] = b1.x; x1[5] = b1.y; x1[6] = b1.z; x1[7] = b1.w;
        },
        [&](int t, float& d0, float& d1) {
          const float2* q = d0p + t * (cols / 32);
          d0 = __ldg(q).x;
          d1 = __ldg(q + 2).x;
        },
        acc);
  }
};

// Grouped Q6_K for the direct kernel on rows of whole steps (one group), the coalesced lane map of
// FmtQ8_0GC: a lane decodes two 16-byte ql words, l and 32 + l (bytes 16 l.. and 512 + 16 l..), so
// each ql load instruction of the warp takes 512 contiguous bytes and each qh load 256 (FmtQ6_KG's
// lane reads its piece's 32 ql and 32 qh bytes in two loads each, 16 bytes from every other
// 16-byte word: each sector crossed from L2 twice). ql word w is 16 bytes s = w % 2 of piece (h, kp)
// = ((w % 8) / 4, (w / 2) % 2) of block w / 8: elements 128 h + 32 kp + 16 s + [0, 16) in the low
// nibbles (group kp), the same + 64 in the high ones (group kp + 2), with qh bytes 16 s.. of the
// block's half h and scales 8 h + 2 kp + s and + 4. Word 32 + l is the same place of block 4 + l / 8.
// The same exact int sums per 16 elements, scaled and summed in another order than FmtQ6_KG.
struct FmtQ6_KGC : FmtQ6_KG {
  // Two words per lane cost registers (long rows at FmtQ6_KG's depth 4: 156, 3 blocks an SM); depth
  // 3 (119) on long rows at one token measured 369.1 tok/s on the 8B Q6_K decode (H100) against
  // 363.2 at 4; 2 on short rows 360.5. Two tokens: FmtQ6_KG's 3 / 4.
  static constexpr int kDirectShortDepth1 = 3, kDirectLongDepth1 = 3;
  struct Lane {
    int base;       // 16 l: ql word l
    int qh, sc, d;  // word l's qh word, its block's 8 scale bytes of half h, its d; from base
    int kp, sel;    // sel = 2 kp + s: its scale byte in each 4-byte half of the 8
  };
  __device__ static Lane lane_of(int l) {
    const int b = l / 8, h = (l / 4) % 2, kp = (l / 2) % 2, s = l % 2, base = 16 * l;
    return Lane{base, kQh + 64 * b + 32 * h + 16 * s - base, kScales + 16 * b + 8 * h - base, kD + 2 * b - base, kp,
                2 * kp + s};
  }
  __device__ static int2 act_offsets(int l) {
    const int b = l / 8, h = (l / 4) % 2, kp = (l / 2) % 2, s = l % 2;
    return int2{256 * b + 128 * h + 32 * kp + 16 * s, 8 * b + 4 * h + kp};
  }
  struct Words {
    uint4 l[2], h[2];
    uint2 sc[2];
    uint32_t d[2];
  };
  __device__ static void load(const uint8_t* p, const Lane& L, Words& w) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // word l of blocks l / 8 and 4 + l / 8
      w.l[u] = ldg_stream_u128(p + 512 * u);
      w.h[u] = ldg_stream_u128(p + L.qh + 256 * u);
      w.sc[u] = ldg_stream_u64(p + L.sc + 64 * u);
      w.d[u] = ldg_stream_u16(p + L.d + 8 * u);
    }
  }
  template <int NT>
  __device__ static void dot_direct(const Words& w, const Lane& L, const int8_t* xq, const float2* xds, int64_t cols,
                                    float (&acc)[NT]) {
    int wl[2][4], wh[2][4], sl[2], sh[2];
    float dd[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const uint32_t lw[4] = {w.l[u].x, w.l[u].y, w.l[u].z, w.l[u].w};
      const uint32_t hw[4] = {w.h[u].x, w.h[u].y, w.h[u].z, w.h[u].w};
      unpack(lw, hw, L.kp, wl[u], wh[u]);
      sl[u] = int(int8_t((w.sc[u].x >> (8 * L.sel)) & 0xFFu));
      sh[u] = int(int8_t((w.sc[u].y >> (8 * L.sel)) & 0xFFu));
      dd[u] = half_bits_to_float(w.d[u]);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int8_t* x = xq + t * cols + 1024 * u;
        const float2* xd = xds + t * (cols / 32) + 32 * u;
        const int4 a = __ldg(reinterpret_cast<const int4*>(x)), b = __ldg(reinterpret_cast<const int4*>(x + 64));
        const int va[4] = {a.x, a.y, a.z, a.w}, vb[4] = {b.x, b.y, b.z, b.w};
        int s_lo = 0, s_hi = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          s_lo = __dp4a(wl[u][j], va[j], s_lo);
          s_hi = __dp4a(wh[u][j], vb[j], s_hi);
        }
        acc[t] += dd[u] * (float(sl[u] * s_lo) * __ldg(xd).x + float(sh[u] * s_hi) * __ldg(xd + 2).x);
      }
    }
  }
};

}  // namespace sluice::backend::cuda::gemv_detail
