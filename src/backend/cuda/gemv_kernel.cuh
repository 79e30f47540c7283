// The one streaming GEMV kernel every weight format runs through. Per-format block decoding lives
// in gemv_formats.cuh; this file moves bytes.
//
// Why stage through shared memory: most GGUF block sizes are not multiples of 16 bytes (Q8_0 34,
// Q6_K 210, Q3_K 110, ...), so a thread that reads "its" block straight from global memory cannot
// use 16-byte loads. Here each warp streams a contiguous byte range of its row (a chunk of whole
// blocks, chunk starts 16-byte aligned) with 16-byte cp.async copies, lanes side by side (fully
// coalesced, L1 bypassed), Cfg::kStages chunks deep, and decodes the blocks from shared memory, where
// 2-byte alignment costs only extra shared loads.
//
// Work split: a persistent grid (as many blocks as are resident at once: 4 per SM at <= 64
// registers, 4 * 48 KB fitting the 228 KB of an H100 SM) over the rows of all the launch's
// matrices (Q, K and V, or gate and up, or several experts: one launch); block b owns rows
// [b*rows/G, (b+1)*rows/G) so every SM gets the same bytes to within one row, and warp w of the
// block takes rows w, w + kWarps, ... of that range. A warp's chunk stream runs across its rows
// without draining, so kStages-1 chunks (up to 4 KB per warp, 128 KB per SM) stay in flight.
#pragma once

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_formats.cuh"

namespace sluice::backend::cuda::gemv_detail {

// Two launch shapes, both 48 KB of static shared memory per block and 4 blocks per SM:
//   kWide:  8 warps, 3 stages of 2 KB per warp (32 warps per SM, more warps to hide latency)
//   kDeep:  4 warps, 3 stages of 4 KB per warp (16 warps per SM, two or more pieces per lane per
//           chunk, so each lane has independent work in flight; up to 128 registers per thread)
// Both keep 2 chunks per warp in flight: 128 KB per SM. (Measured and dropped, 2026-11-25: two
// rows per warp sharing each activation load, 8 or 4 warps: slower on every shape, 2-27%.)
struct CfgWide {
  static constexpr int kWarps = 8, kStages = 3, kStageBytes = 2048;
};
struct CfgDeep {
  static constexpr int kWarps = 4, kStages = 3, kStageBytes = 4096;
};
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
// The 4-byte form goes through L1 (.ca: the only cache mode of copies under 16 bytes).
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The matrices of one launch (kernel parameters): matrix m owns global rows [row0[m], row0[m+1]),
// its weight w[m] (row r at w[m] + (r - row0[m]) * row_bytes), activation a[m] and output y[m]
// ([tokens][rows of m]). Every matrix has the same format and column count.
inline constexpr int kMaxSegs = 16;
struct Segs {
  int n = 0;
  int64_t row0[kMaxSegs + 1] = {};
  const uint8_t* w[kMaxSegs] = {};
  float* y[kMaxSegs] = {};
  ActRef a[kMaxSegs] = {};
};
// The matrix holding global row `row` (n <= kMaxSegs: a scan of the parameter bank).
__device__ __forceinline__ int seg_of(const Segs& s, int64_t row) {
  int m = 0;
  while (m + 1 < s.n && row >= s.row0[m + 1]) ++m;
  return m;
}

// Shapes (host-checked): cols = nb * F::kBlockElems; chunk = cb blocks, cb * kBlockBytes <=
// kStageBytes; nchunks = ceil(nb / cb). kAligned: chunks are copied with cp.async, 16 bytes a lane
// (every w, row_bytes and cb * kBlockBytes multiples of 16), or in 4-byte words where `words`
// (every w a multiple of 4, row_bytes of 2: rows of 2-byte-aligned blocks whose length is not a
// multiple of 16, e.g. Q4_1 or Q8_0 at 576 columns, Q6_K at 3840; a runtime flag, so it costs no
// instantiations; the host leaves 4 bytes of each stage free). Else bytes are copied one at a time:
// the slow, general path.
template <class F>
inline constexpr bool kHasWords = F::kBlockBytes % 16 != 0;  // rows can be 2- or 4- but not 16-byte aligned
// The first weight byte of chunk c (cb blocks a chunk) of global row `row`, in matrix m.
template <class F>
__device__ __forceinline__ const uint8_t* chunk_src(const Segs& segs, int m, int64_t row, int64_t row_bytes, int c,
                                                    int cb) {
  return segs.w[m] + (row - segs.row0[m]) * row_bytes + int64_t(c) * cb * F::kBlockBytes;
}
// The chunk's byte offset past its 4-byte word: where the word copies leave its first byte in the
// stage.
template <class F>
__device__ __forceinline__ int word_head(const Segs& segs, int m, int64_t row, int64_t row_bytes, int c, int cb) {
  return int(reinterpret_cast<uintptr_t>(chunk_src<F>(segs, m, row, row_bytes, c, cb)) & 3);
}
template <class F, int NT, bool kAligned, class Cfg>
__global__ void __launch_bounds__(Cfg::kWarps * kWarpSize) gemv_kernel(const __grid_constant__ Segs segs,
                                                        int64_t row_bytes, int nb, int cb, int nchunks,
                                                        bool words) {
  constexpr int kWarps = Cfg::kWarps, kStages = Cfg::kStages, kStageBytes = Cfg::kStageBytes;
  __shared__ alignas(16) uint8_t stage[kWarps][kStages][kStageBytes];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t rows = segs.row0[segs.n];
  const int64_t r_begin = int64_t(blockIdx.x) * rows / gridDim.x;
  const int64_t r_end = int64_t(blockIdx.x + 1) * rows / gridDim.x;
  const int64_t first_row = r_begin + warp;
  const int64_t my_rows = first_row < r_end ? (r_end - first_row - 1) / kWarps + 1 : 0;
  const int64_t total = my_rows * nchunks;  // chunks this warp streams

  auto issue = [&](int64_t i) {
    const int64_t row = first_row + (i / nchunks) * kWarps;
    const int m = seg_of(segs, row);
    const int c = int(i % nchunks);
    const int nblk = min(cb, nb - c * cb);
    const int bytes = nblk * F::kBlockBytes;
    const uint8_t* src = chunk_src<F>(segs, m, row, row_bytes, c, cb);
    uint8_t* dst = stage[warp][i % kStages];
    if constexpr (kAligned && kHasWords<F>) {
      if (words) {
        // The words covering [src, src + bytes): src may sit 2 bytes past a word boundary (rows of
        // an odd number of 2-mod-4-byte blocks), and the chunk's bytes start at dst + head. The 2
        // bytes before src lie in the matrix (w is word-aligned, so src is not its first byte), and
        // so do the 2 after the chunk's end, except at the end of the matrix: there the last
        // 2 bytes are loaded on their own, so nothing past the matrix is read.
        const int head = int(reinterpret_cast<uintptr_t>(src) & 3);
        const uint8_t* s4 = src - head;
        const int span = head + bytes;  // even: head is 0 or 2, blocks are whole
        const bool at_end = src + bytes == segs.w[m] + (segs.row0[m + 1] - segs.row0[m]) * row_bytes;
        const int nwords = at_end ? span / 4 : (span + 3) / 4;
        for (int w = lane; w < nwords; w += kWarpSize) cp_async_4(dst + 4 * w, s4 + 4 * w);
        if (at_end && (span & 3) != 0 && lane == 0) {
          *reinterpret_cast<uint16_t*>(dst + 4 * nwords) = *reinterpret_cast<const uint16_t*>(s4 + 4 * nwords);
        }
      } else {
        for (int off = lane * 16; off < bytes; off += kWarpSize * 16) cp_async_16(dst + off, src + off);
      }
    } else if constexpr (kAligned) {
      for (int off = lane * 16; off < bytes; off += kWarpSize * 16) cp_async_16(dst + off, src + off);
    } else {
      for (int off = lane; off < bytes; off += kWarpSize) dst[off] = src[off];
    }
  };

  pdl_trigger();  // a following GEMV may start streaming its weights as SMs free up
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < total) issue(s);
    cp_async_commit();  // empty groups keep the group count uniform
  }
  // Launched as a programmatic dependent (launch_pdl): the first weight chunks are on their
  // way while the kernel before this one (the norm or SwiGLU that makes the activation) finishes;
  // from here on the activation and the outputs are touched.
  pdl_wait();

  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;

  for (int64_t i = 0; i < total; ++i) {
    if (i + kStages - 1 < total) issue(i + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // chunk i has landed (for this lane's copies)
    __syncwarp();                  // ... and for every lane's

    const int64_t row = first_row + (i / nchunks) * kWarps;
    const int m = seg_of(segs, row);
    const ActRef& a = segs.a[m];
    const int c = int(i % nchunks);
    const int nblk = min(cb, nb - c * cb);
    const uint8_t* buf = stage[warp][i % kStages];
    if constexpr (kAligned && kHasWords<F>) {
      if (words) buf += word_head<F>(segs, m, row, row_bytes, c, cb);
    }
    const int npieces = nblk * F::kBlockElems / F::kPieceElems;
    const int64_t e_chunk = int64_t(c) * cb * F::kBlockElems;  // first element of the chunk in the row
    // Two pieces per step: their shared loads, activation loads and dp4a chains are independent,
    // so the scheduler overlaps them (one piece alone is a chain of dependent latencies).
    int p = lane;
    for (; p + kWarpSize < npieces; p += 2 * kWarpSize) {
      F::template dot<NT>(buf, p, e_chunk, a, acc);
      F::template dot<NT>(buf, p + kWarpSize, e_chunk, a, acc);
    }
    if (p < npieces) F::template dot<NT>(buf, p, e_chunk, a, acc);

    if (c == nchunks - 1) {
      const int64_t seg_rows = segs.row0[m + 1] - segs.row0[m];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float s = warp_sum(acc[t]);
        if (lane == 0) segs.y[m][int64_t(t) * seg_rows + (row - segs.row0[m])] = s;
        acc[t] = 0.0f;
      }
    }
    __syncwarp();  // every lane is done with this buffer before it is refilled
  }
  cp_async_wait<0>();
}

}  // namespace sluice::backend::cuda::gemv_detail
