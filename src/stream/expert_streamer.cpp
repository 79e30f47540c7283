#include "stream/expert_streamer.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/executor.h"
#include "stream/plan.h"

namespace sluice::stream {
namespace {

using Mark = backend::Backend::Mark;

// The layer loop's logit rows per output projection (model/forward.cpp), which with the tokens per
// pass size its activation buffers, and the default context cap for n_ctx = 0.
constexpr uint64_t kLogitRows = 16;
constexpr int kDefaultMaxCtx = 4096;
// Matrices inside a slot start at multiples of this (the CUDA GEMV's 16-byte loads, with room).
constexpr uint64_t kSlotAlign = 256;
// Backend marks are recycled after 1024 newer ones (cuda_backend.cu): a mark older than this
// horizon has long passed and is not waited on (its event may already name a newer point).
constexpr Mark kMarkHorizon = 900;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t physical_ram() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : (16ull << 30);
}

bool is_expert_field(model::LayerTensorField f) {
  return f == &model::LayerWeights::gate_exps || f == &model::LayerWeights::up_exps ||
         f == &model::LayerWeights::down_exps;
}

constexpr model::LayerTensorField kExpertFields[3] = {&model::LayerWeights::gate_exps, &model::LayerWeights::up_exps,
                                                      &model::LayerWeights::down_exps};

}  // namespace

ExpertPlan plan_experts(const model::Weights& w, int n_ctx, uint64_t workspace_bytes, uint64_t vram_budget,
                        int max_batch) {
  ExpertPlan p;
  const uint64_t n_layer = w.layers.size();
  if (n_layer == 0 || w.n_expert < 1) return p;
  p.n_layer = int(n_layer);
  p.n_expert = w.n_expert;
  p.n_used = w.n_expert_used;
  p.resident_bytes = w.output_norm.nbytes + w.output.nbytes + w.rope_freqs.nbytes;
  // The cache: slots of one expert, matrices at fixed offsets sized for the largest layer.
  uint64_t gate_max = 0, up_max = 0, down_max = 0;
  for (const model::LayerWeights& L : w.layers) {
    for (model::LayerTensorField f : model::kLayerTensorFields) {
      if (!is_expert_field(f)) p.resident_bytes += (L.*f).nbytes;
    }
    p.expert_bytes += L.expert_bytes();
    gate_max = std::max(gate_max, L.gate_exps.expert_bytes());
    up_max = std::max(up_max, L.up_exps.expert_bytes());
    down_max = std::max(down_max, L.down_exps.expert_bytes());
  }
  p.off_up = round_up(gate_max, kSlotAlign);
  p.off_down = p.off_up + round_up(up_max, kSlotAlign);
  p.slot_bytes = p.off_down + round_up(down_max, kSlotAlign);
  // Backend memory the model needs besides weights (as model/forward.cpp allocates it; n_ctx 0
  // means at most kDefaultMaxCtx positions).
  const model::LayerWeights& L0 = w.layers[0];
  const uint64_t n_embd = uint64_t(L0.attn_norm.ne0), n_embd_k = uint64_t(L0.wk.ne1), n_embd_v = uint64_t(L0.wv.ne1);
  const uint64_t n_q = uint64_t(L0.wq.ne1), n_ff = uint64_t(std::max(L0.gate_exps.ne1, L0.gate_shexp.ne1));
  const uint64_t ctx = uint64_t(n_ctx > 0 ? n_ctx : kDefaultMaxCtx);
  const uint64_t kv_bytes = ctx * n_layer * (n_embd_k + n_embd_v) * 2;
  const uint64_t act_bytes = uint64_t(max_batch) * (6 * n_embd + n_q + n_embd_k + n_embd_v + n_q + 2 * n_ff + uint64_t(w.n_expert)) * 4 +
                             kLogitRows * uint64_t(w.token_embd.ne1) * 4;
  p.reserved_bytes = kv_bytes + act_bytes + workspace_bytes;
  const uint64_t fixed = p.resident_bytes + p.reserved_bytes;
  if (vram_budget > fixed) {
    p.n_slots = std::min<uint64_t>((vram_budget - fixed) / p.slot_bytes, n_layer * uint64_t(w.n_expert));
  }
  return p;
}

std::string ExpertPlan::describe(double vram_bw, double h2d_bw, double cpu_bw) const {
  const uint64_t total = uint64_t(n_layer) * uint64_t(n_expert);
  const double per_expert = double(expert_bytes) / double(std::max<uint64_t>(total, 1));
  const double hit = double(n_slots) / double(std::max<uint64_t>(total, 1));
  const double used = per_expert * double(n_used) * double(n_layer);  // expert bytes a token reads
  // Uniform routing: a token finds `hit` of its experts cached; the misses run on the CPU and
  // through the copy engine side by side (each at its own rate; DRAM sharing ignored).
  const double t_vram = (double(resident_bytes) + hit * used) / vram_bw;
  const double t_miss = (1 - hit) * used / (cpu_bw + h2d_bw);
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "  resident (attention, norms, routers, shared experts, output): %s; KV, activations, workspace %s\n"
                "  routed experts: %d layers x %d (top-%d), %s in all, slot %s\n"
                "  VRAM expert cache: %llu slots = %.0f%% of the experts\n"
                "  per token (uniform routing): %s of experts, %.0f%% from the cache; predicted %.2f ms "
                "(VRAM %.2f ms, misses %.2f ms on CPU + copy engine)\n"
                "  skewed routers (real models) hit more: the run prints the measured hit rate\n",
                format_bytes(resident_bytes).c_str(), format_bytes(reserved_bytes).c_str(), n_layer, n_expert, n_used,
                format_bytes(expert_bytes).c_str(), format_bytes(slot_bytes).c_str(), (unsigned long long)n_slots,
                100.0 * hit, format_bytes(uint64_t(used)).c_str(), 100.0 * hit, (t_vram + t_miss) * 1e3, t_vram * 1e3,
                t_miss * 1e3);
  std::string out = buf;
  if (n_slots == 0) {
    out += "  the VRAM budget holds no expert slot: at least " +
           format_bytes(resident_bytes + reserved_bytes + slot_bytes) + " is needed (a run would stop with that error)\n";
  }
  return out;
}

ExpertStreamer::~ExpertStreamer() {
  // Copies may still read pinned memory the backend owns; let the device finish first.
  be_.sync();
}

uint64_t expert_workspace_bytes(const model::Config& cfg, const ExpertStreamOptions& o) {
  if (o.workspace_bytes) return o.workspace_bytes;
  const int ctx = o.n_ctx > 0 ? o.n_ctx : kDefaultMaxCtx;
  return backend::cuda_scratch_bytes(model::Executor::scratch_shape(cfg, o.max_batch, ctx, std::max(1, o.max_sequences)));
}

Result<std::unique_ptr<ExpertStreamer>> ExpertStreamer::create(const gguf::File& file, const model::Weights& w,
                                                               backend::Backend& be, const ExpertStreamOptions& opts) {
  const bool host = be.reads_host_weights();
  if (host && !opts.allow_host_backend) {
    return unsupported(std::string("expert placement keeps experts in a backend's own memory; the ") + be.name() +
                       " backend computes on host memory");
  }
  if (w.layers.empty() || w.n_expert < 2 || !std::all_of(w.layers.begin(), w.layers.end(), [](const auto& l) {
        return l.moe();
      })) {
    return invalid_argument(file.path() + ": expert placement needs a mixture-of-experts model (every layer routed)");
  }
  if (opts.prefill_batch < 1) return invalid_argument("prefill_batch must be >= 1");
  if (opts.quota_period < 1) return invalid_argument("quota_period must be >= 1 decode pass");
  std::unique_ptr<ExpertStreamer> s(new ExpertStreamer(be));
  s->layer_quotas_ = opts.layer_quotas;
  s->quota_period_ = opts.quota_period;
  s->host_backend_ = host;
  s->prefill_batch_ = opts.prefill_batch;
  s->policy_ = opts.policy;
  s->prefetch_ = opts.prefetch;
  s->trace_ = opts.trace;
  s->h2d_bw_ = opts.h2d_bytes_per_s;
  s->cpu_bw_ = opts.cpu_bytes_per_s;
  s->n_layer_ = int(w.layers.size());
  s->n_expert_ = w.n_expert;
  const size_t n_layer = w.layers.size();

  // Resident: the output head and small vectors, and every layer tensor but the routed experts.
  auto upload = [&](model::TensorRef& t) -> Status {
    if (!t.present()) return Status::ok();
    auto v = be.upload_weight(t.view());
    if (!v.is_ok()) return Status(v.status().code(), "uploading " + t.name + ": " + v.status().message());
    s->resident_bytes_ += t.nbytes;
    t.adopt(*v);
    return Status::ok();
  };
  s->globals_ = w;
  s->globals_.layers.clear();
  for (model::TensorRef* t : {&s->globals_.output_norm, &s->globals_.output, &s->globals_.rope_freqs}) {
    SLUICE_RETURN_IF_ERROR(upload(*t));
  }
  s->layers_ = w.layers;
  for (model::LayerWeights& L : s->layers_) {
    for (model::LayerTensorField f : model::kLayerTensorFields) {
      if (is_expert_field(f)) {
        L.*f = {};
      } else {
        SLUICE_RETURN_IF_ERROR(upload(L.*f));
      }
    }
  }

  // Host: every expert in pinned memory (the copy engine's source), and the CPU's packed layout
  // where the RAM budget allows a second copy.
  uint64_t expert_bytes = 0, packed_need = 0;
  s->host_be_ = backend::make_cpu_backend(opts.host_cpu);
  s->host_rope_freqs_ = w.rope_freqs.view();
  for (const model::LayerWeights& L : w.layers) {
    for (model::LayerTensorField f : kExpertFields) {
      expert_bytes += round_up((L.*f).nbytes, 4096);
      packed_need += uint64_t(model::repacked_bytes(*s->host_be_, L.*f));
    }
  }
  const uint64_t ram_budget = opts.ram_budget ? opts.ram_budget : physical_ram() / 4 * 3;
  if (expert_bytes > ram_budget) {
    return invalid_argument("the experts need " + format_bytes(expert_bytes) + " of pinned host memory, the RAM budget is " +
                            format_bytes(ram_budget) + " (raise --ram-budget)");
  }
  const bool pack = packed_need > 0 && expert_bytes + packed_need <= ram_budget;
  s->host_pinned_ = w.layers;
  s->host_cpu_ = w.layers;
  for (size_t l = 0; l < n_layer; ++l) {
    for (model::LayerTensorField f : kExpertFields) {
      const model::TensorRef& src = w.layers[l].*f;
      auto p = be.alloc_staging(int64_t(round_up(src.nbytes, 4096)));
      if (!p.is_ok()) {
        return Status(p.status().code(), "pinned copy of " + src.name + ": " + p.status().message());
      }
      std::memcpy(*p, src.data, src.nbytes);
      file.release(src.data, src.nbytes);  // the pinned copy replaces the file's pages
      s->pinned_bytes_ += round_up(src.nbytes, 4096);
      model::TensorRef& pin = s->host_pinned_[l].*f;
      pin.data = *p;
      pin.packed = false;
      model::TensorRef& cpu = s->host_cpu_[l].*f;
      cpu = pin;
      if (const int64_t pb = pack ? model::repacked_bytes(*s->host_be_, pin) : 0; pb > 0) {
        SLUICE_ASSIGN_OR_RETURN(HostBlock block, alloc_host_block(size_t(pb), "the CPU's packed experts"));
        cpu.adopt(s->host_be_->repack_weight(pin.view(), block.get()));
        s->packed_bytes_ += uint64_t(pb);
        s->packed_blocks_.push_back(std::move(block));
      }
    }
  }

  SLUICE_ASSIGN_OR_RETURN(std::string arch_name, file.get_string("general.architecture"));
  const model::ArchSpec* arch = model::find_arch(arch_name);
  if (!arch) return unsupported(file.path() + ": architecture \"" + arch_name + "\" is not supported");
  SLUICE_ASSIGN_OR_RETURN(const model::Config cfg, model::read_config(file, *arch));
  const ExpertPlan ep = plan_experts(w, opts.n_ctx, expert_workspace_bytes(cfg, opts), 0, opts.max_batch);
  s->off_up_ = ep.off_up;
  s->off_down_ = ep.off_down;
  s->slot_bytes_ = ep.slot_bytes;
  const uint64_t reserved = ep.reserved_bytes;
  uint64_t avail = 0;
  if (host) {
    avail = opts.cache_bytes ? opts.cache_bytes : uint64_t(n_layer) * uint64_t(w.n_expert) * s->slot_bytes_;
  } else {
    const uint64_t budget = opts.vram_budget ? opts.vram_budget : uint64_t(std::max<int64_t>(be.free_memory(), 0)) + s->resident_bytes_;
    const uint64_t need = s->resident_bytes_ + reserved + s->slot_bytes_;
    if (budget < need) {
      return invalid_argument("the VRAM budget " + format_bytes(budget) + " cannot hold the resident part of the model (" +
                              format_bytes(s->resident_bytes_) + "), KV cache, activations and workspace (" +
                              format_bytes(reserved) + ") and one expert slot (" + format_bytes(s->slot_bytes_) +
                              "): at least " + format_bytes(need) + " is needed");
    }
    avail = budget - s->resident_bytes_ - reserved;
    if (opts.cache_bytes) avail = std::min(avail, opts.cache_bytes);
    // What the backend really has left (other processes may hold memory), less a margin for the
    // allocator's own overheads (cuBLAS handles, graph memory).
    constexpr uint64_t kMargin = 256ull << 20;
    if (const int64_t free = be.free_memory(); free >= 0) {
      avail = std::min(avail, uint64_t(free) > reserved + kMargin ? uint64_t(free) - reserved - kMargin : 0);
    }
  }
  uint64_t n_slots = std::min<uint64_t>(avail / s->slot_bytes_, uint64_t(n_layer) * uint64_t(w.n_expert));
  // Slots come in blocks of up to kSlotBlock bytes: one allocation per slot would round each
  // small expert up to the allocator's granule (2 MiB on CUDA) and waste a third of the cache. A
  // block that cannot be had is retried smaller; the cache keeps what was allocated.
  constexpr uint64_t kSlotBlock = 256ull << 20;
  const uint64_t per_block = std::max<uint64_t>(1, kSlotBlock / s->slot_bytes_);
  for (uint64_t made = 0; made < n_slots;) {
    uint64_t want = std::min(per_block, n_slots - made);
    Result<void*> p = be.alloc_slot(int64_t(want * s->slot_bytes_));
    while (!p.is_ok() && want > 1) {
      want /= 2;
      p = be.alloc_slot(int64_t(want * s->slot_bytes_));
    }
    if (!p.is_ok()) {
      n_slots = made;
      break;
    }
    for (uint64_t i = 0; i < want; ++i) {
      Slot slot;
      slot.base = static_cast<uint8_t*>(*p) + i * s->slot_bytes_;
      s->slots_.push_back(slot);
    }
    made += want;
  }
  if (s->slots_.empty() && opts.policy != MissPolicy::kCpu) {
    return invalid_argument("no room for an expert slot (" + format_bytes(s->slot_bytes_) + ") in the VRAM budget");
  }
  const size_t keys = n_layer * size_t(w.n_expert);
  s->where_.assign(keys, -1);
  s->freq_.assign(keys, 0.0);
  s->last_use_.assign(keys, 0);
  s->stats_.layer_uses.assign(n_layer, 0);
  s->stats_.layer_hits.assign(n_layer, 0);
  s->stats_.decode_layer_uses.assign(n_layer, 0);
  s->stats_.decode_layer_hits.assign(n_layer, 0);
  s->mark_.assign(size_t(w.n_expert), false);
  s->held_.assign(n_layer, 0);
  if (s->layer_quotas_) {
    s->decode_uses_.assign(keys, 0.0);
    s->quota_ = plan_expert_quotas(s->decode_uses_, int(n_layer), w.n_expert, s->slots_.size());
  }
  // Initial contents: the same number of experts in every layer (expert-major), until routing
  // statistics say otherwise.
  size_t next = 0;
  for (int e = 0; e < w.n_expert && next < s->slots_.size(); ++e) {
    for (size_t l = 0; l < n_layer && next < s->slots_.size(); ++l) s->fill(s->slots_[next++], int(l) * w.n_expert + e);
  }
  be.sync();
  return s;
}

ExpertStreamer::HostExpert ExpertStreamer::host_expert(int key) const {
  const int l = key / n_expert_, e = key % n_expert_;
  HostExpert h;
  for (int i = 0; i < 3; ++i) {
    h.copy[i] = (host_pinned_[size_t(l)].*kExpertFields[i]).expert(e);
    h.cpu[i] = (host_cpu_[size_t(l)].*kExpertFields[i]).expert(e);
  }
  return h;
}

void ExpertStreamer::fill(Slot& slot, int key) {
  if (slot.key >= 0) {
    where_[size_t(slot.key)] = -1;
    --held_[size_t(slot.key / n_expert_)];
  }
  ++held_[size_t(key / n_expert_)];
  const HostExpert h = host_expert(key);
  uint8_t* base = static_cast<uint8_t*>(slot.base);
  const uint64_t off[3] = {0, off_up_, off_down_};
  // The copy may start once the compute that last read the slot is done.
  const Mark after = slot.free_mark;
  Mark m = 0;
  for (int i = 0; i < 3; ++i) m = be_.copy_to_slot(base + off[i], h.copy[i].data, h.copy[i].ne1 * h.copy[i].row_bytes(), after);
  slot.copy_mark = m;
  newest_mark_ = std::max(newest_mark_, m);
  slot.key = key;
  where_[size_t(key)] = int(&slot - slots_.data());
}

model::ExpertPlacement::Site ExpertStreamer::slot_site(const Slot& slot, int key) const {
  const HostExpert h = host_expert(key);
  const uint8_t* base = static_cast<const uint8_t*>(slot.base);
  Site site;
  site.gate = {h.copy[0].type, h.copy[0].ne0, h.copy[0].ne1, base, false};
  site.up = {h.copy[1].type, h.copy[1].ne0, h.copy[1].ne1, base + off_up_, false};
  site.down = {h.copy[2].type, h.copy[2].ne0, h.copy[2].ne1, base + off_down_, false};
  return site;
}

int ExpertStreamer::victim(int layer) const {
  // Without quotas, or when no slot qualifies under them (the layer's own slots are all read by
  // this pass, e.g. a prefill using more experts than its quota): any slot.
  const bool quotas = layer_quotas_;  // quota_ is planned at creation
  const bool own = quotas && held_[size_t(layer)] >= quota_[size_t(layer)];
  for (const bool restrict : {quotas, false}) {
    int best = -1;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.busy == stamp_ || s.reserved == stamp_) continue;  // read by the layer being placed, or prefetched for the next
      if (s.key < 0) return int(i);
      if (restrict) {
        // At its quota a layer evicts its own experts; below it, those of a layer above its quota.
        const size_t kl = size_t(s.key / n_expert_);
        if (own ? int(kl) != layer : held_[kl] <= quota_[kl]) continue;
      }
      if (best < 0) {
        best = int(i);
        continue;
      }
      if (model::evicts_before(freq_, last_use_, s.key, slots_[size_t(best)].key)) best = int(i);
    }
    if (best >= 0 || !restrict) return best;
  }
  return -1;
}

std::vector<int> plan_expert_quotas(std::span<const double> uses, int n_layer, int n_expert, uint64_t n_slots) {
  SLUICE_CHECK(n_layer >= 0 && n_expert >= 0 && uses.size() == size_t(n_layer) * size_t(n_expert),
               "plan_expert_quotas: one use count per expert of every layer");
  std::vector<int> q(size_t(n_layer), 0);
  std::vector<int> used;
  for (size_t k = 0; k < uses.size(); ++k)
    if (uses[k] > 0) used.push_back(int(k));
  std::stable_sort(used.begin(), used.end(), [&](int a, int b) { return uses[size_t(a)] > uses[size_t(b)]; });
  uint64_t left = std::min<uint64_t>(n_slots, uint64_t(n_layer) * uint64_t(n_expert));
  for (size_t i = 0; i < used.size() && left > 0; ++i, --left) ++q[size_t(used[i] / n_expert)];
  while (left > 0) {  // round-robin over the layers with room
    for (int l = 0; l < n_layer && left > 0; ++l) {
      if (q[size_t(l)] < n_expert) ++q[size_t(l)], --left;
    }
  }
  return q;
}

Status ExpertStreamer::begin_pass(int n_tokens) {
  pass_tokens_ = n_tokens;
  ++stats_.passes;
  if (n_tokens == 1) ++stats_.decode_passes;
  if (layer_quotas_ && n_tokens < prefill_batch_ && ++decode_passes_since_quota_ >= quota_period_) {
    quota_ = plan_expert_quotas(decode_uses_, n_layer_, n_expert_, slots_.size());
    decode_passes_since_quota_ = 0;
  }
  return Status::ok();
}

Status ExpertStreamer::place(int layer, int n_tokens, std::span<const model::ExpertBatch> batches,
                             std::span<Site> sites) {
  SLUICE_CHECK(sites.size() == batches.size(), "place: one site per batch");
  ++stamp_;
  busy_slots_.clear();
  layer_cpu_bytes_ = 0;
  const bool decode = n_tokens < prefill_batch_;
  const bool one = n_tokens == 1;
  // Marks at or below `old` passed long ago (and may have been recycled): not waited on.
  const Mark old = newest_mark_ > kMarkHorizon ? newest_mark_ - kMarkHorizon : 0;
  const int64_t t0 = trace_ ? trace_->now_us() : 0;
  if (predicted_layer_ == layer) {
    // The prediction made in the previous layer against what the router chose.
    const uint64_t hit = model::count_chosen(predicted_set_, batches, mark_);
    stats_.predicted += predicted_set_.size();
    stats_.predicted_used += hit;
    stats_.predicted_actual += batches.size();
    if (one) stats_.decode_predicted_used += hit, stats_.decode_predicted_actual += batches.size();
    predicted_layer_ = -1;
  }
  auto trace = [&](int expert, const char* tier, uint64_t bytes) {
    if (!trace_) return;
    trace_->append({t0, trace_->now_us(), "expert", layer,
                    "blk." + std::to_string(layer) + ".exp." + std::to_string(expert) + ".pass." +
                        std::to_string(stats_.passes - 1),
                    tier, bytes});
  };
  std::vector<size_t> misses;
  for (size_t i = 0; i < batches.size(); ++i) {
    const int key = layer * n_expert_ + batches[i].expert;
    freq_[size_t(key)] += 1;
    if (decode && layer_quotas_) decode_uses_[size_t(key)] += 1;
    last_use_[size_t(key)] = stamp_;
    const HostExpert h = host_expert(key);
    const uint64_t bytes = h.bytes();
    ++stats_.uses;
    ++stats_.layer_uses[size_t(layer)];
    if (one) ++stats_.decode_uses, ++stats_.decode_layer_uses[size_t(layer)];
    if (const int w = where_[size_t(key)]; w >= 0) {
      Slot& slot = slots_[size_t(w)];
      slot.busy = stamp_;
      busy_slots_.push_back(w);
      if (slot.copy_mark > old) be_.compute_wait(slot.copy_mark);
      sites[i] = slot_site(slot, key);
      ++stats_.hits;
      ++stats_.layer_hits[size_t(layer)];
      stats_.hit_bytes += bytes;
      if (one) ++stats_.decode_hits, stats_.decode_hit_bytes += bytes, ++stats_.decode_layer_hits[size_t(layer)];
      trace(batches[i].expert, slot.prefetched ? "prefetch" : "vram hit", bytes);
      if (slot.prefetched) ++stats_.prefetch_used;
      slot.prefetched = false;
      continue;
    }
    misses.push_back(i);
  }
  // Misses: each to the executor that would finish it first (a copy also brings it into the cache).
  double t_cpu = 0, t_copy = 0;
  for (size_t i : misses) {
    const int key = layer * n_expert_ + batches[i].expert;
    const HostExpert h = host_expert(key);
    const uint64_t bytes = h.bytes();
    // The CPU reads the expert once per pass; more rows cost it compute (about 4 rows per read at
    // its GEMV rate before it is compute-bound).
    const double rows = double(batches[i].rows.size());
    const double cpu_cost = double(bytes) / cpu_bw_ * std::max(1.0, rows / 4.0);
    const double copy_cost = double(bytes) / h2d_bw_;
    bool copy = policy_ == MissPolicy::kCopy || (policy_ == MissPolicy::kCostModel && !decode) ||
                (policy_ == MissPolicy::kCostModel && t_copy + copy_cost < t_cpu + cpu_cost);
    const int v = copy ? victim(layer) : -1;
    if (copy && v < 0) copy = false;
    if (copy) {
      Slot& slot = slots_[size_t(v)];
      if (slot.free_mark <= old) slot.free_mark = 0;
      fill(slot, key);
      slot.busy = stamp_;
      busy_slots_.push_back(v);
      be_.compute_wait(slot.copy_mark);
      sites[i] = slot_site(slot, key);
      t_copy += copy_cost;
      ++stats_.copy_misses;
      stats_.copy_bytes += bytes;
      slot.prefetched = false;
      trace(batches[i].expert, "copied", bytes);
      if (one) ++stats_.decode_copy, stats_.decode_copy_bytes += bytes;
    } else {
      sites[i] = {true, h.cpu[0], h.cpu[1], h.cpu[2]};
      t_cpu += cpu_cost;
      layer_cpu_bytes_ += bytes;
      ++stats_.cpu_misses;
      stats_.cpu_bytes += bytes;
      trace(batches[i].expert, "cpu", bytes);
      if (one) ++stats_.decode_cpu, stats_.decode_cpu_bytes += bytes;
    }
  }
  return Status::ok();
}

void ExpertStreamer::done(int layer, double host_seconds) {
  (void)layer;
  if (!busy_slots_.empty()) {
    const Mark m = be_.compute_mark();
    newest_mark_ = std::max(newest_mark_, m);
    for (int w : busy_slots_) slots_[size_t(w)].free_mark = m;
  }
  stats_.host_seconds += host_seconds;
  if (pass_tokens_ == 1) stats_.decode_host_seconds += host_seconds;
  // The CPU's rate as measured on single-token passes refines the cost model.
  if (pass_tokens_ == 1 && host_seconds > 0 && layer_cpu_bytes_ > 0) {
    cpu_bw_ = 0.8 * cpu_bw_ + 0.2 * (double(layer_cpu_bytes_) / host_seconds);
  }
}

const model::LayerWeights* ExpertStreamer::predictor(int layer) {
  if (!prefetch_ || policy_ == MissPolicy::kCpu || slots_.empty() || pass_tokens_ >= prefill_batch_ ||
      layer + 1 >= n_layer_) {
    return nullptr;
  }
  const model::LayerWeights& next = layers_[size_t(layer) + 1];
  return next.moe() ? &next : nullptr;
}

void ExpertStreamer::predicted(int next_layer, const model::MoeRouting& r) {
  if (next_layer >= n_layer_) return;
  model::distinct_experts(r, mark_, predicted_set_);
  predicted_layer_ = next_layer;
  // Copy the predicted experts the cache lacks into slots this layer does not read, after the
  // copies of this layer's misses: they run while this layer's experts compute.
  const Mark old = newest_mark_ > kMarkHorizon ? newest_mark_ - kMarkHorizon : 0;
  for (int32_t e : predicted_set_) {
    const int key = next_layer * n_expert_ + e;
    if (where_[size_t(key)] >= 0) continue;
    const int v = victim(next_layer);
    if (v < 0) break;
    Slot& slot = slots_[size_t(v)];
    if (slot.free_mark <= old) slot.free_mark = 0;
    fill(slot, key);
    slot.reserved = stamp_;
    slot.prefetched = true;
    const uint64_t bytes = host_expert(key).bytes();
    ++stats_.prefetch_copies;
    stats_.prefetch_bytes += bytes;
    if (pass_tokens_ == 1) stats_.decode_prefetch_bytes += bytes;
    if (trace_) {
      trace_->append({trace_->now_us(), trace_->now_us(), "h2d expert", next_layer,
                      "blk." + std::to_string(next_layer) + ".exp." + std::to_string(e) + ".pass." +
                          std::to_string(stats_.passes - 1),
                      "prefetch", bytes});
    }
  }
}

std::string ExpertStreamer::layer_line() const {
  std::string out = "experts: decode hit rate per layer (%):";
  char b[16];
  for (size_t l = 0; l < stats_.decode_layer_uses.size(); ++l) {
    std::snprintf(b, sizeof b, " %.0f",
                  100.0 * double(stats_.decode_layer_hits[l]) / double(std::max<uint64_t>(stats_.decode_layer_uses[l], 1)));
    out += b;
  }
  return out;
}

std::string ExpertStreamer::describe() const {
  const int total = n_layer_ * n_expert_;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "experts: resident part %s in VRAM; cache %d of %d experts (%.0f%%, %s slots); host: %s pinned%s; "
                "cost model: CPU %.1f GB/s, H2D %.1f GB/s; eviction %s",
                format_bytes(resident_bytes_).c_str(), int(slots_.size()), total,
                100.0 * double(slots_.size()) / double(std::max(total, 1)), format_bytes(slot_bytes_).c_str(),
                format_bytes(pinned_bytes_).c_str(),
                packed_bytes_ ? (", CPU packed copy " + format_bytes(packed_bytes_)).c_str() : "", cpu_bw_ / 1e9,
                h2d_bw_ / 1e9, layer_quotas_ ? "within per-layer quotas (re-planned from decode routing)" : "across layers");
  return buf;
}

std::string ExpertStreamer::stats_line() const {
  const ExpertStats& s = stats_;
  const double tok = double(std::max<uint64_t>(s.decode_passes, 1));
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "experts (decode): %llu uses, hit rate %.1f%%; per token: VRAM %.1f MB, CPU %.1f MB (%.1f ms), copied "
                "%.1f MB; CPU share %.1f%% of expert uses",
                (unsigned long long)s.decode_uses,
                100.0 * double(s.decode_hits) / double(std::max<uint64_t>(s.decode_uses, 1)),
                double(s.decode_hit_bytes) / tok / 1e6, double(s.decode_cpu_bytes) / tok / 1e6,
                s.decode_host_seconds / tok * 1e3, double(s.decode_copy_bytes) / tok / 1e6,
                100.0 * double(s.decode_cpu) / double(std::max<uint64_t>(s.decode_uses, 1)));
  std::string out = buf;
  if (prefetch_ && policy_ != MissPolicy::kCpu) {
    std::snprintf(buf, sizeof buf,
                  "; prefetch: accuracy %.1f%% (%llu of %llu used experts predicted), copied ahead %.1f MB/token, "
                  "%llu of %llu copies ahead used",
                  100.0 * double(s.decode_predicted_used) / double(std::max<uint64_t>(s.decode_predicted_actual, 1)),
                  (unsigned long long)s.decode_predicted_used, (unsigned long long)s.decode_predicted_actual,
                  double(s.decode_prefetch_bytes) / tok / 1e6, (unsigned long long)s.prefetch_used,
                  (unsigned long long)s.prefetch_copies);
    out += buf;
  } else {
    out += "; prefetch off";
  }
  return out;
}

std::function<Result<std::unique_ptr<model::LayerSource>>(const gguf::File&, const model::Weights&, backend::Backend&)>
expert_streaming_source(const ExpertStreamOptions& opts, ExpertStreamer** out) {
  return [opts, out](const gguf::File& file, const model::Weights& w,
                     backend::Backend& be) -> Result<std::unique_ptr<model::LayerSource>> {
    ExpertStreamOptions o = opts;
    if (!be.reads_host_weights()) {
      if (auto h2d = backend::cuda_h2d_bandwidth(0); h2d.is_ok()) o.h2d_bytes_per_s = *h2d;
    }
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<ExpertStreamer> s, ExpertStreamer::create(file, w, be, o));
    if (out) *out = s.get();
    return std::unique_ptr<model::LayerSource>(std::move(s));
  };
}

}  // namespace sluice::stream
