// The one layer loop: every supported architecture runs through LlamaFamilyModel::forward, a
// sequence of backend ops; architecture differences are data (arch tables) and the presence of
// optional weights (biases, Q/K norms, rope frequency factors).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/timer.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/executor.h"
#include "model/kv_cache.h"
#include "model/layer_gate.h"
#include "model/model.h"
#include "model/weights.h"

namespace sluice::model {
namespace {

using backend::Tensor;

// Rows of logits computed per output projection when every token's logits are requested.
constexpr int kLogitRows = 16;
constexpr int kDefaultMaxCtx = 4096;

// The default layer source: the validated views into the mmapped file, nothing to fetch.
class MappedLayerSource final : public LayerSource {
 public:
  explicit MappedLayerSource(const Weights& w) : w_(w) {}
  const Weights& globals() const override { return w_; }
  Status begin_pass(int) override { return Status::ok(); }
  Result<const LayerWeights*> acquire(int layer) override { return &w_.layers[size_t(layer)]; }
  void release(int) override {}
  bool release_needs_sync() const override { return false; }
  bool weights_fixed() const override { return true; }
  bool can_skip(const std::vector<bool>&) const override { return true; }
  bool resident(int) const override { return true; }

 private:
  const Weights& w_;
};

class LlamaFamilyModel final : public Model {
 public:
  LlamaFamilyModel(gguf::File file, Config cfg, Weights w, std::unique_ptr<backend::Backend> be)
      : file_(std::move(file)), cfg_(std::move(cfg)), w_(std::move(w)), be_(std::move(be)) {}

  void set_layer_hook(std::function<void(int, std::span<const float>)> hook) { on_layer_ = std::move(hook); }

  // Replaces the mmapped views as the loop's weight source (before the first eval).
  void set_layer_source(std::unique_ptr<LayerSource> src) { src_ = std::move(src); }

  Status init(int n_ctx, int max_seqs, int kv_positions, int max_batch) {
    max_batch_ = max_batch;
    // The KV pool: n_ctx positions for one sequence (every row a position, as without paging), or
    // kv_positions shared by max_seqs sequences, each with a row map per pass.
    blocks_.init(kv_positions > 0 ? kv_positions : n_ctx, max_seqs, n_ctx);
    const int pool = blocks_.pool_rows();
    const int64_t map_rows = max_seqs > 1 ? int64_t(std::min(max_seqs, max_batch_)) * n_ctx : 0;
    // The main executor keeps every layer's KV cache; a host executor (hybrid execution) only the
    // layers it may compute, and activations for a whole batch (a forced placement may run
    // prefill there too).
    SLUICE_RETURN_IF_ERROR(main_.init(*be_, cfg_, pool, map_rows, max_batch_, {}, src_->globals().rope_freqs.view()));
    const LayerSource::HostExecutor host = src_->host_executor();
    if (host.backend) {
      std::vector<bool> layers(size_t(cfg_.n_layer));
      bool any = false, split = false;
      for (int l = 0; l < cfg_.n_layer; ++l) {
        any |= layers[size_t(l)] = src_->host_capable(l);
        split |= src_->split_capable(l);
      }
      if (any || split || src_->experts()) {
        host_ = std::make_unique<Executor>();
        SLUICE_RETURN_IF_ERROR(host_->init(*host.backend, cfg_, pool, map_rows, max_batch_, layers, host.rope_freqs));
        // Activations cross between the executors through memory the main backend copies from
        // fastest (pinned on a GPU), owned by that backend; a split layer's hand-offs may be as
        // wide as its widest matrix output.
        int64_t width = std::max({cfg_.n_embd, cfg_.n_embd_k(), cfg_.n_embd_v()});
        if (split) width = std::max(width, Executor::split_buffer_floats(cfg_));
        const size_t floats = size_t(max_batch_) * size_t(width);
        SLUICE_ASSIGN_OR_RETURN(void* buf, be_->alloc_staging(int64_t(floats * sizeof(float))));
        handoff_ = std::span<float>(static_cast<float*>(buf), floats);
      }
    }
    if (ExpertPlacement* p = src_->experts()) {
      // Without a host executor every expert runs on the main backend (a placement that never
      // gives the host an expert: the CPU-only RAM expert cache).
      main_.set_experts(p, host_.get(), handoff_);
      if (host_) host_->set_experts(nullptr, nullptr, handoff_);
    }
    SLUICE_ASSIGN_OR_RETURN(gathered_, be_->alloc(backend::DType::kF32, cfg_.n_embd, kLogitRows));
    SLUICE_ASSIGN_OR_RETURN(logits_, be_->alloc(backend::DType::kF32, cfg_.n_vocab, kLogitRows));
    // The backend's scratch for the largest pass, allocated now: no pass allocates (the memory
    // plans of stream/ count exactly this).
    return be_->reserve_scratch(Executor::scratch_shape(cfg_, max_batch_, pool, max_seqs));
  }

  const Config& config() const override { return cfg_; }
  const char* backend_name() const override { return be_->name(); }
  int64_t device_bytes() const override { return be_->allocated_bytes(); }
  int n_vocab() const override { return cfg_.n_vocab; }
  int n_ctx() const override { return blocks_.n_ctx(); }
  int n_past() const override { return blocks_.n_past(0); }
  void truncate(int n) override { blocks_.truncate(0, n); }
  uint64_t weight_bytes_per_token() const override {
    // Layers left out of every pass (the layer mask: --skip-layers) are not read.
    uint64_t b = w_.bytes_per_token();
    const std::vector<bool> run = gate_.mask();
    for (size_t l = 0; l < run.size() && l < w_.layers.size(); ++l) {
      if (!run[l]) b -= w_.layer_bytes_per_token(l);
    }
    return b;
  }
  Timings timings() const override { return timings_; }
  void reset_timings() override { timings_ = {}; }
  // Layer skip and early exit (model.h; the gate keeps the loop's part to two questions).
  Status set_layer_mask(std::vector<bool> run) override { return gate_.set_mask(std::move(run), cfg_.n_layer); }
  std::vector<bool> layer_mask() const override { return gate_.mask(); }
  std::vector<bool> resident_layers() const override {
    std::vector<bool> r(size_t(cfg_.n_layer));
    for (int l = 0; l < cfg_.n_layer; ++l) r[size_t(l)] = src_->resident(l);
    return r;
  }
  Status set_early_exit(float threshold, int min_layer) override {
    return gate_.set_early_exit(threshold, min_layer, cfg_.n_layer);
  }
  LayerCounts layer_counts() const override { return gate_.counts(); }
  void set_row_invariant(bool on) override {
    // Only where the main backend has the mode: a GPU's batched passes differ from its one-token
    // passes anyway, and the host executor of a hybrid plan would pay the mode's cost for nothing.
    const bool main_has = main_.backend().set_row_invariant(on);
    if (host_) host_->backend().set_row_invariant(on && main_has);
    row_invariant_ = on && main_has;
  }
  bool row_invariant() const override { return row_invariant_; }

  Result<int> seq_new() override { return blocks_.open(); }
  void seq_free(int seq) override { blocks_.close(seq); }
  Status seq_share(int src, int dst, int n) override {
    if (!blocks_.valid(src) || !blocks_.valid(dst) || src == dst) {
      return invalid_argument("seq_share: sequences " + std::to_string(src) + " -> " + std::to_string(dst) +
                              " are not two open sequences");
    }
    if (blocks_.n_past(dst) != 0) return invalid_argument("seq_share: sequence " + std::to_string(dst) + " holds positions");
    if (n < 0 || n % KvBlocks::kBlockSize != 0 || n > blocks_.n_past(src)) {
      return invalid_argument("seq_share: " + std::to_string(n) + " positions: not a multiple of " +
                              std::to_string(KvBlocks::kBlockSize) + " within sequence " + std::to_string(src) + "'s " +
                              std::to_string(blocks_.n_past(src)));
    }
    blocks_.share(src, dst, n);
    return Status::ok();
  }
  int seq_n_past(int seq) const override { return blocks_.n_past(seq); }
  void seq_truncate(int seq, int n) override { blocks_.truncate(seq, n); }
  int max_sequences() const override { return blocks_.max_seqs(); }
  int max_batch() const override { return max_batch_; }
  int kv_block_size() const override { return KvBlocks::kBlockSize; }
  int kv_blocks_total() const override { return blocks_.n_blocks(); }
  int kv_blocks_free() const override { return blocks_.n_free(); }

  Status eval(std::span<const int32_t> tokens, std::span<float> logits) override {
    const size_t n = tokens.size();
    const size_t nv = size_t(cfg_.n_vocab);
    if (n == 0) return invalid_argument("eval: no tokens");
    const bool all = logits.size() == n * nv && n > 1;
    if (!all && logits.size() != nv) {
      return invalid_argument("eval: logits span has " + std::to_string(logits.size()) + " floats, expected " +
                              std::to_string(nv) + " (last token) or " + std::to_string(n * nv) + " (every token)");
    }
    const int past = blocks_.n_past(0);
    if (int64_t(past) + int64_t(n) > blocks_.n_ctx()) {
      return invalid_argument("context too long: " + std::to_string(past) + " positions used + " +
                              std::to_string(n) + " new tokens exceed the context size " + std::to_string(blocks_.n_ctx()));
    }
    SLUICE_RETURN_IF_ERROR(check_tokens(tokens, ""));
    SLUICE_RETURN_IF_ERROR(blocks_.reserve(0, past + int(n)));
    core::Timer timer;
    for (size_t b = 0; b < n; b += size_t(max_batch_)) {
      const size_t m = std::min<size_t>(size_t(max_batch_), n - b);
      const bool last_chunk = b + m == n;
      float* out = all ? logits.data() + b * nv : (last_chunk ? logits.data() : nullptr);
      const Model::SeqTokens item{0, tokens.subspan(b, m), all};
      const Status st = pass(std::span<const Model::SeqTokens>(&item, 1), out);
      if (!st.is_ok()) {
        blocks_.truncate(0, blocks_.n_past(0));  // the blocks reserved past what was evaluated
        return st;
      }
    }
    be_->sync();
    record(timer.seconds(), n, n > 1);
    return Status::ok();
  }

  // Pinned on a GPU (the backend's staging memory, freed with it).
  Result<std::span<float>> logits_buffer(size_t floats) override {
    for (std::span<float> b : logits_bufs_) {
      if (b.size() >= floats) return b.first(floats);
    }
    SLUICE_ASSIGN_OR_RETURN(void* p, be_->alloc_staging(int64_t(std::max<size_t>(floats, 1) * sizeof(float))));
    return logits_bufs_.emplace_back(static_cast<float*>(p), floats);
  }

  Status eval_batch(std::span<const SeqTokens> items, std::span<float> logits) override {
    if (items.empty()) return invalid_argument("eval_batch: no sequences");
    const size_t nv = size_t(cfg_.n_vocab);
    size_t total = 0, rows = 0;
    int blocks = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const SeqTokens& it = items[i];
      const std::string at = "eval_batch: item " + std::to_string(i) + " (sequence " + std::to_string(it.seq) + ")";
      if (!blocks_.valid(it.seq)) return invalid_argument(at + ": no such open sequence");
      for (size_t j = 0; j < i; ++j) {
        if (items[j].seq == it.seq) return invalid_argument(at + ": sequence appears twice in one batch");
      }
      if (it.tokens.empty()) return invalid_argument(at + ": no tokens");
      SLUICE_RETURN_IF_ERROR(check_tokens(it.tokens, at + ": "));
      const int past = blocks_.n_past(it.seq);
      if (int64_t(past) + int64_t(it.tokens.size()) > blocks_.n_ctx()) {
        return invalid_argument(at + ": " + std::to_string(past) + " positions used + " +
                                std::to_string(it.tokens.size()) + " new tokens exceed the context size " +
                                std::to_string(blocks_.n_ctx()));
      }
      total += it.tokens.size();
      rows += it.all_logits ? it.tokens.size() : 1;
      blocks += blocks_.blocks_needed(it.seq, past + int(it.tokens.size()));
    }
    if (total > size_t(max_batch_)) {
      return invalid_argument("eval_batch: " + std::to_string(total) + " tokens, at most " + std::to_string(max_batch_) +
                              " per pass");
    }
    if (logits.size() != rows * nv) {
      return invalid_argument("eval_batch: logits span has " + std::to_string(logits.size()) + " floats, expected " +
                              std::to_string(rows * nv));
    }
    if (blocks > blocks_.n_free()) {
      return out_of_memory("eval_batch: the batch needs " + std::to_string(blocks) + " more KV blocks, " +
                           std::to_string(blocks_.n_free()) + " of " + std::to_string(blocks_.n_blocks()) + " are free");
    }
    for (const SeqTokens& it : items) {
      SLUICE_CHECK(blocks_.reserve(it.seq, blocks_.n_past(it.seq) + int(it.tokens.size())).is_ok(),
                   "eval_batch: blocks counted free were not");
    }
    core::Timer timer;
    const Status st = pass(items, logits.data());
    if (!st.is_ok()) {
      for (const SeqTokens& it : items) blocks_.truncate(it.seq, blocks_.n_past(it.seq));
      return st;
    }
    be_->sync();
    record(timer.seconds(), total, total > items.size());
    return Status::ok();
  }

 private:
  Status check_tokens(std::span<const int32_t> tokens, const std::string& at) const {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= cfg_.n_vocab) {
        return invalid_argument(at + (at.empty() ? "eval: " : "") + "token id " + std::to_string(tokens[i]) +
                                " at index " + std::to_string(i) + " outside the vocabulary [0, " +
                                std::to_string(cfg_.n_vocab) + ")");
      }
    }
    return Status::ok();
  }

  void record(double s, size_t tokens, bool prefill) {
    if (prefill) {
      timings_.prefill_seconds += s;
      timings_.prefill_tokens += int64_t(tokens);
    } else {
      timings_.decode_seconds += s;
      timings_.decode_tokens += int64_t(tokens);
    }
  }

  // One forward pass over the items' tokens (their blocks reserved): segments, row maps and the
  // rows whose logits are wanted, then the layer loop; each sequence's n_past advances on success.
  // `out` as eval_batch's logits (nullptr: none, a non-final prefill chunk).
  Status pass(std::span<const SeqTokens> items, float* out) {
    ids_.clear();
    segs_.clear();
    map_.clear();
    out_rows_.clear();
    for (const SeqTokens& it : items) {
      const int64_t row0 = int64_t(ids_.size()), n = int64_t(it.tokens.size());
      const int pos0 = blocks_.n_past(it.seq);
      ids_.insert(ids_.end(), it.tokens.begin(), it.tokens.end());
      // A sequence whose blocks are 0, 1, 2, ... (always so with one sequence) needs no map.
      const size_t at = map_.size();
      const bool identity = blocks_.rows(it.seq, pos0 + int(n), map_);
      segs_.push_back({row0, n, pos0, identity ? -1 : int64_t(at)});
      if (it.all_logits) {
        for (int64_t r = 0; r < n; ++r) out_rows_.push_back(int32_t(row0 + r));
      } else {
        out_rows_.push_back(int32_t(row0 + n - 1));
      }
    }
    main_.kv().set_rows(map_);
    if (host_) host_->kv().set_rows(map_);
    SLUICE_RETURN_IF_ERROR(forward(ids_, segs_, out));
    for (const SeqTokens& it : items) {
      blocks_.set_n_past(it.seq, blocks_.n_past(it.seq) + int(it.tokens.size()));
    }
    return Status::ok();
  }

  // Runs the pass's tokens, sequence segment after segment. Writes the logits of the rows in
  // out_rows_ to `out` (nullptr: none). Errors come only from the weight source (I/O, file
  // changed); the pass stops before computing on the layer it could not get.
  // Each layer runs on the executor the source names for this pass (the main backend, or the
  // host CPU in hybrid execution); the residual stream moves where consecutive layers differ.
  Status forward(std::span<const int32_t> ids, std::span<const Segment> segs, float* out) {
    backend::Backend& be = *be_;
    LayerSource& src = *src_;
    const Weights& g = src.globals();
    const int64_t n = int64_t(ids.size());
    const float eps = cfg_.rms_eps;

    SLUICE_RETURN_IF_ERROR(src.begin_pass(int(n)));
    main_.begin_pass();
    if (host_) host_->begin_pass();
    // A decode pass of one sequence over resident weights repeats the same ops every token: one
    // replayable step. Not for mixtures of experts: routing downloads the router's logits in
    // every layer. Not for a sequence with a row map (it changes as the sequence grows). Not
    // with early exit (a pass may stop after any layer); a layer mask's passes are a step of
    // their own (LayerGate::step_key).
    const bool step = n == 1 && segs.size() == 1 && segs[0].map < 0 && out != nullptr && src.weights_fixed() &&
                      !on_layer_ && !host_ && !cfg_.moe() && gate_.replayable();
    const bool skip_fetch = !gate_.full() && src.can_skip(gate_.mask());
    const int pos0 = segs[0].pos0;
    // The embedding lookup is host work (the table stays in host memory): outside the step.
    be.get_rows(g.token_embd.view(), ids, main_.x(n));
    if (cfg_.embd_scale != 1.0f) be.scale(main_.x(n), cfg_.embd_scale);  // gemma3: sqrt(n_embd)
    if (step) {
      // Every decode step of a resident model issues the same ops; only the position changes.
      const uint64_t key = gate_.step_key();  // a layer mask (--skip-layers, self-draft) is other ops
      if (be.replay_step(key, pos0)) {
        gate_.count_replayed(cfg_.n_layer);
        src.pass_replayed(gate_.mask());
        be.download(logits_.first_rows(1), out);
        return Status::ok();
      }
      be.begin_step(key, pos0);
    }
    Executor* cur = &main_;
    gate_.count_pass();
    bool exited = false;
    for (int l = 0; l < cfg_.n_layer; ++l) {
      if (exited || !gate_.runs(l)) {  // layer skip / early exit: fetched only where the source must
        if ((skip_fetch && !gate_.runs(l)) || src.weights_fixed()) continue;
        SLUICE_RETURN_IF_ERROR(src.acquire(l).status());
        src.release(l);
        continue;
      }
      gate_.count_layer();
      // A row-split layer runs on both executors, its residual stream on the main one.
      const LayerWeights* split = host_ ? src.split_host(l) : nullptr;
      Executor* e = host_ && !split && src.on_host(l) ? host_.get() : &main_;
      if (e != cur) {
        cur->move_x(*e, n, handoff_);
        cur = e;
      }
      SLUICE_ASSIGN_OR_RETURN(const LayerWeights* lw, src.acquire(l));
      if (split) {
        SLUICE_RETURN_IF_ERROR(main_.split_layer(*lw, *split, *host_, l, n, segs, handoff_));
      } else {
        SLUICE_RETURN_IF_ERROR(e->layer(*lw, l, n, segs));
      }
      if (host_ && host_->has_kv(l)) {
        // Both executors keep this layer's cache: the other one gets the new rows too.
        e->mirror_kv(e == &main_ ? *host_ : main_, l, n, segs, handoff_);
      }
      if (on_layer_ || (gate_.watches(n) && gate_.wants(l))) {
        e->flush(n);
        hidden_.resize(size_t(n * cfg_.n_embd));
        e->backend().download(e->x(n), hidden_.data());
        if (on_layer_) on_layer_(l, hidden_);
        exited = gate_.watches(n) && gate_.converged(l, hidden_);
      }
      // The source may overwrite this layer's memory once released.
      if (src.release_needs_sync()) e->backend().sync();
      src.release(l);
    }
    cur->flush(n);  // the last layer's residual add (a pending add never outlives its pass)
    if (cur != &main_) cur->move_x(main_, n, handoff_);
    if (!out) {
      if (step) be.end_step();
      return Status::ok();
    }
    // Output head only for the rows whose logits are wanted (the last one in generation): a run
    // of consecutive rows as they lie, scattered rows (a batch of sequences) gathered first.
    const backend::Tensor x = main_.x(n), xn = main_.xn(n);
    const size_t n_out = out_rows_.size();
    const bool consecutive = out_rows_.back() - out_rows_.front() == int32_t(n_out) - 1;
    for (size_t r = 0; r < n_out; r += kLogitRows) {
      const int64_t m = std::min<int64_t>(kLogitRows, int64_t(n_out - r));
      backend::Tensor xr;
      if (consecutive) {
        xr = x.row_range(out_rows_[r], m);
      } else {
        xr = gathered_.first_rows(m);
        be.gather_rows(x, std::span<const int32_t>(out_rows_.data() + r, size_t(m)), xr);
      }
      const backend::Tensor xo = xn.first_rows(m), lg = logits_.first_rows(m);
      be.rms_norm(xr, g.output_norm.view(), eps, xo);
      be.matmul(g.output.view(), xo, lg);
      if (step) be.end_step();
      be.download(lg, out + r * size_t(cfg_.n_vocab));
    }
    return Status::ok();
  }

  gguf::File file_;  // owns the mapping every TensorRef points into
  Config cfg_;
  Weights w_;
  std::unique_ptr<backend::Backend> be_;
  std::unique_ptr<LayerSource> src_ = std::make_unique<MappedLayerSource>(w_);
  Executor main_;                  // the model's backend: every layer's KV cache
  std::unique_ptr<Executor> host_; // hybrid execution: the host CPU (LayerSource::host_executor)
  Tensor logits_;                  // [kLogitRows, n_vocab]
  std::vector<std::span<float>> logits_bufs_;  // logits_buffer()'s, in the backend's staging memory
  Tensor gathered_;                // [kLogitRows, n_embd]: rows whose logits are wanted, when scattered
  KvBlocks blocks_;                // which KV pool blocks each sequence holds
  std::vector<int32_t> ids_;       // a pass's token ids, sequence after sequence
  std::vector<Segment> segs_;      // a pass's sequences
  std::vector<int32_t> map_;       // their KV row maps (those not the identity), concatenated
  std::vector<int32_t> out_rows_;  // the rows whose logits a pass returns
  std::span<float> handoff_;       // activations moving between executors (main backend's staging)
  Timings timings_;
  std::function<void(int, std::span<const float>)> on_layer_;
  std::vector<float> hidden_;  // on_layer_'s download buffer
  LayerGate gate_;             // layers a pass runs (mask, early exit)
  bool row_invariant_ = false;  // set_row_invariant
  int max_batch_ = kDefaultMaxBatch;  // tokens per pass (LoadOptions::max_batch)
};

// Device bytes the whole model needs on a backend with its own memory: every weight but the
// embedding table (looked up on the host), the KV cache, the activations and the backend's
// scratch.
uint64_t device_bytes_needed(const Config& cfg, const Weights& w, int kv_positions, int max_batch, int max_sequences) {
  // Each weight is its own allocation, and cudaMalloc maps large ones in whole 2 MiB pages.
  constexpr uint64_t kPage = uint64_t(2) << 20;
  auto allocated = [&](const TensorRef& t) { return t.nbytes >= kPage / 2 ? (t.nbytes + kPage - 1) / kPage * kPage : t.nbytes; };
  uint64_t bytes = allocated(w.output) + allocated(w.output_norm) + allocated(w.rope_freqs);  // a tied output: the table
  for (const LayerWeights& L : w.layers)
    for (const TensorRef* t : L.tensors()) bytes += allocated(*t);
  bytes += uint64_t(kv_positions) * uint64_t(cfg.n_layer) * uint64_t(cfg.n_embd_k() + cfg.n_embd_v()) * 2;
  bytes += uint64_t(max_batch) * uint64_t(6 * cfg.n_embd + cfg.n_embd_q() + 2 * cfg.n_ff_max() + cfg.n_expert) * 4;
  return bytes + backend::cuda_scratch_bytes(Executor::scratch_shape(cfg, max_batch, kv_positions, max_sequences));
}

backend::CpuOptions cpu_options(const LoadOptions& opts) {
  backend::CpuOptions o;
  o.n_threads = opts.n_threads;
  o.pack_weights = opts.cpu_pack_weights;
  return o;
}

Result<std::unique_ptr<backend::Backend>> make_backend(const LoadOptions& opts, const Config& cfg, const Weights& w,
                                                       int kv_positions, bool streaming) {
  if (opts.backend == BackendKind::kCpu) return backend::make_cpu_backend(cpu_options(opts));
  if (opts.backend == BackendKind::kAuto && (streaming || backend::cuda_device_count() == 0)) {
    return backend::make_cpu_backend(cpu_options(opts));
  }
  auto gpu = backend::make_cuda_backend({0, opts.cuda_graphs, opts.cuda_skip_kernels});
  if (!gpu.is_ok()) {
    if (opts.backend == BackendKind::kAuto) return backend::make_cpu_backend(cpu_options(opts));
    return gpu.status();
  }
  if (streaming) return std::move(gpu).value();  // the source plans device memory itself
  const uint64_t need = device_bytes_needed(cfg, w, kv_positions, opts.max_batch, opts.max_sequences);
  const int64_t free = (*gpu)->free_memory();
  if (free >= 0 && need > uint64_t(free)) {
    if (opts.backend == BackendKind::kAuto) return backend::make_cpu_backend(cpu_options(opts));
    return out_of_memory("the model needs about " + std::to_string(need >> 20) + " MiB of GPU memory, " +
                         std::to_string(uint64_t(free) >> 20) +
                         " MiB are free (stream it with --vram-budget auto, or a smaller -c lowers the KV cache)");
  }
  return std::move(gpu).value();
}

// The weights as the backend reads them: every tensor but the embedding table passed through the
// backend's upload_weight (copied into its memory, or repacked into the CPU's packed layout;
// get_rows looks rows up in the host table). The file's pages of a tensor that was copied leave
// the resident set (they would otherwise count twice).
Result<Weights> upload_weights(backend::Backend& be, const Weights& host, const gguf::File& file,
                               const core::ProgressFn& progress) {
  Weights dev = host;
  uint64_t total = host.output_norm.nbytes + host.output.nbytes + host.rope_freqs.nbytes, done = 0;
  for (const LayerWeights& L : host.layers)
    for (const TensorRef* t : L.tensors()) total += t->nbytes;
  auto up = [&](TensorRef& t) -> Status {
    if (!t.present()) return Status::ok();
    done += t.nbytes;
    if (progress) progress(done, total);
    // Stacked experts whose rows the backend would regroup across expert boundaries stay as they lie.
    if (be.reads_host_weights() && repacked_bytes(be, t) == 0) return Status::ok();
    auto v = be.upload_weight(t.view());
    if (!v.is_ok()) return Status(v.status().code(), "uploading " + t.name + ": " + v.status().message());
    if (v->data != t.data) file.release(t.data, t.nbytes);
    t.adopt(*v);
    return Status::ok();
  };
  SLUICE_RETURN_IF_ERROR(up(dev.output_norm));
  SLUICE_RETURN_IF_ERROR(up(dev.output));
  SLUICE_RETURN_IF_ERROR(up(dev.rope_freqs));
  for (LayerWeights& L : dev.layers) {
    for (TensorRef* t : L.tensors()) SLUICE_RETURN_IF_ERROR(up(*t));
  }
  return dev;
}

}  // namespace

Status check_max_batch(int max_batch) {
  if (max_batch >= 1 && max_batch <= kMaxMaxBatch) return Status::ok();
  return invalid_argument("tokens per pass (max_batch) must be in [1, " + std::to_string(kMaxMaxBatch) + "], got " +
                          std::to_string(max_batch));
}

namespace {

// What a load reads before it picks a backend: the file, its config and weight references, the
// context and KV pool sizes; errors name the bad option or the file's problem.
struct Opened {
  gguf::File file;
  Config cfg;
  Weights w;
  int n_ctx = 0, kv_positions = 0;
};

Result<Opened> open_for_load(const std::string& path, const LoadOptions& opts) {
  if (opts.n_ctx < 0) return invalid_argument("n_ctx must be >= 0, got " + std::to_string(opts.n_ctx));
  if (opts.n_threads < 0) return invalid_argument("n_threads must be >= 0, got " + std::to_string(opts.n_threads));
  if (opts.max_sequences < 1 || opts.max_sequences > 4096) {
    return invalid_argument("max_sequences must be in [1, 4096], got " + std::to_string(opts.max_sequences));
  }
  if (opts.kv_positions < 0) return invalid_argument("kv_positions must be >= 0, got " + std::to_string(opts.kv_positions));
  SLUICE_RETURN_IF_ERROR(check_max_batch(opts.max_batch));
  SLUICE_ASSIGN_OR_RETURN(gguf::File file, gguf::File::open(path));
  SLUICE_ASSIGN_OR_RETURN(std::string arch_name, file.get_string("general.architecture"));
  const ArchSpec* arch = find_arch(arch_name);
  if (!arch) {
    return unsupported(path + ": architecture \"" + arch_name + "\" is not supported (supported: " +
                       supported_archs() + ")");
  }
  SLUICE_ASSIGN_OR_RETURN(Config cfg, read_config(file, *arch));
  SLUICE_ASSIGN_OR_RETURN(Weights w, load_weights(file, *arch, cfg));
  const int n_ctx = opts.n_ctx == 0 ? std::min(cfg.n_ctx_train, kDefaultMaxCtx) : opts.n_ctx;
  if (n_ctx > cfg.n_ctx_train) {
    return invalid_argument("n_ctx " + std::to_string(n_ctx) + " exceeds the model's " + cfg.arch +
                            ".context_length " + std::to_string(cfg.n_ctx_train));
  }
  const int kv_positions = opts.kv_positions > 0 ? opts.kv_positions : n_ctx;
  return Opened{std::move(file), std::move(cfg), std::move(w), n_ctx, kv_positions};
}

}  // namespace

Result<uint64_t> Model::device_bytes(const std::string& path, const LoadOptions& opts) {
  SLUICE_ASSIGN_OR_RETURN(Opened o, open_for_load(path, opts));
  return device_bytes_needed(o.cfg, o.w, o.kv_positions, opts.max_batch, opts.max_sequences);
}

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const LoadOptions& opts) {
  SLUICE_ASSIGN_OR_RETURN(Opened o, open_for_load(path, opts));
  gguf::File& file = o.file;
  Config& cfg = o.cfg;
  Weights& w = o.w;
  const int n_ctx = o.n_ctx;
  SLUICE_ASSIGN_OR_RETURN(auto be, make_backend(opts, cfg, w, o.kv_positions, bool(opts.layer_source)));
  std::unique_ptr<LayerSource> source;
  if (opts.layer_source) {
    SLUICE_ASSIGN_OR_RETURN(source, opts.layer_source(file, w, *be));
  } else {
    SLUICE_ASSIGN_OR_RETURN(w, upload_weights(*be, w, file, opts.on_load_progress));
  }
  auto model = std::make_unique<LlamaFamilyModel>(std::move(file), std::move(cfg), std::move(w), std::move(be));
  if (source) model->set_layer_source(std::move(source));
  if (opts.on_layer) model->set_layer_hook(opts.on_layer);
  SLUICE_RETURN_IF_ERROR(model->init(n_ctx, opts.max_sequences, opts.kv_positions, opts.max_batch));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace sluice::model
