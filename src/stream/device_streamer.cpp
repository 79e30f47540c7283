#include "stream/device_streamer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>

#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/executor.h"
#include "stream/cpu_probe.h"
#include "stream/host_memory.h"

namespace sluice::stream {
namespace {

using Mark = backend::Backend::Mark;
using Clock = FileReader::Clock;

// The layer loop's logit rows per output projection (model/forward.cpp), which with the tokens per
// pass (DeviceStreamOptions::max_batch) size its activation buffers; and the default context cap
// for n_ctx = 0.
constexpr int64_t kLogitRows = 16;
constexpr int kDefaultMaxCtx = 4096;
// The CUDA GEMV reads weights with 16-byte loads; GGUF aligns tensor data to 32 bytes.
constexpr uint64_t kWeightAlign = 16;
// Marks are recycled by the backend after 1024 newer ones (cuda_backend.cu); older records can
// no longer be read and are dropped.
constexpr Mark kMarkHorizon = 960;

using Field = model::LayerTensorField;
constexpr const auto& kLayerFields = model::kLayerTensorFields;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Row split: the matrices whose output rows the executors share (model::Executor::split_layer),
// cut at multiples of kSplitRowGroup rows: a multiple of every CPU packed_rows (WeightView::rows
// cuts a packed matrix at whole groups) and of the CPU's SIMD widths (the activation on each
// side's rows then takes the vector path exactly where the unsplit row does).
constexpr Field kSplitFields[] = {&model::LayerWeights::wq,     &model::LayerWeights::wk,   &model::LayerWeights::wv,
                                  &model::LayerWeights::wo,     &model::LayerWeights::w_gate,
                                  &model::LayerWeights::w_up,   &model::LayerWeights::w_down};
constexpr int64_t kSplitRowGroup = 32;

bool is_split_field(Field f) { return std::find(std::begin(kSplitFields), std::end(kSplitFields), f) != std::end(kSplitFields); }

// The GPU's rows of a matrix of `rows` rows when the CPU takes `cpu_share` of them.
int64_t split_gpu_rows(int64_t rows, double cpu_share) {
  const double groups = double(rows) * (1 - cpu_share) / double(kSplitRowGroup);
  return std::clamp<int64_t>(std::llround(groups) * kSplitRowGroup, 0, rows);
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Byte offset of tensor `t` inside a unit buffer laid out by `u` (the file's bytes at the same
// relative positions, runs packed one after another).
Result<uint64_t> offset_in_unit(const model::TensorRef& t, const gguf::File& f, const UnitLayout& u) {
  const gguf::TensorInfo* info = f.find_tensor(t.name);
  if (!info) return internal_error("stream: tensor " + t.name + " not in the file");
  uint64_t at = 0;
  if (locate(u.runs, info->shard, f.file_offset(*info), info->nbytes, &at)) return at;
  return internal_error("stream: tensor " + t.name + " is outside the reads of unit " + u.name);
}

// Points every present tensor of `lw` into a unit buffer at `base`. With `align`, a tensor whose
// offset is not a multiple of it is an error (the buffer base is aligned, so the offset decides).
Status relocate_layer(model::LayerWeights& lw, const gguf::File& f, const UnitLayout& u, uint8_t* base, uint64_t align) {
  for (Field fld : kLayerFields) {
    model::TensorRef& t = lw.*fld;
    if (!t.present()) continue;
    SLUICE_ASSIGN_OR_RETURN(uint64_t off, offset_in_unit(t, f, u));
    if (align > 1 && off % align != 0) {
      return unsupported(f.path() + ": tensor " + t.name + " lies at an offset that is not a multiple of " +
                         std::to_string(align) + " bytes (the backend's weight loads need that alignment)");
    }
    t.data = base + off;
  }
  return Status::ok();
}

uint64_t tensor_bytes(const gguf::File& f, const char* name) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  return t ? t->nbytes : 0;
}

// Host bytes of the CPU's packed copy of a layer: one block, each repacked matrix at a 64-byte
// aligned offset (the streamer's layout of host_packed_).
uint64_t packed_layer_bytes(const backend::Backend& cpu, const model::LayerWeights& lw) {
  uint64_t total = 0;
  for (Field fld : kLayerFields) {
    const int64_t bytes = model::repacked_bytes(cpu, lw.*fld);
    if (bytes > 0) total += round_up(uint64_t(bytes), 64);
  }
  return total;
}

uint64_t physical_ram() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

}  // namespace

// ---- planning ---------------------------------------------------------------------------------

Result<DevicePlan> plan_device(const gguf::File& file, const FileLayout& layout, const DeviceStreamOptions& opts) {
  if (opts.n_slots < 2) {
    return invalid_argument("--slots must be >= 2 for device streaming (one slot computes while the next is copied), got " +
                            std::to_string(opts.n_slots));
  }
  if (opts.n_ctx < 0) return invalid_argument("n_ctx must be >= 0, got " + std::to_string(opts.n_ctx));
  SLUICE_ASSIGN_OR_RETURN(std::string arch_name, file.get_string("general.architecture"));
  const model::ArchSpec* arch = model::find_arch(arch_name);
  if (!arch) return unsupported(file.path() + ": architecture \"" + arch_name + "\" is not supported");
  SLUICE_ASSIGN_OR_RETURN(model::Config cfg, model::read_config(file, *arch));

  DevicePlan dp;
  dp.n_ctx = opts.n_ctx == 0 ? std::min(cfg.n_ctx_train, kDefaultMaxCtx) : opts.n_ctx;
  // Uploaded non-layer tensors; a tied output head uploads the embedding table as the head.
  const uint64_t head = tensor_bytes(file, "output.weight");
  dp.globals_bytes = (head ? head : tensor_bytes(file, "token_embd.weight")) + tensor_bytes(file, "output_norm.weight") +
                     tensor_bytes(file, "rope_freqs.weight");
  dp.kv_bytes = uint64_t(dp.n_ctx) * uint64_t(cfg.n_layer) * uint64_t(cfg.n_embd_k() + cfg.n_embd_v()) * 2;
  SLUICE_RETURN_IF_ERROR(model::check_max_batch(opts.max_batch));
  dp.max_batch = opts.max_batch;
  dp.activation_bytes = uint64_t(dp.max_batch) *
                            uint64_t(2 * cfg.n_embd + cfg.n_embd_q() + cfg.n_embd_k() + cfg.n_embd_v() +
                                     cfg.n_head * cfg.head_dim_v + 2 * cfg.n_ff) * 4 +
                        uint64_t(kLogitRows) * uint64_t(cfg.n_vocab) * 4;
  dp.workspace_bytes = opts.workspace_bytes ? opts.workspace_bytes
                                             : backend::cuda_scratch_bytes(model::Executor::scratch_shape(
                                                   cfg, dp.max_batch, dp.n_ctx, std::max(1, opts.max_sequences)));
  dp.prefill_batch = opts.prefill_batch;
  dp.vram_budget = opts.vram_budget;
  dp.ram_budget = opts.ram_budget ? opts.ram_budget : physical_ram() / 4 * 3;

  PlanInput& in = dp.input;
  in.has_gpu = true;
  in.min_slots = opts.n_slots;
  in.bw = opts.bw;
  in.batch = std::max(1, opts.decode_batch);
  // Multiply-adds per token of each layer: its matrices' elements (the planner's compute term).
  std::map<std::string, uint64_t> params;
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (t.name.rfind("blk.", 0) != 0 || t.shape.size() < 2) continue;
    params[t.name.substr(0, t.name.find('.', 4))] += t.n_elements();
  }
  // A layer left out of every pass (leave_out_layers: no bytes) computes nothing either.
  // Mixtures of experts are not split by rows (their experts are placed one by one).
  for (const UnitLayout& u : layout.layers) in.units.push_back({u.name, u.bytes, u.bytes ? params[u.name] : 0, !cfg.moe()});
  const size_t n = in.units.size();
  if (opts.hybrid) {
    // The CPU's packed copy of each layer it may compute (as the streamer makes them at load).
    SLUICE_ASSIGN_OR_RETURN(model::Weights w, model::load_weights(file, *arch, cfg));
    backend::CpuOptions one = opts.host_cpu;
    one.n_threads = 1;  // only asked for sizes
    const std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(one);
    for (size_t l = 0; l < n && l < w.layers.size(); ++l) {
      if (in.units[l].bytes == 0) continue;
      in.units[l].cpu_copy_bytes = packed_layer_bytes(*cpu, w.layers[l]);
    }
  }
  // Such a layer is "resident" at no cost: nothing to upload, pin, read or copy.
  auto hold_empty_layers = [&](Plan& p) {
    for (size_t i = 0; i < n; ++i) {
      if (in.units[i].bytes == 0) p.units[i] = {Home::kVram, Executor::kGpu};
    }
  };

  if (!opts.force_homes.empty()) {
    if (opts.force_homes.size() != n) {
      return invalid_argument("force_homes has " + std::to_string(opts.force_homes.size()) + " entries, the model has " +
                              std::to_string(n) + " layers");
    }
    Plan& p = dp.plan;
    p.units.assign(n, UnitPlan{});
    size_t streamed = 0;
    uint64_t largest = 0, largest_disk = 0;
    if (!opts.force_exec.empty() && opts.force_exec.size() != n) {
      return invalid_argument("force_exec has " + std::to_string(opts.force_exec.size()) + " entries, the model has " +
                              std::to_string(n) + " layers");
    }
    if (!opts.force_share.empty() && opts.force_share.size() != n) {
      return invalid_argument("force_share has " + std::to_string(opts.force_share.size()) + " entries, the model has " +
                              std::to_string(n) + " layers");
    }
    for (size_t i = 0; i < n; ++i) {
      const Executor e = opts.force_exec.empty() ? Executor::kGpu : opts.force_exec[i];
      if (e != Executor::kGpu && opts.force_homes[i] != Home::kRam) {
        return invalid_argument("force_exec: layer " + std::to_string(i) +
                                " is not in pinned RAM (home B); the CPU computes only B layers, whole or split");
      }
      const double share = e == Executor::kSplit ? (opts.force_share.empty() ? 0.5 : opts.force_share[i]) : 0.0;
      if (e == Executor::kSplit) {
        if (cfg.moe()) {
          return invalid_argument("force_exec: layer " + std::to_string(i) +
                                  " is a mixture of experts; only dense layers are split by rows");
        }
        if (!(share > 0 && share < 1)) {
          return invalid_argument("force_share: layer " + std::to_string(i) + ": the CPU's share of rows must be in (0, 1), got " +
                                  std::to_string(share));
        }
      }
      p.units[i] = {opts.force_homes[i], e, share};
      if (in.units[i].bytes == 0) p.units[i] = {Home::kVram, Executor::kGpu};
      if (p.units[i].home == Home::kVram) continue;
      ++streamed;
      largest = std::max(largest, in.units[i].bytes);
      if (opts.force_homes[i] == Home::kDisk) largest_disk = std::max(largest_disk, in.units[i].bytes);
    }
    p.n_slots = int(std::min<size_t>(size_t(opts.n_slots), streamed));
    p.slot_bytes = largest;
    p.staging_bytes = 2 * largest_disk;
    score_plan(in, p);
    dp.forced = true;
    dp.n_staging = p.disk_bytes > 0 ? 2 : 0;
    return dp;
  }

  if (dp.vram_budget == 0) return invalid_argument("device streaming needs a VRAM budget (--vram-budget)");
  // The smallest budget any placement fits, by the planner's rule (largest layers resident first,
  // the rest through min(n_slots, streamed) slots of the largest streamed layer).
  std::vector<uint64_t> sizes;
  for (const Unit& u : in.units) sizes.push_back(u.bytes);
  std::sort(sizes.rbegin(), sizes.rend());
  uint64_t min_layers = UINT64_MAX, resident = 0;
  for (size_t r = 0; r <= sizes.size(); ++r) {
    if (r > 0) resident += sizes[r - 1];
    const size_t m = sizes.size() - r;
    min_layers = std::min(min_layers, resident + std::min<uint64_t>(uint64_t(opts.n_slots), m) * (m ? sizes[r] : 0));
  }
  const uint64_t minimum = dp.reserved_bytes() + min_layers;
  if (dp.vram_budget < minimum) {
    return invalid_argument("VRAM budget " + format_bytes(dp.vram_budget) + " is too small: at least " +
                            format_bytes(minimum) + " (" + std::to_string(minimum) + " bytes) is needed: KV cache " +
                            format_bytes(dp.kv_bytes) + " (" + std::to_string(dp.n_ctx) + " positions; a smaller -c lowers it)" +
                            " + activations " + format_bytes(dp.activation_bytes) + " + workspace " +
                            format_bytes(dp.workspace_bytes) + " + output head and norms " + format_bytes(dp.globals_bytes) +
                            " + " + std::to_string(opts.n_slots) + " slots of the largest layer (" +
                            format_bytes(sizes.front()) + ")");
  }
  in.vram_budget = dp.vram_budget;
  in.vram_reserved = dp.reserved_bytes();
  in.ram_budget = dp.ram_budget;
  in.allow_cpu_executor = opts.hybrid;
  in.hybrid_mode = opts.hybrid_mode;
  in.split_share = opts.split_share;
  auto p = make_plan(in);
  if (!p.is_ok()) {
    if (p.status().message().find("staging") == std::string::npos) return p.status();
    // The planner cannot even stage disk reads: state the RAM that needs (two buffers of the
    // largest layer streamed from disk; layers are near-equal in size, so the largest overall).
    return invalid_argument("RAM budget " + format_bytes(dp.ram_budget) + " is too small: reading layers from disk needs " +
                            "2 pinned staging buffers of the largest layer, at least " + format_bytes(2 * sizes.front()) +
                            " (" + std::to_string(2 * sizes.front()) + " bytes)");
  }
  dp.plan = std::move(p).value();
  hold_empty_layers(dp.plan);
  score_plan(in, dp.plan);
  dp.n_staging = dp.plan.disk_bytes > 0 ? 2 : 0;
  return dp;
}

PassPlacement pass_placement(const DevicePlan& dp, int n_tokens) {
  PlanInput in = dp.input;
  in.batch = std::max(n_tokens, 1);
  PassPlacement all{PassKind::kAll, dp.plan};
  for (UnitPlan& u : all.plan.units) u.exec = Executor::kGpu;
  score_plan(in, all.plan);
  if (dp.plan.cpu_exec_bytes == 0 || n_tokens >= dp.prefill_batch) return all;
  PassPlacement decode{PassKind::kDecode, dp.plan};
  score_plan(in, decode.plan);
  if (dp.forced || dp.input.hybrid_mode == HybridMode::kSplit) return decode;
  // Row-split layers only in one-token passes: at 32 tokens a split pass measured ~2x its
  // prediction (H200 host, 2026-11-27 and -28: 855-879 ms against 448), so a multi-token pass
  // chooses among whole-layer placements.
  const bool split = std::any_of(dp.plan.units.begin(), dp.plan.units.end(),
                                 [](const UnitPlan& u) { return u.exec == Executor::kSplit; });
  const bool decode_ok = n_tokens == 1 || !split;
  if (n_tokens <= dp.input.batch && decode_ok) {
    return decode.plan.token_seconds <= all.plan.token_seconds ? decode : all;
  }
  PassPlacement batch{PassKind::kBatch, batch_placement(in, dp.plan)};
  if (decode_ok && decode.plan.token_seconds <= std::min(all.plan.token_seconds, batch.plan.token_seconds)) return decode;
  return batch.plan.cpu_exec_bytes > 0 ? batch : all;
}

std::string DevicePlan::describe() const {
  std::string s = plan.describe(input);
  char line[512];
  if (plan.cpu_exec_bytes > 0) {
    // Long passes (prefill) stream every layer to the GPU: one copy serves the whole batch.
    PlanInput pin = input;
    pin.batch = max_batch;
    Plan pp = plan;
    for (UnitPlan& u : pp.units) u.exec = Executor::kGpu;
    score_plan(pin, pp);
    std::snprintf(line, sizeof line,
                  "  prefill (passes of >= %d tokens; %d here): every streamed layer on the GPU, predicted %.1f ms per "
                  "pass = %.0f tok/s (bound by %s)\n",
                  prefill_batch, pin.batch, pp.token_seconds * 1e3, double(pin.batch) / pp.token_seconds, pp.bound.c_str());
    s += line;
    // Passes shorter than prefill_batch (several sequences, speculative verification): the
    // placement the cost model predicts fastest for each size, in runs of sizes that agree.
    auto key = [](const PassPlacement& pp) { return std::make_pair(int(pp.kind), pp.plan.cpu_exec_bytes); };
    int from = 1;
    PassPlacement run = pass_placement(*this, 1);
    for (int n = 2; n <= prefill_batch; ++n) {
      PassPlacement next = n < prefill_batch ? pass_placement(*this, n) : PassPlacement{};
      if (n < prefill_batch && key(next) == key(run)) {
        run = std::move(next);
        continue;
      }
      const int to = n - 1;
      const double ms = run.plan.token_seconds * 1e3;
      if (run.kind == PassKind::kDecode) {
        std::snprintf(line, sizeof line, "  passes of %d..%d tokens: this placement%s (predicted %.1f ms at %d)\n", from, to,
                      forced || input.hybrid_mode == HybridMode::kSplit ? " (forced)" : "", ms, to);
      } else if (run.kind == PassKind::kBatch) {
        std::snprintf(line, sizeof line,
                      "  passes of %d..%d tokens: %s of its CPU layers on the CPU, every other streamed layer on the GPU "
                      "(predicted %.1f ms at %d, bound by %s)\n",
                      from, to, format_bytes(run.plan.cpu_exec_bytes).c_str(), ms, to, run.plan.bound.c_str());
      } else {
        std::snprintf(line, sizeof line, "  passes of %d..%d tokens: every streamed layer on the GPU (predicted %.1f ms at %d)\n",
                      from, to, ms, to);
      }
      s += line;
      from = n;
      run = std::move(next);
    }
  }
  std::snprintf(line, sizeof line,
                "  VRAM %s of the %s budget: KV cache %s (%d positions), activations %s, workspace %s, output head and "
                "norms %s, resident layers %s, %d slots of %s\n",
                format_bytes(vram_used()).c_str(), forced ? "(forced placement)" : format_bytes(vram_budget).c_str(),
                format_bytes(kv_bytes).c_str(), n_ctx, format_bytes(activation_bytes).c_str(),
                format_bytes(workspace_bytes).c_str(), format_bytes(globals_bytes).c_str(),
                format_bytes(plan.resident_bytes).c_str(), plan.n_slots, format_bytes(plan.slot_bytes).c_str());
  s += line;
  std::snprintf(line, sizeof line,
                "  host RAM %s of the %s budget (pinned: B copies %s, disk staging %d x %s; the CPU's packed layers %s); "
                "token_embd stays in host memory\n",
                format_bytes(plan.ram_bytes + plan.staging_bytes + plan.cpu_copy_bytes).c_str(),
                format_bytes(ram_budget).c_str(), format_bytes(plan.ram_bytes).c_str(), n_staging,
                format_bytes(n_staging ? plan.staging_bytes / uint64_t(n_staging) : 0).c_str(),
                format_bytes(plan.cpu_copy_bytes).c_str());
  return s + line;
}

// ---- the streamer -----------------------------------------------------------------------------

DeviceStreamer::~DeviceStreamer() = default;

Result<uint64_t> auto_vram_budget(int64_t free_bytes, const char* backend_name) {
  if (free_bytes < 0) {
    return invalid_argument(std::string("the ") + backend_name + " backend has no memory limit: give a VRAM budget");
  }
  if (uint64_t(free_bytes) <= kAutoVramMargin) {
    return invalid_argument("--vram-budget auto: the GPU has " + format_bytes(uint64_t(free_bytes)) +
                            " free, no more than the " + format_bytes(kAutoVramMargin) +
                            " kept for allocations outside the plan");
  }
  return uint64_t(free_bytes) - kAutoVramMargin;
}

Result<std::unique_ptr<DeviceStreamer>> DeviceStreamer::create(const std::string& path, const gguf::File& file,
                                                               const model::Weights& w, backend::Backend& be,
                                                               const DeviceStreamOptions& opts_in) {
  const bool host = be.reads_host_weights();
  if (host && !opts_in.allow_host_backend) {
    return unsupported(std::string("device streaming copies layers into a backend's own memory; the ") + be.name() +
                       " backend computes on host memory (use CPU streaming: --ram-budget without --vram-budget)");
  }
  DeviceStreamOptions opts = opts_in;
  if (opts.vram_budget == 0 && opts.force_homes.empty()) {
    SLUICE_ASSIGN_OR_RETURN(opts.vram_budget, auto_vram_budget(be.free_memory(), be.name()));
  }
  std::unique_ptr<DeviceStreamer> s(new DeviceStreamer(be));
  if (opts.prefill_batch < 1) {
    return invalid_argument("prefill_batch must be >= 1, got " + std::to_string(opts.prefill_batch));
  }
  s->host_backend_ = host;
  s->prefill_batch_ = opts.prefill_batch;
  s->timed_ = !host && opts.time_marks;
  s->trace_ = opts.trace;
  s->stats_.device_timed = s->timed_;
  s->learn_cpu_flops_ = opts.learn_cpu_flops && opts.force_exec.empty();
  s->tune_passes_ = opts.tune_passes && opts.force_exec.empty();
  s->tuner_opts_.patience = opts.tune_patience;
  SLUICE_ASSIGN_OR_RETURN(s->layout_, layout_of(file));
  const size_t n_layer = w.layers.size();
  if (s->layout_.layers.size() != n_layer) {
    return invalid_argument(path + ": file has " + std::to_string(s->layout_.layers.size()) +
                            " blk.* layers, the model expects " + std::to_string(n_layer));
  }
  SLUICE_RETURN_IF_ERROR(leave_out_layers(s->layout_, opts.skip));
  s->skip_ = opts.skip;
  SLUICE_ASSIGN_OR_RETURN(s->plan_, plan_device(file, s->layout_, opts));
  s->initial_cpu_flops_ = s->plan_.input.bw.cpu_flops;
  SLUICE_ASSIGN_OR_RETURN(s->reader_, open_reader(file, opts.io));
  FileReader& rd = *s->reader_;
  const Plan& plan = s->plan_.plan;
  const uint64_t align = host ? 1 : kWeightAlign;

  // Globals: the output head and the small vectors live in backend memory; token_embd stays on
  // the host (get_rows moves only the looked-up rows).
  auto upload = [&](model::TensorRef& t) -> Status {
    if (!t.present()) return Status::ok();
    auto v = be.upload_weight(t.view());
    if (!v.is_ok()) return Status(v.status().code(), "uploading " + t.name + ": " + v.status().message());
    t.adopt(*v);  // the CPU backend repacks resident matrices (CpuOptions::pack_weights)
    return Status::ok();
  };
  s->globals_ = w;
  s->globals_.layers.clear();
  for (model::TensorRef* t : {&s->globals_.output_norm, &s->globals_.output, &s->globals_.rope_freqs}) {
    SLUICE_RETURN_IF_ERROR(upload(*t));
  }

  // A: uploaded once. B and C: streamed, in layer order.
  s->resident_views_.resize(n_layer);
  s->stream_index_.assign(n_layer, -1);
  for (size_t l = 0; l < n_layer; ++l) {
    if (plan.units[l].home == Home::kVram) {
      if (s->skipped(int(l))) continue;  // left out of every pass: never uploaded
      s->resident_views_[l] = w.layers[l];
      for (Field fld : kLayerFields) SLUICE_RETURN_IF_ERROR(upload(s->resident_views_[l].*fld));
      continue;
    }
    const int j = int(s->streamed_.size());
    s->stream_index_[l] = j;
    s->streamed_.push_back(int(l));
    if (plan.units[l].home == Home::kDisk) {
      s->c_index_.push_back(int(s->c_pos_.size()));
      s->c_pos_.push_back(j);
    } else {
      s->c_index_.push_back(-1);
    }
  }
  if (s->streamed_.empty()) return s;

  // B: pinned host copies, read once with O_DIRECT (pinned memory is page-aligned), so the
  // page cache does not hold a second copy of what is already pinned.
  s->host_copy_.assign(s->streamed_.size(), nullptr);
  {
    const auto t0 = Clock::now();
    std::vector<FileReader::Ticket> tickets;
    std::vector<uint64_t> ticket_bytes;  // progress: bytes each read brings
    uint64_t loaded = 0, total = 0, done = 0;
    for (size_t j = 0; j < s->streamed_.size(); ++j) {
      if (s->c_index_[j] < 0) total += s->layout_.layers[size_t(s->streamed_[j])].bytes;
    }
    if (opts.on_load_progress && total) opts.on_load_progress(0, total);
    Status st;
    for (size_t j = 0; j < s->streamed_.size() && st.is_ok(); ++j) {
      if (s->c_index_[j] >= 0) continue;
      const UnitLayout& u = s->layout_.layers[size_t(s->streamed_[j])];
      auto p = be.alloc_staging(int64_t(round_up(u.bytes, kIoAlign)));
      if (!p.is_ok()) {
        st = Status(p.status().code(), "pinned copy of " + u.name + ": " + p.status().message());
        break;
      }
      uint8_t* dst = static_cast<uint8_t*>(*p);
      std::memset(dst, 0, size_t(round_up(u.bytes, kIoAlign)));  // bytes past the file end stay defined
      s->pinned_bytes_ += round_up(u.bytes, kIoAlign);
      s->host_copy_[j] = dst;
      loaded += u.bytes;
      for (const ReadRun& r : u.runs) {
        auto t = rd.submit(r.file, r.offset, r.len, dst + r.dst);
        if (!t.is_ok()) {
          st = t.status();
          break;
        }
        tickets.push_back(*t);
        ticket_bytes.push_back(r.len);
      }
    }
    for (size_t i = 0; i < tickets.size(); ++i) {  // all of them, even after an error: no read may outlive this
      Status ws = rd.wait(tickets[i]);
      if (st.is_ok()) st = std::move(ws);
      done += ticket_bytes[i];
      if (st.is_ok() && opts.on_load_progress) opts.on_load_progress(done, total);
    }
    SLUICE_RETURN_IF_ERROR(st);
    if (s->trace_ && loaded) {
      s->trace_->append({s->trace_->us(t0), s->trace_->now_us(), "load", -1, "pinned", "disk", loaded});
    }
  }

  // Hybrid: the host executor's layers start as views into their pinned copies (the file's bytes);
  // below, the matrices with a packed layout are repacked for the CPU's kernels.
  // Split layers are in the hybrid sequence too: their GPU rows are copied.
  s->host_capable_.assign(n_layer, false);
  s->split_capable_.assign(n_layer, false);
  s->host_views_.resize(n_layer);
  bool any_host = false;
  for (size_t j = 0; j < s->streamed_.size(); ++j) {
    const size_t l = size_t(s->streamed_[j]);
    const Executor e = plan.units[l].exec;
    if (e != Executor::kCpu) s->list_hybrid_.push_back(int(j));
    if (e != Executor::kGpu) {
      SLUICE_CHECK(s->host_copy_[j] != nullptr, "stream: a CPU-executed layer has no pinned copy");
      any_host = true;
      (e == Executor::kCpu ? s->host_capable_ : s->split_capable_)[l] = true;
      s->host_views_[l] = w.layers[l];
      SLUICE_RETURN_IF_ERROR(relocate_layer(s->host_views_[l], file, s->layout_.layers[l],
                                            const_cast<uint8_t*>(s->host_copy_[j]), 1));
    }
    s->list_all_.push_back(int(j));
  }
  if (any_host) {
    s->host_be_ = backend::make_cpu_backend(opts.host_cpu);
    s->host_rope_freqs_ = w.rope_freqs.view();  // the file mapping: host memory
    // The CPU computes its layers from its own packed layout where the format has one (as a
    // resident CPU run does: the row kernels on the file layout reach well under half the DRAM
    // rate), so those layers are held twice: the pinned file bytes stay for the passes that
    // stream every layer to the GPU (prefill).
    for (size_t l = 0; l < n_layer; ++l) {
      if (!s->host_capable_[l] && !s->split_capable_[l]) continue;
      // One block per layer, each matrix at a 64-byte aligned offset (packed_layer_bytes, which
      // the plan counted against the RAM budget).
      uint64_t offset[std::size(kLayerFields)] = {}, total = 0;
      for (size_t f = 0; f < std::size(kLayerFields); ++f) {
        const model::TensorRef& t = s->host_views_[l].*kLayerFields[f];
        const int64_t bytes = model::repacked_bytes(*s->host_be_, t);
        offset[f] = bytes > 0 ? total : UINT64_MAX;  // UINT64_MAX: computed on as it lies
        if (bytes > 0) total += round_up(uint64_t(bytes), 64);
      }
      if (total == 0) continue;
      SLUICE_ASSIGN_OR_RETURN(HostBlock block, alloc_host_block(size_t(total), "the CPU's packed layers (hybrid)"));
      for (size_t f = 0; f < std::size(kLayerFields); ++f) {
        model::TensorRef& t = s->host_views_[l].*kLayerFields[f];
        if (offset[f] != UINT64_MAX) t.adopt(s->host_be_->repack_weight(t.view(), block.get() + offset[f]));
      }
      s->host_packed_bytes_ += total;
      s->host_packed_.push_back(std::move(block));
    }
  }
  SLUICE_RETURN_IF_ERROR(s->plan_split(file, w));

  // Slots: the ring every streamed layer passes through, and each (layer, slot) view prepared
  // now so the hot path allocates nothing.
  const int n_slots = plan.n_slots;
  const uint64_t slot_bytes = round_up(plan.slot_bytes, kIoAlign);
  for (int k = 0; k < n_slots; ++k) {
    SLUICE_ASSIGN_OR_RETURN(void* p, be.alloc_slot(int64_t(slot_bytes)));
    if (reinterpret_cast<uintptr_t>(p) % kWeightAlign != 0) {
      return internal_error(std::string("the ") + be.name() + " backend returned a slot that is not 16-byte aligned");
    }
    Slot sl;
    sl.base = p;
    s->slots_.push_back(sl);
    s->slot_lanes_.push_back("h2d slot " + std::to_string(k));
  }
  // Most passes decode; a long prompt restarts the ring on the other sequence.
  s->set_list(s->host_be_ ? &s->list_hybrid_ : &s->list_all_);
  s->slot_views_.resize(s->streamed_.size() * size_t(n_slots));
  s->split_views_.resize(s->streamed_.size() * size_t(n_slots));
  for (size_t j = 0; j < s->streamed_.size(); ++j) {
    const size_t l = size_t(s->streamed_[j]);
    for (int k = 0; k < n_slots; ++k) {
      model::LayerWeights& v = s->slot_views_[j * size_t(n_slots) + size_t(k)];
      v = w.layers[l];
      SLUICE_RETURN_IF_ERROR(
          relocate_layer(v, file, s->layout_.layers[l], static_cast<uint8_t*>(s->slots_[size_t(k)].base), align));
      if (!s->split_capable_[l]) continue;
      // The main executor's part of a split layer: each split matrix's first rows (a prefix of
      // its bytes, at the tensor's offset in the slot, where the hybrid pass copies them).
      model::LayerWeights& sv = s->split_views_[j * size_t(n_slots) + size_t(k)];
      sv = v;
      for (Field f : kSplitFields) {
        model::TensorRef& t = sv.*f;
        if (t.present()) t.ne1 = split_gpu_rows(t.ne1, plan.units[l].cpu_share);
      }
    }
  }

  // C: staging buffers for disk reads.
  if (!s->c_pos_.empty()) {
    uint64_t largest = 0;
    size_t max_runs = 0;
    for (int j : s->c_pos_) {
      const UnitLayout& u = s->layout_.layers[size_t(s->streamed_[size_t(j)])];
      largest = std::max(largest, u.bytes);
      max_runs = std::max(max_runs, u.runs.size());
    }
    const uint64_t bytes = round_up(largest, kIoAlign);
    for (int k = 0; k < s->plan_.n_staging; ++k) {
      auto p = be.alloc_staging(int64_t(bytes));
      if (!p.is_ok()) return Status(p.status().code(), "disk staging buffer: " + p.status().message());
      std::memset(*p, 0, size_t(bytes));
      s->pinned_bytes_ += bytes;
      Staging st;
      st.base = static_cast<uint8_t*>(*p);
      st.tickets.reserve(max_runs);
      s->staging_.push_back(std::move(st));
      s->staging_lanes_.push_back("disk staging " + std::to_string(k));
    }
  }
  // Start the disk reads and the first copies now; begin_pass tops the ring up.
  SLUICE_RETURN_IF_ERROR(s->pump(-1));
  return s;
}

Status DeviceStreamer::plan_split(const gguf::File& file, const model::Weights& w) {
  const Plan& plan = plan_.plan;
  split_ranges_.assign(streamed_.size(), {});
  split_copy_bytes_.assign(streamed_.size(), 0);
  split_cpu_bytes_.assign(streamed_.size(), 0);
  for (size_t j = 0; j < streamed_.size(); ++j) {
    const size_t l = size_t(streamed_[j]);
    if (!split_capable_[l]) continue;
    const double share = plan.units[l].cpu_share;
    std::vector<CopyRange>& ranges = split_ranges_[j];
    for (Field f : kLayerFields) {
      const model::TensorRef& t = w.layers[l].*f;
      if (!t.present()) continue;
      SLUICE_ASSIGN_OR_RETURN(uint64_t off, offset_in_unit(t, file, layout_.layers[l]));
      uint64_t bytes = t.nbytes;
      if (is_split_field(f)) {
        const model::TensorRef& h = host_views_[l].*f;
        const int64_t group = h.packed ? quant::kernels(h.type).packed_rows : 1;
        if (group > 0 && kSplitRowGroup % group != 0) {
          return unsupported("row split: " + t.name + " is packed in groups of " + std::to_string(group) +
                             " rows, which do not divide the split's " + std::to_string(kSplitRowGroup) + "-row cuts");
        }
        const int64_t r = split_gpu_rows(t.ne1, share);
        const uint64_t row = uint64_t(quant::row_bytes(t.type, t.ne0));
        bytes = uint64_t(r) * row;
        split_cpu_bytes_[j] += uint64_t(t.ne1 - r) * row;
      }
      if (bytes > 0) ranges.push_back({off, bytes});
    }
    // In file order, adjacent ranges merged: fewer, larger copies.
    std::sort(ranges.begin(), ranges.end(), [](const CopyRange& a, const CopyRange& b) { return a.offset < b.offset; });
    std::vector<CopyRange> merged;
    for (const CopyRange& r : ranges) {
      if (!merged.empty() && merged.back().offset + merged.back().bytes == r.offset) {
        merged.back().bytes += r.bytes;
      } else {
        merged.push_back(r);
      }
      split_copy_bytes_[j] += r.bytes;
    }
    ranges = std::move(merged);
  }
  return Status::ok();
}

// A per-streamed-layer figure of `layer` (0 for layers not streamed).
uint64_t DeviceStreamer::of_streamed(const std::vector<uint64_t>& v, int layer) const {
  const int j = size_t(layer) < stream_index_.size() ? stream_index_[size_t(layer)] : -1;
  return j >= 0 && size_t(j) < v.size() ? v[size_t(j)] : 0;
}

uint64_t DeviceStreamer::split_copy_bytes(int layer) const { return of_streamed(split_copy_bytes_, layer); }
uint64_t DeviceStreamer::split_cpu_bytes(int layer) const { return of_streamed(split_cpu_bytes_, layer); }

Status DeviceStreamer::fail(Status st) {
  if (failed_.is_ok()) failed_ = std::move(st);
  return failed_;
}

uint64_t DeviceStreamer::cseq_of(uint64_t seq) const {
  // Both sequences hold every C layer, in layer order: C layers run on the GPU in every pass.
  const uint64_t m = list_->size(), mc = c_pos_.size();
  return seq / m * mc + uint64_t(c_index_[size_t((*list_)[seq % m])]);
}

void DeviceStreamer::note_host_wait(const char* what, int layer, Clock::time_point t0, double* counter) {
  const auto t1 = Clock::now();
  const double dt = seconds(t0, t1);
  *counter += dt;
  if (trace_ && dt > 1e-6) {
    const std::string name = layer >= 0 ? layout_.layers[size_t(layer)].name : std::string();
    trace_->append({trace_->us(t0), trace_->us(t1), "host wait", layer, name, what, 0});
  }
}

// Reads of C layers into free staging buffers, in C order. A buffer is free once the copy out of
// it is done; the host waits for that copy only when it was issued by an earlier pump (then it
// has had time to finish), when the disk would otherwise have nothing to read, or when the read
// is needed now (force_upto).
Status DeviceStreamer::submit_reads(int64_t force_upto) {
  const uint64_t n_st = staging_.size();
  if (n_st == 0) return Status::ok();
  const uint64_t mc = c_pos_.size();
  while (c_read_ < c_copied_ + n_st) {
    Staging& st = staging_[c_read_ % n_st];
    if (st.copy_mark != 0) {
      const bool old = st.copy_pump < pump_id_;
      const bool disk_idle = c_read_ == c_copied_;
      const bool forced = int64_t(c_read_) <= force_upto;
      if (!old && !disk_idle && !forced) break;
      const auto t0 = Clock::now();
      be_.host_wait(st.copy_mark);
      const int layer = streamed_[size_t(c_pos_[st.cseq % mc])];
      note_host_wait("staging", layer, t0, &stats_.staging_wait_seconds);
      st.copy_mark = 0;
    }
    const uint64_t j = uint64_t(c_pos_[c_read_ % mc]);
    const UnitLayout& u = layout_.layers[size_t(streamed_[j])];
    st.tickets.clear();  // keeps its capacity: no allocation
    st.cseq = c_read_;
    st.submitted = Clock::now();
    ++c_read_;
    for (const ReadRun& r : u.runs) {
      auto t = reader_->submit(r.file, r.offset, r.len, st.base + r.dst);
      if (!t.is_ok()) return fail(t.status());
      st.tickets.push_back(*t);
    }
  }
  return Status::ok();
}

// The copy of sequence `seq` into its slot (the slot is free: the caller keeps copied_ <
// released_ + n_slots). A C layer needs its read done: without may_block the copy waits for a
// later pump instead; with it the host waits for the disk (a stall the disk causes).
Status DeviceStreamer::issue_copy(uint64_t seq, bool may_block, bool* issued) {
  *issued = false;
  const size_t j = size_t((*list_)[seq % list_->size()]);
  const int layer = streamed_[j];
  const UnitLayout& u = layout_.layers[size_t(layer)];
  const bool disk = is_disk(j);
  const uint8_t* src = host_copy_.empty() ? nullptr : host_copy_[j];
  Staging* st = nullptr;
  if (disk) {
    const uint64_t k = cseq_of(seq);
    if (k >= c_read_) {
      if (!may_block) return Status::ok();
      SLUICE_RETURN_IF_ERROR(submit_reads(int64_t(k)));
    }
    st = &staging_[k % staging_.size()];
    SLUICE_CHECK(st->cseq == k, "stream: staging buffer does not hold the layer to copy");
    if (!may_block) {
      for (FileReader::Ticket t : st->tickets) {
        if (!reader_->is_done(t)) return Status::ok();
      }
    }
    const auto t0 = Clock::now();
    Status rs;
    Clock::time_point arrived = st->submitted;
    for (FileReader::Ticket t : st->tickets) {  // every one, even after an error
      Clock::time_point done{};
      Status ws = reader_->wait(t, &done);
      arrived = std::max(arrived, done);
      if (rs.is_ok()) rs = std::move(ws);
    }
    st->tickets.clear();
    if (may_block) {
      const double before = stats_.disk_wait_seconds;
      note_host_wait("disk", layer, t0, &stats_.disk_wait_seconds);
      if (decode_pass_) stats_.decode_disk_wait_seconds += stats_.disk_wait_seconds - before;
    }
    if (!rs.is_ok()) return fail(std::move(rs));
    if (trace_) {
      trace_->append({trace_->us(st->submitted), trace_->us(arrived), staging_lanes_[k % staging_.size()], layer, u.name,
                      "disk", u.bytes});
    }
    src = st->base;
  }
  // A split layer in a hybrid pass: only its GPU rows (and its vectors) go to the slot.
  const bool split = list_ == &list_hybrid_ && !split_ranges_[j].empty();
  const uint64_t bytes = split ? split_copy_bytes_[j] : u.bytes;
  const size_t slot_k = size_t(seq % ring_);
  Slot& sl = slots_[slot_k];
  // Still there from an earlier pass (a whole copy also holds a split layer's GPU rows): nothing
  // to copy, and the compute waits on the copy that put it there.
  sl.kept = !disk && sl.holds == int(j) && (sl.holds_whole || split);
  if (sl.kept) {
    sl.seq = seq;
    ++copied_;
    *issued = true;
    return Status::ok();
  }
  CopyRecord rec;
  rec.bytes = bytes;
  rec.layer = layer;
  rec.slot = int(slot_k);
  rec.from_disk = disk;
  rec.decode = decode_pass_;
  const auto h0 = Clock::now();
  Mark after = sl.free_mark;
  if (timed_) {
    // An empty copy first: its mark passes when the copy queue reaches this copy and the slot is
    // free, so the pair of marks times the copy itself, not the wait before it.
    rec.start = be_.copy_to_slot(sl.base, src, 0, after);
    after = 0;
  }
  Mark end = 0;
  if (split) {
    // The copy queue runs in order: the ranges after the first need no mark of their own.
    for (const CopyRange& r : split_ranges_[j]) {
      end = be_.copy_to_slot(static_cast<uint8_t*>(sl.base) + r.offset, src + r.offset, int64_t(r.bytes), after);
      after = 0;
    }
  } else {
    end = be_.copy_to_slot(sl.base, src, int64_t(u.bytes), after);
  }
  ++stats_.copies;
  if (host_backend_) {
    const auto h1 = Clock::now();
    stats_.copy_seconds += seconds(h0, h1);
    stats_.copy_bytes_timed += bytes;
    if (trace_) {
      trace_->append({trace_->us(h0), trace_->us(h1), slot_lanes_[slot_k], layer, u.name, disk ? "disk" : "ram", bytes});
    }
  } else if (timed_) {
    rec.end = end;
    rec.anchor = anchor_;
    rec.anchor_us = anchor_us_;
    copy_records_.push_back(rec);
  }
  newest_mark_ = std::max(newest_mark_, end);
  sl.copy_mark = end;
  sl.seq = seq;
  sl.holds = int(j);
  sl.holds_whole = !split;
  last_copy_ = end;
  if (disk) {
    st->copy_mark = end;
    st->copy_pump = pump_id_;
    ++c_copied_;
  }
  ++copied_;
  *issued = true;
  return Status::ok();
}

Status DeviceStreamer::pump(int64_t need) {
  if (list_ == nullptr || list_->empty()) return Status::ok();
  if (!failed_.is_ok()) return failed_;
  ++pump_id_;
  SLUICE_RETURN_IF_ERROR(submit_reads(-1));
  while (copied_ < released_ + ring_) {
    const bool required = need >= 0 && copied_ <= uint64_t(need);
    bool issued = false;
    SLUICE_RETURN_IF_ERROR(issue_copy(copied_, required, &issued));
    if (!issued) break;
  }
  return submit_reads(-1);
}

Status DeviceStreamer::restart_ring(const std::vector<int>* list) {
  // Reads in flight land in staging buffers the new sequence will reuse, and copies issued for
  // the old sequence may still read pinned memory: let both finish. The compute queue is idle
  // (the last eval ended with a sync), so every slot is free.
  Status st;
  for (Staging& sg : staging_) {
    for (FileReader::Ticket t : sg.tickets) {
      Status ws = reader_->wait(t);
      if (st.is_ok()) st = std::move(ws);
    }
    sg.tickets.clear();
    sg.copy_mark = 0;
  }
  if (!st.is_ok()) return fail(std::move(st));
  if (last_copy_ != 0) be_.host_wait(last_copy_);
  for (Slot& sl : slots_) sl.seq = UINT64_MAX;  // what they hold stays: the new list may find it
  acquired_ = released_ = copied_ = 0;
  c_copied_ = c_read_ = 0;
  set_list(list);
  ++stats_.phase_changes;
  return Status::ok();
}

void DeviceStreamer::set_list(const std::vector<int>* list) {
  list_ = list;
  ring_ = slots_.size();
  if (list->empty() || list->size() > slots_.size()) return;
  if (std::any_of(list->begin(), list->end(), [&](int j) { return is_disk(size_t(j)); })) return;
  ring_ = list->size();
}

void DeviceStreamer::relearn_cpu_flops() {
  if (!learn_cpu_flops_ || learn_seconds_ <= 0) return;
  const double measured = learn_ops_ / learn_seconds_;
  double& planned = plan_.input.bw.cpu_flops;
  if (!(measured > 0) || std::abs(measured / planned - 1) <= kRelearnTolerance) return;
  planned = measured;
  stats_.learned_cpu_ops = learn_ops_;
  stats_.learned_cpu_seconds = learn_seconds_;
  // Every size chooses again. A size's tuner stays: its times are measured, not predicted, so a
  // new rate does not make them stale (while its placement is a batch one, its count stands).
  std::fill(pass_choice_.begin(), pass_choice_.end(), -1);
  ++stats_.cpu_flops_updates;
}

void DeviceStreamer::observe_pass(Clock::time_point now) {
  const int n = timed_tokens_;
  timed_tokens_ = 0;
  if (n == 0) return;
  const auto it = tuners_.find(n);
  if (it == tuners_.end()) return;
  ++stats_.tuned_passes;
  if (!it->second.observe(seconds(timed_start_, now))) return;
  ++stats_.tuner_moves;
  if (size_t(n) < pass_choice_.size()) pass_choice_[size_t(n)] = -1;  // placed anew at the next such pass
}

std::vector<std::string> DeviceStreamer::tuning() const {
  std::vector<std::string> out;
  for (const auto& [n, t] : tuners_) out.push_back(std::to_string(n) + " tokens: " + t.describe());
  return out;
}

int DeviceStreamer::choice_for(int n_tokens) {
  const size_t n = size_t(std::max(n_tokens, 1));
  if (pass_choice_.size() <= n) pass_choice_.resize(n + 1, -1);
  int& c = pass_choice_[n];
  if (c >= 0) return c;
  PassPlacement pp = pass_placement(plan_, n_tokens);
  if (pp.kind != PassKind::kBatch) return c = pp.kind == PassKind::kDecode ? kPassDecode : kPassAll;
  if (tune_passes_) {
    // The tuner starts at the planner's count, or where a nearby settled size's correction puts
    // it, and may move it (pass_tuner.h).
    const int planned = cpu_unit_count(pp.plan);
    auto it = tuners_.find(n_tokens);
    if (it == tuners_.end()) {
      const int max_count = cpu_unit_count(plan_.plan);
      CountTuner t(corrected_start(planned, n_tokens, max_count, tuners_), max_count, tuner_opts_);
      t.set_planned(planned);
      it = tuners_.emplace(n_tokens, std::move(t)).first;
    }
    if (it->second.count() != planned) {
      PlanInput in = plan_.input;
      in.batch = n_tokens;
      pp.plan = batch_placement_count(in, plan_.plan, it->second.count());
    }
  }
  std::vector<bool> cpu(layout_.layers.size(), false);
  for (size_t l = 0; l < cpu.size(); ++l) {
    cpu[l] = pp.plan.units[l].exec == Executor::kCpu;
    SLUICE_CHECK(!cpu[l] || host_capable(int(l)), "stream: a batch placement gives the CPU a layer it has no copy of");
  }
  for (size_t i = 0; i < batch_runs_.size(); ++i) {
    if (batch_runs_[i]->cpu == cpu) return c = kPassBatch + int(i);
  }
  auto b = std::make_unique<BatchRun>();
  for (size_t j = 0; j < streamed_.size(); ++j) {
    if (!cpu[size_t(streamed_[j])]) b->list.push_back(int(j));
  }
  b->cpu = std::move(cpu);
  batch_runs_.push_back(std::move(b));
  return c = kPassBatch + int(batch_runs_.size() - 1);
}

Status DeviceStreamer::begin_pass(int n_tokens) {
  if (!failed_.is_ok()) return failed_;
  // Once per pass: a file replaced or truncated under us must stop generation, not feed the
  // layers a mix of two files (fstat + stat: microseconds).
  if (Status st = reader_->check_unchanged(); !st.is_ok()) return fail(std::move(st));
  const Clock::time_point now = Clock::now();
  observe_pass(now);  // the pass before this one, if it is timed for a tuner
  collect();
  decode_pass_ = n_tokens == 1;
  pass_tokens_ = std::max(n_tokens, 1);
  relearn_cpu_flops();
  // The placement the cost model chose for this many tokens (pass_placement): the decode one, a
  // batch one (fewer CPU layers), or every layer streamed to the GPU (prefill: one copy serves the
  // whole batch).
  const int choice = host_be_ != nullptr ? choice_for(n_tokens) : kPassAll;
  const std::vector<int>* list = &list_all_;
  pass_cpu_ = nullptr;
  if (choice == kPassDecode) {
    list = &list_hybrid_;
    pass_cpu_ = &host_capable_;
  } else if (choice >= kPassBatch) {
    const BatchRun& b = *batch_runs_[size_t(choice - kPassBatch)];
    list = &b.list;
    pass_cpu_ = &b.cpu;
    ++stats_.batch_passes;
  }
  const bool restart = list != list_ && !streamed_.empty();
  if (restart) SLUICE_RETURN_IF_ERROR(restart_ring(list));
  if (choice >= kPassBatch && !restart) {
    const auto it = tuners_.find(pass_tokens_);
    if (it != tuners_.end() && !it->second.settled()) {
      timed_start_ = now;
      timed_tokens_ = pass_tokens_;
    }
  }
  ++stats_.passes;
  if (decode_pass_) ++stats_.decode_passes;
  if (trace_ && timed_ && !streamed_.empty()) {
    // The compute queue is idle here (the last eval ended with a sync), so a mark taken now
    // passes at once: device times map to the trace clock through it.
    anchor_ = be_.compute_mark();
    be_.host_wait(anchor_);
    anchor_us_ = trace_->now_us();
    newest_mark_ = std::max(newest_mark_, anchor_);
  }
  return pump(-1);
}

void DeviceStreamer::pass_replayed(const std::vector<bool>& run) {
  // Every layer is resident (weights_fixed): the replayed step read each one it ran from VRAM.
  for (size_t l = 0; l < layout_.layers.size(); ++l) {
    if (skipped(int(l)) || (!run.empty() && !run[l])) continue;
    stats_.vram_bytes += layout_.layers[l].bytes;
    if (decode_pass_) stats_.decode_vram_bytes += layout_.layers[l].bytes;
  }
}

Result<const model::LayerWeights*> DeviceStreamer::acquire(int layer) {
  if (!failed_.is_ok()) return failed_;
  SLUICE_CHECK(layer >= 0 && size_t(layer) < stream_index_.size(), "stream: layer out of range");
  if (skipped(layer)) {
    return invalid_argument("stream: layer " + std::to_string(layer) +
                            " is left out of every pass (--skip-layers): its weights were never loaded");
  }
  const int idx = stream_index_[size_t(layer)];
  const uint64_t bytes = layout_.layers[size_t(layer)].bytes;
  if (on_host(layer)) {
    stats_.cpu_bytes += bytes;
    if (decode_pass_) stats_.decode_cpu_bytes += bytes;
    host_start_ = Clock::now();
    return &host_views_[size_t(layer)];
  }
  if (idx < 0) {
    stats_.vram_bytes += bytes;
    if (decode_pass_) stats_.decode_vram_bytes += bytes;
    return &resident_views_[size_t(layer)];
  }
  const size_t m = list_->size();
  SLUICE_CHECK(m > 0 && streamed_[size_t((*list_)[acquired_ % m])] == layer, "stream: layers must be acquired in order");
  SLUICE_CHECK(acquired_ == released_, "stream: acquire before the previous streamed layer was released");
  SLUICE_RETURN_IF_ERROR(pump(int64_t(acquired_)));
  SLUICE_CHECK(copied_ > acquired_, "stream: the copy of the layer to compute was not issued");
  const size_t k = size_t(acquired_ % ring_);
  Slot& sl = slots_[k];
  SLUICE_CHECK(sl.seq == acquired_, "stream: slot does not hold the layer to compute");
  const bool disk = is_disk(size_t(idx));
  if (timed_) {
    StallRecord r;
    r.before = be_.compute_mark();
    be_.compute_wait(sl.copy_mark);
    r.after = be_.compute_mark();
    r.layer = layer;
    r.from_disk = disk;
    r.decode = decode_pass_;
    r.anchor = anchor_;
    r.anchor_us = anchor_us_;
    newest_mark_ = std::max(newest_mark_, r.after);
    stall_records_.push_back(r);
  } else {
    be_.compute_wait(sl.copy_mark);
  }
  const bool split = split_host(layer) != nullptr;
  if (disk) {
    stats_.disk_bytes += bytes;
    if (decode_pass_) stats_.decode_disk_bytes += bytes;
  } else {
    // Copied from pinned RAM, or (kept) read in place as a resident layer; a split layer's CPU
    // rows are read from DRAM either way.
    const uint64_t gpu = split ? split_copy_bytes_[size_t(idx)] : bytes;
    const uint64_t cpu = split ? split_cpu_bytes_[size_t(idx)] : 0;
    stats_.kept_hits += sl.kept;
    (sl.kept ? stats_.vram_bytes : stats_.ram_bytes) += gpu;
    stats_.split_cpu_bytes += cpu;
    stats_.split_layers += split;
    if (decode_pass_) {
      (sl.kept ? stats_.decode_vram_bytes : stats_.decode_ram_bytes) += gpu;
      stats_.decode_split_cpu_bytes += cpu;
    }
  }
  ++acquired_;
  return &(split ? split_views_ : slot_views_)[size_t(idx) * slots_.size() + k];
}

void DeviceStreamer::release(int layer) {
  SLUICE_CHECK(layer >= 0 && size_t(layer) < stream_index_.size(), "stream: layer out of range");
  if (on_host(layer)) {
    // The host executor is synchronous: its layer is computed when the loop releases it.
    const auto t1 = Clock::now();
    const double dt = seconds(host_start_, t1);
    stats_.cpu_seconds += dt;
    if (decode_pass_) stats_.decode_cpu_seconds += dt;
    if (pass_tokens_ > 1) {
      const Unit& u = plan_.input.units[size_t(layer)];
      const double ops = 2.0 * double(pass_tokens_) * double(u.params);
      stats_.batch_cpu_bytes += u.bytes;
      stats_.batch_cpu_ops += ops;
      stats_.batch_cpu_seconds += dt;
      // Only layers the model predicts compute-bound tell the ops rate (the others are timed by
      // their bytes, which the decode placement's CPU rate already covers).
      const Bandwidths& bw = plan_.input.bw;
      if (learn_cpu_flops_ && ops / bw.cpu_flops >= double(u.bytes) / bw.cpu) {
        learn_ops_ += ops;
        learn_seconds_ += dt;
      }
    }
    if (trace_) {
      const UnitLayout& u = layout_.layers[size_t(layer)];
      trace_->append({trace_->us(host_start_), trace_->us(t1), "cpu", layer, u.name, "ram", u.bytes});
    }
    return;
  }
  if (stream_index_[size_t(layer)] < 0) return;
  if (acquired_ != released_ + 1) return;  // its acquire failed; the error is already sticky
  SLUICE_CHECK(streamed_[size_t((*list_)[released_ % list_->size()])] == layer, "stream: layers must be released in order");
  Slot& sl = slots_[released_ % ring_];
  // The next copy into this slot starts once the compute issued so far (this layer) is done.
  sl.free_mark = be_.compute_mark();
  newest_mark_ = std::max(newest_mark_, sl.free_mark);
  ++released_;
  if (failed_.is_ok()) (void)pump(-1);  // errors are sticky and reported by the next acquire
}

bool DeviceStreamer::can_skip(const std::vector<bool>& run) const {
  // Layers the host executor computes where they lie hold no ring state either, but whether a
  // layer runs there is decided per pass: only VRAM-resident layers and the whole ring qualify.
  size_t skipped = 0, streamed = 0;
  for (size_t l = 0; l < stream_index_.size() && l < run.size(); ++l) {
    if (stream_index_[l] < 0) continue;
    ++streamed;
    skipped += !run[l];
  }
  return skipped == 0 || skipped == streamed;
}

bool DeviceStreamer::resident(int layer) const {
  return layer >= 0 && size_t(layer) < stream_index_.size() && stream_index_[size_t(layer)] < 0;
}

void DeviceStreamer::trace_mark_span(Mark anchor, int64_t anchor_us, Mark from, Mark to, TraceEvent e) {
  if (!trace_ || anchor == 0) return;
  const double a = be_.seconds_between(anchor, from), b = be_.seconds_between(anchor, to);
  if (a < 0 || b < 0) return;  // before the anchor or no longer readable
  e.t_start_us = anchor_us + int64_t(a * 1e6);
  e.t_end_us = anchor_us + int64_t(b * 1e6);
  trace_->append(std::move(e));
}

void DeviceStreamer::collect() {
  if (!timed_) return;
  auto stale = [&](Mark m) { return m + kMarkHorizon <= newest_mark_; };
  while (!stall_records_.empty()) {
    const StallRecord& r = stall_records_.front();
    const double d = be_.seconds_between(r.before, r.after);
    if (d < 0 && !stale(r.after)) break;  // not passed yet: later records have not either
    if (d >= 0) {
      stats_.compute_stall_seconds += d;
      if (r.decode) stats_.decode_compute_stall_seconds += d;
      if (d > 1e-6) {
        trace_mark_span(r.anchor, r.anchor_us, r.before, r.after,
                        {0, 0, "stall", r.layer, layout_.layers[size_t(r.layer)].name, r.from_disk ? "disk" : "ram", 0});
      }
    }
    stall_records_.pop_front();
  }
  while (!copy_records_.empty()) {
    const CopyRecord& r = copy_records_.front();
    const double d = be_.seconds_between(r.start, r.end);
    if (d < 0 && !stale(r.end)) break;
    if (d >= 0) {
      stats_.copy_seconds += d;
      stats_.copy_bytes_timed += r.bytes;
      trace_mark_span(r.anchor, r.anchor_us, r.start, r.end,
                      {0, 0, slot_lanes_[size_t(r.slot)], r.layer, layout_.layers[size_t(r.layer)].name,
                       r.from_disk ? "disk" : "ram", r.bytes});
    }
    copy_records_.pop_front();
  }
}

std::string measure_hybrid_bandwidths(const gguf::File& file, DeviceStreamOptions& opts) {
  if (backend::cuda_device_count() == 0) return "not measured (no GPU)";
  std::map<quant::Type, uint64_t> by_type;
  int64_t ne0 = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (t.name.rfind("blk.", 0) != 0 || t.shape.size() < 2) continue;
    by_type[t.type] += t.nbytes;
    ne0 = std::max<int64_t>(ne0, int64_t(t.shape[0]));
  }
  if (by_type.empty()) return "not measured (no layer matrices)";
  CpuProbeOptions po;
  po.type = std::max_element(by_type.begin(), by_type.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  po.ne0 = ne0;
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(opts.host_cpu);
  const int threads = opts.host_cpu.n_threads;
  auto copy = [](uint64_t bytes, const std::function<void()>& during) {
    return backend::cuda_h2d_bandwidth_during(0, bytes, during);
  };
  auto p = probe_cpu(*cpu, threads, po, copy);
  if (!p.is_ok()) return "not measured (" + p.status().message() + ")";
  if (p->shared > 0) {
    // In a hybrid token the CPU and the copy engine work at the same time for most of it: plan
    // with the rates they reach together (the planner would otherwise stop handing layers to the
    // CPU as soon as the copies fit at the H2D rate of an idle DRAM).
    opts.bw.cpu = p->shared;
    opts.bw.cpu_alone = p->alone;  // for the part of its work the copies do not overlap
    opts.bw.h2d = std::min(opts.bw.h2d, p->h2d_shared);
    opts.bw.dram = p->shared + p->h2d_shared;
  } else {
    opts.bw.cpu = p->alone;
  }
  // The batched rate: a bare 32-token product (p->flops) runs faster than a layer in a pass
  // (measured on the H200 host, 16 cores, 2026-11-27, 70B Q4_K_M: 2.6-3.0 Tops/s bare, whole CPU
  // layers in 32-token passes 17.9 GB/s of weights, ~2e12 ops/s). The probe times the file's most
  // common format (Q4_K in a Q4_K_M file); the layers also hold Q6_K matrices, whose products ran
  // at 2.2 Tops/s against Q4_K's 3.1-3.2 (2026-11-28, same host; the layer's other work, attention
  // and norms of 32 rows included, was under 5% of its time in a profile). With
  // learn_cpu_flops the streamer starts from the bare rate, so the first multi-token passes try
  // CPU layers, and replaces it with the rate those layers reach; without, the default stays.
  if (opts.learn_cpu_flops && p->flops > 0) opts.bw.cpu_flops = p->flops;
  return p->describe();
}

std::function<Result<std::unique_ptr<model::LayerSource>>(const gguf::File&, const model::Weights&, backend::Backend&)>
device_streaming_source(const std::string& path, const DeviceStreamOptions& opts, DeviceStreamer** out) {
  return [path, opts, out](const gguf::File& file, const model::Weights& w,
                           backend::Backend& be) -> Result<std::unique_ptr<model::LayerSource>> {
    DeviceStreamOptions o = opts;
    if (!be.reads_host_weights() && o.measure_bandwidths) {
      // The planner's two GPU terms, measured on this machine (a failed probe keeps the default).
      if (auto h2d = backend::cuda_h2d_bandwidth(0); h2d.is_ok()) o.bw.h2d = *h2d;
      if (auto vram = backend::cuda_copy_bandwidth(0); vram.is_ok()) o.bw.vram = *vram;
    }
    std::string cpu_note = "not measured";
    if (!be.reads_host_weights() && o.hybrid && o.measure_cpu) cpu_note = measure_hybrid_bandwidths(file, o);
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<DeviceStreamer> s, DeviceStreamer::create(path, file, w, be, o));
    s->set_cpu_probe(std::move(cpu_note));
    if (out) *out = s.get();
    return std::unique_ptr<model::LayerSource>(std::move(s));
  };
}

}  // namespace sluice::stream
