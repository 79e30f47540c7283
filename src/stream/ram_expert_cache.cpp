#include "stream/ram_expert_cache.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "gguf/gguf.h"
#include "stream/cpu_streamer.h"
#include "stream/plan.h"

namespace sluice::stream {
namespace {

using Clock = FileReader::Clock;

constexpr model::LayerTensorField kExpertFields[3] = {&model::LayerWeights::gate_exps, &model::LayerWeights::up_exps,
                                                      &model::LayerWeights::down_exps};

bool is_expert_field(model::LayerTensorField f) {
  return f == kExpertFields[0] || f == kExpertFields[1] || f == kExpertFields[2];
}

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Bytes an O_DIRECT read of n file bytes at any offset spans (align_range), at most.
uint64_t read_span(uint64_t n) { return round_up(n, kIoAlign) + kIoAlign; }

// Bytes the resident part holds for t: the backend's packed layout where the resident load packs
// it (model::repacked_bytes), else the file's bytes; 64-byte aligned starts (the packed kernels'
// loads).
uint64_t held_bytes(const backend::Backend& be, const model::TensorRef& t) {
  if (!t.present()) return 0;
  const int64_t pb = model::repacked_bytes(be, t);
  return round_up(pb > 0 ? uint64_t(pb) : t.nbytes, 64);
}

// The packed bytes of one expert of stacked tensor t where the resident load packs t, else 0.
int64_t expert_packed_bytes(const backend::Backend& be, const model::TensorRef& t) {
  if (!t.present() || model::repacked_bytes(be, t) <= 0) return 0;
  return be.repacked_bytes(t.expert(0));
}

bool tied(const model::Weights& w) { return w.output.data == w.token_embd.data; }

}  // namespace

Result<RamExpertPlan> plan_ram_experts(const model::Weights& w, const backend::Backend& be,
                                       const RamExpertOptions& opts) {
  RamExpertPlan p;
  p.n_layer = int(w.layers.size());
  p.n_expert = w.n_expert;
  p.n_used = w.n_expert_used;
  p.budget = opts.ram_budget;
  if (p.n_layer == 0 || w.n_expert < 1) return invalid_argument("the RAM expert cache needs a mixture-of-experts model");
  // Resident: the embedding table as it lies (rows looked up), the output head (a tied one is a
  // packed copy of the table where the CPU packs, else the table itself), norms, every layer
  // tensor but the routed experts.
  p.resident_bytes = round_up(w.token_embd.nbytes, 64) + held_bytes(be, w.output_norm) + held_bytes(be, w.rope_freqs);
  if (!tied(w) || model::repacked_bytes(be, w.output) > 0) p.resident_bytes += held_bytes(be, w.output);
  uint64_t hold[3] = {}, stage[3] = {};
  for (const model::LayerWeights& L : w.layers) {
    uint64_t file_bytes = 0;
    for (model::LayerTensorField f : model::kLayerTensorFields) {
      if (!is_expert_field(f)) p.resident_bytes += held_bytes(be, L.*f);
    }
    for (int i = 0; i < 3; ++i) {
      const model::TensorRef& t = L.*kExpertFields[i];
      if (!t.present()) return invalid_argument("layer tensor " + t.name + " missing: not a routed-expert layer");
      const uint64_t eb = t.expert_bytes();
      const int64_t pb = expert_packed_bytes(be, t);
      hold[i] = std::max(hold[i], pb > 0 ? uint64_t(pb) : read_span(eb));
      if (pb > 0) stage[i] = std::max(stage[i], read_span(eb));
      p.expert_bytes += t.nbytes;
      file_bytes += eb;
    }
    p.expert_file_bytes = std::max(p.expert_file_bytes, file_bytes);
  }
  p.off_up = round_up(hold[0], kIoAlign);
  p.off_down = p.off_up + round_up(hold[1], kIoAlign);
  p.slot_bytes = p.off_down + round_up(hold[2], kIoAlign);
  p.staging_bytes = round_up(stage[0], kIoAlign) + round_up(stage[1], kIoAlign) + round_up(stage[2], kIoAlign);
  p.n_staging = p.staging_bytes > 0 ? std::max(p.n_used, 1) : 0;
  p.min_slots = uint64_t(std::max(p.n_used, 1));
  const uint64_t all = uint64_t(p.n_layer) * uint64_t(p.n_expert);
  const uint64_t fixed = p.resident_bytes + uint64_t(p.n_staging) * p.staging_bytes;
  if (opts.ram_budget < p.min_budget()) {
    return invalid_argument(
        "RAM budget " + format_bytes(opts.ram_budget) + " is too small for the expert cache: at least " +
        format_bytes(p.min_budget()) + " (" + std::to_string(p.min_budget()) + " bytes) is needed: " +
        format_bytes(p.resident_bytes) + " of weights that are not routed experts (attention, norms, routers, " +
        "embeddings, output) + " + std::to_string(p.min_slots) + " expert slots of " + format_bytes(p.slot_bytes) +
        " (one layer's active experts)" +
        (p.n_staging ? " + " + std::to_string(p.n_staging) + " read buffers of " + format_bytes(p.staging_bytes) +
                           " (experts are repacked after their read)"
                     : std::string()));
  }
  p.n_slots = std::min((opts.ram_budget - fixed) / p.slot_bytes, all);
  if (opts.cache_bytes) p.n_slots = std::min(p.n_slots, opts.cache_bytes / p.slot_bytes);
  if (p.n_slots < p.min_slots) {
    return invalid_argument("the expert cache cap " + format_bytes(opts.cache_bytes) + " holds " +
                            std::to_string(p.n_slots) + " expert slots of " + format_bytes(p.slot_bytes) +
                            "; a layer's active experts need " + std::to_string(p.min_slots));
  }
  return p;
}

std::string RamExpertPlan::describe() const {
  const uint64_t all = uint64_t(n_layer) * uint64_t(n_expert);
  const double per_expert = double(expert_bytes) / double(std::max<uint64_t>(all, 1));
  const double share = double(n_slots) / double(std::max<uint64_t>(all, 1));
  const double used = per_expert * double(n_used) * double(n_layer);
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "  resident (attention, norms, routers, shared experts, embeddings, output): %s\n"
                "  routed experts: %d layers x %d (top-%d), %s in all; one expert %s on disk, %s in a cache slot\n"
                "  RAM expert cache: %llu slots = %.0f%% of the experts (%s)%s\n"
                "  weights in RAM %s of the %s budget (minimum %s)\n"
                "  per token: %s of experts; with uniform routing %.0f%% from the cache, %s read from disk "
                "(skewed routers hit more: the run prints the measured hit rate)\n",
                format_bytes(resident_bytes).c_str(), n_layer, n_expert, n_used, format_bytes(expert_bytes).c_str(),
                format_bytes(expert_file_bytes).c_str(), format_bytes(slot_bytes).c_str(), (unsigned long long)n_slots,
                100.0 * share, format_bytes(n_slots * slot_bytes).c_str(),
                n_staging ? (", " + std::to_string(n_staging) + " read buffers of " + format_bytes(staging_bytes) +
                             " (experts repacked after their read)")
                                .c_str()
                          : "",
                format_bytes(total_bytes()).c_str(), format_bytes(budget).c_str(), format_bytes(min_budget()).c_str(),
                format_bytes(uint64_t(used)).c_str(), 100.0 * share, format_bytes(uint64_t((1 - share) * used)).c_str());
  return buf;
}

RamExpertCache::~RamExpertCache() {
  // Reads may still be in flight into the pool: wait for them before it is freed.
  for (Slot& s : slots_) {
    if (s.pending) (void)finish(s);
  }
}

Result<std::unique_ptr<RamExpertCache>> RamExpertCache::create(const gguf::File& file, const model::Weights& w,
                                                               backend::Backend& be, const RamExpertOptions& opts) {
  if (!be.reads_host_weights()) {
    return unsupported(std::string("the RAM expert cache computes on host memory; the ") + be.name() +
                       " backend cannot use it (use --backend cpu, or --vram-budget for the GPU's expert cache)");
  }
  SLUICE_ASSIGN_OR_RETURN(RamExpertPlan plan, plan_ram_experts(w, be, opts));
  std::unique_ptr<RamExpertCache> s(new RamExpertCache());
  s->plan_ = plan;
  s->be_ = &be;
  s->trace_ = opts.trace;
  s->prefetch_ = opts.prefetch;
  s->prefetch_max_tokens_ = opts.prefetch_max_tokens;
  s->prefetch_top_ = opts.prefetch_top;
  s->n_layer_ = plan.n_layer;
  s->n_expert_ = plan.n_expert;
  s->file_ = w.layers;
  SLUICE_ASSIGN_OR_RETURN(s->reader_, open_reader(file, opts.io));
  for (const model::LayerWeights& L : w.layers) {
    for (model::LayerTensorField f : kExpertFields) {
      const gguf::TensorInfo* info = file.find_tensor((L.*f).name);
      if (!info) return internal_error("ram expert cache: tensor " + (L.*f).name + " not in " + file.path());
      s->tensor_offset_.push_back(file.file_offset(*info));
      s->tensor_file_.push_back(info->shard);
    }
  }

  // Resident part: copied (or repacked) out of the mapping, whose pages are then dropped, so what
  // stays in RAM is what the budget counts.
  SLUICE_ASSIGN_OR_RETURN(s->resident_, alloc_host_block(plan.resident_bytes, "the resident weights"));
  uint8_t* at = s->resident_.get();
  uint64_t total = plan.resident_bytes, done = 0;
  auto progress = [&](uint64_t b) {
    done += b;
    if (opts.on_load_progress && total) opts.on_load_progress(std::min(done, total), total);
  };
  progress(0);
  auto hold = [&](model::TensorRef& t) {
    if (!t.present()) return;
    const int64_t pb = model::repacked_bytes(be, t);
    const void* src = t.data;
    if (pb > 0) {
      t.adopt(be.repack_weight(t.view(), at));
      at += round_up(uint64_t(pb), 64);
    } else {
      std::memcpy(at, t.data, t.nbytes);
      t.data = at;
      at += round_up(t.nbytes, 64);
    }
    file.release(src, t.nbytes);
    progress(t.nbytes);
  };
  s->globals_ = w;
  s->globals_.layers.clear();
  model::Weights& g = s->globals_;
  const bool tie = tied(w);
  {
    std::memcpy(at, w.token_embd.data, w.token_embd.nbytes);
    g.token_embd.data = at;
    at += round_up(w.token_embd.nbytes, 64);
    progress(w.token_embd.nbytes);
  }
  if (tie && model::repacked_bytes(be, w.output) <= 0) {
    g.output.data = g.token_embd.data;  // the table itself, as the resident run reads it
  } else {
    hold(g.output);
  }
  hold(g.output_norm);
  hold(g.rope_freqs);
  if (!tie) file.release(w.token_embd.data, w.token_embd.nbytes);
  s->layers_ = w.layers;
  for (model::LayerWeights& L : s->layers_) {
    for (model::LayerTensorField f : model::kLayerTensorFields) {
      if (is_expert_field(f)) {
        L.*f = {};
      } else {
        hold(L.*f);
      }
    }
  }
  if (tie) file.release(w.token_embd.data, w.token_embd.nbytes);
  SLUICE_CHECK(uint64_t(at - s->resident_.get()) == plan.resident_bytes, "ram expert cache: resident sizes disagree");

  // The cache and the staging buffers, in one block.
  const uint64_t pool = plan.n_slots * plan.slot_bytes + uint64_t(plan.n_staging) * plan.staging_bytes;
  SLUICE_ASSIGN_OR_RETURN(s->pool_, alloc_host_block(pool, "the expert cache"));
  s->owned_bytes_ = plan.resident_bytes + pool;
  s->slots_.resize(plan.n_slots);
  for (uint64_t i = 0; i < plan.n_slots; ++i) s->slots_[i].base = s->pool_.get() + i * plan.slot_bytes;
  for (int i = 0; i < plan.n_staging; ++i) {
    s->staging_.push_back(s->pool_.get() + plan.n_slots * plan.slot_bytes + uint64_t(i) * plan.staging_bytes);
  }
  s->staging_busy_.assign(s->staging_.size(), false);
  const size_t keys = size_t(plan.n_layer) * size_t(plan.n_expert);
  s->where_.assign(keys, -1);
  s->freq_.assign(keys, 0.0);
  s->last_use_.assign(keys, 0);
  s->mark_.assign(size_t(plan.n_expert), false);
  s->stats_.layer_uses.assign(size_t(plan.n_layer), 0);
  s->stats_.layer_hits.assign(size_t(plan.n_layer), 0);
  return s;
}

RamExpertCache::ExpertMatrix RamExpertCache::matrix(int key, int i) const {
  const int l = key / n_expert_, e = key % n_expert_;
  const model::TensorRef& t = file_[size_t(l)].*kExpertFields[i];
  ExpertMatrix m;
  m.shape = t.expert(e);
  m.shape.data = nullptr;
  m.bytes = t.expert_bytes();
  m.packed_bytes = expert_packed_bytes(*be_, t);
  return m;
}

uint64_t RamExpertCache::expert_file_bytes(int key) const {
  const model::LayerWeights& L = file_[size_t(key / n_expert_)];
  return L.gate_exps.expert_bytes() + L.up_exps.expert_bytes() + L.down_exps.expert_bytes();
}

Status RamExpertCache::fail(Status st) {
  if (failed_.is_ok()) failed_ = std::move(st);
  return failed_;
}

bool RamExpertCache::arrived(Slot& s) {
  for (int i = 0; i < s.n_tickets; ++i) {
    if (!reader_->is_done(s.tickets[i])) return false;
  }
  return true;
}

RamExpertCache::Slot& RamExpertCache::oldest_pending(bool with_staging) {
  Slot* best = nullptr;
  for (Slot& s : slots_) {
    if (!s.pending || (with_staging && s.staging < 0)) continue;
    if (!best || s.submitted < best->submitted) best = &s;
  }
  SLUICE_CHECK(best != nullptr, "ram expert cache: no read in flight to complete");
  return *best;
}

int RamExpertCache::free_staging() const {
  for (size_t i = 0; i < staging_busy_.size(); ++i) {
    if (!staging_busy_[i]) return int(i);
  }
  return -1;
}

Status RamExpertCache::start_read(Slot& s, int key) {
  SLUICE_CHECK(!s.pending, "ram expert cache: reading into a slot with a read in flight");
  if (s.key >= 0) where_[size_t(s.key)] = -1;
  s.key = key;
  where_[size_t(key)] = int(&s - slots_.data());
  s.pending = true;
  s.prefetched = false;
  s.n_tickets = 0;
  s.staging = -1;
  s.submitted = Clock::now();
  const int l = key / n_expert_, e = key % n_expert_;
  const uint64_t off[3] = {0, plan_.off_up, plan_.off_down};
  uint64_t soff = 0;
  for (int i = 0; i < 3; ++i) {
    const model::TensorRef& t = file_[size_t(l)].*kExpertFields[i];
    const ExpertMatrix m = matrix(key, i);
    const AlignedRange r = align_range(tensor_offset_[size_t(l) * 3 + size_t(i)] + uint64_t(e) * m.bytes, m.bytes);
    uint8_t* dst = s.base + off[i];
    if (m.packed_bytes > 0) {
      if (s.staging < 0) {
        s.staging = free_staging();
        SLUICE_CHECK(s.staging >= 0, "ram expert cache: no free read buffer");
        staging_busy_[size_t(s.staging)] = true;
      }
      dst = staging_[size_t(s.staging)] + soff;
      soff += round_up(read_span(m.bytes), kIoAlign);
    }
    auto tk = reader_->submit(tensor_file_[size_t(l) * 3 + size_t(i)], r.offset, r.len, dst);
    if (!tk.is_ok()) return fail(Status(tk.status().code(), "reading expert " + std::to_string(e) + " of " + t.name +
                                                                ": " + tk.status().message()));
    s.tickets[s.n_tickets++] = *tk;
  }
  return Status::ok();
}

Status RamExpertCache::finish(Slot& s) {
  if (!s.pending) return Status::ok();
  Status st;
  for (int i = 0; i < s.n_tickets; ++i) {  // every read waited for, even after an error
    Status ws = reader_->wait(s.tickets[i]);
    if (st.is_ok()) st = std::move(ws);
  }
  s.pending = false;
  s.n_tickets = 0;
  if (st.is_ok() && s.staging >= 0) {
    // Repack the matrices read into the staging buffer: the slice of the stacked tensor's packed
    // layout the resident load makes.
    const int l = s.key / n_expert_, e = s.key % n_expert_;
    const uint64_t off[3] = {0, plan_.off_up, plan_.off_down};
    uint64_t soff = 0;
    for (int i = 0; i < 3; ++i) {
      const ExpertMatrix m = matrix(s.key, i);
      if (m.packed_bytes <= 0) continue;
      const AlignedRange r = align_range(tensor_offset_[size_t(l) * 3 + size_t(i)] + uint64_t(e) * m.bytes, m.bytes);
      backend::WeightView v = m.shape;
      v.data = staging_[size_t(s.staging)] + soff + r.skip;
      be_->repack_weight(v, s.base + off[i]);
      soff += round_up(read_span(m.bytes), kIoAlign);
    }
  }
  if (s.staging >= 0) staging_busy_[size_t(s.staging)] = false;
  s.staging = -1;
  if (!st.is_ok()) {
    where_[size_t(s.key)] = -1;
    s.key = -1;
    return fail(std::move(st));
  }
  return Status::ok();
}

model::ExpertPlacement::Site RamExpertCache::site(const Slot& s) const {
  const int l = s.key / n_expert_, e = s.key % n_expert_;
  const uint64_t off[3] = {0, plan_.off_up, plan_.off_down};
  backend::WeightView v[3];
  for (int i = 0; i < 3; ++i) {
    const ExpertMatrix m = matrix(s.key, i);
    v[i] = m.shape;
    if (m.packed_bytes > 0) {
      v[i].data = s.base + off[i];
      v[i].packed = true;
    } else {
      const AlignedRange r = align_range(tensor_offset_[size_t(l) * 3 + size_t(i)] + uint64_t(e) * m.bytes, m.bytes);
      v[i].data = s.base + off[i] + r.skip;
      v[i].packed = false;
    }
  }
  return Site{false, v[0], v[1], v[2]};
}

int RamExpertCache::victim() const {
  int best = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.busy == stamp_) continue;  // read by the layer being placed (or read ahead for the next)
    if (s.key < 0) return int(i);
    if (best < 0) {
      best = int(i);
      continue;
    }
    if (model::evicts_before(freq_, last_use_, s.key, slots_[size_t(best)].key)) best = int(i);
  }
  return best;
}

Status RamExpertCache::begin_pass(int n_tokens) {
  if (!failed_.is_ok()) return failed_;
  if (Status st = reader_->check_unchanged(); !st.is_ok()) return fail(std::move(st));
  pass_tokens_ = n_tokens;
  decode_ = n_tokens == 1;
  ++stats_.passes;
  if (decode_) ++stats_.decode_passes;
  return Status::ok();
}

Result<const model::LayerWeights*> RamExpertCache::acquire(int layer) {
  if (!failed_.is_ok()) return failed_;
  SLUICE_CHECK(layer >= 0 && layer < n_layer_, "ram expert cache: layer out of range");
  return &layers_[size_t(layer)];
}

Status RamExpertCache::place(int layer, int n_tokens, std::span<const model::ExpertBatch> batches,
                             std::span<Site> sites) {
  SLUICE_CHECK(sites.size() == batches.size(), "place: one site per batch");
  SLUICE_CHECK(batches.size() <= slots_.size(), "place: more experts than cache slots in one group");
  (void)n_tokens;
  if (!failed_.is_ok()) return failed_;
  ++stamp_;
  const auto t0 = Clock::now();
  // Reads started ahead that have arrived are completed now (no wait); the others only when this
  // layer uses them or their slot or read buffer is needed, so a wrong prediction costs disk time
  // and a slot, never a wait. A prediction for this layer is scored against what the router chose.
  for (Slot& s : slots_) {
    if (s.pending && arrived(s)) SLUICE_RETURN_IF_ERROR(finish(s));
  }
  if (predicted_layer_ == layer) {
    const uint64_t hit = model::count_chosen(predicted_set_, batches, mark_);
    stats_.predicted += predicted_set_.size();
    stats_.predicted_used += hit;
    stats_.predicted_actual += batches.size();
    if (decode_) {
      stats_.decode_predicted_used += hit;
      stats_.decode_predicted_actual += batches.size();
    }
    predicted_layer_ = -1;
  }
  misses_.clear();
  for (size_t i = 0; i < batches.size(); ++i) {
    const int key = layer * n_expert_ + batches[i].expert;
    freq_[size_t(key)] += 1;
    last_use_[size_t(key)] = stamp_;
    ++stats_.uses;
    if (decode_) ++stats_.decode_uses, ++stats_.layer_uses[size_t(layer)];
    if (const int w = where_[size_t(key)]; w >= 0) {
      Slot& s = slots_[size_t(w)];
      s.busy = stamp_;
      if (s.pending) SLUICE_RETURN_IF_ERROR(finish(s));  // read ahead, still arriving
      continue;
    }
    misses_.push_back(int(i));
  }
  // Misses: into the least valuable slots, all reads in flight at once where read buffers allow
  // (else the oldest read holding one is completed first).
  be_->sync();  // a slot about to be overwritten may still be read by earlier ops (none on the CPU)
  for (int i : misses_) {
    const int key = layer * n_expert_ + batches[size_t(i)].expert;
    while (!staging_.empty() && free_staging() < 0) SLUICE_RETURN_IF_ERROR(finish(oldest_pending(true)));
    const int v = victim();
    SLUICE_CHECK(v >= 0, "ram expert cache: no slot to evict");
    Slot& s = slots_[size_t(v)];
    if (s.pending) SLUICE_RETURN_IF_ERROR(finish(s));  // an unused read ahead: its bytes land first
    SLUICE_RETURN_IF_ERROR(start_read(s, key));
    s.busy = stamp_;
  }
  for (int i : misses_) {
    const int key = layer * n_expert_ + batches[size_t(i)].expert;
    SLUICE_RETURN_IF_ERROR(finish(slots_[size_t(where_[size_t(key)])]));
  }
  const auto t1 = Clock::now();
  const double waited = std::chrono::duration<double>(t1 - t0).count();
  stats_.wait_seconds += waited;
  if (decode_) stats_.decode_wait_seconds += waited;
  size_t next_miss = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const int key = layer * n_expert_ + batches[i].expert;
    Slot& s = slots_[size_t(where_[size_t(key)])];
    sites[i] = site(s);
    const uint64_t bytes = expert_file_bytes(key);
    const bool miss = next_miss < misses_.size() && misses_[next_miss] == int(i);
    const char* tier = "ram hit";
    if (miss) {
      ++next_miss;
      ++stats_.misses;
      stats_.disk_bytes += bytes;
      if (decode_) stats_.decode_disk_bytes += bytes;
      tier = "disk";
    } else {
      ++stats_.hits;
      stats_.hit_bytes += bytes;
      if (decode_) ++stats_.decode_hits, ++stats_.layer_hits[size_t(layer)], stats_.decode_hit_bytes += bytes;
      if (s.prefetched) {
        ++stats_.prefetch_used;
        tier = "prefetch";
      }
    }
    s.prefetched = false;
    if (trace_) {
      trace_->append({trace_->us(t0), trace_->us(t1), "expert", layer,
                      "blk." + std::to_string(layer) + ".exp." + std::to_string(batches[i].expert) + ".pass." +
                          std::to_string(stats_.passes - 1),
                      tier, bytes});
    }
  }
  return Status::ok();
}

const model::LayerWeights* RamExpertCache::predictor(int layer) {
  if (!prefetch_ || pass_tokens_ > prefetch_max_tokens_ || layer + 1 >= n_layer_) return nullptr;
  const model::LayerWeights& next = layers_[size_t(layer) + 1];
  return next.moe() ? &next : nullptr;
}

void RamExpertCache::predicted(int next_layer, const model::MoeRouting& r) {
  if (!failed_.is_ok() || next_layer >= n_layer_) return;
  model::distinct_experts(r, mark_, predicted_set_);
  predicted_layer_ = next_layer;
  // Read the predicted experts that are not cached, while this layer computes: only each token's
  // prefetch_top highest-ranked predictions (a read ahead that goes unused takes disk time from
  // the misses, and the lower ranks are right less often). Slots of this layer's experts are kept;
  // a read waits for a free read buffer only where experts are repacked.
  const int top = prefetch_top_ > 0 ? std::min(prefetch_top_, r.n_used) : r.n_used;
  for (int t = 0; t < r.n_tokens; ++t) {
    for (int k = 0; k < top; ++k) mark_[size_t(r.experts[size_t(t) * size_t(r.n_used) + size_t(k)])] = true;
  }
  ahead_.clear();
  for (int32_t e : predicted_set_) {
    if (mark_[size_t(e)]) ahead_.push_back(e);
    mark_[size_t(e)] = false;
  }
  for (int32_t e : ahead_) {
    const int key = next_layer * n_expert_ + e;
    if (where_[size_t(key)] >= 0) continue;
    if (!staging_.empty() && free_staging() < 0) break;
    const int v = victim();
    if (v < 0) break;
    Slot& s = slots_[size_t(v)];
    if (s.pending) {
      // An earlier read ahead, unused: reuse its slot only once it has arrived (no waiting here).
      if (!arrived(s) || !finish(s).is_ok()) break;
    }
    if (!start_read(s, key).is_ok()) return;  // sticky: the next place() reports it
    s.busy = stamp_;  // kept from the next predictions of this pass's layer
    s.prefetched = true;
    const uint64_t bytes = expert_file_bytes(key);
    ++stats_.prefetch_reads;
    stats_.prefetch_bytes += bytes;
    stats_.disk_bytes += bytes;
    if (decode_) stats_.decode_prefetch_bytes += bytes, stats_.decode_disk_bytes += bytes;
    if (trace_) {
      trace_->append({trace_->us(s.submitted), trace_->now_us(), "disk expert", next_layer,
                      "blk." + std::to_string(next_layer) + ".exp." + std::to_string(e) + ".pass." +
                          std::to_string(stats_.passes - 1),
                      "prefetch", bytes});
    }
  }
}

std::string RamExpertCache::describe() const {
  const int total = n_layer_ * n_expert_;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "experts: resident part %s in RAM; cache %d of %d experts (%.0f%%, %s slots) from %s reads; prefetch %s",
                format_bytes(plan_.resident_bytes).c_str(), int(slots_.size()), total,
                100.0 * double(slots_.size()) / double(std::max(total, 1)), format_bytes(plan_.slot_bytes).c_str(),
                reader_->direct() ? "O_DIRECT" : "buffered", prefetch_ ? "on" : "off");
  return buf;
}

std::string RamExpertCache::stats_line() const {
  const RamExpertStats& s = stats_;
  const bool decode = s.decode_passes > 0;
  const double n = double(std::max<uint64_t>(decode ? s.decode_passes : s.passes, 1));
  const uint64_t uses = decode ? s.decode_uses : s.uses;
  const uint64_t hits = decode ? s.decode_hits : s.hits;
  char pf[200] = "prefetch off";
  const uint64_t pa = decode ? s.decode_predicted_actual : s.predicted_actual;
  const uint64_t pu = decode ? s.decode_predicted_used : s.predicted_used;
  if (prefetch_) {
    std::snprintf(pf, sizeof pf, "prefetch: accuracy %.1f%% (%llu of %llu used experts predicted), read ahead %.2f MB/%s, %llu of %llu reads ahead used",
                  100.0 * double(pu) / double(std::max<uint64_t>(pa, 1)), (unsigned long long)pu, (unsigned long long)pa,
                  double(decode ? s.decode_prefetch_bytes : s.prefetch_bytes) / n / 1e6, decode ? "token" : "pass",
                  (unsigned long long)s.prefetch_used, (unsigned long long)s.prefetch_reads);
  }
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "experts (%s): %llu uses, hit rate %.1f%%; per %s: RAM %.2f MB, disk %.2f MB, waiting for reads %.2f ms; %s",
                decode ? "decode" : "all passes", (unsigned long long)uses,
                100.0 * double(hits) / double(std::max<uint64_t>(uses, 1)), decode ? "token" : "pass",
                double(decode ? s.decode_hit_bytes : s.hit_bytes) / n / 1e6,
                double(decode ? s.decode_disk_bytes : s.disk_bytes) / n / 1e6,
                (decode ? s.decode_wait_seconds : s.wait_seconds) / n * 1e3, pf);
  return buf;
}

std::string RamExpertCache::layer_line() const {
  std::string out = "experts: decode hit rate per layer (%):";
  char b[16];
  for (size_t l = 0; l < stats_.layer_uses.size(); ++l) {
    std::snprintf(b, sizeof b, " %.0f",
                  100.0 * double(stats_.layer_hits[l]) / double(std::max<uint64_t>(stats_.layer_uses[l], 1)));
    out += b;
  }
  return out;
}

std::function<Result<std::unique_ptr<model::LayerSource>>(const gguf::File&, const model::Weights&, backend::Backend&)>
ram_expert_source(const RamExpertOptions& opts, RamExpertCache** out) {
  return [opts, out](const gguf::File& file, const model::Weights& w,
                     backend::Backend& be) -> Result<std::unique_ptr<model::LayerSource>> {
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RamExpertCache> s, RamExpertCache::create(file, w, be, opts));
    if (out) *out = s.get();
    return std::unique_ptr<model::LayerSource>(std::move(s));
  };
}

}  // namespace sluice::stream
