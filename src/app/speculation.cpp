#include "app/speculation.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "app/common.h"
#include "model/config.h"

namespace sluice::app {

void add_layer_skip_flags(CLI::App& app, SpecFlags& f) {
  app.add_option("--skip-layers", f.skip_layers,
                 "LOSSY, off by default: leave layers out of every pass, before their weights are fetched: N (the N "
                 "most skippable by calibration), auto (calibrated cosine >= 0.98) or a comma-separated list; see "
                 "sluice calibrate for the perplexity cost");
  app.add_option("--early-exit", f.early_exit,
                 "LOSSY, off by default: stop a one-token pass once a layer's input and output have cosine similarity "
                 ">= COS (e.g. 0.999)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--early-exit-min", f.early_exit_min, "first layer after which --early-exit may stop (default: half)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--calibration", f.calibration, "per-layer scores written by sluice calibrate (default MODEL.calib)");
}

void add_spec_flags(CLI::App& app, SpecFlags& f) {
  app.add_option("--draft-model", f.draft_model,
                 "speculative decoding with this draft model (same vocabulary; loaded resident)");
  app.add_flag("--self-draft", f.self_draft,
               "speculative decoding drafting with the model's own resident layers (all layers resident: "
               "--draft-layers)");
  app.add_option("--draft-layers", f.draft_layers,
                 "self-draft of a resident model: layers the draft leaves out: auto (half, the most skippable by "
                 "calibration, else every other layer), N or a comma-separated list")
      ->capture_default_str();
  app.add_option("--draft-k", f.draft_k, "tokens drafted per verification pass (the most, with --draft-adaptive)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_flag("--draft-adaptive", f.adaptive,
               "choose K per pass from the running acceptance rate and measured pass times (at most --draft-k)");
  add_layer_skip_flags(app, f);
}

Status write_calibration(const std::string& path, const std::vector<double>& cosine, const std::string& comment) {
  std::ofstream out(path);
  if (!out) return io_error("cannot write calibration file '" + path + "'");
  out << "# sluice calibrate: per layer, the mean cosine similarity of its input and output hidden state\n";
  out << "# " << comment << "\n";
  char line[64];
  for (size_t l = 0; l < cosine.size(); ++l) {
    std::snprintf(line, sizeof line, "%zu %.6f\n", l, cosine[l]);
    out << line;
  }
  if (!out) return io_error("writing calibration file '" + path + "' failed");
  return Status::ok();
}

Result<std::vector<double>> read_calibration(const std::string& path, int n_layer) {
  std::ifstream in(path);
  if (!in) {
    return invalid_argument("no calibration file '" + path + "': run sluice calibrate -m MODEL first, or pass --calibration FILE");
  }
  std::vector<double> cos(size_t(n_layer), -2.0);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    int l = -1;
    double c = 0;
    if (!(ss >> l >> c) || l < 0 || l >= n_layer) {
      return invalid_argument(path + ":" + std::to_string(lineno) + ": expected \"layer cosine\" with layer in [0, " +
                              std::to_string(n_layer) + ")");
    }
    cos[size_t(l)] = c;
  }
  for (int l = 0; l < n_layer; ++l) {
    if (cos[size_t(l)] < -1.5) {
      return invalid_argument(path + ": no score for layer " + std::to_string(l) + " (written for another model?)");
    }
  }
  return cos;
}

std::string calibration_path(const SpecFlags& f, const std::string& model_path) {
  return f.calibration.empty() ? model_path + ".calib" : f.calibration;
}

Result<std::vector<bool>> layers_to_run(const std::string& flag, const std::string& spec, int n_layer,
                                        const std::vector<double>* calibration, int auto_count) {
  std::vector<bool> run(size_t(n_layer), true);
  // Candidates, most skippable first: by calibrated cosine, never the first or last layer (they
  // turn embeddings into the residual stream and the stream into logits).
  auto ranked = [&]() {
    std::vector<int> ids;
    for (int l = 1; l + 1 < n_layer; ++l) ids.push_back(l);
    if (calibration) {
      std::stable_sort(ids.begin(), ids.end(),
                       [&](int a, int b) { return (*calibration)[size_t(a)] > (*calibration)[size_t(b)]; });
    }
    return ids;
  };
  auto skip_n = [&](int n) -> Result<std::vector<bool>> {
    std::vector<int> ids = ranked();
    if (n < 0 || n > int(ids.size())) {
      return invalid_argument(flag + " " + std::to_string(n) + ": at most " + std::to_string(ids.size()) +
                              " layers can be left out (never the first or the last)");
    }
    if (!calibration) {
      // No calibration: spread evenly over the candidates.
      std::vector<int> spread;
      for (int i = 0; i < n; ++i) spread.push_back(ids[size_t((int64_t(i) * int64_t(ids.size())) / n)]);
      ids = spread;
    }
    for (int i = 0; i < n; ++i) run[size_t(ids[size_t(i)])] = false;
    return run;
  };
  if (spec == "auto") return skip_n(std::min<int>(auto_count, std::max(0, n_layer - 2)));
  if (!spec.empty() && std::all_of(spec.begin(), spec.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      spec.find(',') == std::string::npos) {
    return skip_n(std::stoi(spec.size() > 6 ? "999999" : spec));
  }
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long l = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || l < 0 || l >= n_layer) {
      return invalid_argument(flag + ": '" + item + "' is not a layer id in [0, " + std::to_string(n_layer) +
                              ") (expected N, auto or a comma-separated list of layer ids)");
    }
    run[size_t(l)] = false;
  }
  return run;
}

namespace {

std::string list_of(const std::vector<bool>& run, bool value) {
  std::string s;
  for (size_t l = 0; l < run.size(); ++l) {
    if (run[l] != value) continue;
    if (!s.empty()) s += ",";
    s += std::to_string(l);
  }
  return s.empty() ? "none" : s;
}

}  // namespace

Result<std::vector<bool>> skip_layers_run(const SpecFlags& f, const std::string& model_path, int n_layer) {
  if (f.skip_layers.empty()) return std::vector<bool>{};
  std::vector<double> cal;
  // N and auto choose by calibration; a list (a single id needs a trailing comma: "5,") does not.
  const bool needs_cal =
      f.skip_layers == "auto" || std::all_of(f.skip_layers.begin(), f.skip_layers.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (needs_cal) {
    SLUICE_ASSIGN_OR_RETURN(cal, read_calibration(calibration_path(f, model_path), n_layer));
  }
  int auto_count = 0;
  for (int l = 1; l + 1 < n_layer && !cal.empty(); ++l) auto_count += cal[size_t(l)] >= kAutoSkipCosine;
  return layers_to_run("--skip-layers", f.skip_layers, n_layer, cal.empty() ? nullptr : &cal, auto_count);
}

Status plan_layer_skip(const SpecFlags& f, const gguf::File& file, const std::string& model_path, StreamFlags& sf) {
  sf.skip_layers.clear();
  if (f.skip_layers.empty()) return Status::ok();
  SLUICE_ASSIGN_OR_RETURN(std::string arch_name, file.get_string("general.architecture"));
  const model::ArchSpec* arch = model::find_arch(arch_name);
  if (!arch) return unsupported(model_path + ": architecture \"" + arch_name + "\" is not supported");
  SLUICE_ASSIGN_OR_RETURN(model::Config cfg, model::read_config(file, *arch));
  SLUICE_ASSIGN_OR_RETURN(std::vector<bool> run, skip_layers_run(f, model_path, cfg.n_layer));
  sf.skip_layers.resize(run.size());
  for (size_t l = 0; l < run.size(); ++l) sf.skip_layers[l] = !run[l];
  return Status::ok();
}

Status apply_layer_flags(model::Model& m, const SpecFlags& f, const std::string& model_path) {
  const int n_layer = m.config().n_layer;
  if (!f.skip_layers.empty()) {
    SLUICE_ASSIGN_OR_RETURN(std::vector<bool> run, skip_layers_run(f, model_path, n_layer));
    SLUICE_RETURN_IF_ERROR(m.set_layer_mask(run));
    std::fprintf(stderr, "skip:    LOSSY: layers %s left out of every pass (see sluice calibrate for the perplexity cost)\n",
                 list_of(run, false).c_str());
  }
  if (f.early_exit > 0) {
    const int min_layer = f.early_exit_min >= 0 ? f.early_exit_min : n_layer / 2;
    SLUICE_RETURN_IF_ERROR(m.set_early_exit(f.early_exit, min_layer));
    std::fprintf(stderr, "exit:    LOSSY: one-token passes stop after layer >= %d once cosine(input, output) >= %g\n",
                 min_layer, double(f.early_exit));
  }
  return Status::ok();
}

Result<Speculation> make_speculation(const SpecFlags& f, const ModelFlags& mf, model::Model& target,
                                     const model::Tokenizer& target_tok) {
  Speculation s;
  s.options.k = f.draft_k;
  s.options.adaptive = f.adaptive;
  SLUICE_RETURN_IF_ERROR(decode::validate(s.options));
  if (!f.draft_model.empty() && f.self_draft) {
    return invalid_argument("--draft-model and --self-draft exclude each other: choose one kind of draft");
  }
  if (!f.draft_model.empty()) {
    auto meta = open_model_meta(f.draft_model);
    if (!meta.is_ok()) return Status(meta.status().code(), "--draft-model: " + meta.status().message());
    // The tokenizers first (header only), then the loaded model's logits width.
    SLUICE_RETURN_IF_ERROR(decode::check_same_vocabulary(mf.model_path, target_tok, target_tok.n_vocab(), f.draft_model,
                                                         *meta->tokenizer, meta->tokenizer->n_vocab()));
    ModelFlags df = mf;
    df.model_path = f.draft_model;
    df.n_ctx = target.n_ctx();
    double secs = 0;
    auto dm = load_weights(df, secs);
    if (!dm.is_ok()) return Status(dm.status().code(), "--draft-model " + f.draft_model + ": " + dm.status().message());
    SLUICE_RETURN_IF_ERROR(decode::check_same_vocabulary(mf.model_path, target_tok, target.n_vocab(), f.draft_model,
                                                         *meta->tokenizer, (*dm)->n_vocab()));
    s.draft_model = std::move(dm).value();
    s.drafter = std::make_unique<decode::ModelDrafter>(*s.draft_model);
    std::fprintf(stderr, "spec:    draft model %s (%d layers on the %s backend, loaded in %.2f s), K = %d%s\n",
                 f.draft_model.c_str(), s.draft_model->config().n_layer, s.draft_model->backend_name(), secs, f.draft_k,
                 f.adaptive ? " (adaptive)" : "");
    return s;
  }
  if (!f.self_draft) return s;
  const int n_layer = target.config().n_layer;
  std::vector<bool> run = target.resident_layers();
  const bool all_resident = std::all_of(run.begin(), run.end(), [](bool r) { return r; });
  std::string how = "the resident layers";
  if (run.empty() || all_resident) {
    // Every layer is resident: the draft leaves out a calibrated (or given) set.
    std::vector<double> cal;
    const std::string cpath = calibration_path(f, mf.model_path);
    if (auto c = read_calibration(cpath, n_layer); c.is_ok()) cal = std::move(c).value();
    SLUICE_ASSIGN_OR_RETURN(run, layers_to_run("--draft-layers", f.draft_layers, n_layer, cal.empty() ? nullptr : &cal,
                                               n_layer / 2));
    how = cal.empty() ? "layers left out evenly (no calibration file " + cpath + ")" : "calibrated from " + cpath;
  } else if (std::none_of(run.begin(), run.end(), [](bool r) { return r; })) {
    return invalid_argument("--self-draft: no layer of the model is resident (raise the VRAM or RAM budget)");
  }
  s.drafter = std::make_unique<decode::SelfDrafter>(target, run);
  std::fprintf(stderr, "spec:    %s (%s; left out: %s), K = %d%s\n", s.drafter->describe().c_str(), how.c_str(),
               list_of(run, false).c_str(), f.draft_k, f.adaptive ? " (adaptive)" : "");
  return s;
}

Status charge_draft_to_budgets(const std::string& draft_path, const ModelFlags& mf, StreamFlags& sf) {
  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(draft_path, ec);
  if (ec) return invalid_argument("--draft-model: cannot read '" + draft_path + "': " + ec.message());
  auto charge = [&](std::string& budget, const char* flag) -> Status {
    if (budget.empty()) return Status::ok();
    if (budget == "auto") {
      return invalid_argument(std::string(flag) + " auto with a draft model: give a size, which the draft is charged to");
    }
    SLUICE_ASSIGN_OR_RETURN(uint64_t b, stream::parse_byte_size(budget));
    if (b <= bytes) {
      return invalid_argument(std::string(flag) + " " + budget + " cannot hold the draft model (" +
                              stream::format_bytes(bytes) + ") and the model");
    }
    std::fprintf(stderr, "spec:    draft model %s charged to %s: %s of %s left for the model\n",
                 stream::format_bytes(bytes).c_str(), flag, stream::format_bytes(b - bytes).c_str(), budget.c_str());
    budget = std::to_string(b - bytes);
    return Status::ok();
  };
  // The draft runs where the target's resident layers run: on the GPU with --vram-budget.
  if (!sf.vram_budget.empty() && mf.backend != "cpu") return charge(sf.vram_budget, "--vram-budget");
  return charge(sf.ram_budget, "--ram-budget");
}

Result<GenerationSetup> prepare_generation(const ModelFlags& mf, const SamplingFlags& sf, const SpecFlags& spf,
                                           StreamFlags& stf) {
  if (spf.speculative()) stf.decode_batch = spf.draft_k + 1;
  if (!spf.draft_model.empty()) SLUICE_RETURN_IF_ERROR(charge_draft_to_budgets(spf.draft_model, mf, stf));
  SLUICE_RETURN_IF_ERROR(resolve_stream_flags(stf).status());
  SLUICE_ASSIGN_OR_RETURN(decode::SamplerParams sampling, resolve_sampling(sf));
  SLUICE_ASSIGN_OR_RETURN(ModelMeta meta, open_model_meta(mf.model_path));
  SLUICE_RETURN_IF_ERROR(plan_layer_skip(spf, *meta.file, mf.model_path, stf));
  return GenerationSetup{sampling, std::move(meta)};
}

void print_layer_counts(FILE* out, const model::Model& m, const SpecFlags& f) {
  if (f.skip_layers.empty() && f.early_exit <= 0) return;
  const model::Model::LayerCounts c = m.layer_counts();
  std::fprintf(out, "layers:  LOSSY: %.2f of %d layers run per pass, %lld of %lld passes exited early\n",
               c.passes > 0 ? double(c.layers_run) / double(c.passes) : 0.0, m.config().n_layer,
               static_cast<long long>(c.early_exits), static_cast<long long>(c.passes));
}

}  // namespace sluice::app
