// Host-side launch of gemv_kernel for one format: shape checks, chunk sizing, grid, token count
// dispatch. Included by the per-family .cu files (gemv_float.cu, gemv_legacy.cu, gemv_kquant.cu),
// which split the template instantiations so they compile in parallel.
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv.h"
#include "backend/cuda/gemv_direct.cuh"
#include "backend/cuda/gemv_kernel.cuh"

namespace sluice::backend::cuda {
const char* gemv_type_name(quant::Type type);  // for messages (gemv.cu)
}  // namespace sluice::backend::cuda

namespace sluice::backend::cuda::gemv_detail {

struct ChunkPlan {
  int cb = 0;       // blocks per chunk
  int nchunks = 0;  // chunks per row
};

// Chunks as even as possible (a short last chunk would carry few bytes and thin out what is in
// flight), each at most stage_bytes, each a multiple of `multiple` blocks: chunk starts stay
// 16-byte aligned, float pieces stay whole, and a chunk holds a multiple of 32 pieces so that no
// lane idles (Q6_K: 8 blocks = 32 pieces = 1680 B).
inline ChunkPlan plan_chunks(int64_t nb, int block_bytes, int multiple, int stage_bytes) {
  int64_t chunks = std::max<int64_t>(1, (nb * block_bytes + stage_bytes - 1) / stage_bytes);
  for (;; ++chunks) {
    int64_t cb = (nb + chunks - 1) / chunks;
    cb = (cb + multiple - 1) / multiple * multiple;
    if (cb * block_bytes <= stage_bytes || cb <= multiple) {
      return ChunkPlan{int(cb), int((nb + cb - 1) / cb)};
    }
  }
}

// The grid is persistent: exactly as many blocks as fit at once (the occupancy depends on each
// instantiation's registers: more tokens, more registers), so that the even row split is also an
// even split of bytes per SM and no second wave trails.
// Blocks of `kernel` resident per SM. It depends only on the instantiation (registers, shared
// memory) and the GPU architecture, so callers ask once per instantiation (a function-local
// static): the query costs microseconds of host time, and decode of a mixture of experts launches
// thousands of GEMVs per token.
template <class K>
int blocks_per_sm(K* kernel, int threads) {
  int v = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kernel, threads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    v = 1;
  }
  return std::max(v, 1);
}

template <class F, int NT, bool kAligned, class Cfg>
Status launch_one(const DeviceInfo& dev, cudaStream_t stream, const Segs& segs, int64_t row_bytes, int nb,
                  const ChunkPlan& plan, bool words = false) {
  auto* kernel = gemv_kernel<F, NT, kAligned, Cfg>;
  constexpr int kThreads = Cfg::kWarps * kWarpSize;
  static const int per_sm = blocks_per_sm(kernel, kThreads);  // immutable after initialization
  const int grid = int(std::min<int64_t>(int64_t(dev.sm_count) * per_sm, segs.row0[segs.n]));
  SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(kernel, dim3(unsigned(grid)), dim3(kThreads), 0, stream, segs, row_bytes, nb,
                                         plan.cb, plan.nchunks, words));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("gemv_kernel");
  return Status::ok();
}

// words: rows 2- or 4- but not 16-byte aligned (the kernel's 4-byte word copies).
template <class F, class Cfg>
Status launch_tokens(int tokens, const DeviceInfo& dev, cudaStream_t stream, const Segs& segs, int64_t row_bytes,
                     int nb, const ChunkPlan& plan, bool words = false) {
  static_assert(kMaxGemvTokens == 8);
  switch (tokens) {
    case 1: return launch_one<F, 1, true, Cfg>(dev, stream, segs, row_bytes, nb, plan, words);
    case 2: return launch_one<F, 2, true, Cfg>(dev, stream, segs, row_bytes, nb, plan, words);
    case 3: return launch_one<F, 3, true, Cfg>(dev, stream, segs, row_bytes, nb, plan, words);
    case 4: return launch_one<F, 4, true, Cfg>(dev, stream, segs, row_bytes, nb, plan, words);
    case 5: return launch_one<F, 5, true, Cfg>(dev, stream, segs, row_bytes, nb, plan, words);
    case 6: return launch_one<F, 6, true, Cfg>(dev, stream, segs, row_bytes, nb, plan, words);
    case 7: return launch_one<F, 7, true, Cfg>(dev, stream, segs, row_bytes, nb, plan, words);
    case 8: return launch_one<F, 8, true, Cfg>(dev, stream, segs, row_bytes, nb, plan, words);
    default: return invalid_argument("gemv: bad token count");
  }
}

// The direct kernel (gemv_direct.cuh): a persistent grid of kDirectWarps-warp blocks, one warp per
// row at a time.
// epi: the rope-and-store epilogue (gemv_direct_rope_kernel; a warp's rows go in pairs).
template <class F, int NT, int kDepth, bool kFull>
Status launch_direct_k(const DeviceInfo& dev, cudaStream_t stream, const Segs& segs, int64_t row_bytes, int nb,
                       const RopeEpi* epi) {
  constexpr int kThreads = kDirectWarps * kWarpSize;
  const int64_t rows = segs.row0[segs.n];
  const int npieces = nb * (F::kBlockElems / F::kPieceElems);
  if (epi != nullptr) {
    auto* kernel = gemv_direct_rope_kernel<F, NT, kDepth, kFull>;
    static const int per_sm = blocks_per_sm(kernel, kThreads);  // immutable after initialization
    const int64_t units = (rows / 2 + kDirectWarps - 1) / kDirectWarps;
    const int grid = int(std::min<int64_t>(int64_t(dev.sm_count) * per_sm, units));
    SLUICE_CUDA_RETURN_IF_ERROR(
        launch_pdl(kernel, dim3(unsigned(grid)), dim3(kThreads), 0, stream, segs, row_bytes, npieces, *epi));
    SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("gemv_direct_rope_kernel");
    return Status::ok();
  }
  auto* kernel = gemv_direct_kernel<F, NT, kDepth, kFull>;
  static const int per_sm = blocks_per_sm(kernel, kThreads);  // immutable after initialization
  const int grid = int(std::min<int64_t>(int64_t(dev.sm_count) * per_sm, (rows + kDirectWarps - 1) / kDirectWarps));
  SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(kernel, dim3(unsigned(grid)), dim3(kThreads), 0, stream, segs, row_bytes, npieces));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("gemv_direct_kernel");
  return Status::ok();
}
// Ring depth by shape, measured on an H200 with bench_gpu_gemv (docs/CUDA.md): 3 row steps (80
// registers for Q4_K, 6 blocks per SM) on rows of up to 8192 columns, where each warp gets many
// rows; on long rows (ffn_down: 14336, 28672 columns; few rows per warp) more steps in flight
// win: 6 for Q4_K, 4 for Q5_K (whose larger words cost more registers per step).
// Grouped Q6_K and Q8_0 (18-19 registers of words per step) take 4 on long rows, as Q5_K.
// Rows of whole steps take FullStepsOf<F> (Q4_K, grouped Q6_K and Q8_0: the coalesced lane maps of
// DirectQ4_KC, FmtQ6_KGC, FmtQ8_0GC) unless SLUICE_CUDA_GEMV_COALESCED=0 (A/B runs; read once per
// process). Their ring depths are their own at one token (kDirectShortDepth1, kDirectLongDepth1:
// measured on the 8B decode on an H100, docs/CUDA.md); at two tokens 3 on short rows and
// kDirectLongDepth on long ones (the depths their GPU tests ran at).
bool gemv_coalesced_enabled();

template <class F, int NT>
Status launch_direct(const DeviceInfo& dev, cudaStream_t stream, const Segs& segs, int64_t row_bytes, int nb,
                     bool coalesced, const RopeEpi* epi = nullptr) {
  constexpr int kLongDepth = F::kDirectLongDepth;
  const bool full = nb * (F::kBlockElems / F::kPieceElems) % kWarpSize == 0;
  const bool long_rows = int64_t(nb) * F::kBlockElems >= 12288;
  using FF = typename FullStepsOf<F>::type;
  if constexpr (!std::is_same_v<FF, F>) {
    if (full && coalesced) {
      constexpr int kShortDepth = NT == 1 ? FF::kDirectShortDepth1 : 3;
      constexpr int kLongDepthC = NT == 1 ? FF::kDirectLongDepth1 : FF::kDirectLongDepth;
      return long_rows ? launch_direct_k<FF, NT, kLongDepthC, true>(dev, stream, segs, row_bytes, nb, epi)
                       : launch_direct_k<FF, NT, kShortDepth, true>(dev, stream, segs, row_bytes, nb, epi);
    }
  }
  if (long_rows) {
    return full ? launch_direct_k<F, NT, kLongDepth, true>(dev, stream, segs, row_bytes, nb, epi)
                : launch_direct_k<F, NT, kLongDepth, false>(dev, stream, segs, row_bytes, nb, epi);
  }
  return full ? launch_direct_k<F, NT, 3, true>(dev, stream, segs, row_bytes, nb, epi)
              : launch_direct_k<F, NT, 3, false>(dev, stream, segs, row_bytes, nb, epi);
}

// The rope-and-store epilogue's own checks (the direct kernel's are the caller's) and its kernel
// parameters.
inline Status rope_epi_of(const GemvGroupArgs& g, RopeEpi& e) {
  const GemvRopeStore& r = *g.rope;
  if (r.head_dim <= 0 || r.head_dim % 2 != 0 || r.half < 0 || 2 * r.half > r.head_dim) {
    return unsupported("gemv rope epilogue: bad head_dim or rotary pairs");
  }
  if (g.tokens > 2) return unsupported("gemv rope epilogue: more than 2 tokens");
  for (int i = 0; i < g.n; ++i) {
    const int kind = r.kind[i];
    const int64_t rows = g.m[i].rows;
    if (kind != kEpiQ && kind != kEpiK && kind != kEpiV) return invalid_argument("gemv rope epilogue: bad matrix kind");
    if (rows % 2 != 0 || (kind != kEpiV && rows % r.head_dim != 0)) {
      return unsupported("gemv rope epilogue: rows not in pairs or not whole heads");
    }
    if (kind != kEpiQ && (r.cache[i] == nullptr || r.cache_stride[i] < rows)) {
      return invalid_argument("gemv rope epilogue: missing or narrow cache");
    }
    e.kind[i] = kind;
    e.cache[i] = static_cast<__half*>(r.cache[i]);
    e.cache_stride[i] = r.cache_stride[i];
  }
  e.head_dim = r.head_dim;
  e.half = r.half;
  e.theta_scale = r.theta_scale;
  e.freq_scale = r.freq_scale;
  e.freq_factors = r.freq_factors;
  e.pos0 = r.pos0;
  e.pos_dev = r.pos_dev;
  e.row_map = r.row_map;
  return Status::ok();
}

// The direct kernel is the default for the formats that have one, at 1..2 tokens: measured on an
// H200 (docs/CUDA.md), decode of Llama-3 8B and 70B Q4_K_M shapes is 7-12% faster with it on every
// matrix than with the staged shapes. (Alone in a loop, bench_gpu_gemv times it 5-10% behind the
// staged shapes on ffn_down; in the model, with its neighbours, it is ahead on every shape: with it
// only on the tall matrices the 70B decodes 10% slower than with it everywhere.) Variant
// kGemvDirect selects it explicitly (tests, bench_gpu_gemv --variants); SLUICE_CUDA_GEMV_DIRECT=0
// turns the default off (A/B runs). Read once per process.
bool gemv_direct_enabled();

// Measured on an H100 (docs/CUDA.md): the deep shape wins where every warp gets many rows
// (14336 and 128256 rows), the wide one on 4096-row matrices with long rows.
inline int pick_variant(int variant, int64_t rows) {
  if (variant == 0 || variant == 1) return variant;
  return rows >= 12288 ? 1 : 0;
}

// Formats of the grouped layout (layout.h): rows of whole groups, read only where aligned.
template <class F>
inline constexpr bool kGroupedFmt = requires { F::kGrouped; };

template <class F>
Status launch_gemv(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream) {
  static_assert(F::kBlockElems % F::kPieceElems == 0 || F::kPieceElems % F::kBlockElems == 0);
  static_assert(F::kBlockBytes <= CfgWide::kStageBytes);
  int64_t elem_multiple = std::max(F::kBlockElems, F::kPieceElems);
  if constexpr (kGroupedFmt<F>) elem_multiple = F::kGroupElems;
  if (g.n < 1 || g.n > kMaxGemvMatrices) {
    return invalid_argument("gemv: " + std::to_string(g.n) + " matrices in one launch (1.." +
                            std::to_string(kMaxGemvMatrices) + ")");
  }
  if (g.cols <= 0 || g.cols % elem_multiple != 0) {
    return invalid_argument("gemv " + std::string(gemv_type_name(g.type)) + ": cols " + std::to_string(g.cols) +
                            " must be a positive multiple of " + std::to_string(elem_multiple));
  }
  if (g.tokens < 1 || g.tokens > kMaxGemvTokens) {
    return invalid_argument("gemv: tokens " + std::to_string(g.tokens) + " outside 1.." + std::to_string(kMaxGemvTokens));
  }
  if (g.variant < -1 || g.variant >= kGemvVariants) return invalid_argument("gemv: bad launch variant");
  const int64_t nb64 = g.cols / F::kBlockElems;
  if (nb64 > (int64_t(1) << 30)) return invalid_argument("gemv: row too long");
  const int nb = int(nb64);
  const int64_t row_bytes = nb64 * F::kBlockBytes;

  Segs segs;
  bool aligned = row_bytes % 16 == 0;
  bool ds16 = true;  // every activation's (d, d * sum) pairs 16-byte aligned (the direct kernel's float4 loads)
  for (int i = 0; i < g.n; ++i) {
    const GemvMatrix& mx = g.m[i];
    if (mx.rows < 0) return invalid_argument("gemv: negative row count");
    if (mx.w == nullptr || mx.y == nullptr) return invalid_argument("gemv: null weight or output pointer");
    if constexpr (F::kQ8) {
      if (mx.xq.q == nullptr || mx.xq.ds == nullptr || mx.xq.cols != g.cols || mx.xq.tokens < g.tokens) {
        return invalid_argument("gemv: quantized activation missing or of the wrong shape");
      }
      if (reinterpret_cast<uintptr_t>(mx.xq.q) % 16 != 0 || reinterpret_cast<uintptr_t>(mx.xq.ds) % 8 != 0) {
        return invalid_argument("gemv: quantized activation must be 16-byte aligned");
      }
    } else {
      if (mx.x == nullptr || reinterpret_cast<uintptr_t>(mx.x) % 16 != 0) {
        return invalid_argument("gemv: f32 activation missing or not 16-byte aligned");
      }
    }
    aligned = aligned && reinterpret_cast<uintptr_t>(mx.w) % 16 == 0;
    if constexpr (F::kQ8) ds16 = ds16 && reinterpret_cast<uintptr_t>(mx.xq.ds) % 16 == 0;
    segs.w[segs.n] = static_cast<const uint8_t*>(mx.w);
    segs.y[segs.n] = mx.y;
    segs.a[segs.n] = ActRef{mx.x, mx.xq.q, mx.xq.ds, g.cols};
    segs.row0[segs.n + 1] = segs.row0[segs.n] + mx.rows;
    ++segs.n;
  }
  const int64_t rows = segs.row0[segs.n];
  if (rows == 0) return Status::ok();

  // Rows whose byte length (or start) is not a multiple of 16 are copied in 4-byte words through
  // the same launches, where every weight starts on a word (formats with 2-byte aligned blocks:
  // Q4_1 and Q8_0 at 576 columns, SmolLM2's every matrix; Q6_K at an odd number of blocks, e.g.
  // 3840 or 5376 columns, where rows are only 2-byte aligned and a chunk starts 2 bytes into its
  // first word). Anything else takes the slow general path below.
  bool word_ptrs = row_bytes % 2 == 0;
  for (int i = 0; i < segs.n; ++i) word_ptrs = word_ptrs && reinterpret_cast<uintptr_t>(segs.w[i]) % 4 == 0;
  const int copy = aligned ? 16 : kHasWords<F> && !kGroupedFmt<F> && word_ptrs ? (row_bytes % 4 == 0 ? 4 : 2) : 1;

  // Blocks per chunk must be a multiple of: the copy width's alignment of chunk starts (16 or 4;
  // none for 2-byte rows, whose chunks may start 2 bytes into a word), whole float pieces, and 32
  // pieces per chunk where that fits.
  const int align_blocks = copy == 2 ? 1 : copy / std::gcd(F::kBlockBytes, copy);
  const int piece_blocks = std::max(1, F::kPieceElems / F::kBlockElems);
  const int lane_blocks = 32 * F::kPieceElems / std::gcd(32 * F::kPieceElems, F::kBlockElems);
  const bool deep = copy >= 2 && pick_variant(g.variant, rows) == 1;
  // 2-byte rows: a chunk and the 2 bytes before and after it share the stage.
  const int stage_bytes = (deep ? CfgDeep::kStageBytes : CfgWide::kStageBytes) - (copy == 2 ? 4 : 0);
  int multiple = std::lcm(align_blocks, piece_blocks);
  if (std::lcm(multiple, lane_blocks) * F::kBlockBytes <= stage_bytes) multiple = std::lcm(multiple, lane_blocks);
  const ChunkPlan plan = plan_chunks(nb, F::kBlockBytes, multiple, stage_bytes);
  if constexpr (kGroupedFmt<F>) {
    if (!aligned) return invalid_argument("gemv: grouped weights must be 16-byte aligned");
  }
  using D = typename DirectOf<F>::type;
  if constexpr (!std::is_void_v<D>) {
    const bool direct = g.variant == kGemvDirect || g.variant == kGemvDirectPieceLanes ||
                        (g.variant == -1 && gemv_direct_enabled());
    const bool coalesced = g.variant != kGemvDirectPieceLanes && gemv_coalesced_enabled();
    if (aligned && ds16 && rows <= INT32_MAX && direct && g.tokens <= 2) {
      if (g.rope != nullptr) {
        RopeEpi e;
        SLUICE_RETURN_IF_ERROR(rope_epi_of(g, e));
        if (g.check_only) return Status::ok();
        return g.tokens == 1 ? launch_direct<D, 1>(dev, stream, segs, row_bytes, nb, coalesced, &e)
                             : launch_direct<D, 2>(dev, stream, segs, row_bytes, nb, coalesced, &e);
      }
      return g.tokens == 1 ? launch_direct<D, 1>(dev, stream, segs, row_bytes, nb, coalesced)
                           : launch_direct<D, 2>(dev, stream, segs, row_bytes, nb, coalesced);
    }
  }
  if (g.rope != nullptr) {
    return unsupported(std::string("gemv rope epilogue: no direct kernel for this call (") + gemv_type_name(g.type) +
                       ", " + std::to_string(g.tokens) + " tokens)");
  }
  if (copy >= 2) {
    return deep ? launch_tokens<F, CfgDeep>(g.tokens, dev, stream, segs, row_bytes, nb, plan, copy < 16)
                : launch_tokens<F, CfgWide>(g.tokens, dev, stream, segs, row_bytes, nb, plan, copy < 16);
  }
  // Slow general path, one launch per matrix and token (the weight bytes are re-read per token).
  for (int i = 0; i < g.n; ++i) {
    const GemvMatrix& mx = g.m[i];
    for (int t = 0; t < g.tokens; ++t) {
      Segs one;
      one.n = 1;
      one.row0[1] = mx.rows;
      one.w[0] = static_cast<const uint8_t*>(mx.w);
      one.y[0] = mx.y + t * mx.rows;
      one.a[0] = ActRef{mx.x ? mx.x + t * g.cols : nullptr, mx.xq.q ? mx.xq.q + t * g.cols : nullptr,
                        mx.xq.ds ? mx.xq.ds + t * (g.cols / 32) : nullptr, g.cols};
      if (mx.rows == 0) continue;
      const Status st = launch_one<F, 1, false, CfgWide>(dev, stream, one, row_bytes, nb, plan);
      if (!st.is_ok()) return st;
    }
  }
  return Status::ok();
}

}  // namespace sluice::backend::cuda::gemv_detail

namespace sluice::backend::cuda {
// One per family .cu file; gemv() in gemv.cu dispatches on the type.
Status gemv_float_formats(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream);
Status gemv_legacy_formats(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream);
Status gemv_k_formats(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream);
Status gemv_k45_formats(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream);
Status gemv_k6_format(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream);
}  // namespace sluice::backend::cuda
