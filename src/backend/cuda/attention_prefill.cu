// Prefill attention (many query rows): causal flash attention on CUDA cores, f32 math. A block
// takes 32 query rows of one query head and walks the key tiles [0, last row's position]; K/V
// tiles are staged in shared memory with 16-byte loads, scores live only in registers and one
// per-warp tile of probabilities, and the softmax is online (running max and sum per row), so
// memory is O(rows + tile) and no n x n score matrix exists.
//
// Each warp owns 8 query rows from start to finish:
//   scores   lane l computes the 8 rows x keys {l, l + 32} (kKeysPerLane of them); q is read as
//            float4 broadcasts from a [d][row] layout, K as half2 from rows padded to an odd word
//            stride so the 32 lanes (32 different rows) hit 32 different banks;
//   softmax  per row: warp max over the tile, masked keys -inf, rescale factor for the old state;
//            each lane keeps a partial sum of its own keys' exponentials (summed at the end);
//   output   lane l owns dims {l, l + 32, ...} of the 8 rows; probabilities are read back as
//            float4 broadcasts from a [key][row] layout, V as consecutive halves (no conflicts).
#include <cmath>
#include <string>

#include "backend/cuda/attention_internal.cuh"

namespace sluice::backend::cuda::attn {
namespace {

template <int HD>
struct PrefillShape {
  static constexpr int kKeys = HD <= 128 ? 64 : 32;       // key tile (smaller for wide heads: smem)
  static constexpr int kKeysPerLane = kKeys / kWarpSize;  // 2 or 1
  static constexpr int kDimsPerLane = HD / kWarpSize;     // 1..8
  static constexpr int kR = kPrefillRowsPerWarp;
  static constexpr int kKStride = HD + 2;                 // halves; HD/2 + 1 words: odd
  static constexpr int kPieces = HD / 8;                  // 16-byte pieces per K/V row
  // Shared memory, bytes: q [warps][HD][kR] f32 | K [kKeys][kKStride] f16 | V [kKeys][HD] f16 |
  // P [warps][kKeys][kR] f32. Every region starts 16-byte aligned.
  static constexpr int kQBytes = kPrefillWarps * HD * kR * 4;
  static constexpr int kKBytes = kKeys * kKStride * 2;
  static constexpr int kVBytes = kKeys * HD * 2;
  static constexpr int kPBytes = kPrefillWarps * kKeys * kR * 4;
  static constexpr int kSmemBytes = kQBytes + kKBytes + kVBytes + kPBytes;
  static_assert(HD % 32 == 0 && HD >= 32 && HD <= 256, "head_dim: multiples of 32 up to 256");
  static_assert(kR == 8, "rows are moved as two float4");
  static_assert(kQBytes % 16 == 0 && kKBytes % 16 == 0 && kVBytes % 16 == 0);
  static_assert((HD / 2 + 1) % 2 == 1, "K row stride must be an odd number of words");
};

struct PrefillParams {
  const float* q;  // [n_tokens][q_stride]
  int64_t q_stride;
  const __half* k;  // [positions][k_stride]
  int64_t k_stride;
  const __half* v;
  int64_t v_stride;
  float* out;  // [n_tokens][out_stride]
  int64_t out_stride;
  int n_tokens;
  int group;  // query heads per KV head
  int pos0;
  int window;  // AttentionArgs::window (0: none)
  const int* row_map;  // AttentionArgs::row_map (nullptr: position = row)
  float scale_log2;  // scale * log2(e): scores in log2 units, exponentials by exp2f
};

// Grid: x = query tiles of 32 rows (last tile first: it has the most keys, so the longest blocks
// start early and the tail is short), y = query head.
template <int HD>
__global__ void __launch_bounds__(kPrefillThreads) prefill_kernel(const PrefillParams p) {
  using S = PrefillShape<HD>;
  constexpr int kR = S::kR;
  extern __shared__ __align__(16) unsigned char smem[];
  float* const qs = reinterpret_cast<float*>(smem);
  __half* const ks = reinterpret_cast<__half*>(smem + S::kQBytes);
  __half* const vs = reinterpret_cast<__half*>(smem + S::kQBytes + S::kKBytes);
  float* const ps = reinterpret_cast<float*>(smem + S::kQBytes + S::kKBytes + S::kVBytes);

  const int tid = int(threadIdx.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int qtile = int(gridDim.x) - 1 - int(blockIdx.x);
  const int head = int(blockIdx.y);
  const int kvh = head / p.group;
  const int q0 = qtile * kPrefillRows;
  const int row0 = q0 + warp * kR;  // first query row of this warp
  // Keys any row of the block sees: [0, pos0 + last row]. Rows past n_tokens (the tail of the
  // last tile) compute with q = 0 over these keys and are not stored.
  const int n_kv = p.pos0 + min(q0 + kPrefillRows, p.n_tokens);
  // With a sliding window, no row of the block sees keys before its first row's window.
  const int kv_lo = p.window > 0 ? max(0, p.pos0 + q0 - p.window + 1) : 0;

  // q of the warp's rows, pre-scaled, as [d][row].
  float* const qw = qs + warp * HD * kR;
  for (int r = 0; r < kR; ++r) {
    const int row = row0 + r;
    const float* qrow = p.q + int64_t(row) * p.q_stride + int64_t(head) * HD;
    for (int d = lane; d < HD; d += kWarpSize) qw[d * kR + r] = row < p.n_tokens ? qrow[d] * p.scale_log2 : 0.0f;
  }
  float* const pw = ps + warp * S::kKeys * kR;

  float o[kR][S::kDimsPerLane];
  float m_run[kR];
  float l_part[kR];  // this lane's keys only
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    m_run[r] = -INFINITY;
    l_part[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < S::kDimsPerLane; ++i) o[r][i] = 0.0f;
  }

  const __half* const kbase = p.k + int64_t(kvh) * HD;
  const __half* const vbase = p.v + int64_t(kvh) * HD;

  for (int kv0 = kv_lo; kv0 < n_kv; kv0 += S::kKeys) {
    __syncthreads();  // every warp is done with the previous tile's K and V (and q is written)
    for (int i = tid; i < S::kKeys * S::kPieces; i += kPrefillThreads) {
      const int r = i / S::kPieces;
      const int c = i % S::kPieces;
      const int j = kv0 + r;
      // Rows past n_kv are zero, never read from memory: the cache may end there, and V garbage
      // times a zero probability could still be NaN.
      uint4 kr = make_uint4(0, 0, 0, 0), vr = make_uint4(0, 0, 0, 0);
      if (j < n_kv) {
        const int64_t row = cache_row(p.row_map, j);
        kr = load_row16(kbase + row * p.k_stride + c * 8);
        vr = load_row16(vbase + row * p.v_stride + c * 8);
      }
      // K rows have an odd word stride, so only 4-byte alignment: four 32-bit stores.
      uint32_t* kd = reinterpret_cast<uint32_t*>(ks + r * S::kKStride + c * 8);
      kd[0] = kr.x;
      kd[1] = kr.y;
      kd[2] = kr.z;
      kd[3] = kr.w;
      *reinterpret_cast<uint4*>(vs + r * HD + c * 8) = vr;
    }
    __syncthreads();

    // Scores (log2 units) of the warp's rows x this lane's keys.
    float s[kR][S::kKeysPerLane];
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
      for (int kk = 0; kk < S::kKeysPerLane; ++kk) s[r][kk] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HD; d += 2) {
      float2 kf[S::kKeysPerLane];
#pragma unroll
      for (int kk = 0; kk < S::kKeysPerLane; ++kk)
        kf[kk] = __half22float2(*reinterpret_cast<const __half2*>(ks + (lane + kWarpSize * kk) * S::kKStride + d));
      const float4 qa0 = *reinterpret_cast<const float4*>(qw + d * kR);
      const float4 qa1 = *reinterpret_cast<const float4*>(qw + d * kR + 4);
      const float4 qb0 = *reinterpret_cast<const float4*>(qw + (d + 1) * kR);
      const float4 qb1 = *reinterpret_cast<const float4*>(qw + (d + 1) * kR + 4);
      const float qa[kR] = {qa0.x, qa0.y, qa0.z, qa0.w, qa1.x, qa1.y, qa1.z, qa1.w};
      const float qb[kR] = {qb0.x, qb0.y, qb0.z, qb0.w, qb1.x, qb1.y, qb1.z, qb1.w};
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int kk = 0; kk < S::kKeysPerLane; ++kk) s[r][kk] = fmaf(qb[r], kf[kk].y, fmaf(qa[r], kf[kk].x, s[r][kk]));
    }

    // Online softmax per row. Without a window, key 0 is in the first tile and visible to every
    // row (also the padding rows), so the running max is finite from the first tile on; a row
    // whose keys all lie before this tile's masked part just gets alpha = 1 and zero
    // probabilities. With a window, a row may see no key of the first tiles (its window starts
    // later): its max stays -inf, and the exponent is taken against 0 so alpha and the
    // probabilities are 0 instead of NaN.
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int qpos = p.pos0 + row0 + r;
      const int lo = p.window > 0 ? qpos - p.window + 1 : 0;
      float mt = -INFINITY;
#pragma unroll
      for (int kk = 0; kk < S::kKeysPerLane; ++kk) {
        const int j = kv0 + lane + kWarpSize * kk;
        if (j > qpos || j >= n_kv || j < lo) s[r][kk] = -INFINITY;
        mt = fmaxf(mt, s[r][kk]);
      }
      const float m_new = fmaxf(m_run[r], warp_max(mt));
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m_run[r] - m_ref);  // 0 on the first tile
      m_run[r] = m_new;
      float psum = 0.0f;
#pragma unroll
      for (int kk = 0; kk < S::kKeysPerLane; ++kk) {
        s[r][kk] = exp2f(s[r][kk] - m_ref);
        psum += s[r][kk];
      }
      l_part[r] = l_part[r] * alpha + psum;
#pragma unroll
      for (int i = 0; i < S::kDimsPerLane; ++i) o[r][i] *= alpha;
    }
    // Probabilities as [key][row] for the output step.
#pragma unroll
    for (int kk = 0; kk < S::kKeysPerLane; ++kk) {
      float* dst = pw + (lane + kWarpSize * kk) * kR;
      *reinterpret_cast<float4*>(dst) = make_float4(s[0][kk], s[1][kk], s[2][kk], s[3][kk]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(s[4][kk], s[5][kk], s[6][kk], s[7][kk]);
    }
    __syncwarp();

    // o += P V over the tile's valid keys (rows past n_kv have zero probability).
    const int n_keys = min(S::kKeys, n_kv - kv0);
#pragma unroll 2
    for (int j = 0; j < n_keys; ++j) {
      const float4 pa = *reinterpret_cast<const float4*>(pw + j * kR);
      const float4 pb = *reinterpret_cast<const float4*>(pw + j * kR + 4);
      const float pr[kR] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
      for (int i = 0; i < S::kDimsPerLane; ++i) {
        const float vf = __half2float(vs[j * HD + lane + kWarpSize * i]);
#pragma unroll
        for (int r = 0; r < kR; ++r) o[r][i] = fmaf(pr[r], vf, o[r][i]);
      }
    }
    __syncwarp();  // the next tile's probabilities overwrite pw
  }

#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const float l = warp_sum(l_part[r]);  // > 0 for stored rows: the row's own key contributes
    const int row = row0 + r;
    if (row < p.n_tokens) {
      float* orow = p.out + int64_t(row) * p.out_stride + int64_t(head) * HD;
      const float inv = 1.0f / l;
#pragma unroll
      for (int i = 0; i < S::kDimsPerLane; ++i) orow[lane + kWarpSize * i] = o[r][i] * inv;
    }
  }
}

template <int HD>
Status launch_prefill_hd(const PrefillParams& p, int n_head, cudaStream_t stream) {
  using S = PrefillShape<HD>;
  // Above 48 KB dynamic shared memory needs an opt-in per kernel; it is a property of the kernel,
  // not of a stream, so setting it on every launch is cheap and keeps no state here.
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes));
  const dim3 grid(unsigned(ceil_div(p.n_tokens, kPrefillRows)), unsigned(n_head));
  prefill_kernel<HD><<<grid, kPrefillThreads, S::kSmemBytes, stream>>>(p);
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("prefill_kernel");
  return Status::ok();
}

}  // namespace

Status launch_prefill(const AttentionArgs& a, cudaStream_t stream) {
  PrefillParams p{};
  p.q = a.q;
  p.q_stride = a.q_stride;
  p.k = static_cast<const __half*>(a.k_cache);
  p.k_stride = a.k_stride;
  p.v = static_cast<const __half*>(a.v_cache);
  p.v_stride = a.v_stride;
  p.out = a.out;
  p.out_stride = a.out_stride;
  p.n_tokens = a.n_tokens;
  p.group = a.n_head / a.n_head_kv;
  p.pos0 = a.pos0;
  p.window = a.window;
  p.row_map = a.row_map;
  p.scale_log2 = a.scale * kLog2e;
  switch (a.head_dim) {
    case 32: return launch_prefill_hd<32>(p, a.n_head, stream);
    case 64: return launch_prefill_hd<64>(p, a.n_head, stream);
    case 96: return launch_prefill_hd<96>(p, a.n_head, stream);
    case 128: return launch_prefill_hd<128>(p, a.n_head, stream);
    case 160: return launch_prefill_hd<160>(p, a.n_head, stream);
    case 192: return launch_prefill_hd<192>(p, a.n_head, stream);
    case 224: return launch_prefill_hd<224>(p, a.n_head, stream);
    case 256: return launch_prefill_hd<256>(p, a.n_head, stream);
    default: break;
  }
  return unsupported("attention: head_dim " + std::to_string(a.head_dim) + " has no prefill kernel");
}

}  // namespace sluice::backend::cuda::attn
