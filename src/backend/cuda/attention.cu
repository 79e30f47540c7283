// Entry points of attention.h: argument checks, the decode split plan, workspace sizing, and the
// choice between the decode (attention_decode.cu) and prefill (attention_prefill.cu) kernels.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_internal.cuh"

namespace sluice::backend::cuda {
namespace attn {
int single_pass_keys() {
  static const int keys = [] {  // immutable after its first initialization
    const char* env = std::getenv("SLUICE_CUDA_ATTN_SINGLE_KEYS");
    if (env == nullptr || *env == '\0') return kSinglePassKeys;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    return (*end == '\0' && v >= 0 && v <= (1L << 30)) ? int(v) : kSinglePassKeys;
  }();
  return keys;
}
}  // namespace attn

namespace {

using attn::ceil_div;

// Enough blocks that every SM has kDecodeBlocksPerSm of them, but no split shorter than
// kMinSplitKeys and no more than kMaxSplits; split lengths are whole tiles. Up to
// single_pass_keys() keys, one split.
attn::DecodePlan plan_decode(const AttentionArgs& a, int sm_count) {
  attn::DecodePlan plan;
  plan.group = a.n_head / a.n_head_kv;
  plan.n_hgroups = int(ceil_div(plan.group, attn::kMaxHeadsPerBlock));
  plan.heads_per_block = int(ceil_div(plan.group, plan.n_hgroups));  // balanced: 6 -> 3 + 3, not 4 + 2
  // Keys of the last (longest) query row, or the range of positions the plan is made for. With a
  // sliding window the splits still cut [0, n_ctx): those wholly before a row's window are empty
  // for that row (the kernel skips them), so one plan serves every position of a replayed step.
  int64_t n_ctx = std::max<int64_t>(int64_t(a.pos0) + a.n_tokens, a.plan_ctx);
  if (a.seq_rows != nullptr) {  // the longest sequence
    n_ctx = 1;
    for (int t = 0; t < a.n_tokens; ++t) n_ctx = std::max<int64_t>(n_ctx, int64_t(a.seq_rows[t].pos) + 1);
  }
  const int64_t base_blocks = int64_t(a.n_tokens) * a.n_head_kv * plan.n_hgroups;
  const int64_t target = int64_t(attn::kDecodeBlocksPerSm) * sm_count;
  const int64_t splits = n_ctx <= attn::single_pass_keys()
                             ? 1
                             : std::clamp<int64_t>(ceil_div(target, base_blocks), 1, attn::max_splits(n_ctx));
  const int64_t keys = ceil_div(ceil_div(n_ctx, splits), attn::kDecodeTile) * attn::kDecodeTile;
  plan.split_keys = int(keys);
  plan.n_splits = int(ceil_div(n_ctx, keys));  // <= splits: rounding up to whole tiles may drop some
  return plan;
}

Status check_args(const AttentionArgs& a, int sm_count) {
  if (!attn::head_dim_supported(a.head_dim)) {
    return unsupported("attention: head_dim " + std::to_string(a.head_dim) +
                       " is not supported (multiples of 32 from 32 to 256)");
  }
  if (a.n_tokens < 0 || a.pos0 < 0 || int64_t(a.pos0) + a.n_tokens > INT_MAX) {
    return invalid_argument("attention: bad positions (n_tokens " + std::to_string(a.n_tokens) + ", pos0 " +
                            std::to_string(a.pos0) + ")");
  }
  if (a.window < 0) return invalid_argument("attention: negative window " + std::to_string(a.window));
  if (a.seq_rows != nullptr) {
    if (a.n_tokens > kMaxAttentionSeqRows) {
      return invalid_argument("attention: " + std::to_string(a.n_tokens) + " sequence rows, at most " +
                              std::to_string(kMaxAttentionSeqRows) + " per call");
    }
    for (int t = 0; t < a.n_tokens; ++t) {
      if (a.seq_rows[t].pos < 0 || a.seq_rows[t].row < 0 || a.seq_rows[t].pos == INT_MAX) {
        return invalid_argument("attention: sequence row " + std::to_string(t) + " has a bad row or position");
      }
    }
  }
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.n_head > 65535) {
    return invalid_argument("attention: bad head counts (n_head " + std::to_string(a.n_head) + ", n_head_kv " +
                            std::to_string(a.n_head_kv) + ")");
  }
  if (sm_count <= 0) return invalid_argument("attention: sm_count must be positive");
  if (a.q == nullptr || a.k_cache == nullptr || a.v_cache == nullptr || a.out == nullptr) {
    return invalid_argument("attention: null q, cache or out pointer");
  }
  const int64_t q_cols = int64_t(a.n_head) * a.head_dim;
  const int64_t kv_cols = int64_t(a.n_head_kv) * a.head_dim;
  if (a.q_stride < q_cols || a.out_stride < q_cols || a.k_stride < kv_cols || a.v_stride < kv_cols) {
    return invalid_argument("attention: a row stride is shorter than its row");
  }
  // K/V rows are read in 16-byte pieces: base and every row start 16-byte aligned (head offsets
  // are multiples of head_dim * 2 = 64 bytes).
  const auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(a.k_cache) || misaligned(a.v_cache) || a.k_stride % 8 != 0 || a.v_stride % 8 != 0) {
    return invalid_argument("attention: K/V cache rows must start 16-byte aligned (pointer 16-byte aligned, "
                            "stride a multiple of 8 elements)");
  }
  return Status::ok();
}

}  // namespace

int64_t attention_workspace_bytes(int n_tokens, int n_head, int head_dim, int max_positions) {
  if (n_tokens <= 0 || n_head <= 0 || head_dim <= 0 || max_positions <= 0) return 0;
  // Prefill needs none; the answer for n_tokens also covers every call with fewer rows, so a
  // buffer sized for the largest batch serves the decode calls (at most kDecodeMaxTokens rows).
  const int64_t rows = std::min(n_tokens, attn::kDecodeMaxTokens);
  return attn::decode_workspace_bytes(rows, n_head, head_dim, attn::max_splits(max_positions));
}

int64_t attention_seq_workspace_bytes(int n_rows, int n_head, int head_dim, int max_positions) {
  if (n_rows <= 0 || n_head <= 0 || head_dim <= 0 || max_positions <= 0) return 0;
  return attn::decode_workspace_bytes(std::min(n_rows, kMaxAttentionSeqRows), n_head, head_dim,
                                      attn::max_splits(max_positions));
}

bool attention_writes_q8(const AttentionArgs& args) {
  if (args.seq_rows != nullptr) {  // rows 0, 1, ... of a dense output, as the activation is laid out
    for (int t = 0; t < args.n_tokens; ++t) {
      if (args.seq_rows[t].row != t) return false;
    }
    return args.n_tokens > 0 && args.n_tokens <= kMaxAttentionSeqRows &&
           args.out_stride == int64_t(args.n_head) * args.head_dim && args.head_dim % 32 == 0;
  }
  return args.n_tokens > 0 && args.n_tokens <= attn::kDecodeMaxTokens &&
         args.out_stride == int64_t(args.n_head) * args.head_dim && args.head_dim % 32 == 0;
}

Status attention(const AttentionArgs& args, void* workspace, int64_t workspace_bytes, int sm_count,
                 cudaStream_t stream) {
  SLUICE_RETURN_IF_ERROR(check_args(args, sm_count));
  if (args.n_tokens == 0) return Status::ok();
  if (args.n_tokens > attn::kDecodeMaxTokens && args.seq_rows == nullptr) return attn::launch_prefill(args, stream);

  const attn::DecodePlan plan = plan_decode(args, sm_count);
  const int64_t need = attn::decode_workspace_bytes(args.n_tokens, args.n_head, args.head_dim, plan.n_splits);
  if (workspace == nullptr || workspace_bytes < need) {
    return invalid_argument("attention: workspace too small: " + std::to_string(workspace_bytes) + " bytes, need " +
                            std::to_string(need) + " (attention_workspace_bytes for " +
                            std::to_string(int64_t(args.pos0) + args.n_tokens) + " positions, or attention_seq_workspace_bytes)");
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return invalid_argument("attention: workspace must be 16-byte aligned");
  }
  return attn::launch_decode(args, plan, workspace, stream);
}

}  // namespace sluice::backend::cuda
