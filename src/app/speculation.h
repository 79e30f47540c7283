// The speculative-decoding and layer-skip flags (docs/SPECULATIVE.md) for run, bench and
// perplexity: --draft-model / --self-draft / --draft-k, and the lossy --skip-layers / --early-exit
// (off by default; `sluice calibrate` writes the per-layer scores they choose from).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "app/common.h"
#include "app/options.h"  // declares CLI::App
#include "core/status.h"
#include "decode/speculative.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace sluice::app {

struct SpecFlags {
  std::string draft_model;   // --draft-model FILE: a separate draft model (same vocabulary)
  bool self_draft = false;   // --self-draft: the target's resident layers (or --draft-layers)
  // --draft-layers auto|N|LIST: the layers a self-draft leaves out when every layer is resident
  // (auto: half of them, the most skippable by calibration; N: the N most skippable; LIST: ids).
  std::string draft_layers = "auto";
  int draft_k = 4;           // --draft-k
  bool adaptive = false;     // --draft-adaptive
  // Lossy, off by default: --skip-layers N|auto|LIST (auto: layers with calibrated cosine >=
  // kAutoSkipCosine), --early-exit COS (with --early-exit-min LAYER).
  std::string skip_layers;
  float early_exit = 0;
  int early_exit_min = -1;   // -1: half the layers
  std::string calibration;   // --calibration FILE (default MODEL.calib, written by sluice calibrate)
  bool speculative() const { return !draft_model.empty() || self_draft; }
};
inline constexpr double kAutoSkipCosine = 0.98;

void add_spec_flags(CLI::App& app, SpecFlags& f);
// --skip-layers, --early-exit, --early-exit-min, --calibration only (perplexity).
void add_layer_skip_flags(CLI::App& app, SpecFlags& f);

// Per-layer calibration (decode/calibrate.h) as written to and read from a .calib file: one line
// "layer cosine" per layer ('#' comments). Errors name the file and line.
Status write_calibration(const std::string& path, const std::vector<double>& cosine, const std::string& comment);
Result<std::vector<double>> read_calibration(const std::string& path, int n_layer);
// The calibration file for a model: --calibration, else MODEL.calib.
std::string calibration_path(const SpecFlags& f, const std::string& model_path);

// Layers that RUN when the layers named by `spec` are left out: "N" (the N most skippable by
// calibration), "auto" (auto_rule), or a comma-separated list of layer ids. Errors name the flag.
Result<std::vector<bool>> layers_to_run(const std::string& flag, const std::string& spec, int n_layer,
                                        const std::vector<double>* calibration, int auto_count);

// The layers --skip-layers leaves running (empty when the flag is absent). Errors name the flag.
Result<std::vector<bool>> skip_layers_run(const SpecFlags& f, const std::string& model_path, int n_layer);
// Before the model loads (`file`: its opened GGUF): the layers --skip-layers leaves out go to the
// streamers (StreamFlags::skip_layers), so that under a budget they are neither held nor read.
Status plan_layer_skip(const SpecFlags& f, const gguf::File& file, const std::string& model_path, StreamFlags& sf);

// Applies --skip-layers and --early-exit to `m` (prints what it skipped to stderr). No-op when
// neither is given.
Status apply_layer_flags(model::Model& m, const SpecFlags& f, const std::string& model_path);

// A drafter for `target` from the flags (nullptr when not speculating). A draft model is loaded
// resident with the target's backend flags and context, and its vocabulary checked.
struct Speculation {
  std::unique_ptr<model::Model> draft_model;
  std::unique_ptr<decode::Drafter> drafter;
  decode::SpeculativeOptions options;
};
Result<Speculation> make_speculation(const SpecFlags& f, const ModelFlags& mf, model::Model& target,
                                     const model::Tokenizer& target_tok);

// A draft model is kept resident: its file's bytes come out of --vram-budget (GPU backend) or
// --ram-budget, whichever the target is planned with. Error: the budget is smaller than the draft.
Status charge_draft_to_budgets(const std::string& draft_path, const ModelFlags& mf, StreamFlags& sf);

// What `run` and `chat` settle before the weights load: a verification pass of K + 1 tokens when
// speculating (the planner places units for it), a draft model's bytes charged to the budgets the
// target is planned with, the stream flags, the sampling parameters (seed resolved), the model's
// metadata, and the layers --skip-layers leaves out. Errors name the flag or the file.
struct GenerationSetup {
  decode::SamplerParams sampling;
  ModelMeta meta;
};
Result<GenerationSetup> prepare_generation(const ModelFlags& mf, const SamplingFlags& sf, const SpecFlags& spf,
                                           StreamFlags& stf);

// "layers:  ..." line: layers run per pass and early exits, when --skip-layers or --early-exit is on.
void print_layer_counts(FILE* out, const model::Model& m, const SpecFlags& f);

}  // namespace sluice::app
