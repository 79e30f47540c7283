// Mixture-of-experts routing, on the host. The router's logits come back from the backend once per
// MoE layer (n_tokens x n_expert floats); the choice of experts and their weights is made here, in
// one scalar implementation shared by every backend, so the CPU and the GPU (and the placement
// layer, which needs the choice to decide where each expert runs) always agree.
//
// Semantics are llama.cpp's build_moe_ffn with softmax gating: p = softmax(logits) over all
// experts; the n_used largest p are chosen (ties: the lower expert id); weights are those p,
// divided by their sum (clamped below at 2^-14) when `norm`, then multiplied by `scale`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sluice::model {

struct MoeRouting {
  int n_tokens = 0;
  int n_used = 0;
  std::vector<int32_t> experts;  // [n_tokens][n_used], by descending probability
  std::vector<float> weights;    // [n_tokens][n_used]
};

// logits: [n_tokens][n_expert] row-major. Preconditions: 1 <= n_used <= n_expert.
void route_experts(std::span<const float> logits, int n_tokens, int n_expert, int n_used, bool norm, float scale,
                   MoeRouting& out);

// The tokens routed to one expert: a dense batch for the expert's matrices.
struct ExpertBatch {
  int32_t expert = 0;
  std::vector<int32_t> rows;    // token rows of the pass, ascending
  std::vector<float> weights;   // the router weight of each row
};

// One batch per expert that at least one token chose, in ascending expert order (a deterministic
// order of accumulation, the same on every backend). Reuses `out`'s storage.
void group_by_expert(const MoeRouting& r, int n_expert, std::vector<ExpertBatch>& out);

}  // namespace sluice::model
