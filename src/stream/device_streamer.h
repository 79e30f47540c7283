// Device streaming: the layer source for a backend with its own memory (the CUDA backend) when the
// model does not fit it. From the plan (make_plan with has_gpu = true), every layer has a home:
//   A  uploaded once at start-up (upload_weight): resident, pointers fixed;
//   B  its bytes held in pinned host memory (alloc_staging, read once at start-up), copied each
//      pass into a ring of n_slots backend slots (copy_to_slot);
//   C  read from disk each pass (FileReader, O_DIRECT) into a ring of pinned staging buffers, then
//      copied into the slots as B.
// The output head, output_norm and rope_freqs are uploaded; token_embd stays in host memory
// (Backend::get_rows reads the host table).
//
// Streamed layers pass through the slots in sequence (s = pass * n_streamed + index among
// streamed layers; slot s % n_slots), and the host never waits for the device on the hot path:
//   copy s into its slot   starts after the compute mark taken at release(s - n_slots) (slot free)
//   compute of s           waits (compute_wait) for the mark of copy s, issued in acquire(s)
//   release(s)             takes compute_mark() and issues copy s + n_slots into the freed slot
// so while layer s computes, copies of s+1 .. s+n_slots-1 are queued or running (prefetch depth
// n_slots - 1), wrapping from the last layer of one pass to the first of the next.
// C layers: read C-index k goes into staging buffer k % n_staging once the copy of k - n_staging
// out of that buffer is done (host_wait on its mark: the only host wait, and it is taken without
// need only when the disk would otherwise idle); the copy of k is issued once its read is done.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/model.h"
#include "model/weights.h"
#include "stream/cpu_streamer.h"
#include "stream/host_memory.h"
#include "stream/io.h"
#include "stream/pass_tuner.h"
#include "stream/plan.h"
#include "stream/trace.h"

namespace sluice::gguf {
class File;
}

namespace sluice::stream {

// Passes of at least this many tokens stream every layer to the GPU (DeviceStreamOptions).
inline constexpr int kPrefillBatch = 64;
// learn_cpu_flops: the relative difference between the measured and the planned rate that
// re-plans the multi-token passes.
inline constexpr double kRelearnTolerance = 0.1;

struct DeviceStreamOptions {
  // Backend memory for everything the model puts there: uploaded output head and norms, resident
  // layers, slots, KV cache, activations and workspace. 0: the backend's free memory at load less
  // kAutoVramMargin (auto_vram_budget).
  uint64_t vram_budget = 0;
  // Pinned host memory for B copies plus C staging. 0: three quarters of physical RAM.
  uint64_t ram_budget = 0;
  int n_slots = 2;          // backend slots for streamed layers (>= 2: one computes, one fills)
  // Layers no pass runs (--skip-layers, lossy; empty: none): neither uploaded, pinned, read nor
  // copied (zero bytes in the plan, placed in VRAM at no cost). The model must leave them out of
  // every pass (Model::set_layer_mask); acquiring one is an error.
  std::vector<bool> skip;
  int n_ctx = 0;            // the model's KV cache positions (LoadOptions::n_ctx; 0: model default)
  int max_batch = model::kDefaultMaxBatch;  // tokens per pass (LoadOptions::max_batch): sizes the activations
  int max_sequences = 1;    // sequences one pass may hold (LoadOptions::max_sequences): sizes attention's scratch
  // The backend's scratch (Backend::reserve_scratch); 0: backend::cuda_scratch_bytes for the model
  // and the options above.
  uint64_t workspace_bytes = 0;
  IoOptions io;
  Bandwidths bw;            // planning; h2d and vram are measured at load where possible
  bool measure_bandwidths = true;  // cuda_h2d_bandwidth / cuda_copy_bandwidth at load (GPU only)
  // Read device queue times from marks (copy seconds, compute stalls). Costs two compute marks per
  // streamed layer; off: only host-side waits are counted.
  bool time_marks = true;
  // Optional access trace (not owned; must outlive the streamer): "h2d slot K" copies, "disk
  // staging K" reads, "stall" host waits, "load" start-up reads.
  TraceWriter* trace = nullptr;
  // Optional: (bytes so far, bytes in all) while the pinned-RAM (B) layers are read at start-up.
  core::ProgressFn on_load_progress;

  // Hybrid execution: during decode passes the host CPU computes the pinned-RAM (B) layers the
  // planner gives it (allow_cpu_executor, from measured bandwidths) where they lie, while the copy
  // queue streams the other B and C layers to the GPU. A pass of several tokens (several
  // sequences' decode tokens, a speculative verification, a short prompt) takes the placement the
  // cost model predicts fastest for its token count (pass_placement): the decode one, a subset of
  // its CPU layers on the CPU (the CPU's time per layer grows with the tokens, a copy's does not),
  // or every streamed layer on the GPU; passes of prefill_batch tokens or more (prefill:
  // compute-bound on the CPU, and one copy serves the whole batch) always the last. Placements
  // planned with force_homes/force_exec: the decode one below prefill_batch. Off: every streamed
  // layer is copied (pure streaming).
  bool hybrid = true;
  int prefill_batch = kPrefillBatch;
  // Tokens per decode pass the placement is planned for: 1, or K + 1 when speculative decoding
  // verifies K drafted tokens per pass (a larger batch favours streaming to the GPU over CPU
  // compute).
  int decode_batch = 1;
  int cpu_threads = 0;      // the host executor's threads (0: physical cores)
  // Measure the CPU's GB/s (alone and while the GPU copies) at load for the plan (GPU only).
  bool measure_cpu = true;
  // Learn the CPU's rate on multi-token passes from the passes themselves: the CPU layers of
  // passes whose predicted CPU time is compute-bound (n x 2 x params / cpu_flops above bytes /
  // cpu) are timed, and once their ops over their seconds differ from bw.cpu_flops by more than
  // kRelearnTolerance, bw.cpu_flops takes the measured rate and every pass size's placement is
  // chosen again (the start-up probe times a bare product; a layer in a pass also runs its
  // attention, norms and activations while the copy engine shares DRAM).
  bool learn_cpu_flops = true;
  // Tune each multi-token pass size's CPU layer count from the passes' own times (CountTuner,
  // stream/pass_tuner.h): starting at the batch placement's count (moved by the correction a
  // nearby settled size measured, corrected_start), one layer fewer or more at a time while that
  // is faster. Only sizes whose placement is a batch one (kBatch).
  bool tune_passes = true;
  // Counts the tuner tries past one that is not faster before a direction ends
  // (CountTuner::Options::patience).
  int tune_patience = CountTuner::Options{}.patience;

  // Tests: run the pipeline on a backend that reads host weights (the CPU backend implements the
  // streaming calls synchronously), and force each layer's home instead of planning.
  bool allow_host_backend = false;
  std::vector<Home> force_homes;  // per layer; empty: the planner decides
  // Hybrid placements the planner scores (--hybrid): whole layers alternating between CPU and GPU,
  // layers split by matrix rows, or the faster of the two. kSplit is forced: every pinned-RAM
  // dense layer split, and hybrid passes for every pass shorter than prefill_batch.
  HybridMode hybrid_mode = HybridMode::kAuto;
  double split_share = 0;  // split layers: the CPU's share of rows, in (0, 1); 0: the planner's choice

  // Tests: each layer's executor in hybrid passes (with force_homes; kCpu and kSplit only for B
  // layers, kSplit only for dense layers).
  std::vector<Executor> force_exec;
  // With force_exec: each kSplit layer's CPU share of rows, in (0, 1) (per layer; empty: 0.5).
  std::vector<double> force_share;
  // Tests: the host executor's backend options (e.g. without packed weights, so a forced mix is
  // bit-comparable with a resident run on the CPU backend).
  backend::CpuOptions host_cpu;
};

struct DevicePlan {
  PlanInput input;              // units = layers
  Plan plan;
  int n_ctx = 0;                // resolved KV cache positions
  int max_batch = model::kDefaultMaxBatch;  // tokens per pass (the longest prefill pass)
  uint64_t globals_bytes = 0;   // output head, output_norm, rope_freqs (uploaded)
  uint64_t kv_bytes = 0;        // KV cache (f16)
  uint64_t activation_bytes = 0;
  uint64_t workspace_bytes = 0;
  uint64_t vram_budget = 0, ram_budget = 0;
  int n_staging = 0;            // pinned staging buffers for C reads (0 without C layers)
  bool forced = false;          // homes came from force_homes
  int prefill_batch = kPrefillBatch;  // passes of at least this many tokens stream every layer to the GPU
  uint64_t reserved_bytes() const { return globals_bytes + kv_bytes + activation_bytes + workspace_bytes; }
  // Backend bytes the plan uses: reserved + resident layers + slots.
  uint64_t vram_used() const { return reserved_bytes() + plan.resident_bytes + uint64_t(plan.n_slots) * plan.slot_bytes; }
  std::string describe() const;
};

// What a budget of 0 ("--vram-budget auto") leaves unplanned of the backend's free memory at load:
// allocations the plan does not count (kernel modules loaded lazily on first launch, CUDA graphs,
// the allocator's rounding of each buffer).
inline constexpr uint64_t kAutoVramMargin = 256ull << 20;
// The budget "auto" resolves to with `free_bytes` free (a backend's free_memory()); errors when
// the backend reports no limit (free_bytes < 0) or the margin takes all of it.
Result<uint64_t> auto_vram_budget(int64_t free_bytes, const char* backend_name);

// The placement for `file` under the budgets of `opts` (vram_budget must be set: the caller
// resolves 0 to the backend's free memory). Errors (kInvalidArgument) when the VRAM budget cannot
// hold the reserved memory plus n_slots slots of the largest layer, or the RAM budget cannot hold
// the staging that reading from disk needs, stating the minimum.
Result<DevicePlan> plan_device(const gguf::File& file, const FileLayout& layout, const DeviceStreamOptions& opts);
// The placement a pass of n_tokens runs (with a host executor): kDecode, the plan's own (its CPU
// layers on the host); kBatch, batch_placement's for n_tokens (a subset of those CPU layers); kAll,
// every streamed layer copied to the GPU. Passes of at least prefill_batch tokens take kAll, and
// with a forced placement or --hybrid split every shorter pass takes kDecode; otherwise the
// fastest prediction for n_tokens, the decode placement on ties, and for passes no longer than the
// plan's own batch (decode) only kDecode or kAll. A decode placement with row-split layers serves
// one-token passes only. `plan` is the chosen placement scored at n_tokens.
enum class PassKind { kAll, kDecode, kBatch };
struct PassPlacement {
  PassKind kind = PassKind::kAll;
  Plan plan;
};
PassPlacement pass_placement(const DevicePlan& dp, int n_tokens);

// Counters since load; "decode" is passes of one token. Bytes are counted as passes consume them.
struct DeviceStreamStats {
  uint64_t passes = 0, decode_passes = 0;
  uint64_t vram_bytes = 0, decode_vram_bytes = 0;  // A: resident layers read in place
  uint64_t ram_bytes = 0, decode_ram_bytes = 0;    // B: copied from pinned RAM
  uint64_t disk_bytes = 0, decode_disk_bytes = 0;  // C: read from disk, then copied
  // Copy queue: seconds copying and the bytes those copies moved (from marks on a GPU; the memcpy
  // on host backends). Copies are timed once their marks have passed: call collect() after a
  // run for the last pass.
  double copy_seconds = 0;
  uint64_t copy_bytes_timed = 0;
  uint64_t copies = 0;
  // Streamed layers whose slot still held them (kept in their slots), so nothing was copied;
  // their bytes count as read in place (vram_bytes).
  uint64_t kept_hits = 0;
  // Stall estimate: compute waiting for copies (time between the compute marks around each
  // compute_wait), and the host blocked on disk reads or on copies still reading staging.
  double compute_stall_seconds = 0, decode_compute_stall_seconds = 0;
  double disk_wait_seconds = 0, decode_disk_wait_seconds = 0;
  double staging_wait_seconds = 0;
  // Hybrid execution: layers the host CPU computed (B bytes read where they lie), and the host
  // time spent on them (acquire to release: the CPU's compute, synchronous).
  uint64_t cpu_bytes = 0, decode_cpu_bytes = 0;
  // Row-split layers: the bytes of their CPU rows (the bytes copied, their GPU rows and vectors,
  // count in ram_bytes). Their time is not split out between the executors.
  uint64_t split_cpu_bytes = 0, decode_split_cpu_bytes = 0;
  uint64_t split_layers = 0;  // split layers computed (all passes)
  double cpu_seconds = 0, decode_cpu_seconds = 0;
  uint64_t phase_changes = 0;  // passes whose executor set differed from the last (ring restarted)
  uint64_t batch_passes = 0;   // passes that ran a batch placement (pass_placement: kBatch)
  // CPU layers of multi-token passes (any placement): bytes, ops (2 x tokens x params) and host
  // seconds; how many times their measured rate replaced the planned cpu_flops.
  uint64_t batch_cpu_bytes = 0;
  double batch_cpu_ops = 0, batch_cpu_seconds = 0;
  uint64_t cpu_flops_updates = 0;
  // The sample behind the last update (learn_cpu_flops): ops and seconds of the compute-bound CPU
  // layers timed until then; the rate in use is their quotient.
  double learned_cpu_ops = 0, learned_cpu_seconds = 0;
  // Pass tuning: passes timed for a tuner, and count changes it made.
  uint64_t tuned_passes = 0, tuner_moves = 0;
  bool device_timed = false;  // copy_seconds / compute stalls come from the backend's marks
};

class DeviceStreamer final : public model::LayerSource {
 public:
  // Plans, uploads globals and A layers, reads B layers into pinned memory, allocates slots and
  // staging, and starts the first reads. `be` must outlive the streamer (the model owns both and
  // destroys the source first).
  static Result<std::unique_ptr<DeviceStreamer>> create(const std::string& path, const gguf::File& file,
                                                        const model::Weights& w, backend::Backend& be,
                                                        const DeviceStreamOptions& opts);
  ~DeviceStreamer() override;

  const model::Weights& globals() const override { return globals_; }
  Status begin_pass(int n_tokens) override;
  Result<const model::LayerWeights*> acquire(int layer) override;
  void release(int layer) override;
  // Layer skip: resident layers, or every streamed layer at once (the ring of reads ahead then
  // waits, unchanged, for the next pass that runs them).
  bool can_skip(const std::vector<bool>& run) const override;
  bool resident(int layer) const override;
  // Slot reuse is ordered on the device by marks, never by a host sync.
  bool release_needs_sync() const override { return false; }
  // Only when every layer is resident (then decode steps may be replayed).
  bool weights_fixed() const override { return streamed_.empty(); }
  void pass_replayed(const std::vector<bool>& run) override;
  HostExecutor host_executor() override { return {host_be_.get(), host_rope_freqs_}; }
  bool host_capable(int layer) const override { return size_t(layer) < host_capable_.size() && host_capable_[size_t(layer)]; }
  bool on_host(int layer) const override {
    return pass_cpu_ != nullptr && size_t(layer) < pass_cpu_->size() && (*pass_cpu_)[size_t(layer)];
  }
  bool split_capable(int layer) const override {
    return size_t(layer) < split_capable_.size() && split_capable_[size_t(layer)];
  }
  const model::LayerWeights* split_host(int layer) const override {
    return decode_placement() && split_capable(layer) ? &host_views_[size_t(layer)] : nullptr;
  }
  // A split layer's bytes copied per hybrid pass (its matrices' GPU rows, its other tensors
  // whole) and its matrices' CPU rows' bytes; 0 for other layers.
  uint64_t split_copy_bytes(int layer) const;
  uint64_t split_cpu_bytes(int layer) const;

  const DevicePlan& plan() const { return plan_; }
  // The CPU's ops/s for multi-token passes the streamer started with (the plan's, before any
  // learn_cpu_flops update); plan().input.bw.cpu_flops is the rate in use now.
  double initial_cpu_flops() const { return initial_cpu_flops_; }
  // The CPU probe behind the plan's CPU terms (measured at load; empty when not measured).
  const std::string& cpu_probe() const { return cpu_probe_; }
  void set_cpu_probe(std::string note) { cpu_probe_ = std::move(note); }
  const DeviceStreamStats& stats() const { return stats_; }
  // Pass tuning, per pass size: "32 tokens: 19 -> 17 (settled; 19: 519.9 ms, ...)" (CPU layers;
  // CountTuner::describe), one entry per tuned size, in size order (empty: nothing tuned).
  std::vector<std::string> tuning() const;
  // Folds the timings of copies and stalls whose marks have passed into stats() (begin_pass does
  // it for earlier passes; call after a run, once the backend is idle, for the last one).
  void collect();
  uint64_t pinned_bytes() const { return pinned_bytes_; }
  // Host memory of the CPU's packed copies of its layers (hybrid; 0 without packing).
  uint64_t host_packed_bytes() const { return host_packed_bytes_; }

 private:
  struct Slot {
    void* base = nullptr;
    backend::Backend::Mark free_mark = 0;  // compute mark at the release of its last layer
    backend::Backend::Mark copy_mark = 0;  // end of the copy of its current layer
    uint64_t seq = 0;
    // What its bytes are (kept across ring restarts): the streamed index whose copy it holds
    // (-1: none), whole or only a split layer's GPU rows; and whether sequence `seq` found it
    // there and copied nothing (a layer kept in its slot).
    int holds = -1;
    bool holds_whole = false;
    bool kept = false;
  };
  struct Staging {
    uint8_t* base = nullptr;
    std::vector<FileReader::Ticket> tickets;  // capacity reserved at start-up
    uint64_t cseq = 0;                          // C-index of the read it holds
    FileReader::Clock::time_point submitted{};
    backend::Backend::Mark copy_mark = 0;       // copy out of it still to be waited for; 0: none
    uint64_t copy_pump = 0;                     // pump() call that issued that copy
  };
  // Marks to turn into seconds once they have passed.
  struct CopyRecord {
    backend::Backend::Mark start = 0, end = 0;
    uint64_t bytes = 0;
    int layer = -1;
    int slot = 0;
    bool from_disk = false;
    bool decode = false;
    backend::Backend::Mark anchor = 0;  // trace clock anchor when issued (0: no trace)
    int64_t anchor_us = 0;
  };
  struct StallRecord {
    backend::Backend::Mark before = 0, after = 0;
    int layer = -1;
    bool from_disk = false;
    bool decode = false;
    backend::Backend::Mark anchor = 0;
    int64_t anchor_us = 0;
  };

  DeviceStreamer(backend::Backend& be) : be_(be) {}
  Status fail(Status st);
  // Row split: the copy ranges and byte counts of the split layers (after their host views).
  Status plan_split(const gguf::File& file, const model::Weights& w);
  // Issues every copy and read that may start now (in sequence order); with need >= 0, blocks
  // until the copy of sequence `need` is issued (waiting for its disk read if it must).
  Status pump(int64_t need);
  Status submit_reads(int64_t force_upto);
  // Switches the streamed sequence to `list` (a pass of another phase): waits for the reads and
  // copies in flight, then restarts the ring at sequence 0.
  Status restart_ring(const std::vector<int>* list);
  // Runs the ring on `list`: with no more layers than slots and none from disk, each layer gets
  // a slot of its own (ring size = the list's length) and stays there from pass to pass (copied
  // only when its slot holds something else: Plan::kept_units); else every slot takes turns.
  void set_list(const std::vector<int>* list);
  Status issue_copy(uint64_t seq, bool may_block, bool* issued);
  void trace_mark_span(backend::Backend::Mark anchor, int64_t anchor_us, backend::Backend::Mark from,
                       backend::Backend::Mark to, TraceEvent e);
  bool is_disk(size_t j) const { return c_index_[j] >= 0; }
  uint64_t cseq_of(uint64_t seq) const;
  void note_host_wait(const char* what, int layer, FileReader::Clock::time_point t0, double* counter);

  backend::Backend& be_;
  DevicePlan plan_;
  FileLayout layout_;
  std::unique_ptr<FileReader> reader_;  // drains in-flight reads on destruction (buffers are the backend's)

  model::Weights globals_;
  std::vector<model::LayerWeights> resident_views_;  // per layer (A)
  std::vector<int> stream_index_;      // per layer: index among streamed layers, or -1
  uint64_t of_streamed(const std::vector<uint64_t>& v, int layer) const;
  std::vector<int> streamed_;          // streamed layer ids, in order (index j)
  std::vector<bool> skip_;             // DeviceStreamOptions::skip (per layer, or empty)
  bool skipped(int layer) const { return !skip_.empty() && skip_[size_t(layer)]; }
  // The streamed sequence of a pass: indices j in order. all_: every streamed layer (prefill and
  // pure streaming); hybrid_: those the GPU computes in passes of the decode placement (the others
  // run on the host); a batch placement's own (BatchRun). list_ points at the one the ring is
  // running.
  std::vector<int> list_all_, list_hybrid_;
  const std::vector<int>* list_ = nullptr;
  size_t ring_ = 0;  // slots the ring on list_ uses (set_list): sequence s goes to slot s % ring_
  const std::vector<bool>* pass_cpu_ = nullptr;  // per layer: the host computes it this pass
  bool decode_placement() const { return pass_cpu_ == &host_capable_; }  // this pass runs the plan's own
  int prefill_batch_ = kPrefillBatch;
  // A batch placement (pass_placement: kBatch): its CPU layers and its streamed sequence. Held by
  // pointer so list_ and pass_cpu_ stay valid as more are added; passes of different sizes that
  // choose the same layers share one (no ring restart between them).
  struct BatchRun {
    std::vector<bool> cpu;
    std::vector<int> list;
  };
  std::vector<std::unique_ptr<BatchRun>> batch_runs_;
  // Per pass size n: the placement chosen for n tokens (kPassAll, kPassDecode, or kPassBatch + the
  // index into batch_runs_), -1 not yet chosen.
  static constexpr int kPassAll = 0, kPassDecode = 1, kPassBatch = 2;
  std::vector<int> pass_choice_;
  int choice_for(int n_tokens);
  // Pass tuning (DeviceStreamOptions::tune_passes): a tuner per batch-placed pass size, and the
  // pass being timed (begin_pass to the next begin_pass; not a pass that restarted the ring, whose
  // first copies were not issued ahead).
  bool tune_passes_ = false;
  CountTuner::Options tuner_opts_;  // each new tuner's (the patience from DeviceStreamOptions)
  std::map<int, CountTuner> tuners_;
  FileReader::Clock::time_point timed_start_{};
  int timed_tokens_ = 0;  // 0: the pass running is not timed
  void observe_pass(FileReader::Clock::time_point now);
  std::unique_ptr<backend::Backend> host_be_;   // the host executor (hybrid), or null
  backend::WeightView host_rope_freqs_;
  std::vector<bool> host_capable_;              // per layer
  std::vector<model::LayerWeights> host_views_; // per layer: views into its pinned copy (host and split layers)
  // Row split: per layer whether it may run split; per streamed index the byte ranges of the
  // layer buffer a hybrid pass copies (empty: not split), their total and the CPU rows' bytes;
  // [streamed index * n_slots + slot] the main executor's views (split matrices cut to their GPU
  // rows; split layers only).
  struct CopyRange {
    uint64_t offset = 0, bytes = 0;
  };
  std::vector<bool> split_capable_;
  std::vector<std::vector<CopyRange>> split_ranges_;
  std::vector<uint64_t> split_copy_bytes_, split_cpu_bytes_;
  std::vector<model::LayerWeights> split_views_;
  FileReader::Clock::time_point host_start_{};  // acquire of the host layer being computed
  int pass_tokens_ = 1;                         // tokens of the pass being run
  // learn_cpu_flops: compute-bound CPU layers of multi-token passes since load (ops, seconds).
  bool learn_cpu_flops_ = false;
  double learn_ops_ = 0, learn_seconds_ = 0;
  double initial_cpu_flops_ = 0;
  void relearn_cpu_flops();
  std::string cpu_probe_;
  std::vector<HostBlock> host_packed_;  // host layers' packed matrices, one block per layer
  uint64_t host_packed_bytes_ = 0;
  std::vector<int> c_index_;           // per streamed index: index among C layers, or -1
  std::vector<int> c_pos_;             // per C index: streamed index
  std::vector<const uint8_t*> host_copy_;  // per streamed index: pinned bytes (B), nullptr (C)
  std::vector<model::LayerWeights> slot_views_;  // [streamed index * n_slots + slot]
  std::vector<Slot> slots_;
  std::vector<Staging> staging_;
  uint64_t pinned_bytes_ = 0;

  uint64_t acquired_ = 0;    // next sequence to acquire
  uint64_t released_ = 0;    // sequences released
  uint64_t copied_ = 0;      // next sequence whose copy is to be issued
  uint64_t c_copied_ = 0;    // C copies issued
  uint64_t c_read_ = 0;      // next C-index to read
  uint64_t pump_id_ = 0;
  backend::Backend::Mark last_copy_ = 0;  // end of the last copy issued (the copy queue is FIFO)
  backend::Backend::Mark newest_mark_ = 0;
  bool host_backend_ = false;  // copies are synchronous memcpys: time them on the host
  bool timed_ = false;         // device marks are read for copy seconds and compute stalls
  bool decode_pass_ = false;
  std::deque<CopyRecord> copy_records_;
  std::deque<StallRecord> stall_records_;
  // Trace clock anchor: a compute mark that passed at a known host time.
  backend::Backend::Mark anchor_ = 0;
  int64_t anchor_us_ = 0;
  TraceWriter* trace_ = nullptr;
  std::vector<std::string> slot_lanes_, staging_lanes_;
  Status failed_;  // sticky: once a read or check failed, every later call reports it
  DeviceStreamStats stats_;
};

// Hybrid execution's planner inputs, measured now on this machine (GPU builds with a device):
// the CPU computing one-token products in the format holding most of `file`'s layer bytes, alone
// and while the copy engine streams pinned memory. Sets opts.bw.cpu (the CPU's rate while copies
// run: in a hybrid token the copy engine is busy nearly all the time) and opts.bw.dram (the two
// rates together); returns the probe's description, or why nothing was measured.
std::string measure_hybrid_bandwidths(const gguf::File& file, DeviceStreamOptions& opts);

// The LoadOptions::layer_source hook for device streaming; *out (optional) receives the streamer
// the model will own, for stats. Error on a backend that reads host weights (use CPU streaming)
// unless opts.allow_host_backend.
std::function<Result<std::unique_ptr<model::LayerSource>>(const gguf::File&, const model::Weights&, backend::Backend&)>
device_streaming_source(const std::string& path, const DeviceStreamOptions& opts, DeviceStreamer** out);

}  // namespace sluice::stream
