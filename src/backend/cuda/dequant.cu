// dequantize_to_f16 (ops.h): any weight format -> f16 rows, the operand the prefill GEMM reads.
//
// Bandwidth: for every block format the output (2 bytes per element) outweighs the input (0.3 to
// 1.1 bytes per element), so the writes set the pace. Each thread step produces 8 consecutive
// output elements and stores them as one 16-byte write; a warp's 32 steps are 512 contiguous
// bytes. The input is read where it lies (no staging): a warp's 32 groups of 8 cover 256
// consecutive elements, i.e. one K-quant super-block or 8 legacy blocks, a contiguous byte range
// of at most 272 bytes, so its loads fall into a handful of sectors, and the scale bytes every
// thread of a block re-reads hit L1.
//
// Exactness: values are computed with the same f32 operations, in the same order and with the
// same single roundings as quant's scalar reference (the _rn intrinsics keep nvcc from fusing a
// multiply and an add into an FMA, which the reference, built for baseline x86-64, never does),
// then rounded to f16 to nearest even. The result is bit-identical to fp32_to_fp16(reference).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/layout.h"
#include "backend/cuda/ops.h"

namespace sluice::backend::cuda {

const char* gemv_type_name(quant::Type type);  // gemv.cu: format names for messages

namespace {

constexpr int kThreads = 256;
// Grid-stride loops cap the grid: a few waves of resident blocks on the largest GPUs, so huge
// matrices (a 70B FFN is 0.23 G elements) do not launch millions of short-lived blocks.
constexpr int64_t kMaxBlocks = 4096;
constexpr int kGroup = 8;  // output elements per thread step: one 16-byte f16 store

// ---- read-only loads at the alignment each block layout guarantees ------------------------------
// Blocks whose size is a multiple of 4 bytes (Q4_1 20, Q5_1 24, Q2_K 84, Q4_K 144, Q5_K 176) keep
// every field 4-byte aligned given a 4-byte aligned base; the others (Q4_0 18, Q5_0 22, Q8_0 34,
// Q3_K 110, Q6_K 210) only 2-byte aligned, so their words are assembled from 16-bit loads.
//
// The decoders and these helpers are also host functions (plain loads, plain f32 arithmetic, which
// the baseline x86-64 host build never fuses) so that their index and bit arithmetic can be
// checked against the reference on a machine without a GPU.
#define SLUICE_HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define SLUICE_UNROLL _Pragma("unroll")
#else
#define SLUICE_UNROLL
#endif

template <class T>
SLUICE_HD uint32_t ld_ro(const T* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}
SLUICE_HD uint32_t ld_u8(const uint8_t* p) { return ld_ro(p); }
SLUICE_HD uint32_t ld_u16(const uint8_t* p) { return ld_ro(reinterpret_cast<const uint16_t*>(p)); }
SLUICE_HD uint32_t ld_u32(const uint8_t* p) { return ld_ro(reinterpret_cast<const uint32_t*>(p)); }
SLUICE_HD uint32_t ld_u32_a2(const uint8_t* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }
SLUICE_HD float ld_f16(const uint8_t* p) { return __half2float(__ushort_as_half(uint16_t(ld_u16(p)))); }

// 8 consecutive bytes as two little-endian words; byte k is (w[k / 4] >> (8 * (k % 4))) & 0xFF.
template <int kAlign>
SLUICE_HD void ld_8(const uint8_t* p, uint32_t (&w)[2]) {
  static_assert(kAlign == 2 || kAlign == 4);
  if constexpr (kAlign == 4) {
    w[0] = ld_u32(p);
    w[1] = ld_u32(p + 4);
  } else {
    w[0] = ld_u32_a2(p);
    w[1] = ld_u32_a2(p + 4);
  }
}
SLUICE_HD uint32_t byte_of(const uint32_t (&w)[2], int k) { return (w[k >> 2] >> (8 * (k & 3))) & 0xFFu; }

// Single-rounding f32 operations: never contracted into an FMA.
SLUICE_HD float f_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SLUICE_HD float f_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SLUICE_HD float f_sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// ---- per-format decoding of elements [8j, 8j + 8) of one block ------------------------------------
// Layouts and bit positions: quant/blocks.h. Each decode mirrors the reference's expression for
// the value (ref_legacy.cpp, ref_kquants.cpp) operation for operation.

struct DecQ4_0 {  // x = (q - 8) * d
  static constexpr int kElems = 32, kBytes = 18, kAlign = 2;
  SLUICE_HD static void decode(const uint8_t* b, int j, float (&v)[kGroup]) {
    const float d = ld_f16(b);
    uint32_t w[2];
    ld_8<kAlign>(b + 2 + 8 * (j & 1), w);  // qs[l] holds element l (low nibble) and l + 16 (high)
    const int shift = 4 * (j >> 1);
    SLUICE_UNROLL
    for (int k = 0; k < kGroup; ++k) v[k] = f_mul(float(int((byte_of(w, k) >> shift) & 0xF) - 8), d);
  }
};

struct DecQ4_1 {  // x = q * d + m
  static constexpr int kElems = 32, kBytes = 20, kAlign = 4;
  SLUICE_HD static void decode(const uint8_t* b, int j, float (&v)[kGroup]) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
    uint32_t w[2];
    ld_8<kAlign>(b + 4 + 8 * (j & 1), w);
    const int shift = 4 * (j >> 1);
    SLUICE_UNROLL
    for (int k = 0; k < kGroup; ++k) v[k] = f_add(f_mul(float((byte_of(w, k) >> shift) & 0xF), d), m);
  }
};

// Q5_0/Q5_1: element e in [0, 32) has its low 4 bits in qs[e % 16] (nibble e / 16) and bit 4 in
// bit e of qh. Our elements e = 8j + k: qs index 8 (j & 1) + k, nibble j >> 1.
struct DecQ5_0 {  // x = (q - 16) * d
  static constexpr int kElems = 32, kBytes = 22, kAlign = 2;
  SLUICE_HD static void decode(const uint8_t* b, int j, float (&v)[kGroup]) {
    const float d = ld_f16(b);
    const uint32_t qh = ld_u32_a2(b + 2) >> (8 * j);
    uint32_t w[2];
    ld_8<kAlign>(b + 6 + 8 * (j & 1), w);
    const int shift = 4 * (j >> 1);
    SLUICE_UNROLL
    for (int k = 0; k < kGroup; ++k) {
      const int q = int(((byte_of(w, k) >> shift) & 0xF) | (((qh >> k) & 1) << 4));
      v[k] = f_mul(float(q - 16), d);
    }
  }
};

struct DecQ5_1 {  // x = q * d + m
  static constexpr int kElems = 32, kBytes = 24, kAlign = 4;
  SLUICE_HD static void decode(const uint8_t* b, int j, float (&v)[kGroup]) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
    const uint32_t qh = ld_u32(b + 4) >> (8 * j);
    uint32_t w[2];
    ld_8<kAlign>(b + 8 + 8 * (j & 1), w);
    const int shift = 4 * (j >> 1);
    SLUICE_UNROLL
    for (int k = 0; k < kGroup; ++k) {
      const uint32_t q = ((byte_of(w, k) >> shift) & 0xF) | (((qh >> k) & 1) << 4);
      v[k] = f_add(f_mul(float(q), d), m);
    }
  }
};

// A Q8_0 block from its d and its quants, wherever they lie (GGUF block or grouped layout).
template <int kAlign>
SLUICE_HD void decode_q8_0(const uint8_t* qs, const uint8_t* d_p, int j, float (&v)[kGroup]) {
  const float d = ld_f16(d_p);
  uint32_t w[2];
  ld_8<kAlign>(qs + 8 * j, w);
  SLUICE_UNROLL
  for (int k = 0; k < kGroup; ++k) v[k] = f_mul(float(int8_t(byte_of(w, k))), d);
}

struct DecQ8_0 {  // x = q * d
  static constexpr int kElems = 32, kBytes = 34, kAlign = 2;
  SLUICE_HD static void decode(const uint8_t* b, int j, float (&v)[kGroup]) { decode_q8_0<kAlign>(b + 2, b, j, v); }
};

// Grouped Q8_0 (layout.h): block `blk` of the flat run (rows are whole groups) at group blk / 8.
struct DecQ8_0G {
  static constexpr int kElems = 32, kBytes = 34;
  using Grouped = void;  // dequant_blocks_kernel calls decode_at
  SLUICE_HD static void decode_at(const uint8_t* w, uint64_t blk, int j, float (&v)[kGroup]) {
    const uint8_t* g = w + (blk / kGroupBlocks) * kQ8GroupBytes;
    const int b = int(blk % kGroupBlocks);
    decode_q8_0<4>(g + 32 * b, g + kQ8GroupD + 2 * b, j, v);
  }
};

// Q2_K, Q3_K and Q6_K number element i = 128h + 32k + l (h in {0,1}, k in [0,4), l in [0,32)).
// Our group j covers i = 8j .. 8j + 7: h = j / 16, k = (j / 4) % 4, l = 8 (j % 4) + [0, 8); all
// 8 lie in sub-block s = i / 16 = 8h + 2k + l / 16 = j / 2.
struct DecQ2_K {  // x = (d * sc) * q - (dmin * mn)
  static constexpr int kElems = 256, kBytes = 84, kAlign = 4;
  SLUICE_HD static void decode(const uint8_t* b, int j, float (&v)[kGroup]) {
    const int h = j >> 4, k = (j >> 2) & 3, l0 = 8 * (j & 3);
    const uint32_t sc = ld_u8(b + (j >> 1));  // scales[s]: sc low nibble, mn high
    const float dl = f_mul(ld_f16(b + 80), float(sc & 0xF));
    const float ml = f_mul(ld_f16(b + 82), float(sc >> 4));
    uint32_t w[2];
    ld_8<kAlign>(b + 16 + 32 * h + l0, w);  // qs[32h + l]
    SLUICE_UNROLL
    for (int e = 0; e < kGroup; ++e) v[e] = f_sub(f_mul(dl, float((byte_of(w, e) >> (2 * k)) & 3)), ml);
  }
};

struct DecQ3_K {  // x = (d * (sc - 32)) * q, q = lo + 4 hi - 4
  static constexpr int kElems = 256, kBytes = 110, kAlign = 2;
  SLUICE_HD static void decode(const uint8_t* b, int j, float (&v)[kGroup]) {
    const int h = j >> 4, k = (j >> 2) & 3, l0 = 8 * (j & 3), s = j >> 1;
    const uint8_t* scales = b + 96;
    const uint32_t lo4 = s < 8 ? (ld_u8(scales + s) & 0xF) : (ld_u8(scales + s - 8) >> 4);
    const uint32_t hi2 = (ld_u8(scales + 8 + (s & 3)) >> (2 * (s >> 2))) & 3;
    const float dl = f_mul(ld_f16(b + 108), float(int(lo4 | (hi2 << 4)) - 32));
    uint32_t qs[2], hm[2];
    ld_8<kAlign>(b + 32 + 32 * h + l0, qs);  // qs[32h + l]
    ld_8<kAlign>(b + l0, hm);                // hmask[l]
    const int hbit = 4 * h + k;
    SLUICE_UNROLL
    for (int e = 0; e < kGroup; ++e) {
      const int lo = int((byte_of(qs, e) >> (2 * k)) & 3);
      const int hi = int((byte_of(hm, e) >> hbit) & 1);
      v[e] = f_mul(dl, float(lo + 4 * hi - 4));
    }
  }
};

// Q4_K/Q5_K number element i = 64p + 32hi + l; sub-block (scale/min pair) i / 32. Our group j:
// sub-block j / 4, p = j / 8, hi = (j / 4) % 2, l = 8 (j % 4) + [0, 8).
SLUICE_HD void k_scale_min(const uint8_t* s, int sub, float d, float dmin, float* dl, float* ml) {
  uint32_t sc, mn;
  if (sub < 4) {
    sc = ld_u8(s + sub) & 63;
    mn = ld_u8(s + sub + 4) & 63;
  } else {
    const uint32_t a = ld_u8(s + sub + 4);
    sc = (a & 0xF) | ((ld_u8(s + sub - 4) >> 6) << 4);
    mn = (a >> 4) | ((ld_u8(s + sub) >> 6) << 4);
  }
  *dl = f_mul(d, float(sc));
  *ml = f_mul(dmin, float(mn));
}

struct DecQ4_K {  // x = (d * sc) * q - (dmin * mn)
  static constexpr int kElems = 256, kBytes = 144, kAlign = 4;
  SLUICE_HD static void decode(const uint8_t* b, int j, float (&v)[kGroup]) {
    const int sub = j >> 2, p = j >> 3, l0 = 8 * (j & 3), shift = 4 * (sub & 1);
    float dl, ml;
    k_scale_min(b + 4, sub, ld_f16(b), ld_f16(b + 2), &dl, &ml);
    uint32_t w[2];
    ld_8<kAlign>(b + 16 + 32 * p + l0, w);  // qs[32p + l]
    SLUICE_UNROLL
    for (int e = 0; e < kGroup; ++e) v[e] = f_sub(f_mul(dl, float((byte_of(w, e) >> shift) & 0xF)), ml);
  }
};

struct DecQ5_K {  // as Q4_K, bit 4 of element (p, hi, l) is bit 2p + hi = sub of qh[l]
  static constexpr int kElems = 256, kBytes = 176, kAlign = 4;
  SLUICE_HD static void decode(const uint8_t* b, int j, float (&v)[kGroup]) {
    const int sub = j >> 2, p = j >> 3, l0 = 8 * (j & 3), shift = 4 * (sub & 1);
    float dl, ml;
    k_scale_min(b + 4, sub, ld_f16(b), ld_f16(b + 2), &dl, &ml);
    uint32_t qs[2], qh[2];
    ld_8<kAlign>(b + 48 + 32 * p + l0, qs);  // qs[32p + l]
    ld_8<kAlign>(b + 16 + l0, qh);           // qh[l]
    SLUICE_UNROLL
    for (int e = 0; e < kGroup; ++e) {
      const uint32_t q = ((byte_of(qs, e) >> shift) & 0xF) | (((byte_of(qh, e) >> sub) & 1) << 4);
      v[e] = f_sub(f_mul(dl, float(q)), ml);
    }
  }
};

// A Q6_K block from its four fields (ql, qh, scales, d), wherever they lie: in the GGUF block
// (DecQ6_K) or in the CUDA backend's grouped layout (DecQ6_KG, layout.h). kAlign: of ql and qh.
template <int kAlign>
SLUICE_HD void decode_q6k(const uint8_t* ql_b, const uint8_t* qh_b, const uint8_t* sc_b, const uint8_t* d_p, int j,
                          float (&v)[kGroup]) {
  const int h = j >> 4, k = (j >> 2) & 3, l0 = 8 * (j & 3);
  const float dl = f_mul(ld_f16(d_p), float(int8_t(ld_u8(sc_b + (j >> 1)))));
  uint32_t ql[2], qh[2];
  ld_8<kAlign>(ql_b + 64 * h + 32 * (k & 1) + l0, ql);  // ql[64h + 32 (k & 1) + l]
  ld_8<kAlign>(qh_b + 32 * h + l0, qh);                 // qh[32h + l]
  const int lshift = 4 * (k >> 1), hshift = 2 * k;
  SLUICE_UNROLL
  for (int e = 0; e < kGroup; ++e) {
    const int q = int(((byte_of(ql, e) >> lshift) & 0xF) | (((byte_of(qh, e) >> hshift) & 3) << 4));
    v[e] = f_mul(dl, float(q - 32));
  }
}

struct DecQ6_K {  // x = (d * sc) * (q - 32)
  static constexpr int kElems = 256, kBytes = 210, kAlign = 2;
  SLUICE_HD static void decode(const uint8_t* b, int j, float (&v)[kGroup]) {
    decode_q6k<kAlign>(b, b + 128, b + 192, b + 208, j, v);
  }
};

// Grouped Q6_K (layout.h): block `blk` of the flat run (rows are whole groups) at group blk / 8.
struct DecQ6_KG {
  static constexpr int kElems = 256, kBytes = 210;
  using Grouped = void;  // dequant_blocks_kernel calls decode_at
  SLUICE_HD static void decode_at(const uint8_t* w, uint64_t blk, int j, float (&v)[kGroup]) {
    const uint8_t* g = w + (blk / kGroupBlocks) * kQ6kGroupBytes;
    const int b = int(blk % kGroupBlocks);
    decode_q6k<4>(g + 128 * b, g + kQ6kGroupQh + 64 * b, g + kQ6kGroupScales + 16 * b, g + kQ6kGroupD + 2 * b, j, v);
  }
};

// Eight f32 values -> f16 (round to nearest even) at dst. kVec: dst is 16-byte aligned, one
// 16-byte store; otherwise eight 2-byte stores.
template <bool kVec>
__device__ __forceinline__ void store_8(__half* dst, const float (&v)[kGroup]) {
  if constexpr (kVec) {
    uint32_t u[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      u[k] = uint32_t(__half_as_ushort(__float2half_rn(v[2 * k]))) |
             (uint32_t(__half_as_ushort(__float2half_rn(v[2 * k + 1]))) << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(u[0], u[1], u[2], u[3]);
  } else {
#pragma unroll
    for (int k = 0; k < kGroup; ++k) dst[k] = __float2half_rn(v[k]);
  }
}

// The rows of a block format are whole blocks laid end to end, so the matrix is one flat run of
// blocks and one flat run of output elements: group g (8 elements) is elements [8g, 8g + 8) of the
// output and elements [8 (g % G), ...) of block g / G, G = groups per block.
template <class F, bool kVec>
__global__ void __launch_bounds__(kThreads)
    dequant_blocks_kernel(const uint8_t* __restrict__ w, __half* __restrict__ dst, uint64_t ngroups) {
  constexpr uint64_t kGroupsPerBlock = F::kElems / kGroup;
  const uint64_t step = uint64_t(gridDim.x) * kThreads;
  for (uint64_t g = uint64_t(blockIdx.x) * kThreads + threadIdx.x; g < ngroups; g += step) {
    float v[kGroup];
    if constexpr (requires { typename F::Grouped; }) {
      F::decode_at(w, g / kGroupsPerBlock, int(g % kGroupsPerBlock), v);
    } else {
      F::decode(w + (g / kGroupsPerBlock) * F::kBytes, int(g % kGroupsPerBlock), v);
    }
    store_8<kVec>(dst + g * kGroup, v);
  }
}

// Float formats. kVec: source and destination 16-byte aligned and n a multiple of 8: 8 elements
// per step with 16-byte loads and stores. Otherwise one element per step with natural loads.
enum class FloatFmt { kF32, kF16, kBF16 };

template <FloatFmt kFmt>
__device__ __forceinline__ float load_float_elem(const void* w, uint64_t i) {
  if constexpr (kFmt == FloatFmt::kF32) {
    return __ldg(static_cast<const float*>(w) + i);
  } else if constexpr (kFmt == FloatFmt::kF16) {
    return half_bits_to_float(__ldg(static_cast<const uint16_t*>(w) + i));
  } else {
    return bf16_bits_to_float(__ldg(static_cast<const uint16_t*>(w) + i));
  }
}

template <FloatFmt kFmt, bool kVec>
__global__ void __launch_bounds__(kThreads)
    dequant_float_kernel(const void* __restrict__ w, __half* __restrict__ dst, uint64_t n) {
  const uint64_t step = uint64_t(gridDim.x) * kThreads;
  const uint64_t first = uint64_t(blockIdx.x) * kThreads + threadIdx.x;
  if constexpr (!kVec) {
    for (uint64_t i = first; i < n; i += step) dst[i] = __float2half_rn(load_float_elem<kFmt>(w, i));
  } else {
    const uint64_t ngroups = n / kGroup;
    for (uint64_t g = first; g < ngroups; g += step) {
      if constexpr (kFmt == FloatFmt::kF16) {
        // f16 -> f32 -> f16 is the identity on every non-NaN value: copy the bits.
        reinterpret_cast<uint4*>(dst)[g] = __ldg(static_cast<const uint4*>(w) + g);
      } else {
        float v[kGroup];
        if constexpr (kFmt == FloatFmt::kF32) {
          const float4 a = __ldg(static_cast<const float4*>(w) + 2 * g);
          const float4 b = __ldg(static_cast<const float4*>(w) + 2 * g + 1);
          v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        } else {
          const uint4 a = __ldg(static_cast<const uint4*>(w) + g);
          const uint32_t words[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            v[2 * k] = bf16_bits_to_float(words[k] & 0xFFFFu);
            v[2 * k + 1] = bf16_bits_to_float(words[k] >> 16);
          }
        }
        store_8<true>(dst + g * kGroup, v);
      }
    }
  }
}

int grid_for(uint64_t work_items) {
  return int(std::min<uint64_t>((work_items + kThreads - 1) / kThreads, uint64_t(kMaxBlocks)));
}

bool aligned_to(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

template <class F>
Status launch_blocks(const void* w, int64_t n, void* dst, cudaStream_t stream) {
  const uint64_t ngroups = uint64_t(n) / kGroup;  // n is a multiple of F::kElems, hence of 8
  const auto* src = static_cast<const uint8_t*>(w);
  auto* out = static_cast<__half*>(dst);
  if (aligned_to(dst, 16)) {
    dequant_blocks_kernel<F, true><<<grid_for(ngroups), kThreads, 0, stream>>>(src, out, ngroups);
  } else {
    dequant_blocks_kernel<F, false><<<grid_for(ngroups), kThreads, 0, stream>>>(src, out, ngroups);
  }
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("dequant_blocks_kernel");
  return Status::ok();
}

template <FloatFmt kFmt>
Status launch_float(const void* w, int64_t n, void* dst, cudaStream_t stream) {
  auto* out = static_cast<__half*>(dst);
  if (aligned_to(w, 16) && aligned_to(dst, 16) && n % kGroup == 0) {
    const uint64_t ngroups = uint64_t(n) / kGroup;
    dequant_float_kernel<kFmt, true><<<grid_for(ngroups), kThreads, 0, stream>>>(w, out, uint64_t(n));
  } else {
    dequant_float_kernel<kFmt, false><<<grid_for(uint64_t(n)), kThreads, 0, stream>>>(w, out, uint64_t(n));
  }
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("dequant_float_kernel");
  return Status::ok();
}

struct Layout {
  int64_t elems = 0;  // elements per block
  int64_t bytes = 0;  // bytes per block
  int64_t align = 1;  // alignment the kernel's loads need of the weight pointer
};
template <class F>
constexpr Layout layout() {
  static_assert(F::kBytes % F::kAlign == 0);
  return {F::kElems, F::kBytes, F::kAlign};
}

// Block layout of the formats this file decodes; elems == 0 for the others.
Layout layout_of(quant::Type type) {
  using T = quant::Type;
  switch (type) {
    case T::kF32: return {1, 4, 4};
    case T::kF16: return {1, 2, 2};
    case T::kBF16: return {1, 2, 2};
    case T::kQ4_0: return layout<DecQ4_0>();
    case T::kQ4_1: return layout<DecQ4_1>();
    case T::kQ5_0: return layout<DecQ5_0>();
    case T::kQ5_1: return layout<DecQ5_1>();
    case T::kQ8_0: return layout<DecQ8_0>();
    case T::kQ2_K: return layout<DecQ2_K>();
    case T::kQ3_K: return layout<DecQ3_K>();
    case T::kQ4_K: return layout<DecQ4_K>();
    case T::kQ5_K: return layout<DecQ5_K>();
    case T::kQ6_K: return layout<DecQ6_K>();
    default: return {};
  }
}

}  // namespace

bool dequantize_supported(quant::Type type) { return layout_of(type).elems != 0; }

Status dequantize_to_f16(quant::Type type, const void* w, int64_t rows, int64_t cols, void* dst,
                         cudaStream_t stream, bool grouped) {
  if (grouped && !groupable(type, cols)) {
    return invalid_argument(std::string("dequantize_to_f16: no grouped layout for ") + gemv_type_name(type) +
                            " rows of " + std::to_string(cols) + " columns");
  }
  // Grouped rows: whole groups, 16-byte aligned.
  const Layout lay = !grouped ? layout_of(type)
                     : type == quant::Type::kQ6_K ? Layout{DecQ6_KG::kElems, DecQ6_KG::kBytes, 16}
                                                  : Layout{DecQ8_0G::kElems, DecQ8_0G::kBytes, 16};
  if (lay.elems == 0) {
    return unsupported(std::string("dequantize_to_f16: no CUDA kernel for format ") + gemv_type_name(type));
  }
  const std::string what = std::string("dequantize_to_f16 ") + gemv_type_name(type) + ": ";
  if (rows < 0 || cols < 0 || cols % lay.elems != 0) {
    return invalid_argument(what + std::to_string(rows) + " rows x " + std::to_string(cols) +
                            " cols: cols must be a non-negative multiple of " + std::to_string(lay.elems));
  }
  const int64_t n = rows * cols;
  if (n == 0) return Status::ok();
  if (w == nullptr || dst == nullptr) return invalid_argument(what + "null pointer");
  // The loads assume the alignment the layout gives every field when the data starts where a
  // block may start (GGUF tensor data is 32-byte aligned; device allocations 256-byte).
  const uintptr_t w_align = uintptr_t(lay.align);
  if (!aligned_to(w, w_align) || !aligned_to(dst, 2)) {
    return invalid_argument(what + "weights must be " + std::to_string(w_align) +
                            "-byte aligned and dst 2-byte aligned");
  }
  using T = quant::Type;
  switch (type) {
    case T::kF32: return launch_float<FloatFmt::kF32>(w, n, dst, stream);
    case T::kF16: return launch_float<FloatFmt::kF16>(w, n, dst, stream);
    case T::kBF16: return launch_float<FloatFmt::kBF16>(w, n, dst, stream);
    case T::kQ4_0: return launch_blocks<DecQ4_0>(w, n, dst, stream);
    case T::kQ4_1: return launch_blocks<DecQ4_1>(w, n, dst, stream);
    case T::kQ5_0: return launch_blocks<DecQ5_0>(w, n, dst, stream);
    case T::kQ5_1: return launch_blocks<DecQ5_1>(w, n, dst, stream);
    case T::kQ8_0:
      return grouped ? launch_blocks<DecQ8_0G>(w, n, dst, stream) : launch_blocks<DecQ8_0>(w, n, dst, stream);
    case T::kQ2_K: return launch_blocks<DecQ2_K>(w, n, dst, stream);
    case T::kQ3_K: return launch_blocks<DecQ3_K>(w, n, dst, stream);
    case T::kQ4_K: return launch_blocks<DecQ4_K>(w, n, dst, stream);
    case T::kQ5_K: return launch_blocks<DecQ5_K>(w, n, dst, stream);
    case T::kQ6_K:
      return grouped ? launch_blocks<DecQ6_KG>(w, n, dst, stream) : launch_blocks<DecQ6_K>(w, n, dst, stream);
    default: break;
  }
  return internal_error(what + "layout without a kernel");
}

}  // namespace sluice::backend::cuda

#undef SLUICE_HD
#undef SLUICE_UNROLL
