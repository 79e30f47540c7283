// Expert placement for mixture-of-experts models larger than the GPU's memory (docs/STREAMING.md,
// "Mixture of experts"). Everything but the routed experts (attention, norms, routers, shared
// experts, output head) is resident in backend memory. The routed experts:
//   - a VRAM expert cache: slots of one expert each (gate, up and down matrices), filled at load
//     and re-filled by copies from pinned host memory; eviction by measured use frequency, then
//     recency (an expert used in the current layer is never evicted), across all layers or, with
//     per-layer quotas (ExpertStreamOptions::layer_quotas), within the missing expert's layer
//     once that layer holds its quota; the quotas are re-planned from the decode passes' measured
//     routing (plan_expert_quotas) every quota_period decode passes;
//   - every expert in pinned host memory (the copy engine's source), and for the host CPU in its
//     packed layout where the RAM budget allows (else the pinned bytes as they lie);
//   - per pass, once the router has spoken (model::ExpertPlacement::place): a cached expert runs
//     on the GPU; a missed one either runs on the host CPU, in parallel with the GPU computing the
//     cached ones, or is copied into a cache slot and runs on the GPU, whichever the cost model
//     says finishes first (misses are assigned longest first to the executor that would finish it
//     earliest: CPU at its measured GB/s, copy engine at the measured H2D GB/s). Passes of
//     prefill_batch tokens or more copy every miss (one copy serves the whole batch).
// The host never waits for the device: copies are ordered after the compute that last read the
// slot through backend marks, and compute after the copy.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"
#include "stream/host_memory.h"
#include "stream/trace.h"

namespace sluice::gguf {
class File;
}

namespace sluice::stream {

enum class MissPolicy {
  kCostModel,  // decode: CPU or copy by predicted finish time; prefill: copy
  kCpu,        // every miss on the CPU (llama.cpp's --n-cpu-moe, with a cache)
  kCopy,       // every miss copied into the cache (pure streaming of experts)
};

struct ExpertStreamOptions {
  uint64_t vram_budget = 0;  // 0: the backend's free memory at load
  uint64_t ram_budget = 0;   // pinned expert copies + the CPU's packed copies; 0: 3/4 of RAM
  int n_ctx = 0;             // KV cache positions (0: the model's default)
  int max_batch = model::kDefaultMaxBatch;  // tokens per pass (LoadOptions::max_batch)
  int max_sequences = 1;  // sequences one pass may hold (LoadOptions::max_sequences)
  // The backend's scratch (Backend::reserve_scratch); 0: backend::cuda_scratch_bytes for the model
  // and the options above.
  uint64_t workspace_bytes = 0;
  int prefill_batch = 32;
  backend::CpuOptions host_cpu;  // the host executor (threads: physical cores by default)
  MissPolicy policy = MissPolicy::kCostModel;
  // Cost-model starting points in bytes/s; the CPU's is refined from its measured expert times.
  double h2d_bytes_per_s = 25e9;
  double cpu_bytes_per_s = 40e9;
  uint64_t cache_bytes = 0;   // tests and sweeps: cap the expert cache (0: what the budget leaves)
  bool allow_host_backend = false;  // tests: run on the CPU backend (streaming calls synchronous)
  // Prefetch (--expert-prefetch): the next layer's router applied to this layer's state predicts
  // its experts; the missing ones are copied into the cache while this layer computes. Decode
  // passes only (fewer than prefill_batch tokens), not with MissPolicy::kCpu (no copies).
  bool prefetch = true;
  // Per-layer quotas of cache slots (--expert-quotas layer): a miss copied into the cache evicts
  // an expert of its own layer once the layer holds its quota, else one of a layer above its
  // quota. The quotas start uniform (the initial fill) and are re-planned from the decode passes'
  // expert uses every quota_period decode passes, so a prefill's burst of experts cannot push out
  // the experts decode keeps using. Off: one pool, eviction across layers.
  bool layer_quotas = false;
  int quota_period = 16;
  // Optional (not owned; outlives the streamer): one "expert" row per expert use, tier "vram hit",
  // "prefetch" (a hit on an expert copied ahead), "cpu" or "copied".
  TraceWriter* trace = nullptr;
};

// The sizes behind a placement (pure; ExpertStreamer::create and --plan use it): what stays
// resident, the slot layout, the memory besides weights, and how many slots a VRAM budget holds.
struct ExpertPlan {
  int n_layer = 0, n_expert = 0, n_used = 0;
  uint64_t resident_bytes = 0;  // every tensor but token_embd and the routed experts
  uint64_t expert_bytes = 0;    // the routed experts of every layer
  uint64_t reserved_bytes = 0;  // KV cache, activations, workspace
  uint64_t slot_bytes = 0, off_up = 0, off_down = 0;
  uint64_t n_slots = 0;         // for the budget given (0 without one)
  // The plan and a predicted decode time under uniform routing, at the given bytes/s.
  std::string describe(double vram_bw, double h2d_bw, double cpu_bw) const;
};
ExpertPlan plan_experts(const model::Weights& w, int n_ctx, uint64_t workspace_bytes, uint64_t vram_budget,
                        int max_batch = model::kDefaultMaxBatch);
// The backend scratch plan_experts counts for a model of `cfg` under `o`: o.workspace_bytes, or for 0
// what the CUDA backend reserves for it (backend::cuda_scratch_bytes).
uint64_t expert_workspace_bytes(const model::Config& cfg, const ExpertStreamOptions& o);

// Per-layer quotas of n_slots cache slots (pure): uses[l * n_expert + e] counts the uses of expert
// e of layer l. Each slot goes to one of the n_slots most-used experts (more uses first, then the
// lower key); the slots left over once every used expert has one are dealt round-robin to the
// layers with room (at most n_expert per layer), layer 0 first. With no uses at all that is the
// uniform split the cache starts with. The quotas sum to min(n_slots, n_layer * n_expert).
std::vector<int> plan_expert_quotas(std::span<const double> uses, int n_layer, int n_expert, uint64_t n_slots);

struct ExpertStats {
  uint64_t passes = 0, decode_passes = 0;
  uint64_t uses = 0, hits = 0, cpu_misses = 0, copy_misses = 0;          // expert executions
  uint64_t decode_uses = 0, decode_hits = 0, decode_cpu = 0, decode_copy = 0;
  uint64_t hit_bytes = 0, cpu_bytes = 0, copy_bytes = 0;                  // expert bytes read
  uint64_t decode_hit_bytes = 0, decode_cpu_bytes = 0, decode_copy_bytes = 0;
  double host_seconds = 0, decode_host_seconds = 0;
  std::vector<uint64_t> layer_uses, layer_hits;  // per layer
  std::vector<uint64_t> decode_layer_uses, decode_layer_hits;
  // Prefetch: experts the predictions named, those of them the layer used, every expert used by a
  // predicted layer; copies started ahead, those used.
  uint64_t predicted = 0, predicted_used = 0, predicted_actual = 0;
  uint64_t decode_predicted_used = 0, decode_predicted_actual = 0;
  uint64_t prefetch_copies = 0, prefetch_used = 0, prefetch_bytes = 0, decode_prefetch_bytes = 0;
};

class ExpertStreamer final : public model::LayerSource, public model::ExpertPlacement {
 public:
  static Result<std::unique_ptr<ExpertStreamer>> create(const gguf::File& file, const model::Weights& w,
                                                        backend::Backend& be, const ExpertStreamOptions& opts);
  ~ExpertStreamer() override;

  // LayerSource: every layer resident but its routed experts.
  const model::Weights& globals() const override { return globals_; }
  Status begin_pass(int n_tokens) override;
  Result<const model::LayerWeights*> acquire(int layer) override { return &layers_[size_t(layer)]; }
  void release(int) override {}
  bool release_needs_sync() const override { return false; }
  HostExecutor host_executor() override { return {host_be_.get(), host_rope_freqs_}; }
  model::ExpertPlacement* experts() override { return this; }

  // ExpertPlacement.
  Status place(int layer, int n_tokens, std::span<const model::ExpertBatch> batches,
               std::span<Site> sites) override;
  void done(int layer, double host_seconds) override;
  const model::LayerWeights* predictor(int layer) override;
  void predicted(int next_layer, const model::MoeRouting& routing) override;

  const ExpertStats& stats() const { return stats_; }
  int cache_slots() const { return int(slots_.size()); }
  // Per-layer quotas (empty without ExpertStreamOptions::layer_quotas) and cached experts per layer.
  const std::vector<int>& quotas() const { return quota_; }
  const std::vector<int>& layer_cached() const { return held_; }
  int n_experts_total() const { return n_layer_ * n_expert_; }
  uint64_t resident_bytes() const { return resident_bytes_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t pinned_bytes() const { return pinned_bytes_; }
  uint64_t packed_bytes() const { return packed_bytes_; }
  double cpu_bytes_per_s() const { return cpu_bw_; }
  double h2d_bytes_per_s() const { return h2d_bw_; }
  // One paragraph: resident part, cache slots and their share of all experts, host copies.
  std::string describe() const;
  // "experts: ..." summary of stats() (hit rate, per-tier bytes per token, CPU vs GPU share).
  std::string stats_line() const;
  // Decode hit rate of every layer.
  std::string layer_line() const;

 private:
  explicit ExpertStreamer(backend::Backend& be) : be_(be) {}
  struct Slot {
    void* base = nullptr;
    int key = -1;                          // layer * n_expert + expert held; -1: empty
    backend::Backend::Mark copy_mark = 0;  // end of the copy that filled it
    backend::Backend::Mark free_mark = 0;  // compute mark after the last layer that read it
    uint64_t busy = 0;                     // layer stamp of the pass that reads it now
    uint64_t reserved = 0;                 // layer stamp of the place() that prefetched into it
    bool prefetched = false;               // copied ahead and not used yet
  };
  // The three matrices of expert `key` in host memory: where the copy engine reads (pinned) and
  // where the CPU computes (packed where made, else the pinned bytes).
  struct HostExpert {
    backend::WeightView copy[3], cpu[3];
    uint64_t bytes() const {
      return uint64_t(copy[0].ne1 * copy[0].row_bytes() + copy[1].ne1 * copy[1].row_bytes() +
                      copy[2].ne1 * copy[2].row_bytes());
    }
  };
  HostExpert host_expert(int key) const;
  Site slot_site(const Slot& s, int key) const;
  // The slot a copy of an expert of `layer` goes to: -1 when every slot is read by this pass.
  int victim(int layer) const;
  void fill(Slot& s, int key);

  backend::Backend& be_;
  std::unique_ptr<backend::Backend> host_be_;
  backend::WeightView host_rope_freqs_;
  model::Weights globals_;
  std::vector<model::LayerWeights> layers_;      // resident views (routed experts absent)
  std::vector<model::LayerWeights> host_pinned_; // stacked experts in pinned memory
  std::vector<model::LayerWeights> host_cpu_;    // stacked experts as the CPU reads them
  std::vector<HostBlock> packed_blocks_;
  int n_layer_ = 0, n_expert_ = 0;
  uint64_t slot_bytes_ = 0, resident_bytes_ = 0, pinned_bytes_ = 0, packed_bytes_ = 0;
  uint64_t off_up_ = 0, off_down_ = 0;           // matrix offsets inside a slot
  std::vector<Slot> slots_;
  std::vector<int> where_;                       // key -> slot, -1: not cached
  std::vector<double> freq_;                     // key -> uses
  std::vector<uint64_t> last_use_;               // key -> layer stamp of its last use
  bool layer_quotas_ = false;
  int quota_period_ = 16;
  std::vector<int> quota_;                       // layer -> slots it may hold (layer_quotas_)
  std::vector<int> held_;                        // layer -> slots holding one of its experts
  std::vector<double> decode_uses_;              // key -> uses in decode passes (layer_quotas_ only)
  int decode_passes_since_quota_ = 0;
  uint64_t stamp_ = 0;                           // increases every place()
  backend::Backend::Mark newest_mark_ = 0;       // the latest mark a slot holds
  int pass_tokens_ = 0;
  bool host_backend_ = false;
  int prefill_batch_ = 32;
  MissPolicy policy_ = MissPolicy::kCostModel;
  double h2d_bw_ = 25e9, cpu_bw_ = 40e9;
  uint64_t layer_cpu_bytes_ = 0;                 // host bytes of the layer being placed
  std::vector<int> busy_slots_;
  bool prefetch_ = true;
  int predicted_layer_ = -1;               // the layer predicted_set_ is for
  std::vector<int32_t> predicted_set_;
  std::vector<bool> mark_;                 // n_expert scratch
  TraceWriter* trace_ = nullptr;
  ExpertStats stats_;
};

// The layer source factory for model::LoadOptions::layer_source. *out (optional) receives the
// streamer (owned by the model).
std::function<Result<std::unique_ptr<model::LayerSource>>(const gguf::File&, const model::Weights&, backend::Backend&)>
expert_streaming_source(const ExpertStreamOptions& opts, ExpertStreamer** out);

}  // namespace sluice::stream
