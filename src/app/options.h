// Flags shared by the model-driven subcommands (run, chat, perplexity, bench), so each flag is
// spelled, defaulted and range-checked once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "decode/sampler.h"
#include "model/model.h"

// Declared, not included: <CLI/CLI.hpp> defines validator objects (ExistingFile, ValidIPV4, ...)
// whose initializers, with the virtual members CLI::App pulls in, put ~1 MB of CLI11 code into
// every translation unit that includes it (measured under ASan: half the object code of a test
// that never parses a flag). Only the files that build or parse a command line include it.
namespace CLI {
class App;
}

namespace sluice::app {

struct ModelFlags {
  std::string model_path;  // -m
  std::string backend = "auto";  // --backend auto|cpu|cuda
  bool graphs = true;            // CUDA: replay recorded decode steps (--no-graphs: A/B)
  uint32_t skip_kernels = 0;     // CUDA: kernel kinds left out (bench --skip-kernels, a diagnostic)
  int n_ctx = 0;           // -c; 0: the model's own context length (capped by model/)
  int n_threads = 0;       // -t; 0: all physical cores
  int max_batch = model::kDefaultMaxBatch;  // --ubatch: tokens per forward pass (model::LoadOptions::max_batch)
  // Sequences open at once and the KV pool size in positions (model::LoadOptions; set by
  // `sluice serve --parallel/--kv-positions`, 1 and 0 for every other command).
  int max_sequences = 1;
  int kv_positions = 0;
};

// Streaming and its observability (docs/STREAMING.md), for run, chat, perplexity and bench.
struct StreamFlags {
  std::string ram_budget;  // --ram-budget SIZE (K/M/G suffixes); empty: weights on the mmapped file
  // --vram-budget SIZE: the device pipeline (docs/STREAMING.md): the CUDA backend computes, layers
  // beyond the budget are copied into VRAM slots each token from pinned RAM (--ram-budget bounds
  // it) or from disk. Empty: whole-model upload, or the pipeline when the model does not fit.
  std::string vram_budget;
  // --slots: ring slots for streamed layers (prefetch depth = slots - 1); 0: stream_slots' default.
  int n_slots = 0;
  bool show_plan = false;  // --plan: print the placement and predicted token time, then exit
  std::string trace_path;  // --trace FILE: per-layer access trace (CSV), needs --ram-budget
  bool no_probe = false;   // --no-probe: planner uses the default disk bandwidth (tests, scripts)
  bool no_hybrid = false;  // --no-hybrid: the device pipeline copies every streamed layer (no CPU executor)
  bool fixed_cpu_rate = false;  // --fixed-cpu-rate: multi-token passes placed with the default CPU ops rate, not learned
  bool no_pass_tuning = false;  // --no-pass-tuning: multi-token passes keep the cost model's CPU layer count
  int pass_tuning_patience = 1;  // --pass-tuning-patience
  // --hybrid auto|alternate|split|split=SHARE: which hybrid placements the planner scores (whole
  // layers alternating between CPU and GPU, layers split by rows, or the faster); SHARE fixes the
  // CPU's share of a split layer's rows.
  std::string hybrid = "auto";
  // Mixtures of experts with --vram-budget (stream/expert_streamer.h): where a cache miss runs
  // (cost: CPU or copy by the cost model; cpu; copy) and a cap on the VRAM expert cache.
  std::string expert_misses = "cost";
  std::string expert_cache;
  // --expert-prefetch auto|on|off: predict the next layer's experts with its router on the
  // current hidden state and move the missing ones ahead (VRAM cache: copied; RAM cache: read from
  // disk). auto: off for both (copies or reads ahead that go unused take PCIe or disk time from the
  // misses; measured slower on both, docs/STREAMING.md).
  std::string expert_prefetch = "auto";
  // --expert-quotas global|layer: the VRAM expert cache evicts across all layers (global), or
  // keeps per-layer quotas re-planned from decode routing (layer; stream/expert_streamer.h).
  std::string expert_quotas = "global";
  // Tokens per decode pass: 1, or K + 1 with speculative decoding (set by the command from
  // --draft-k): the planner places units for that batch, and --plan shows both plans.
  int decode_batch = 1;
  // Layers left out of every pass (--skip-layers, resolved before load by plan_layer_skip): the
  // CPU streamer neither holds nor reads them. Empty: none.
  std::vector<bool> skip_layers;
};

struct SamplingFlags {
  decode::SamplerParams params;
  bool seed_given = false;  // --seed appeared on the command line (set while parsing)
};

// -m (required), -c, -t, --ubatch, --backend, --no-graphs.
void add_model_flags(CLI::App& app, ModelFlags& f, int default_ctx = 0);
// --ubatch (part of add_model_flags; for commands with their own -m/-t flags).
void add_ubatch_flag(CLI::App& app, ModelFlags& f);
// --backend, --no-graphs (part of add_model_flags; for commands with their own -m/-t flags).
void add_backend_flags(CLI::App& app, ModelFlags& f);
// The --backend choice as model/ takes it.
model::BackendKind backend_kind(const ModelFlags& f);

// `--skip-kernels LIST` (sluice bench, a diagnostic): comma-separated kinds of CUDA kernel launches
// to leave out, as backend::CudaKernelKind bits: norm, addnorm, rope, attn, glu, gemv. An empty
// list is 0; an unknown name is an error naming it and the known ones.
Result<uint32_t> parse_skip_kernels(std::string_view list);
// The names of the kinds set in `mask`, comma-separated in the order above.
std::string skip_kernel_names(uint32_t mask);

// --ram-budget, --vram-budget, --slots, --plan, --trace, --no-probe, --no-hybrid, --hybrid.
void add_stream_flags(CLI::App& app, StreamFlags& f);

// --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed. Ranges are checked by
// decode::validate() after parsing, so the message names the flag and the accepted range.
void add_sampling_flags(CLI::App& app, SamplingFlags& f);

// Parses argv. Returns an exit code when the command should end now: 0 after --help, 2 (with
// CLI11's message naming the flag on stderr) for unknown flags or unparsable values.
std::optional<int> parse_flags(CLI::App& app, int argc, char** argv);

// The sampler parameters with the seed resolved: --seed if given, else a fresh random one
// (printed to stderr by the caller so the run can be replayed). Error: out-of-range value.
Result<decode::SamplerParams> resolve_sampling(const SamplingFlags& f);

}  // namespace sluice::app
