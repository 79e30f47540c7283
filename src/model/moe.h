// Mixture-of-experts routing, on the host. The router's logits come back from the backend once per
// MoE layer (n_tokens x n_expert floats); the choice of experts and their weights is made here, in
// one scalar implementation shared by every backend, so the CPU and the GPU (and the placement
// layer, which needs the choice to decide where each expert runs) always agree.
//
// Semantics are llama.cpp's build_moe_ffn with softmax gating: p = softmax(logits) over all
// experts; the n_used largest p are chosen (ties: the lower expert id); weights are those p,
// divided by their sum (clamped below at 2^-14) when `norm`, then multiplied by `scale`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace sluice::model {

struct LayerWeights;

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

// Prefetch bookkeeping shared by the expert caches. `mark` is n_expert flags, all false on entry
// and on return (scratch that saves a sort or a set per layer).
// out = the distinct experts of `r`, ascending (a layer's predicted set).
void distinct_experts(const MoeRouting& r, std::vector<bool>& mark, std::vector<int32_t>& out);
// How many of `predicted` the router then chose (one batch per chosen expert).
uint64_t count_chosen(std::span<const int32_t> predicted, std::span<const ExpertBatch> batches,
                      std::vector<bool>& mark);
// The eviction order both expert caches use: the expert with key k goes before the one with key b
// when it has fewer uses, or as many and an older last use.
inline bool evicts_before(std::span<const double> uses, std::span<const uint64_t> last_use, int k, int b) {
  return uses[size_t(k)] < uses[size_t(b)] ||
         (uses[size_t(k)] == uses[size_t(b)] && last_use[size_t(k)] < last_use[size_t(b)]);
}

// Where the routed experts of a layer run, decided per pass once the routing is known. Without a
// placement every expert runs on the executor computing the layer, from the layer's stacked
// tensors. A placement (stream/expert_streamer) keeps some experts in the main backend's memory
// and has the host CPU compute the others where they lie, in parallel with the main backend.
class ExpertPlacement {
 public:
  virtual ~ExpertPlacement() = default;
  struct Site {
    bool host = false;                   // the host executor computes it (views in host memory)
    backend::WeightView gate, up, down;  // the expert's matrices where its executor reads them
  };
  // One site per batch, called before any expert of `layer` runs in this pass (n_tokens rows). It
  // may enqueue copies on the main backend; the main backend's compute issued after place()
  // is ordered after them. Views stay valid until done(layer).
  virtual Status place(int layer, int n_tokens, std::span<const ExpertBatch> batches, std::span<Site> sites) = 0;
  // Every expert of `layer` has been issued (the main backend's may still run); host_seconds is
  // the host's time computing its experts (0 when it had none), for the placement's cost model.
  virtual void done(int layer, double host_seconds) = 0;

  // The most batches one place() may take (a cache with fewer slots than a layer's pass may
  // route to): the executor then places and computes a layer's experts in groups of at most this
  // many, in the same ascending expert order, so the sums are those of one group.
  virtual size_t max_batches_per_place() const { return std::numeric_limits<size_t>::max(); }

  // Prefetch of the next layer's experts. predictor(layer): the weights whose router predicts the
  // experts of the layer after `layer` (its ffn_norm and gate_inp, readable by the main backend),
  // or nullptr for no prediction. The executor then applies them to this layer's residual stream
  // at the router (after attention: the state the next layer's FFN will see, less this layer's
  // FFN and the next attention) and hands the routing it gives to predicted() after the last
  // place() of `layer`, so the placement can start moving those experts while `layer` computes.
  // Prediction only changes where experts are and when they move, never what is computed.
  virtual const LayerWeights* predictor(int layer) {
    (void)layer;
    return nullptr;
  }
  virtual void predicted(int next_layer, const MoeRouting& routing) {
    (void)next_layer;
    (void)routing;
  }
};

}  // namespace sluice::model
