// Decode attention (1..kDecodeMaxTokens query rows): flash-decoding. The key range of each query
// row is cut into splits so that even one KV head at a long context spreads over every SM; each
// block scores its split for up to kMaxHeadsPerBlock query heads of one KV head, keeps an f32
// running max, sum of exponentials and unnormalized weighted V sum, and writes them to the
// workspace. A combine kernel rescales the splits to a common max and normalizes. A call of one
// split (short contexts, attn::single_pass_keys) skips the workspace and the combine: the split
// kernel normalizes and writes the output and its int8 activation itself, with the combine's
// arithmetic (bit-identical to split + combine of the same plan).
//
// Thread layout of a block (HD = head_dim): a K/V row of one KV head is HD f16 = HD/8 16-byte
// pieces; kLanes (HD/8 rounded up to a power of two, so shuffles reduce within aligned lane
// groups) consecutive lanes read one row, piece c in lane c (lanes c >= HD/8 idle, only for HD
// not a power of two). The kDecodeThreads threads form kGroups = kDecodeThreads / kLanes key
// groups; group g handles keys g, g + kGroups, ... of each 64-key tile, so the lanes of a warp
// read consecutive rows.
#include <cmath>
#include <string>

#include "backend/cuda/attention_internal.cuh"

namespace sluice::backend::cuda::attn {
namespace {

constexpr int pow2_ceil(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

template <int HD>
struct DecodeShape {
  static constexpr int kPieces = HD / 8;                           // 16-byte pieces per row
  static constexpr int kLanes = pow2_ceil(kPieces);                // lanes per key (4..32)
  static constexpr int kGroups = kDecodeThreads / kLanes;          // keys in flight per step (8..64)
  static constexpr int kKeysPerGroup = kDecodeTile / kGroups;      // per tile (1..8)
  // A tile's K rows of a key group and its V rows are loaded together (V does not depend on the
  // scores), so a tile waits for memory once (a decode at a short context is a chain of these
  // waits); at 256 threads a group has at most 8 keys: 16 16-byte registers.
  static_assert(kKeysPerGroup <= 8, "a key group's K and V rows of a tile are held in registers");
  static_assert(HD % 32 == 0 && HD >= 32 && HD <= 256, "head_dim: multiples of 32 up to 256");
  static_assert(kLanes <= kWarpSize && kDecodeTile % kGroups == 0);
  static_assert(kDecodeTile == 2 * kWarpSize, "the softmax step gives each lane two keys of a tile");
};

// AttentionArgs::seq_rows as the kernels read them (kernel parameters).
struct SeqRowDev {
  int64_t row;
  const int* map;
  int pos;
};

struct DecodeParams {
  const float* q;  // [n_tokens][q_stride]
  int64_t q_stride;
  const __half* k;  // [positions][k_stride]
  int64_t k_stride;
  const __half* v;
  int64_t v_stride;
  float* ws_acc;   // [rows][HD], see decode_workspace_bytes
  float2* ws_ml;   // [rows] (max in log2 units, sum of exp2)
  int n_head;
  int n_head_kv;
  int group;
  int n_hgroups;
  int heads_per_block;
  int n_splits;
  int split_keys;
  int pos0;
  int window;          // AttentionArgs::window (0: none)
  const int* pos_dev;  // non-null: pos0 is read here (a replayed step)
  const int* row_map;  // AttentionArgs::row_map (nullptr: position = row)
  float* out;       // kFinal: the output [rows][out_stride] and its optional int8 activation
  int64_t out_stride;
  int8_t* out_q;
  float2* out_ds;
  float scale_log2;  // scale * log2(e): scores come out in log2 units, so exp2f is the exponential
  int n_seq_rows;    // > 0: query row t is seq[t] (its q/out row, position and row map)
  SeqRowDev seq[kMaxAttentionSeqRows];
};

// The out rows of the combine (n == 0: row t is row t).
struct OutRows {
  int n;
  int64_t row[kMaxAttentionSeqRows];
};

// Grid: one block per (head group, split, KV head, query row), flattened with the head group
// fastest so the blocks sharing a KV head's rows run side by side and the second reads hit L2.
// kPaged: keys through the paged cache's row map (a separate instantiation, so the unpaged
// kernel, every single-sequence decode, has no map load or branch in its key loops).
// kFinal: one split (p.n_splits == 1); the block writes the normalized output, not the workspace.
template <int HD, bool kPaged, bool kFinal>
__global__ void __launch_bounds__(kDecodeThreads) decode_split_kernel(const __grid_constant__ DecodeParams p) {
  pdl_wait();
  pdl_trigger();
  using S = DecodeShape<HD>;
  __shared__ float sc[2][kMaxHeadsPerBlock][kDecodeTile];  // scores, then probabilities; 2 tiles
  __shared__ float alpha_s[kMaxHeadsPerBlock];             // per-tile rescale of the accumulators
  __shared__ float red[S::kGroups * kMaxHeadsPerBlock * HD];  // final sum over key groups (<= 16 KB)
  __shared__ float l_s[kMaxHeadsPerBlock];                    // kFinal: each head's sum of exponentials

  int b = int(blockIdx.x);
  const int hg = b % p.n_hgroups;
  b /= p.n_hgroups;
  const int split = b % p.n_splits;
  b /= p.n_splits;
  const int kvh = b % p.n_head_kv;
  const int t = b / p.n_head_kv;

  const int tid = int(threadIdx.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int grp = tid / S::kLanes;  // key group
  const int c = tid % S::kLanes;    // 16-byte piece of the row
  const bool piece_ok = c < S::kPieces;

  // Query row t sees keys [lo, pos0 + t] (lo = 0, or its sliding window's start); this split owns
  // [begin, end) of them (maybe none: when t is not the last row, the plan is made for the longest
  // row or the step's position range; with a window, for splits wholly before it). Every key of
  // [begin, end) is visible, so each tile's first key is and the tile max is finite.
  // Several sequences: row t is its own sequence's one decode row, with its own keys.
  const bool multi = p.n_seq_rows > 0;
  const int n_kv = multi ? p.seq[t].pos + 1 : (p.pos_dev != nullptr ? *p.pos_dev : p.pos0) + t + 1;
  const int* row_map = multi ? p.seq[t].map : p.row_map;
  const int64_t q_row = multi ? p.seq[t].row : int64_t(t);
  const int lo = p.window > 0 ? max(0, n_kv - p.window) : 0;
  const int split0 = split * p.split_keys;
  const int begin = max(split0, lo);
  const int end = min(split0 + p.split_keys, n_kv);
  const int slot0 = hg * p.heads_per_block;
  const int nh = min(p.heads_per_block, p.group - slot0);  // heads of this block, >= 1
  const int head0 = kvh * p.group + slot0;

  // This thread's 8 elements of each query head, pre-scaled.
  float qr[kMaxHeadsPerBlock][8];
#pragma unroll
  for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
    const float* qh = p.q + q_row * p.q_stride + int64_t(head0 + h) * HD + c * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) qr[h][e] = (h < nh && piece_ok) ? qh[e] * p.scale_log2 : 0.0f;
  }
  float acc[kMaxHeadsPerBlock][8];
#pragma unroll
  for (int h = 0; h < kMaxHeadsPerBlock; ++h)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[h][e] = 0.0f;
  // Running max and sum of head `warp` (warps 0..nh-1), identical in every lane of that warp.
  float m_run = -INFINITY;
  float l_run = 0.0f;

  const __half* kp = p.k + int64_t(kvh) * HD + c * 8;
  const __half* vp = p.v + int64_t(kvh) * HD + c * 8;

  // This thread's piece of the K or V row of key j (zeros past the end: those rows are not read;
  // a V row's probability is 0 there but the memory may hold anything, and NaN * 0 = NaN).
  auto load_piece = [&](const __half* base, int64_t stride, int j) {
    const int64_t row = kPaged && piece_ok && j < end ? cache_row(row_map, j) : int64_t(j);
    return (piece_ok && j < end) ? load_row16(base + row * stride) : make_uint4(0, 0, 0, 0);
  };

  int buf = 0;
  for (int tile0 = begin; tile0 < end; tile0 += kDecodeTile, buf ^= 1) {
    // 1. Scores of the tile's keys for every head into sc[buf] (-inf past the split's end).
    //    sc is double-buffered: a slow thread may still read the previous tile's probabilities.
    uint4 kr[S::kKeysPerGroup], vr[S::kKeysPerGroup];
#pragma unroll
    for (int u = 0; u < S::kKeysPerGroup; ++u) kr[u] = load_piece(kp, p.k_stride, tile0 + grp + S::kGroups * u);
#pragma unroll
    for (int u = 0; u < S::kKeysPerGroup; ++u) vr[u] = load_piece(vp, p.v_stride, tile0 + grp + S::kGroups * u);
#pragma unroll
    for (int u = 0; u < S::kKeysPerGroup; ++u) {
      const int jl = grp + S::kGroups * u;
      float kf[8];
      halves8_to_float(kr[u], kf);
#pragma unroll
      for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
        if (h < nh) {  // uniform across the block: the shuffles below see every lane
          float s = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) s = fmaf(qr[h][e], kf[e], s);
#pragma unroll
          for (int o = S::kLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
          if (c == 0) sc[buf][h][jl] = tile0 + jl < end ? s : -INFINITY;
        }
      }
    }
    __syncthreads();

    // 2. Warp h: tile max, new running max, probabilities in place, rescale factor of the old
    //    state. The tile holds at least one key, so the new max is finite.
    if (warp < nh) {
      const float s0 = sc[buf][warp][lane];
      const float s1 = sc[buf][warp][lane + kWarpSize];
      const float m_new = fmaxf(m_run, warp_max(fmaxf(s0, s1)));
      const float p0 = exp2f(s0 - m_new);  // exp2f(-inf) = 0 for masked keys
      const float p1 = exp2f(s1 - m_new);
      sc[buf][warp][lane] = p0;
      sc[buf][warp][lane + kWarpSize] = p1;
      const float alpha = exp2f(m_run - m_new);  // 0 on the first tile (m_run = -inf)
      l_run = l_run * alpha + warp_sum(p0 + p1);
      m_run = m_new;
      if (lane == 0) alpha_s[warp] = alpha;
    }
    __syncthreads();

    // 3. acc = acc * alpha + sum over the group's keys of p * V (8 elements per thread).
#pragma unroll
    for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
      if (h < nh) {
        const float alpha = alpha_s[h];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] *= alpha;
      }
    }
#pragma unroll
    for (int u = 0; u < S::kKeysPerGroup; ++u) {
      const int jl = grp + S::kGroups * u;
      float vf[8];
      halves8_to_float(vr[u], vf);
#pragma unroll
      for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
        if (h < nh) {
          const float pj = sc[buf][h][jl];
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[h][e] = fmaf(pj, vf[e], acc[h][e]);
        }
      }
    }
  }

  // Sum the key groups' partial outputs (they share the running max, so plain addition).
  if (piece_ok) {
#pragma unroll
    for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
      if (h < nh) {
#pragma unroll
        for (int e = 0; e < 8; ++e) red[(grp * kMaxHeadsPerBlock + h) * HD + c * 8 + e] = acc[h][e];
      }
    }
  }
  if (kFinal && warp < nh && lane == 0) l_s[warp] = l_run;
  __syncthreads();
  // nh * HD is a multiple of 32 and a warp's 32 outputs are one q8 block of the output row, so the
  // kFinal branch's warp shuffles (q8_block) see whole warps.
  for (int idx = tid; idx < nh * HD; idx += kDecodeThreads) {
    const int h = idx / HD;
    const int d = idx % HD;
    float sum = 0.0f;
#pragma unroll
    for (int g = 0; g < S::kGroups; ++g) sum += red[(g * kMaxHeadsPerBlock + h) * HD + d];
    if constexpr (kFinal) {
      // The combine's arithmetic for one split: weight exp2f(0) = 1, y = sum * (1 / l). The split
      // holds the row's own key, so l > 0.
      const float inv = 1.0f / l_s[h];
      const float y = sum * inv;
      const int64_t e = q_row * p.out_stride + int64_t(head0 + h) * HD + d;
      p.out[e] = y;
      if (p.out_q != nullptr) q8_block(y, p.out_q + (e - int64_t(lane)), p.out_ds + e / 32);
    } else {
      const int64_t row = (int64_t(t) * p.n_head + head0 + h) * p.n_splits + split;
      p.ws_acc[row * HD + d] = sum;
    }
  }
  if constexpr (kFinal) return;
  // An empty split writes (-inf, 0) and zeros: the combine gives it weight 0.
  if (warp < nh && lane == 0) {
    const int64_t row = (int64_t(t) * p.n_head + head0 + warp) * p.n_splits + split;
    p.ws_ml[row] = make_float2(m_run, l_run);
  }
}

// Block-wide reduction of one value per thread (max or sum); every thread gets the result.
// Starts with a barrier so back-to-back calls may reuse `scratch`.
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  const int n_warps = int(blockDim.x) / kWarpSize;
  float r = scratch[0];
  for (int w = 1; w < n_warps; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

// One block per (head, query row): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s.
// Each row has a non-empty split (the one holding its own position), so M is finite and the
// denominator positive; empty splits (before a sliding window, past a short row) weigh 0.
__global__ void __launch_bounds__(kDecodeThreads)
    decode_combine_kernel(const float* __restrict__ ws_acc, const float2* __restrict__ ws_ml, float* __restrict__ out,
                          int64_t out_stride, int n_head, int head_dim, int n_splits, int8_t* __restrict__ out_q,
                          float2* __restrict__ out_ds, const __grid_constant__ OutRows rows) {
  __shared__ float w[kMaxSplits];
  __shared__ float scratch[kDecodeThreads / kWarpSize];
  pdl_wait();
  pdl_trigger();
  const int head = int(blockIdx.x);
  const int t = int(blockIdx.y);
  const int64_t row0 = (int64_t(t) * n_head + head) * n_splits;

  float mx = -INFINITY;
  for (int s = int(threadIdx.x); s < n_splits; s += kDecodeThreads) mx = fmaxf(mx, ws_ml[row0 + s].x);
  mx = block_reduce<true>(mx, scratch);
  float denom = 0.0f;
  for (int s = int(threadIdx.x); s < n_splits; s += kDecodeThreads) {
    const float2 ml = ws_ml[row0 + s];
    const float ws = exp2f(ml.x - mx);  // 0 for empty splits (m = -inf)
    w[s] = ws;
    denom += ws * ml.y;
  }
  denom = block_reduce<false>(denom, scratch);  // its barriers also publish w[]
  const float inv = 1.0f / denom;
  // head_dim is a multiple of 32: each warp covers 32 consecutive outputs, one q8 block of the
  // dense output row (out_q: the output projection's int8 activation, written here).
  for (int d = int(threadIdx.x); d < head_dim; d += kDecodeThreads) {
    float acc = 0.0f;
    for (int s = 0; s < n_splits; ++s) acc = fmaf(w[s], ws_acc[(row0 + s) * head_dim + d], acc);
    const float y = acc * inv;
    const int64_t e = (rows.n > 0 ? rows.row[t] : int64_t(t)) * out_stride + int64_t(head) * head_dim + d;
    out[e] = y;
    if (out_q != nullptr) q8_block(y, out_q + (e - int64_t(threadIdx.x % kWarpSize)), out_ds + e / 32);
  }
}

template <int HD>
Status launch_decode_hd(const DecodeParams& p, int n_tokens, float* out, int64_t out_stride, int8_t* out_q,
                        float2* out_ds, cudaStream_t stream) {
  const int64_t blocks = int64_t(n_tokens) * p.n_head_kv * p.n_hgroups * p.n_splits;
  const bool paged = p.row_map != nullptr || p.n_seq_rows > 0;
  if (p.n_splits == 1) {
    DecodeParams pf = p;
    pf.out = out;
    pf.out_stride = out_stride;
    pf.out_q = out_q;
    pf.out_ds = out_ds;
    const auto kernel = paged ? decode_split_kernel<HD, true, true> : decode_split_kernel<HD, false, true>;
    SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(kernel, dim3(unsigned(blocks)), dim3(kDecodeThreads), 0, stream, pf));
    SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("decode_split_kernel (one split)");
    return Status::ok();
  }
  const auto kernel = paged ? decode_split_kernel<HD, true, false> : decode_split_kernel<HD, false, false>;
  OutRows rows{};
  rows.n = p.n_seq_rows;
  for (int t = 0; t < p.n_seq_rows; ++t) rows.row[t] = p.seq[t].row;
  SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(kernel, dim3(unsigned(blocks)), dim3(kDecodeThreads), 0, stream, p));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("decode_split_kernel");
  SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(decode_combine_kernel, dim3(unsigned(p.n_head), unsigned(n_tokens)),
                                         dim3(kDecodeThreads), 0, stream, p.ws_acc, p.ws_ml, out, out_stride,
                                         p.n_head, HD, p.n_splits, out_q, out_ds, rows));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("decode_combine_kernel");
  return Status::ok();
}

}  // namespace

Status launch_decode(const AttentionArgs& a, const DecodePlan& plan, void* workspace, cudaStream_t stream) {
  DecodeParams p{};
  p.q = a.q;
  p.q_stride = a.q_stride;
  p.k = static_cast<const __half*>(a.k_cache);
  p.k_stride = a.k_stride;
  p.v = static_cast<const __half*>(a.v_cache);
  p.v_stride = a.v_stride;
  const int64_t rows = int64_t(a.n_tokens) * a.n_head * plan.n_splits;
  p.ws_acc = static_cast<float*>(workspace);
  p.ws_ml = reinterpret_cast<float2*>(p.ws_acc + rows * a.head_dim);
  p.n_head = a.n_head;
  p.n_head_kv = a.n_head_kv;
  p.group = plan.group;
  p.n_hgroups = plan.n_hgroups;
  p.heads_per_block = plan.heads_per_block;
  p.n_splits = plan.n_splits;
  p.split_keys = plan.split_keys;
  p.pos0 = a.pos0;
  p.window = a.window;
  p.pos_dev = a.pos_dev;
  p.row_map = a.row_map;
  p.scale_log2 = a.scale * kLog2e;
  p.n_seq_rows = a.seq_rows != nullptr ? a.n_tokens : 0;
  for (int t = 0; t < p.n_seq_rows; ++t) p.seq[t] = {a.seq_rows[t].row, a.seq_rows[t].row_map, a.seq_rows[t].pos};
  const bool q8 = a.out_q != nullptr && a.out_ds != nullptr && attention_writes_q8(a);
  int8_t* q = q8 ? a.out_q : nullptr;
  float2* ds = q8 ? a.out_ds : nullptr;
  switch (a.head_dim) {
    case 32: return launch_decode_hd<32>(p, a.n_tokens, a.out, a.out_stride, q, ds, stream);
    case 64: return launch_decode_hd<64>(p, a.n_tokens, a.out, a.out_stride, q, ds, stream);
    case 96: return launch_decode_hd<96>(p, a.n_tokens, a.out, a.out_stride, q, ds, stream);
    case 128: return launch_decode_hd<128>(p, a.n_tokens, a.out, a.out_stride, q, ds, stream);
    case 160: return launch_decode_hd<160>(p, a.n_tokens, a.out, a.out_stride, q, ds, stream);
    case 192: return launch_decode_hd<192>(p, a.n_tokens, a.out, a.out_stride, q, ds, stream);
    case 224: return launch_decode_hd<224>(p, a.n_tokens, a.out, a.out_stride, q, ds, stream);
    case 256: return launch_decode_hd<256>(p, a.n_tokens, a.out, a.out_stride, q, ds, stream);
    default: break;
  }
  return unsupported("attention: head_dim " + std::to_string(a.head_dim) + " has no decode kernel");
}

}  // namespace sluice::backend::cuda::attn
