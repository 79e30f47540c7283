// CPU-only mixture of experts under a RAM budget (docs/STREAMING.md, "RAM expert cache"). A token
// reads only n_expert_used of each layer's routed experts, so instead of streaming whole layers
// (every expert) this layer source keeps everything but the routed experts resident in RAM and
// reads each expert from disk when the router picks it, into a RAM cache of expert slots:
//   - resident: attention, norms, routers, shared experts, output head and the embedding table,
//     copied from the file once at load (the CPU's packed layout where the resident load packs);
//   - an expert = its gate, up and down slices of the stacked tensors (rows [e*ne1, (e+1)*ne1),
//     as model::TensorRef::expert cuts them), read with the FileReader (io_uring, O_DIRECT) and
//     repacked per expert with the backend's repack_weight where the resident load packs the
//     stacked tensor: a packed row range is exactly that slice of the whole tensor's packed layout,
//     so every expert is computed from the bytes the resident run computes from (bit-identical);
//   - eviction: the slot whose expert has the fewest uses so far, then the least recently used;
//     a slot read by the layer being placed is never evicted;
//   - prefetch (optional): the executor applies the next layer's router to the current hidden
//     state (model::ExpertPlacement::predictor); predicted experts missing from the cache are read
//     while this layer computes. Prediction accuracy = predicted and used / used.
// A layer whose pass routes to more experts than the cache holds is placed and computed in groups
// (ExpertPlacement::max_batches_per_place).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/progress.h"
#include "core/status.h"
#include "model/model.h"
#include "model/weights.h"
#include "stream/host_memory.h"
#include "stream/io.h"
#include "stream/trace.h"

namespace sluice::gguf {
class File;
}

namespace sluice::stream {

struct RamExpertOptions {
  uint64_t ram_budget = 0;   // bytes for every weight held in RAM: resident part + expert cache + staging
  uint64_t cache_bytes = 0;  // tests and sweeps: cap the expert cache (0: what the budget leaves)
  IoOptions io;
  bool prefetch = false;     // read the next layer's predicted experts ahead (--expert-prefetch on)
  // Passes of more tokens than this do not prefetch (a prefill routes to most experts anyway).
  int prefetch_max_tokens = 4;
  // Reads ahead only each token's prefetch_top highest-ranked predicted experts (0: all n_used).
  // Measured on a synthetic qwen3moe (docs/STREAMING.md): reading all 8 predictions ahead used 17%
  // of the reads and tripled the disk bytes per token; the top 2 used 37%, +15% disk bytes.
  int prefetch_top = 2;
  // Optional (not owned; must outlive the cache): one "expert" row per expert use (tier "ram hit",
  // "disk", or "prefetch" for a hit on an expert read ahead) and "disk expert" rows for reads.
  TraceWriter* trace = nullptr;
  core::ProgressFn on_load_progress;
};

// The sizes behind the cache (pure; the load and --plan use it).
struct RamExpertPlan {
  int n_layer = 0, n_expert = 0, n_used = 0;
  uint64_t budget = 0;
  uint64_t resident_bytes = 0;  // every tensor but the routed experts, as held (packed where packed)
  uint64_t expert_bytes = 0;    // the routed experts of every layer, file bytes
  uint64_t expert_file_bytes = 0;  // the largest expert's file bytes (gate + up + down)
  uint64_t slot_bytes = 0, off_up = 0, off_down = 0;  // one cache slot: matrices at these offsets
  uint64_t staging_bytes = 0;   // one expert's read in the file's layout, before it is repacked (0: nothing packed)
  int n_staging = 0;            // staging buffers (reads in flight that are repacked after)
  uint64_t n_slots = 0;         // cache slots the budget holds (capped at every expert)
  uint64_t min_slots = 0;       // one layer's active experts (n_used)
  uint64_t min_budget() const { return resident_bytes + uint64_t(n_staging) * staging_bytes + min_slots * slot_bytes; }
  uint64_t total_bytes() const { return resident_bytes + uint64_t(n_staging) * staging_bytes + n_slots * slot_bytes; }
  std::string describe() const;
};
// `be` decides what is repacked (its repacked_bytes). Error (kInvalidArgument) when the budget is
// below min_budget(), naming the parts.
Result<RamExpertPlan> plan_ram_experts(const model::Weights& w, const backend::Backend& be, const RamExpertOptions& opts);

struct RamExpertStats {
  uint64_t passes = 0, decode_passes = 0;
  uint64_t uses = 0, hits = 0, misses = 0;              // expert uses (one per expert per layer per pass)
  uint64_t decode_uses = 0, decode_hits = 0;
  uint64_t disk_bytes = 0, decode_disk_bytes = 0;       // expert bytes read from disk (misses and prefetches)
  uint64_t hit_bytes = 0, decode_hit_bytes = 0;         // expert bytes computed from the cache
  double wait_seconds = 0, decode_wait_seconds = 0;     // place() waiting for expert reads
  // Prefetch: experts predicted for a layer, those of them the layer used, every expert it used
  // (over the passes that predicted); reads started ahead, and those that were used.
  uint64_t predicted = 0, predicted_used = 0, predicted_actual = 0;
  uint64_t decode_predicted_used = 0, decode_predicted_actual = 0;
  uint64_t prefetch_reads = 0, prefetch_used = 0, prefetch_bytes = 0, decode_prefetch_bytes = 0;
  std::vector<uint64_t> layer_uses, layer_hits;         // decode passes, per layer
};

class RamExpertCache final : public model::LayerSource, public model::ExpertPlacement {
 public:
  static Result<std::unique_ptr<RamExpertCache>> create(const gguf::File& file, const model::Weights& w,
                                                        backend::Backend& be, const RamExpertOptions& opts);
  ~RamExpertCache() override;

  // LayerSource: every layer resident but its routed experts.
  const model::Weights& globals() const override { return globals_; }
  Status begin_pass(int n_tokens) override;
  Result<const model::LayerWeights*> acquire(int layer) override;
  void release(int) override {}
  bool release_needs_sync() const override { return false; }
  model::ExpertPlacement* experts() override { return this; }

  // ExpertPlacement.
  Status place(int layer, int n_tokens, std::span<const model::ExpertBatch> batches,
               std::span<Site> sites) override;
  void done(int, double) override {}
  size_t max_batches_per_place() const override { return slots_.size(); }
  const model::LayerWeights* predictor(int layer) override;
  void predicted(int next_layer, const model::MoeRouting& routing) override;

  const RamExpertPlan& plan() const { return plan_; }
  const RamExpertStats& stats() const { return stats_; }
  int cache_slots() const { return int(slots_.size()); }
  uint64_t owned_bytes() const { return owned_bytes_; }
  const FileReader& reader() const { return *reader_; }
  // One line: resident part, cache slots and their share of all experts.
  std::string describe() const;
  // "experts (decode): ..." hit rate, disk bytes per token, prefetch accuracy; and one line of
  // hit rates per layer.
  std::string stats_line() const;
  std::string layer_line() const;

 private:
  RamExpertCache() = default;
  struct Slot {
    uint8_t* base = nullptr;
    int key = -1;               // layer * n_expert + expert; -1: empty
    uint64_t busy = 0;          // stamp of the place() reading it
    bool pending = false;       // a read in flight (finish() completes it)
    bool prefetched = false;    // read ahead and not used yet
    int staging = -1;           // staging buffer of the pending read (packed matrices), -1: none
    FileReader::Ticket tickets[3] = {};
    int n_tickets = 0;
    FileReader::Clock::time_point submitted{};
  };
  // Where matrix i (gate, up, down) of expert `key` lies in the file and how the slot holds it.
  struct ExpertMatrix {
    backend::WeightView shape;  // ne1 rows of the expert (data unset)
    uint32_t file = 0;
    uint64_t offset = 0, bytes = 0;  // file bytes of the expert's slice
    int64_t packed_bytes = 0;        // > 0: held repacked
  };
  ExpertMatrix matrix(int key, int i) const;
  uint64_t expert_file_bytes(int key) const;
  Status start_read(Slot& s, int key);  // s.key = key, read submitted (pending)
  Status finish(Slot& s);               // waits for s's read, repacks into the slot
  Site site(const Slot& s) const;
  int victim() const;
  int free_staging() const;
  bool arrived(Slot& s);                        // every read of s's pending expert completed (no wait)
  Slot& oldest_pending(bool with_staging);      // the earliest submitted read in flight
  Status fail(Status st);

  RamExpertPlan plan_;
  backend::Backend* be_ = nullptr;
  HostBlock resident_, pool_;  // before the reader: destroyed after it drains
  uint64_t owned_bytes_ = 0;
  std::unique_ptr<FileReader> reader_;
  model::Weights globals_;
  std::vector<model::LayerWeights> layers_;  // resident views (routed experts absent)
  std::vector<model::LayerWeights> file_;    // the file's views (stacked expert shapes and names)
  std::vector<uint64_t> tensor_offset_;      // [layer * 3 + matrix]: the stacked tensor's offset in its file
  std::vector<uint32_t> tensor_file_;        // [layer * 3 + matrix]: its file (shard)
  int n_layer_ = 0, n_expert_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint8_t*> staging_;
  std::vector<bool> staging_busy_;
  std::vector<int> where_;          // key -> slot, -1: not cached
  std::vector<double> freq_;        // key -> uses
  std::vector<uint64_t> last_use_;  // key -> stamp of its last use
  uint64_t stamp_ = 0;
  bool decode_ = false;
  int pass_tokens_ = 0;
  bool prefetch_ = true;
  int prefetch_max_tokens_ = 4;
  int prefetch_top_ = 2;
  std::vector<int32_t> ahead_;               // predicted() scratch: the experts read ahead
  int predicted_layer_ = -1;                 // the layer predicted_set_ is for
  std::vector<int32_t> predicted_set_;       // experts predicted for it (ascending, distinct)
  std::vector<int> misses_;                  // place() scratch
  std::vector<bool> mark_;                   // n_expert scratch
  TraceWriter* trace_ = nullptr;
  Status failed_;
  RamExpertStats stats_;
};

// The LoadOptions::layer_source hook; *out (optional) receives the cache the model will own.
std::function<Result<std::unique_ptr<model::LayerSource>>(const gguf::File&, const model::Weights&, backend::Backend&)>
ram_expert_source(const RamExpertOptions& opts, RamExpertCache** out);

}  // namespace sluice::stream
