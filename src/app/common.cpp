#include "app/common.h"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <map>

#include "app/commands.h"
#include "backend/backend.h"
#include "core/progress.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/weights.h"
#include "quant/quant.h"

namespace sluice::app {

int exit_code_for(const Status& st) {
  switch (st.code()) {
    case ErrorCode::kOk: return kExitOk;
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kCorruptFile:
    case ErrorCode::kUnsupported:
    case ErrorCode::kIo: return kExitBadInput;
    case ErrorCode::kOutOfMemory:
    case ErrorCode::kInternal: return kExitFailure;
  }
  return kExitFailure;
}

int report_error(std::string_view command, const Status& st) {
  std::fprintf(stderr, "sluice %.*s: %s\n", int(command.size()), command.data(), st.message().c_str());
  return exit_code_for(st);
}

Result<ModelMeta> open_model_meta(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return io_error("model file '" + path + "' does not exist");
  if (std::filesystem::is_directory(path, ec)) return io_error("model path '" + path + "' is a directory");
  auto file = gguf::File::open(path);
  if (!file.is_ok()) return file.status();
  ModelMeta meta;
  meta.file = std::make_unique<gguf::File>(std::move(file).value());
  auto tok = model::Tokenizer::from_gguf(*meta.file);
  if (!tok.is_ok()) return Status(tok.status().code(), path + ": tokenizer: " + tok.status().message());
  meta.tokenizer = std::move(tok).value();
  return meta;
}

// The model's load options from the shared flags (every loader: resident, CPU or device streaming).
model::LoadOptions load_options(const ModelFlags& f) {
  model::LoadOptions opts;
  opts.n_ctx = f.n_ctx;
  opts.n_threads = f.n_threads;
  opts.max_sequences = f.max_sequences;
  opts.kv_positions = f.kv_positions;
  opts.max_batch = f.max_batch;
  opts.backend = backend_kind(f);
  opts.cuda_graphs = f.graphs;
  opts.cuda_skip_kernels = f.skip_kernels;
  return opts;
}

Result<std::unique_ptr<model::Model>> load_weights(const ModelFlags& f, double& seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  model::LoadOptions opts = load_options(f);
  opts.on_load_progress = core::progress_bar("loading " + f.model_path);
  auto m = model::Model::load(f.model_path, opts);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

Result<std::optional<uint64_t>> resolve_stream_flags(const StreamFlags& sf) {
  std::optional<uint64_t> budget;
  if (!sf.ram_budget.empty()) {
    auto b = stream::parse_byte_size(sf.ram_budget);
    if (!b.is_ok()) return invalid_argument("--ram-budget: " + b.status().message());
    budget = *b;
  }
  if (!sf.vram_budget.empty()) {
    auto v = stream::parse_vram_budget(sf.vram_budget);
    if (!v.is_ok()) return invalid_argument("--vram-budget: " + v.status().message());
  }
  // The trace records the streaming pipeline; the mmapped path has no reads or slots to show.
  if (!sf.trace_path.empty() && !budget && sf.vram_budget.empty()) {
    return invalid_argument("--trace records the streaming pipeline and needs --ram-budget (a budget of the file's "
                            "size keeps every layer resident)");
  }
  return budget;
}

int stream_slots(const StreamFlags& sf, int max_sequences, bool device) {
  if (sf.n_slots > 0) return sf.n_slots;
  if (!device) return stream::CpuStreamOptions{}.n_slots;
  return max_sequences >= kServerSlotsSequences ? kServerSlots : stream::DeviceStreamOptions{}.n_slots;
}

namespace {

// Streamer options from the flags; the disk bandwidth is measured unless --no-probe.
Result<stream::CpuStreamOptions> stream_options(const ModelFlags& mf, const StreamFlags& sf,
                                                std::optional<stream::DiskProbe>& probe) {
  stream::CpuStreamOptions o;
  o.n_slots = stream_slots(sf, mf.max_sequences, /*device=*/false);
  o.skip = sf.skip_layers;
  if (!sf.no_probe) {
    SLUICE_ASSIGN_OR_RETURN(stream::DiskProbe p, stream::probe_disk(mf.model_path, o.io));
    if (p.measured) o.bw.disk = p.bytes_per_s;
    probe = p;
  }
  return o;
}

// The device pipeline's options from the flags: --vram-budget (0: the GPU's free memory),
// --ram-budget bounds the pinned host copies and staging; the disk is probed unless --no-probe.
// The KV cache positions the streaming planners reserve memory for: the shared pool of a server
// (ModelFlags::kv_positions), else one context.
int kv_pool_positions(const ModelFlags& mf) { return mf.kv_positions > 0 ? mf.kv_positions : mf.n_ctx; }

Result<stream::DeviceStreamOptions> device_options(const ModelFlags& mf, const StreamFlags& sf,
                                                   std::optional<stream::DiskProbe>& probe) {
  stream::DeviceStreamOptions o;
  o.n_slots = stream_slots(sf, mf.max_sequences, /*device=*/true);
  o.skip = sf.skip_layers;
  o.hybrid = !sf.no_hybrid;
  o.learn_cpu_flops = !sf.fixed_cpu_rate;
  o.tune_passes = !sf.no_pass_tuning;
  o.tune_patience = sf.pass_tuning_patience;
  SLUICE_RETURN_IF_ERROR(stream::parse_hybrid_mode(sf.hybrid, &o.hybrid_mode, &o.split_share));
  o.host_cpu.n_threads = mf.n_threads;
  o.n_ctx = kv_pool_positions(mf);
  o.max_batch = mf.max_batch;
  o.max_sequences = mf.max_sequences;
  o.decode_batch = sf.decode_batch;
  if (!sf.vram_budget.empty()) {
    SLUICE_ASSIGN_OR_RETURN(o.vram_budget, stream::parse_vram_budget(sf.vram_budget));
  }
  if (!sf.ram_budget.empty()) {
    SLUICE_ASSIGN_OR_RETURN(o.ram_budget, stream::parse_byte_size(sf.ram_budget));
  }
  if (!sf.no_probe) {
    SLUICE_ASSIGN_OR_RETURN(stream::DiskProbe p, stream::probe_disk(mf.model_path, o.io));
    if (p.measured) o.bw.disk = p.bytes_per_s;
    probe = p;
  }
  return o;
}

// --vram-budget asks for the device pipeline, which needs the CUDA backend to compute.
Result<bool> device_streaming_requested(const ModelFlags& mf, const StreamFlags& sf) {
  if (sf.vram_budget.empty()) return false;
  if (backend_kind(mf) == model::BackendKind::kCpu) {
    return invalid_argument("--vram-budget streams layers into GPU memory; --backend cpu computes on host memory "
                            "(use --ram-budget alone for CPU streaming)");
  }
  return true;
}

// Whether the file is a mixture of experts (<arch>.expert_count > 0).
Result<bool> is_moe(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(gguf::File file, gguf::File::open(path));
  SLUICE_ASSIGN_OR_RETURN(std::string arch, file.get_string("general.architecture"));
  if (!file.find(arch + ".expert_count")) return false;
  SLUICE_ASSIGN_OR_RETURN(uint64_t n, file.get_uint(arch + ".expert_count"));
  return n > 0;
}

Result<stream::MissPolicy> miss_policy(const StreamFlags& sf) {
  if (sf.expert_misses == "cost") return stream::MissPolicy::kCostModel;
  if (sf.expert_misses == "cpu") return stream::MissPolicy::kCpu;
  if (sf.expert_misses == "copy") return stream::MissPolicy::kCopy;
  return invalid_argument("--expert-misses '" + sf.expert_misses + "': expected cost, cpu or copy");
}

// The RAM expert cache's options from the flags (CPU only, --ram-budget on a MoE file).
Result<stream::RamExpertOptions> ram_expert_options(const StreamFlags& sf, uint64_t budget) {
  stream::RamExpertOptions o;
  o.ram_budget = budget;
  o.prefetch = sf.expert_prefetch == "on";  // auto: off (reads ahead compete with misses for the disk)
  if (!sf.expert_cache.empty()) {
    SLUICE_ASSIGN_OR_RETURN(o.cache_bytes, stream::parse_byte_size(sf.expert_cache));
  }
  return o;
}

Result<LoadedModel> load_device_streamed(const ModelFlags& mf, const StreamFlags& sf) {
  LoadedModel lm;
  if (!sf.trace_path.empty()) {
    SLUICE_ASSIGN_OR_RETURN(lm.trace, stream::TraceWriter::open(sf.trace_path));
  }
  const auto t0 = std::chrono::steady_clock::now();
  SLUICE_ASSIGN_OR_RETURN(stream::DeviceStreamOptions o, device_options(mf, sf, lm.probe));
  o.trace = lm.trace.get();
  o.on_load_progress = core::progress_bar("pinning layers of " + mf.model_path);
  model::LoadOptions lo = load_options(mf);
  lo.backend = model::BackendKind::kCuda;
  lo.layer_source = stream::device_streaming_source(mf.model_path, o, &lm.device_streamer);
  SLUICE_ASSIGN_OR_RETURN(const bool moe, is_moe(mf.model_path));
  if (moe) {
    // Mixtures of experts: everything but the routed experts resident, experts cached in VRAM and
    // computed by the CPU or copied on a miss (stream/expert_streamer.h).
    stream::ExpertStreamOptions eo;
    eo.vram_budget = o.vram_budget;
    eo.ram_budget = o.ram_budget;
    eo.n_ctx = kv_pool_positions(mf);
    eo.max_batch = mf.max_batch;
    eo.max_sequences = mf.max_sequences;
    eo.host_cpu.n_threads = mf.n_threads;
    SLUICE_ASSIGN_OR_RETURN(eo.policy, miss_policy(sf));
    if (!sf.expert_cache.empty()) {
      SLUICE_ASSIGN_OR_RETURN(eo.cache_bytes, stream::parse_byte_size(sf.expert_cache));
    }
    eo.prefetch = sf.expert_prefetch == "on";  // auto: off (unused copies ahead cost PCIe time; measured)
    eo.layer_quotas = sf.expert_quotas == "layer";
    eo.trace = lm.trace.get();
    lo.layer_source = stream::expert_streaming_source(eo, &lm.expert_streamer);
  }
  auto m = model::Model::load(mf.model_path, lo);
  lm.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!m.is_ok()) return m.status();
  lm.model = std::move(m).value();
  return lm;
}

// The VRAM budget --plan plans with, from the parsed flag: its size, or for auto (0) what a
// load would resolve it to (the GPU's free memory now, less the margin).
Result<uint64_t> plan_vram_budget(uint64_t v) {
  if (v != 0) return v;
  if (backend::cuda_device_count() == 0) {
    return invalid_argument("--vram-budget auto sizes itself from the GPU's free memory, and this machine has no GPU");
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<backend::Backend> gpu, backend::make_cuda_backend({0, false}));
  return stream::auto_vram_budget(gpu->free_memory(), gpu->name());
}

std::string disk_source(const std::optional<stream::DiskProbe>& probe) {
  if (!probe) return "default (--no-probe)";
  if (!probe->measured) return "default: " + probe->describe();
  return "measured: " + probe->describe();
}

}  // namespace

Status print_plan(const ModelFlags& mf, const StreamFlags& sf, const gguf::File& file) {
  SLUICE_ASSIGN_OR_RETURN(std::optional<uint64_t> budget, resolve_stream_flags(sf));
  SLUICE_ASSIGN_OR_RETURN(stream::FileLayout layout, stream::layout_of(file));
  std::optional<stream::DiskProbe> probe;
  SLUICE_ASSIGN_OR_RETURN(bool device, device_streaming_requested(mf, sf));
  if (!device && !budget && backend_kind(mf) != model::BackendKind::kCpu && backend::cuda_device_count() > 0) {
    // What load_model does on this GPU: the whole model when it fits the free memory, else the
    // device pipeline with the free memory as the VRAM budget (after_whole_load).
    SLUICE_ASSIGN_OR_RETURN(const uint64_t need, model::Model::device_bytes(mf.model_path, load_options(mf)));
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<backend::Backend> gpu, backend::make_cuda_backend({0, false}));
    const int64_t free = gpu->free_memory();
    gpu.reset();
    if (free < 0 || need <= uint64_t(free)) {
      std::printf("plan: the whole model on the GPU (%s of GPU memory needed, %s free)\n",
                  stream::format_bytes(need).c_str(), free < 0 ? "unknown" : stream::format_bytes(uint64_t(free)).c_str());
      return Status::ok();
    }
    std::printf("plan: the whole model needs %s of GPU memory, %s are free: layers stream through the GPU "
                "(--vram-budget auto)\n",
                stream::format_bytes(need).c_str(), stream::format_bytes(uint64_t(free)).c_str());
    device = true;
  }
  SLUICE_ASSIGN_OR_RETURN(const bool moe, is_moe(mf.model_path));
  if (device && moe) {
    // Mixtures of experts are placed per expert (stream/expert_streamer.h), not per layer.
    SLUICE_ASSIGN_OR_RETURN(std::string arch_name, file.get_string("general.architecture"));
    const model::ArchSpec* arch = model::find_arch(arch_name);
    if (!arch) return unsupported(file.path() + ": architecture \"" + arch_name + "\" is not supported");
    SLUICE_ASSIGN_OR_RETURN(model::Config cfg, model::read_config(file, *arch));
    SLUICE_ASSIGN_OR_RETURN(model::Weights w, model::load_weights(file, *arch, cfg));
    // No --vram-budget: a model larger than the GPU (above), planned as with auto.
    SLUICE_ASSIGN_OR_RETURN(const uint64_t parsed,
                            stream::parse_vram_budget(sf.vram_budget.empty() ? "auto" : sf.vram_budget));
    SLUICE_ASSIGN_OR_RETURN(const uint64_t vram, plan_vram_budget(parsed));
    double h2d = 25e9, vram_bw = 1e12;
    std::string source = "default (no GPU)";
    if (backend::cuda_device_count() > 0) {
      auto a = backend::cuda_h2d_bandwidth(0);
      auto b = backend::cuda_copy_bandwidth(0);
      if (a.is_ok()) h2d = *a;
      if (b.is_ok()) vram_bw = *b;
      source = a.is_ok() && b.is_ok() ? "measured" : "default (measurement failed)";
    }
    stream::ExpertStreamOptions eo;
    eo.n_ctx = kv_pool_positions(mf);
    eo.max_batch = mf.max_batch;
    eo.max_sequences = mf.max_sequences;
    const stream::ExpertPlan plan =
        stream::plan_experts(w, eo.n_ctx, stream::expert_workspace_bytes(cfg, eo), vram, eo.max_batch);
    std::printf("plan (mixture of experts, expert placement; VRAM budget %s; H2D %.1f GB/s, VRAM %.0f GB/s %s; CPU %.1f "
                "GB/s assumed, refined while running):\n%s",
                stream::format_bytes(vram).c_str(), h2d / 1e9, vram_bw / 1e9, source.c_str(), eo.cpu_bytes_per_s / 1e9,
                plan.describe(vram_bw, h2d, eo.cpu_bytes_per_s).c_str());
    return Status::ok();
  }
  if (device) {
    SLUICE_ASSIGN_OR_RETURN(stream::DeviceStreamOptions o, device_options(mf, sf, probe));
    SLUICE_ASSIGN_OR_RETURN(o.vram_budget, plan_vram_budget(o.vram_budget));  // parsed by device_options
    SLUICE_RETURN_IF_ERROR(stream::leave_out_layers(layout, o.skip));
    // The GPU terms measured where there is a GPU (the pipeline measures them again at load).
    std::string gpu_source = "default (no GPU)";
    if (backend::cuda_device_count() > 0) {
      auto h2d = backend::cuda_h2d_bandwidth(0);
      auto vram = backend::cuda_copy_bandwidth(0);
      if (h2d.is_ok()) o.bw.h2d = *h2d;
      if (vram.is_ok()) o.bw.vram = *vram;
      gpu_source = h2d.is_ok() && vram.is_ok() ? "measured" : "default (measurement failed)";
    }
    const std::string cpu_note = o.hybrid ? stream::measure_hybrid_bandwidths(file, o) : "hybrid off (--no-hybrid)";
    if (o.decode_batch > 1) {
      // Speculative decoding: the plan a one-token decode pass would get, then the one for K + 1.
      stream::DeviceStreamOptions o1 = o;
      o1.decode_batch = 1;
      SLUICE_ASSIGN_OR_RETURN(stream::DevicePlan plan1, stream::plan_device(file, layout, o1));
      std::printf("plan without speculation (1 token per decode pass):\n%s\nplan with speculation (%d tokens per "
                  "verification pass, --draft-k %d):\n",
                  plan1.describe().c_str(), o.decode_batch, o.decode_batch - 1);
    }
    SLUICE_ASSIGN_OR_RETURN(stream::DevicePlan plan, stream::plan_device(file, layout, o));
    std::printf("plan (GPU device pipeline; H2D %.1f GB/s, VRAM %.0f GB/s %s; disk %.2f GB/s %s;\n"
                "      CPU %.1f GB/s, DRAM %.1f GB/s shared: %s):\n%s",
                o.bw.h2d / 1e9, o.bw.vram / 1e9, gpu_source.c_str(), o.bw.disk / 1e9, disk_source(probe).c_str(),
                o.bw.cpu / 1e9, o.bw.dram / 1e9, cpu_note.c_str(), plan.describe().c_str());
    return Status::ok();
  }
  // The CPU backend decides which matrices are held repacked (and their size); one thread is
  // enough to ask it.
  backend::CpuOptions co;
  co.n_threads = 1;
  const std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(co);
  if (moe && budget) {
    // CPU only with a RAM budget: the routed experts are cached per expert (stream/ram_expert_cache.h).
    SLUICE_ASSIGN_OR_RETURN(std::string arch_name, file.get_string("general.architecture"));
    const model::ArchSpec* arch = model::find_arch(arch_name);
    if (!arch) return unsupported(file.path() + ": architecture \"" + arch_name + "\" is not supported");
    SLUICE_ASSIGN_OR_RETURN(model::Config cfg, model::read_config(file, *arch));
    SLUICE_ASSIGN_OR_RETURN(model::Weights w, model::load_weights(file, *arch, cfg));
    SLUICE_ASSIGN_OR_RETURN(stream::RamExpertOptions ro, ram_expert_options(sf, *budget));
    SLUICE_ASSIGN_OR_RETURN(stream::RamExpertPlan plan, stream::plan_ram_experts(w, *cpu, ro));
    std::printf("plan (mixture of experts, CPU only, RAM expert cache; experts read from disk with O_DIRECT when "
                "missed; prefetch %s):\n%s",
                ro.prefetch ? "on" : "off", plan.describe().c_str());
    return Status::ok();
  }
  SLUICE_ASSIGN_OR_RETURN(stream::CpuStreamOptions o, stream_options(mf, sf, probe));
  SLUICE_ASSIGN_OR_RETURN(layout, stream::layout_of(file, cpu.get()));
  SLUICE_RETURN_IF_ERROR(stream::leave_out_layers(layout, o.skip));
  uint64_t all = layout.globals.ram_bytes();
  for (const auto& u : layout.layers) all += u.ram_bytes();
  o.ram_budget = budget.value_or(all);
  SLUICE_ASSIGN_OR_RETURN(stream::CpuPlan plan, stream::plan_cpu(layout, o));
  if (sf.decode_batch > 1) {
    // CPU only, placement does not depend on the batch; the pass time does (the compute term).
    stream::PlanInput in = plan.input;
    stream::Plan p1 = plan.plan, pk = plan.plan;
    in.batch = 1;
    stream::score_plan(in, p1);
    in.batch = sf.decode_batch;
    stream::score_plan(in, pk);
    std::printf("speculation: predicted %.2f ms per 1-token pass, %.2f ms per %d-token verification pass (%.2fx); "
                "break-even at %.2f tokens per pass\n",
                p1.token_seconds * 1e3, pk.token_seconds * 1e3, sf.decode_batch, pk.token_seconds / p1.token_seconds,
                pk.token_seconds / p1.token_seconds);
  }
  std::printf("plan (CPU only; disk %.2f GB/s %s; CPU %.0f GB/s default):\n%s", o.bw.disk / 1e9,
              disk_source(probe).c_str(), o.bw.cpu / 1e9, plan.describe().c_str());
  return Status::ok();
}

LoadFallback after_whole_load(model::BackendKind asked, bool has_gpu, const Status& failure) {
  if (asked == model::BackendKind::kCpu || !has_gpu) return LoadFallback::kNone;
  if (failure.code() == ErrorCode::kOutOfMemory) return LoadFallback::kDevicePipeline;
  // The GPU's own failures (a format or op it lacks, a CUDA error); the file's and the flags'
  // errors would stop the CPU too, so they stand.
  const bool gpu_failure = failure.code() == ErrorCode::kUnsupported || failure.code() == ErrorCode::kInternal;
  return asked == model::BackendKind::kAuto && gpu_failure ? LoadFallback::kCpu : LoadFallback::kNone;
}

Result<LoadedModel> load_model(const ModelFlags& mf, const StreamFlags& sf) {
  SLUICE_ASSIGN_OR_RETURN(std::optional<uint64_t> budget, resolve_stream_flags(sf));
  SLUICE_ASSIGN_OR_RETURN(bool device, device_streaming_requested(mf, sf));
  if (device) return load_device_streamed(mf, sf);
  LoadedModel lm;
  if (!budget) {
    // --backend auto on a machine with a GPU tries the GPU first (model/ would quietly pick the CPU
    // for a model larger than the GPU, and the device pipeline is the faster place for it).
    const bool has_gpu = backend::cuda_device_count() > 0;
    ModelFlags whole = mf;
    if (backend_kind(mf) == model::BackendKind::kAuto && has_gpu) whole.backend = "cuda";
    auto m = load_weights(whole, lm.load_s);
    if (m.is_ok()) {
      lm.model = std::move(m).value();
      return lm;
    }
    switch (after_whole_load(backend_kind(mf), has_gpu, m.status())) {
      case LoadFallback::kNone:
        return m.status();
      case LoadFallback::kDevicePipeline: {
        // A model larger than the GPU's free memory: stream it through the device pipeline with
        // the free memory as the VRAM budget (the planner gives the CPU layers where that pays).
        std::fprintf(stderr, "sluice: %s; streaming layers through the GPU instead\n", m.status().message().c_str());
        auto d = load_device_streamed(whole, sf);
        if (d.is_ok() || backend_kind(mf) != model::BackendKind::kAuto) return d;
        std::fprintf(stderr, "sluice: the GPU streaming pipeline could not load the model (%s); running on the CPU\n",
                     d.status().message().c_str());
        break;
      }
      case LoadFallback::kCpu:
        std::fprintf(stderr, "sluice: the GPU could not take the model (%s); running on the CPU\n",
                     m.status().message().c_str());
        break;
    }
    ModelFlags cpu = mf;
    cpu.backend = "cpu";
    SLUICE_ASSIGN_OR_RETURN(lm.model, load_weights(cpu, lm.load_s));
    return lm;
  }
  if (!sf.trace_path.empty()) {
    SLUICE_ASSIGN_OR_RETURN(lm.trace, stream::TraceWriter::open(sf.trace_path));
  }
  const auto t0 = std::chrono::steady_clock::now();
  SLUICE_ASSIGN_OR_RETURN(stream::CpuStreamOptions o, stream_options(mf, sf, lm.probe));
  o.ram_budget = *budget;
  o.trace = lm.trace.get();
  o.on_load_progress = core::progress_bar("loading resident layers of " + mf.model_path);
  model::LoadOptions lo = load_options(mf);
  lo.layer_source = stream::cpu_streaming_source(mf.model_path, o, &lm.streamer);
  SLUICE_ASSIGN_OR_RETURN(const bool moe, is_moe(mf.model_path));
  if (moe) {
    // Mixtures of experts: everything but the routed experts resident, experts read from disk
    // into a RAM cache when the router picks them (stream/ram_expert_cache.h).
    SLUICE_ASSIGN_OR_RETURN(stream::RamExpertOptions ro, ram_expert_options(sf, *budget));
    ro.io = o.io;
    ro.trace = o.trace;
    ro.on_load_progress = o.on_load_progress;
    lo.layer_source = stream::ram_expert_source(ro, &lm.ram_experts);
  }
  auto m = model::Model::load(mf.model_path, lo);
  lm.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!m.is_ok()) return m.status();
  lm.model = std::move(m).value();
  return lm;
}

namespace {
// Bytes of the layers a device plan gives the CPU whole (its hybrid layers).
double cpu_unit_bytes(const stream::DevicePlan& dp) {
  double bytes = 0;
  for (size_t i = 0; i < dp.plan.units.size() && i < dp.input.units.size(); ++i) {
    if (dp.plan.units[i].exec == stream::Executor::kCpu) bytes += double(dp.input.units[i].bytes);
  }
  return bytes;
}
}  // namespace

Status finish_stream(FILE* out, LoadedModel& lm, const decode::Timings& t) {
  if (lm.expert_streamer) {
    std::fprintf(out, "%s\n%s\n%s\n", lm.expert_streamer->describe().c_str(), lm.expert_streamer->stats_line().c_str(),
                 lm.expert_streamer->layer_line().c_str());
  }
  if (lm.ram_experts) {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const stream::RamExpertCache& rc = *lm.ram_experts;
    std::fprintf(out, "%s; weights in RAM %.1f MB; peak RSS %.1f MB\n%s\n%s\n", rc.describe().c_str(),
                 double(rc.owned_bytes()) / 1e6, double(ru.ru_maxrss) * 1024 / 1e6, rc.stats_line().c_str(),
                 rc.layer_line().c_str());
  }
  if (lm.device_streamer) {
    stream::DeviceStreamer& ds = *lm.device_streamer;
    ds.collect();  // the run ended with a sync: every mark of the last pass has passed
    const stream::DeviceStreamStats& s = ds.stats();
    const stream::Plan& p = ds.plan().plan;
    const bool decode = s.decode_passes > 0;
    const double n = double(std::max<uint64_t>(decode ? s.decode_passes : s.passes, 1));
    const char* per = decode ? "token" : "pass";
    const double vram = double(decode ? s.decode_vram_bytes : s.vram_bytes) / n;
    const double ram = double(decode ? s.decode_ram_bytes : s.ram_bytes) / n;
    const double disk = double(decode ? s.decode_disk_bytes : s.disk_bytes) / n;
    const double stall = (decode ? s.decode_compute_stall_seconds : s.compute_stall_seconds) / n;
    const double disk_wait = (decode ? s.decode_disk_wait_seconds : s.disk_wait_seconds) / n;
    const double cpu = double(decode ? s.decode_cpu_bytes : s.cpu_bytes) / n;
    std::fprintf(out,
                 "stream:  device pipeline, %d slots of %.1f MB; per %s: VRAM-resident %.1f MB, pinned RAM copied %.1f MB, "
                 "computed by the CPU %.1f MB, disk %.1f MB; pinned %.1f MB; layers found in their slots %.2f per pass; "
                 "%llu of %llu passes with a batch placement\n",
                 p.n_slots, double(p.slot_bytes) / 1e6, per, vram / 1e6, ram / 1e6, cpu / 1e6, disk / 1e6,
                 double(ds.pinned_bytes()) / 1e6, double(s.kept_hits) / double(std::max<uint64_t>(s.passes, 1)),
                 (unsigned long long)s.batch_passes, (unsigned long long)s.passes);
    const stream::DevicePlan& dp = ds.plan();
    std::fprintf(out, "vram:    %.1f MB held by the model; planned %.1f MB of the %.1f MB budget (scratch %.1f MB)\n",
                 double(lm.model->device_bytes()) / 1e6, double(dp.vram_used()) / 1e6, double(dp.vram_budget) / 1e6,
                 double(dp.workspace_bytes) / 1e6);
    std::fprintf(out,
                 "copies:  %.2f GB/s while copying (%.1f ms per %s), compute waiting for copies %.2f ms per %s%s; host "
                 "waits: disk %.2f ms per %s, staging %.2f ms in all\n",
                 s.copy_seconds > 0 ? double(s.copy_bytes_timed) / s.copy_seconds / 1e9 : 0.0,
                 s.copy_seconds / double(std::max<uint64_t>(s.passes, 1)) * 1e3, "pass", stall * 1e3, per,
                 s.device_timed ? "" : " (not timed)", disk_wait * 1e3, per, s.staging_wait_seconds * 1e3);
    if (s.batch_cpu_seconds > 0) {
      // CPU layers of multi-token passes (several sequences, verification): their rate, and the
      // ops rate the cost model chooses those passes' placements with (learned from them).
      std::fprintf(out,
                   "batch:   CPU layers of multi-token passes: %.1f GB, %.1f Tops in %.2f s = %.1f GB/s, %.2f Tops/s "
                   "measured; their placements planned with %.2f Tops/s (%.2f at load, %llu updates)\n",
                   double(s.batch_cpu_bytes) / 1e9, s.batch_cpu_ops / 1e12, s.batch_cpu_seconds,
                   double(s.batch_cpu_bytes) / s.batch_cpu_seconds / 1e9, s.batch_cpu_ops / s.batch_cpu_seconds / 1e12,
                   ds.plan().input.bw.cpu_flops / 1e12, ds.initial_cpu_flops() / 1e12,
                   (unsigned long long)s.cpu_flops_updates);
    }
    const std::vector<std::string> tuned = ds.tuning();
    if (!tuned.empty()) {
      // Pass tuning: the CPU layer count of each batch-placed pass size, from the passes' times.
      std::fprintf(out, "tuned:   %llu passes timed, %llu count changes; CPU layers per pass size:\n",
                   (unsigned long long)s.tuned_passes, (unsigned long long)s.tuner_moves);
      for (const std::string& t : tuned) std::fprintf(out, "           passes of %s\n", t.c_str());
    }
    if (!decode && s.cpu_bytes > 0 && s.cpu_seconds > 0) {
      // Batched passes with CPU layers (bench --batch-seqs, serving): the CPU's measured rate on
      // them against the rate its plan assumed (bytes of its units over its predicted seconds).
      const stream::DevicePlan& dp = ds.plan();
      const double planned_bytes = cpu_unit_bytes(ds.plan());
      std::fprintf(out,
                   "hybrid:  CPU layers of the %d-token passes: %.1f GB in %.2f s = %.1f GB/s measured; planned %.1f GB/s "
                   "(%.1f MB in %.2f ms a pass, predicted pass %.2f ms); %s\n",
                   dp.input.batch, double(s.cpu_bytes) / 1e9, s.cpu_seconds, double(s.cpu_bytes) / s.cpu_seconds / 1e9,
                   p.t_cpu > 0 ? planned_bytes / p.t_cpu / 1e9 : 0.0, planned_bytes / 1e6, p.t_cpu * 1e3,
                   p.token_seconds * 1e3, ds.cpu_probe().c_str());
    }
    if (decode && t.n_decode > 0) {
      const double tok_ms = t.decode_s / t.n_decode * 1e3;
      const stream::Bandwidths& bw = ds.plan().input.bw;
      std::fprintf(out,
                   "plan:    predicted %.2f ms/token (bound by %s), measured %.2f ms/token; planned with H2D %.1f GB/s, "
                   "CPU %.1f GB/s (%.1f with no copies), DRAM %.1f GB/s, VRAM %.0f GB/s\n",
                   p.token_seconds * 1e3, p.bound.c_str(), tok_ms, bw.h2d / 1e9, bw.cpu / 1e9,
                   (bw.cpu_alone > 0 ? bw.cpu_alone : bw.cpu) / 1e9, bw.dram / 1e9, bw.vram / 1e9);
      if (s.decode_cpu_bytes > 0) {
        // Predicted vs measured per executor: the CPU's layers (host time), the rest of the token
        // (GPU layers, waiting for copies, hand-offs) and the copy engine.
        const double cpu_ms = s.decode_cpu_seconds / n * 1e3;
        const double pred_cpu_ms = p.t_cpu * 1e3;  // the plan's own CPU share of t_exec
        // The CPU's planned rate: its units' bytes over their predicted time (between the rate
        // with copies running and the rate alone, by how long the copies run).
        const double planned_bytes = cpu_unit_bytes(ds.plan());
        std::fprintf(out,
                     "hybrid:  CPU computes %.1f MB/token: %.2f ms/token = %.1f GB/s (predicted %.2f ms at %.1f GB/s); "
                     "GPU, copies and hand-offs %.2f ms/token (predicted %.2f ms: h2d %.2f, exec on GPU %.2f); "
                     "%s\n",
                     double(s.decode_cpu_bytes) / n / 1e6, cpu_ms,
                     cpu_ms > 0 ? double(s.decode_cpu_bytes) / n / (cpu_ms * 1e-3) / 1e9 : 0.0, pred_cpu_ms,
                     p.t_cpu > 0 ? planned_bytes / p.t_cpu / 1e9 : 0.0, tok_ms - cpu_ms, p.token_seconds * 1e3 - pred_cpu_ms, p.t_h2d * 1e3,
                     p.t_exec * 1e3 - pred_cpu_ms, ds.cpu_probe().c_str());
      }
      if (s.decode_split_cpu_bytes > 0) {
        // Row split: the CPU's and the GPU's rows of a layer run at once, so only the token time
        // is measured; the plan's split layers are t_split of it.
        std::fprintf(out,
                     "split:   layers split by rows: the CPU computes %.1f MB/token of their rows, %.1f MB/token "
                     "copied from pinned RAM in all; predicted %.2f ms/token for the split layers (hand-offs included)\n",
                     double(s.decode_split_cpu_bytes) / n / 1e6, double(s.decode_ram_bytes) / n / 1e6, p.t_split * 1e3);
      }
    }
  }
  if (lm.streamer) {
    const stream::StreamStats& ss = lm.streamer->stats();
    const stream::CpuLayerStreamer& st = *lm.streamer;
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const char* how = st.reader().direct() ? "O_DIRECT" : "buffered";
    const double rss_mb = double(ru.ru_maxrss) * 1024 / 1e6;
    const double ram_mb = double(st.owned_bytes()) / 1e6;
    // Repacking streamed layers into the CPU's packed layout (compute thread, after each read).
    const bool decode_stats = ss.decode_passes > 0;
    const double repack_s = decode_stats ? ss.decode_repack_seconds : ss.repack_seconds;
    char repack[96] = "";
    if (repack_s > 0) {
      std::snprintf(repack, sizeof repack, "; repack %.2f ms/%s (%.2f GB/s)",
                    repack_s / double(std::max<uint64_t>(decode_stats ? ss.decode_passes : ss.passes, 1)) * 1e3,
                    decode_stats ? "token" : "pass",
                    double(decode_stats ? ss.decode_repack_bytes : ss.repack_bytes) / repack_s / 1e9);
    }
    if (ss.decode_passes > 0) {
      const double n = double(ss.decode_passes);
      const double disk_tok = double(ss.decode_bytes_read) / n;
      std::fprintf(out,
                   "stream:  %.1f MB from disk per decoded token (%s, %d slots), disk %.2f GB/s, stall %.2f ms/token "
                   "(%.0f%% of decode)%s; weights in RAM %.1f MB; peak RSS %.1f MB\n",
                   disk_tok / 1e6, how, st.plan().plan.n_slots, t.decode_s > 0 ? double(ss.decode_bytes_read) / t.decode_s / 1e9 : 0.0,
                   ss.decode_stall_seconds / n * 1e3, t.decode_s > 0 ? 100.0 * ss.decode_stall_seconds / t.decode_s : 0.0,
                   repack, ram_mb, rss_mb);
      // Per tier, per decoded token: bytes and the rate they were consumed at; for the disk also
      // the rate while a read was in flight (what the device delivered) next to the probe's.
      const uint64_t w = lm.model->weight_bytes_per_token();
      const double ram_tok = double(w) > disk_tok ? double(w) - disk_tok : 0.0;
      const double tok_s = t.decode_tok_s();
      char probe[32] = "-";
      if (lm.probe && lm.probe->measured) std::snprintf(probe, sizeof probe, "%.2f GB/s", lm.probe->bytes_per_s / 1e9);
      std::fprintf(out,
                   "tiers:   disk %.1f MB/token = %.2f GB/s (%.2f GB/s while reading, busy %.0f%% of decode; probe %s); "
                   "RAM %.1f MB/token = %.2f GB/s\n",
                   disk_tok / 1e6, disk_tok * tok_s / 1e9,
                   ss.decode_read_busy_seconds > 0 ? double(ss.decode_bytes_read) / ss.decode_read_busy_seconds / 1e9 : 0.0,
                   t.decode_s > 0 ? 100.0 * std::min(1.0, ss.decode_read_busy_seconds / t.decode_s) : 0.0,
                   probe,
                   ram_tok / 1e6, ram_tok * tok_s / 1e9);
    } else {
      const double n = double(std::max<uint64_t>(ss.passes, 1));
      std::fprintf(out,
                   "stream:  %.1f MB from disk per pass over %llu passes (%s, %d slots), stall %.2f ms/pass; RAM-resident "
                   "layers %.1f MB/pass%s; weights in RAM %.1f MB; peak RSS %.1f MB\n",
                   double(ss.bytes_read) / n / 1e6, static_cast<unsigned long long>(ss.passes), how,
                   st.plan().plan.n_slots, ss.stall_seconds / n * 1e3, double(ss.ram_bytes) / n / 1e6, repack, ram_mb,
                   rss_mb);
    }
  }
  if (lm.trace) {
    SLUICE_RETURN_IF_ERROR(lm.trace->flush());
    std::fprintf(out, "trace:   %llu events -> %s\n", static_cast<unsigned long long>(lm.trace->events()),
                 lm.trace->path().c_str());
  }
  return Status::ok();
}

Result<model::ChatTemplate> chat_template_for(const gguf::File& file, const std::string& override_name) {
  if (!override_name.empty()) return model::ChatTemplate::by_name(override_name);
  const gguf::Value* v = file.find("tokenizer.chat_template");
  const std::string text = v != nullptr && v->type == gguf::ValueType::kString ? v->s : "";
  if (text.empty()) {
    // No template in the file (the published Gemma 3 270M GGUF has none): the architecture's own
    // chat format, where its vocabulary has that format's turn markers as tokens.
    const gguf::Value* arch = file.find("general.architecture");
    const gguf::Value* tokens = file.find("tokenizer.ggml.tokens");
    if (arch != nullptr && arch->type == gguf::ValueType::kString && tokens != nullptr &&
        tokens->type == gguf::ValueType::kArray) {
      auto has_token = [&](std::string_view s) {
        return std::any_of(tokens->items.begin(), tokens->items.end(),
                           [&](const gguf::Value& t) { return t.type == gguf::ValueType::kString && t.s == s; });
      };
      if (auto t = model::ChatTemplate::for_architecture(arch->s, has_token); t.is_ok()) return t;
    }
  }
  auto t = model::ChatTemplate::detect(text);
  if (!t.is_ok()) {
    return invalid_argument(file.path() + ": " + t.status().message() +
                            "; choose one with --chat-template chatml|llama3|mistral|llama2|gemma");
  }
  return t;
}

ModelSummary summarize(const gguf::File& file) {
  ModelSummary s;
  std::map<quant::Type, uint64_t> bytes_by_type;
  for (const auto& t : file.tensors()) {
    s.n_params += t.n_elements();
    s.n_bytes += t.nbytes;
    bytes_by_type[t.type] += t.nbytes;
  }
  auto str = [&](const char* key) {
    const gguf::Value* v = file.find(key);
    return v != nullptr && v->type == gguf::ValueType::kString ? v->s : std::string();
  };
  std::string d = str("general.architecture");
  if (d.empty()) d = "?";
  std::string size = str("general.size_label");
  if (size.empty()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1fB", double(s.n_params) / 1e9);
    size = buf;
  }
  d += " " + size;
  // The format holding most of the bytes names the quantization, as llama-bench's does.
  quant::Type main_type = quant::Type::kF32;
  uint64_t most = 0;
  for (const auto& [type, n] : bytes_by_type) {
    if (n > most) most = n, main_type = type;
  }
  if (most > 0) {
    std::string q = quant::type_name(main_type);
    for (auto& c : q) c = char(std::toupper(static_cast<unsigned char>(c)));
    d += " " + q;
  }
  s.description = d;
  return s;
}

void print_stats(FILE* out, double load_s, const decode::Timings& t, uint64_t weight_bytes_per_token,
                 const char* backend) {
  std::fprintf(out, "load:    %.3f s (backend %s)\n", load_s, backend);
  std::fprintf(out, "prefill: %d tokens in %.3f s = %.1f tok/s\n", t.n_prompt, t.prefill_s, t.prefill_tok_s());
  if (t.n_decode > 0) {
    const double gbs = double(weight_bytes_per_token) * t.decode_tok_s() / 1e9;
    std::fprintf(out, "decode:  %d tokens in %.3f s = %.1f tok/s\n", t.n_decode, t.decode_s, t.decode_tok_s());
    std::fprintf(out, "weights: %.1f MB per decoded token x %.1f tok/s = %.2f GB/s\n",
                 double(weight_bytes_per_token) / 1e6, t.decode_tok_s(), gbs);
  } else {
    std::fprintf(out, "decode:  0 tokens (no decode step ran)\n");
    std::fprintf(out, "weights: %.1f MB per decoded token (no decode rate to report)\n",
                 double(weight_bytes_per_token) / 1e6);
  }
}

void accumulate(decode::Timings& a, const decode::Timings& b) {
  a.n_prompt += b.n_prompt;
  a.prefill_s += b.prefill_s;
  a.n_decode += b.n_decode;
  a.decode_s += b.decode_s;
}

bool print_to_stdout(std::string_view piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
  return true;
}

}  // namespace sluice::app
