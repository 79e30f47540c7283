// Causal multi-head attention over the F16 KV cache on the GPU, the device counterpart of
// Backend::attention (backend.h):
//   out[t][h] = softmax(scale * q[t][h] . K[a .. pos0+t][h/g]) V[a .. pos0+t][h/g],  g = n_head / n_head_kv,
//   a = first_key(t) (0, or the start of a sliding window)
// Decode (one or a few query rows) splits the key range across blocks (flash-decoding: partial
// softmax per split, then a combine pass), so any context length fills the GPU; prefill (many
// rows) tiles queries and keys flash-style with an online softmax: no n x n score matrix is ever
// materialized, memory is O(n).
//
// Host-only header. All pointers are device pointers; work is enqueued on `stream`; nothing
// synchronizes.
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstdint>

#include "core/status.h"

namespace sluice::backend::cuda {

// One query row of a call over several sequences (AttentionArgs::seq_rows).
struct AttentionSeqRow {
  int64_t row = 0;               // the row of q and out
  int pos = 0;                   // its position: it sees keys [0, pos] (or its window) of its sequence
  const int* row_map = nullptr;  // its sequence's paged cache (device memory; nullptr: position = row)
};
inline constexpr int kMaxAttentionSeqRows = 32;

struct AttentionArgs {
  const float* q = nullptr;     // [n_tokens][q_stride], row = n_head * head_dim floats
  int64_t q_stride = 0;
  int n_tokens = 0;
  const void* k_cache = nullptr;  // f16 [positions][k_stride], row = n_head_kv * head_dim
  int64_t k_stride = 0;
  const void* v_cache = nullptr;  // f16 [positions][v_stride]
  int64_t v_stride = 0;
  float* out = nullptr;         // [n_tokens][out_stride], row = n_head * head_dim floats
  int64_t out_stride = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;             // a multiple of 32, <= 256
  float scale = 1.0f;
  int pos0 = 0;                 // query t sees cache rows [0, pos0 + t]
  int window = 0;               // > 0: query t sees only rows (pos0 + t - window, pos0 + t] (sliding window)
  // Paged cache (Tensor::row_map): position j is cache row row_map[j] (device memory, pos0 +
  // n_tokens entries); nullptr: position j is row j.
  const int* row_map = nullptr;
  // Decode only (optional): the kernels read pos0 from this device int when they run (a recorded
  // step replayed at later positions), and the key splits are planned for plan_ctx positions
  // (>= pos0 + n_tokens; splits past the context are empty), so one plan serves a range of
  // positions. Results depend only on the plan, not on which of these set it.
  const int* pos_dev = nullptr;
  int plan_ctx = 0;
  // Decode only (optional): also write the int8 activation of out ([n_tokens][n_head * head_dim],
  // as quantize_activation_q8 makes it; out must be dense) for the output projection's GEMV.
  int8_t* out_q = nullptr;
  float2* out_ds = nullptr;
  // Optional: one decode row of each of several sequences in one call (a batched decode pass).
  // Query row t is seq_rows[t] (host memory, n_tokens <= kMaxAttentionSeqRows entries); pos0,
  // pos_dev, plan_ctx and row_map are then unused. Always the decode kernels: rows of different
  // sequences share no keys, so the prefill kernel's tiles would gain nothing.
  const AttentionSeqRow* seq_rows = nullptr;
};
// True when attention() writes out_q/out_ds for this call shape (decode rows, dense output).
bool attention_writes_q8(const AttentionArgs& args);

// Workspace bytes attention() needs for this call shape at most `max_positions` cache rows
// (allocate once for the largest call; 0 is a valid answer).
int64_t attention_workspace_bytes(int n_tokens, int n_head, int head_dim, int max_positions);
// The same for a call with seq_rows of n_rows rows.
int64_t attention_seq_workspace_bytes(int n_rows, int n_head, int head_dim, int max_positions);

// Enqueues the attention. Error: unsupported head_dim, bad arguments, workspace too small, launch
// failure.
Status attention(const AttentionArgs& args, void* workspace, int64_t workspace_bytes, int sm_count,
                 cudaStream_t stream);

}  // namespace sluice::backend::cuda
