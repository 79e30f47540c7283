// CPU-only streaming: the layer source for a model larger than the RAM budget. From the plan
// (make_plan with has_gpu = false), resident layers and the non-layer tensors (token_embd, output,
// output_norm, rope_freqs) are read once at load into memory this class owns (not the page-cache
// mmap, so every resident byte is counted against the budget); the other layers are read from disk
// each pass into a ring of n_slots RAM slots allocated once at start-up.
//
// Slot life cycle (sequence number s = pass * n_streamed + index among streamed layers; slot
// s % n_slots):  free --submit--> reading --acquire waits--> in use --release--> free (and the
// read of s + n_slots is submitted into it at once). So while layer s is computed, the reads of
// s+1 .. s+n_slots-1 are in flight: prefetch depth k = n_slots - 1, wrapping from the last layer
// to the first of the next pass. Nothing is allocated on the hot path.
//
// Repacking: matrices the backend computes on in its own layout (Backend::repacked_bytes: the
// CPU's 16-row packed layout of Q4_K, Q6_K, Q8_0) are held in that layout wherever they live, so
// a streamed run computes exactly what the resident run does. Resident units keep only their
// other tensors in the file's layout and hold the packed matrices instead (read at load through
// a staging buffer a few groups of rows at a time, so the file layout never exists in full next
// to the packed copy). A streamed layer is read into its slot as before; acquire() then repacks
// its matrices into one packed buffer (Backend::repack_weight, on the backend's threads) before
// the layer is computed, while the reads of the next layers stay in flight.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/progress.h"
#include "core/status.h"
#include "model/model.h"
#include "model/weights.h"
#include "stream/io.h"
#include "stream/plan.h"
#include "stream/trace.h"

namespace sluice::gguf {
class File;
}

namespace sluice::stream {

struct CpuStreamOptions {
  uint64_t ram_budget = 0;  // bytes for all weights held in RAM: non-layer + resident + slots
  int n_slots = 2;          // ring slots for streamed layers (>= 1; 2+ overlaps disk and compute)
  // Layers no pass runs (--skip-layers, lossy; empty: none): neither held in RAM nor read, so
  // they cost no budget and no disk bytes. The model must leave them out of every pass
  // (Model::set_layer_mask); acquiring one is an error.
  std::vector<bool> skip;
  IoOptions io;
  Bandwidths bw;            // for the predicted token time only
  // Optional access trace (not owned; must outlive the streamer): start-up reads ("load"), each
  // slot read ("disk slot K"), stalls ("stall") and each layer's compute ("cpu").
  TraceWriter* trace = nullptr;
  // Optional: (bytes so far, bytes in all) while the RAM-resident tensors are read (and repacked)
  // at start-up.
  core::ProgressFn on_load_progress;
};

// One aligned read of a unit: bytes [offset, offset + len) of file `file` (the shard index of a
// split model, gguf::TensorInfo::shard; 0 otherwise) land at unit buffer + dst. A run never spans
// two files; a unit whose tensors lie in several shards has runs in each.
struct ReadRun {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
  uint64_t dst = 0;
};
// A matrix the backend computes on in its own (repacked) layout.
struct PackedTensor {
  std::string name;           // file tensor (token_embd.weight also stands for a tied output)
  backend::WeightView shape;  // type, ne0, ne1 (data unset)
  uint32_t file = 0;          // the file (shard) holding it
  uint64_t offset = 0;        // absolute offset of its first byte in that file
  uint64_t src = 0;           // where it lies in a buffer laid out by the unit's `runs`
  uint64_t dst = 0;           // where its repacked copy lies in the unit's packed area
  uint64_t bytes = 0;         // Backend::repacked_bytes
};
struct UnitLayout {
  std::string name;             // "blk.3" or "globals"
  std::vector<ReadRun> runs;    // every tensor: what a streamed slot receives
  uint64_t bytes = 0;           // buffer bytes: the sum of the aligned runs
  // Resident: the tensors held in the file's layout (all but the repacked matrices), and the
  // repacked matrices (each 64-byte aligned in a packed area of packed_bytes, a kIoAlign multiple).
  std::vector<ReadRun> kept_runs;
  uint64_t kept_bytes = 0;
  std::vector<PackedTensor> packed;
  uint64_t packed_bytes = 0;
  uint64_t ram_bytes() const { return kept_bytes + packed_bytes; }  // held when resident
};
// Where each layer's tensors lie in the model's file(s), grouped into large aligned reads (tensors
// of one layer are close together in GGUF files; gaps under 1 MiB are read rather than split;
// a layer cut by a shard boundary of a split model is read from both files). With a
// backend, also which matrices it repacks (token_embd never: rows are looked up in the file's
// layout; a tied output is a repacked copy of it); without one, none.
struct FileLayout {
  std::vector<UnitLayout> layers;  // blk.0 .. blk.{n-1}
  UnitLayout globals;              // every tensor outside blk.*
};
Result<FileLayout> layout_of(const gguf::File& file, const backend::Backend* be = nullptr);
// Empties the units of the layers with skip[l] (CpuStreamOptions::skip): zero bytes, no reads.
// Error when skip names another layer count.
Status leave_out_layers(FileLayout& layout, const std::vector<bool>& skip);
// Where bytes [off, off + n) of file `file` land in a buffer laid out by `runs`; false when no
// run holds them all.
bool locate(const std::vector<ReadRun>& runs, uint32_t file, uint64_t off, uint64_t n, uint64_t* at);
// A reader holding every file of the model (its shards, in order: file index = shard index),
// checked to have the sizes `file` was parsed with (else the model changed while loading).
Result<std::unique_ptr<FileReader>> open_reader(const gguf::File& file, const IoOptions& io);

struct CpuPlan {
  PlanInput input;        // units = layers, bytes = file bytes (what a pass reads)
  Plan plan;              // plan.resident_bytes: file bytes of the resident layers
  uint64_t budget = 0;
  uint64_t globals_bytes = 0;       // RAM held by the non-layer tensors (repacked where packed)
  uint64_t resident_ram_bytes = 0;  // RAM held by the resident layers (repacked where packed)
  uint64_t pack_bytes = 0;          // the packed buffer streamed layers are repacked into
  // globals + resident layers + slots + packed buffer: what the budget must hold.
  uint64_t total_bytes = 0;
  std::string describe() const;
};
// The smallest budget any placement fits: the non-layer tensors plus, over the choices of
// resident layers (largest first), those layers plus n_slots slots of the largest streamed one
// and the packed buffer of the largest repacked streamed one.
uint64_t min_ram_budget(const FileLayout& layout, int n_slots);
// Keeps the most layers resident (largest first) that fit the budget with the slots and the
// packed buffer the rest need. Errors (kInvalidArgument) when the budget is below
// min_ram_budget, stating it.
Result<CpuPlan> plan_cpu(const FileLayout& layout, const CpuStreamOptions& opts);

// Counters since load; "decode" is passes of one token.
struct StreamStats {
  uint64_t passes = 0, decode_passes = 0;
  uint64_t bytes_read = 0, decode_bytes_read = 0;  // streamed (disk tier) bytes consumed by passes
  uint64_t ram_bytes = 0, decode_ram_bytes = 0;    // RAM-resident layer bytes consumed by passes
  double stall_seconds = 0, decode_stall_seconds = 0;  // compute waiting for a slot's read
  // Time some slot read was in flight during decode passes (union of [submit, last byte]
  // intervals, as seen at acquire): streamed bytes / this = the disk's achieved GB/s while busy.
  double decode_read_busy_seconds = 0;
  // Repacking streamed layers after their read (compute thread, before the layer runs).
  uint64_t repack_bytes = 0, decode_repack_bytes = 0;  // repacked bytes written
  double repack_seconds = 0, decode_repack_seconds = 0;
};

class CpuLayerStreamer final : public model::LayerSource {
 public:
  // Reads (and repacks) the resident units, allocates the slots and starts the first reads. `be`
  // computes the layers and must outlive the streamer; its repacked_bytes decides what is packed.
  static Result<std::unique_ptr<CpuLayerStreamer>> create(const std::string& path, const gguf::File& file,
                                                          const model::Weights& w, backend::Backend& be,
                                                          const CpuStreamOptions& opts);
  ~CpuLayerStreamer() override;

  const model::Weights& globals() const override { return globals_; }
  Status begin_pass(int n_tokens) override;
  Result<const model::LayerWeights*> acquire(int layer) override;
  void release(int layer) override;
  // Layer skip: resident layers, or every streamed layer at once (the ring of reads ahead then
  // waits, unchanged, for the next pass that runs them).
  bool can_skip(const std::vector<bool>& run) const override;
  bool resident(int layer) const override;

  const CpuPlan& plan() const { return plan_; }
  const StreamStats& stats() const { return stats_; }
  uint64_t owned_bytes() const { return resident_bytes_ + slot_pool_bytes_ + pack_pool_bytes_; }
  const FileReader& reader() const { return *reader_; }

 private:
  struct AlignedFree {
    void operator()(uint8_t* p) const;
  };
  using Buffer = std::unique_ptr<uint8_t, AlignedFree>;
  enum class SlotState { kFree, kReading, kReady, kInUse };
  struct Slot {
    uint8_t* base = nullptr;
    SlotState state = SlotState::kFree;
    std::vector<FileReader::Ticket> tickets;  // capacity reserved at start-up
    uint64_t seq = 0;
    FileReader::Clock::time_point submitted{};
  };

  CpuLayerStreamer() = default;
  Status submit_next();  // starts the read of sequence submitted_ into its slot
  bool skipped(int layer) const { return !skip_.empty() && skip_[size_t(layer)]; }
  // Reads matrix `p` from the file into `staging` a few row groups at a time and repacks it into
  // dst (p.bytes). Load time only.
  Status pack_from_file(const PackedTensor& p, uint8_t* dst, uint8_t* staging, uint64_t staging_bytes);
  Status fail(Status st);

  CpuPlan plan_;
  FileLayout layout_;
  // Buffers before the reader: members are destroyed in reverse order, and the reader drains its
  // in-flight reads on destruction, so the kernel never writes into freed memory.
  Buffer resident_;
  Buffer slot_pool_;
  Buffer pack_pool_;  // the streamed layer being computed, its repacked matrices
  uint64_t resident_bytes_ = 0, slot_pool_bytes_ = 0, pack_pool_bytes_ = 0;
  std::unique_ptr<FileReader> reader_;
  backend::Backend* be_ = nullptr;
  bool pack_in_use_ = false;  // a streamed layer's packed matrices are in pack_pool_ until release

  model::Weights globals_;                    // views into resident_
  std::vector<model::LayerWeights> resident_views_;  // per layer (used when resident)
  std::vector<int> stream_index_;             // per layer: index among streamed layers, or -1
  std::vector<int> streamed_;                 // streamed layer ids, in order
  std::vector<bool> skip_;                    // CpuStreamOptions::skip (per layer, or empty)
  std::vector<model::LayerWeights> slot_views_;  // [streamed index * n_slots + slot]
  std::vector<Slot> slots_;
  uint64_t next_seq_ = 0;   // next sequence number to acquire
  uint64_t submitted_ = 0;  // next sequence number to submit
  bool decode_pass_ = false;
  TraceWriter* trace_ = nullptr;
  std::vector<std::string> slot_lanes_;       // "disk slot K", built once
  FileReader::Clock::time_point compute_start_{};  // acquire of the layer being computed
  FileReader::Clock::time_point busy_until_{};     // end of the last read counted as busy
  Status failed_;           // sticky: once a read failed, every later call reports it
  StreamStats stats_;
};

// The LoadOptions::layer_source hook for CPU streaming; *out (optional) receives the streamer the
// model will own, for stats.
std::function<Result<std::unique_ptr<model::LayerSource>>(const gguf::File&, const model::Weights&, backend::Backend&)>
cpu_streaming_source(const std::string& path, const CpuStreamOptions& opts, CpuLayerStreamer** out);

}  // namespace sluice::stream
