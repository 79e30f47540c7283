#include "app/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iterator>
#include <random>
#include <utility>

#include "app/commands.h"

namespace sluice::app {

void add_model_flags(CLI::App& app, ModelFlags& f, int default_ctx) {
  f.n_ctx = default_ctx;
  app.add_option("-m,--model", f.model_path, "GGUF model file (of a split model: the first shard)")->required();
  app.add_option("-c,--ctx-size", f.n_ctx, "context size in tokens (0: the model's, capped at 4096)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  app.add_option("-t,--threads", f.n_threads, "CPU threads (0: all physical cores)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  add_ubatch_flag(app, f);
  add_backend_flags(app, f);
}

void add_ubatch_flag(CLI::App& app, ModelFlags& f) {
  app.add_option("--ubatch", f.max_batch,
                 "tokens per forward pass; longer prompts are evaluated in passes of this size. A streamed model "
                 "moves its streamed layers once a pass, so a larger value prefills long prompts faster, at the "
                 "cost of activation memory")
      ->check(CLI::Range(1, model::kMaxMaxBatch))
      ->capture_default_str();
}

void add_backend_flags(CLI::App& app, ModelFlags& f) {
  app.add_option("-b,--backend", f.backend,
                 "device: cuda, cpu, or auto (the GPU when there is one: the whole model when it fits in the free memory, else "
                 "layers streamed through it with the CPU computing some; the CPU without a GPU)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("!--no-graphs", f.graphs,
               "CUDA: issue every decode kernel from the host instead of replaying the recorded step (A/B runs)");
}

namespace {
constexpr std::pair<const char*, uint32_t> kSkipKinds[] = {
    {"norm", backend::kCudaNorm}, {"addnorm", backend::kCudaAddNorm}, {"rope", backend::kCudaRope},
    {"attn", backend::kCudaAttention}, {"glu", backend::kCudaGlu}, {"gemv", backend::kCudaGemv}};
}  // namespace

Result<uint32_t> parse_skip_kernels(std::string_view list) {
  uint32_t mask = 0;
  if (list.empty()) return mask;
  for (bool more = true; more;) {  // every piece between commas, empty ones included
    const size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    more = comma != std::string_view::npos;
    if (more) list.remove_prefix(comma + 1);
    const auto* kind = std::find_if(std::begin(kSkipKinds), std::end(kSkipKinds),
                                    [&](const auto& k) { return name == k.first; });
    if (kind == std::end(kSkipKinds)) {
      return invalid_argument("--skip-kernels: unknown kernel kind '" + std::string(name) + "' (known: " +
                              skip_kernel_names(~0u) + ")");
    }
    mask |= kind->second;
  }
  return mask;
}

std::string skip_kernel_names(uint32_t mask) {
  std::string out;
  for (const auto& [name, bit] : kSkipKinds) {
    if (mask & bit) out += (out.empty() ? "" : ",") + std::string(name);
  }
  return out;
}

model::BackendKind backend_kind(const ModelFlags& f) {
  if (f.backend == "cpu") return model::BackendKind::kCpu;
  if (f.backend == "cuda") return model::BackendKind::kCuda;
  return model::BackendKind::kAuto;
}

void add_stream_flags(CLI::App& app, StreamFlags& f) {
  // With --ram-budget the weights always go through the streamer, which keeps as many layers
  // resident as the budget allows and reads the rest from disk each token.
  app.add_option("--ram-budget", f.ram_budget,
                 "RAM for weights (K/M/G suffixes); layers beyond it are streamed from disk each token");
  app.add_option("--vram-budget", f.vram_budget,
                 "GPU memory for the model (K/M/G suffixes, or auto: the GPU's free memory at load less 256 MiB); "
                 "layers beyond it are copied in from pinned RAM (bounded by --ram-budget) or disk each token");
  app.add_option("--slots", f.n_slots,
                 "ring slots for streamed layers (prefetch depth = slots - 1; default 2, or 3 where the GPU streams "
                 "layers for 16 or more sequences at once: sluice serve --parallel 16+)")
      ->check(CLI::Range(1, 64));
  app.add_flag("--plan", f.show_plan, "print the placement plan and predicted token time, then exit");
  app.add_option("--trace", f.trace_path, "write a per-layer access trace (CSV) of the streamed run to FILE");
  app.add_flag("--no-probe", f.no_probe, "skip the start-up disk probe (the planner uses its default disk bandwidth)");
  app.add_flag("--no-hybrid", f.no_hybrid,
               "with --vram-budget: copy every streamed layer to the GPU (pure streaming) instead of letting the CPU "
               "compute some pinned-RAM layers where they lie");
  app.add_flag("--fixed-cpu-rate", f.fixed_cpu_rate,
               "with --vram-budget: choose the placements of multi-token passes with the default CPU ops rate instead "
               "of starting from the measured bare rate and learning the rate the CPU's layers reach in those passes");
  app.add_flag("--no-pass-tuning", f.no_pass_tuning,
               "with --vram-budget: keep the cost model's CPU layer count for multi-token passes instead of tuning it "
               "from the passes' own times (one layer fewer or more while that is faster)");
  app.add_option("--pass-tuning-patience", f.pass_tuning_patience,
                 "with --vram-budget: counts the pass tuner tries past one that is not faster before it gives up a "
                 "direction (default 1; 0: stop at the first)")
      ->check(CLI::Range(0, 8));
  app.add_option("--hybrid", f.hybrid,
                 "with --vram-budget: the hybrid placements the planner scores: alternate (the CPU computes whole "
                 "pinned-RAM layers), split (every pinned-RAM layer's matrices split by rows between CPU and GPU; "
                 "split=SHARE fixes the CPU's share of rows, e.g. split=0.4), auto (the faster prediction)")
      ->capture_default_str();
  app.add_option("--expert-misses", f.expert_misses,
                 "mixture of experts with --vram-budget: where an expert missing from the VRAM cache runs: cost (CPU or "
                 "copied to the GPU, whichever the cost model says finishes first; prefill copies), cpu, copy")
      ->check(CLI::IsMember({"cost", "cpu", "copy"}));
  app.add_option("--expert-cache", f.expert_cache,
                 "mixture of experts: cap the expert cache (VRAM with --vram-budget, RAM with --ram-budget alone) at "
                 "SIZE (default: what the budget leaves)");
  app.add_option("--expert-prefetch", f.expert_prefetch,
                 "mixture of experts with a budget: predict the next layer's experts (its router on the current hidden "
                 "state) and copy (--vram-budget) or read (--ram-budget) the missing ones ahead; auto: off (measured "
                 "slower on both caches)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--expert-quotas", f.expert_quotas,
                 "mixture of experts with --vram-budget: global (a miss copied into the VRAM cache evicts the least-used "
                 "expert of any layer) or layer (per-layer quotas of slots, re-planned from the decode passes' routing "
                 "every 16 tokens; a layer at its quota evicts its own)")
      ->check(CLI::IsMember({"global", "layer"}))
      ->capture_default_str();
}

void add_sampling_flags(CLI::App& app, SamplingFlags& f) {
  auto& p = f.params;
  app.add_option("--temp", p.temperature, "temperature; 0 = greedy (argmax)")->capture_default_str();
  app.add_option("--top-k", p.top_k, "keep the k most likely tokens; 0 = disabled")->capture_default_str();
  app.add_option("--top-p", p.top_p, "keep the smallest set with probability mass >= p; 1 = disabled")
      ->capture_default_str();
  app.add_option("--min-p", p.min_p, "drop tokens below min-p x the top probability; 0 = disabled")
      ->capture_default_str();
  app.add_option("--repeat-penalty", p.repeat_penalty, "penalty for recently seen tokens; 1 = disabled")
      ->capture_default_str();
  app.add_option("--repeat-last-n", p.repeat_last_n, "tokens the repeat penalty looks back over")
      ->capture_default_str();
  app.add_option("--seed", p.seed, "random seed (default: random, printed)")->each([&f](const std::string&) {
    f.seed_given = true;
  });
}

std::optional<int> parse_flags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help or the error
    return rc == 0 ? kExitOk : kExitBadInput;
  }
  return std::nullopt;
}

Result<decode::SamplerParams> resolve_sampling(const SamplingFlags& f) {
  decode::SamplerParams p = f.params;
  SLUICE_RETURN_IF_ERROR(decode::validate(p));
  if (!f.seed_given) {
    std::random_device rd;
    p.seed = (uint64_t(rd()) << 32) ^ rd();
  }
  return p;
}

}  // namespace sluice::app
