// sluice calibrate -m MODEL -f TEXT [-n TOKENS] [-o FILE]: scores every layer by the mean cosine
// similarity of its input and output hidden state on the text (decode/calibrate.h), writes the
// scores (MODEL.calib by default; --skip-layers, --draft-layers read them) and reports the
// perplexity cost on the same text of leaving out the N most skippable layers and of early exit
// at a few thresholds, with the layers each run uses. Layer skip and early exit are lossy: these
// are the numbers to quote with them.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "app/commands.h"
#include "app/common.h"
#include "app/speculation.h"
#include "decode/calibrate.h"
#include "model/config.h"

namespace sluice::app {

int cmd_calibrate(int argc, char** argv) {
  CLI::App app{"Score layers for --skip-layers / self-draft, with the perplexity cost of skipping", "sluice calibrate"};
  ModelFlags mf;
  std::string text_path, out_path;
  int n_tokens = 256;
  int max_skip = 8;
  bool no_exit = false;
  add_model_flags(app, mf);
  app.add_option("-f,--file", text_path, "calibration text")->required();
  app.add_option("-n,--tokens", n_tokens, "tokens of the text to use")->check(CLI::Range(8, 1 << 16))->capture_default_str();
  app.add_option("-o,--output", out_path, "where to write the scores (default MODEL.calib)");
  app.add_option("--max-skip", max_skip, "report perplexity for skipping 1, 2, 4, ... up to this many layers")
      ->check(CLI::Range(0, 1 << 10))
      ->capture_default_str();
  app.add_flag("--no-early-exit", no_exit, "do not measure early exit (one pass per token: the slow part)");
  if (auto rc = parse_flags(app, argc, argv)) return *rc;

  std::ifstream in(text_path, std::ios::binary);
  if (!in) return report_error("calibrate", io_error("cannot read text file '" + text_path + "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  auto meta = open_model_meta(mf.model_path);
  if (!meta.is_ok()) return report_error("calibrate", meta.status());
  const model::Tokenizer& tok = *meta->tokenizer;
  std::vector<int32_t> tokens = tok.encode(ss.str(), tok.add_bos_default(), /*parse_special=*/false);
  if (tokens.size() < 8) {
    return report_error("calibrate", invalid_argument("'" + text_path + "' has " + std::to_string(tokens.size()) +
                                                      " tokens; calibration needs at least 8"));
  }
  if (int(tokens.size()) > n_tokens) tokens.resize(size_t(n_tokens));
  if (mf.n_ctx == 0) mf.n_ctx = std::max(int(tokens.size()), 64);

  // The hidden states come through the layer hook (a download per layer: calibration only).
  std::unique_ptr<decode::LayerCosine> cos;
  bool collecting = true;
  model::LoadOptions lo;
  lo.n_ctx = mf.n_ctx;
  lo.n_threads = mf.n_threads;
  lo.backend = backend_kind(mf);
  lo.cuda_graphs = mf.graphs;
  lo.on_layer = [&](int layer, std::span<const float> hidden) {
    if (collecting && cos) cos->on_layer(layer, hidden);
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto loaded = model::Model::load(mf.model_path, lo);
  if (!loaded.is_ok()) return report_error("calibrate", loaded.status());
  model::Model& m = **loaded;
  const int n_layer = m.config().n_layer;
  cos = std::make_unique<decode::LayerCosine>(n_layer, m.config().n_embd);
  std::vector<float> logits(size_t(m.n_vocab()));
  if (Status st = m.eval(tokens, logits); !st.is_ok()) return report_error("calibrate", st);
  collecting = false;
  const std::vector<double> score = cos->mean();
  m.truncate(0);

  if (out_path.empty()) out_path = mf.model_path + ".calib";
  if (Status st = write_calibration(out_path, score, mf.model_path + ", " + std::to_string(tokens.size()) +
                                                         " tokens of " + text_path);
      !st.is_ok()) {
    return report_error("calibrate", st);
  }
  std::printf("calibration: %s, %zu tokens of %s -> %s\n", mf.model_path.c_str(), tokens.size(), text_path.c_str(),
              out_path.c_str());
  std::vector<int> ranked;
  for (int l = 1; l + 1 < n_layer; ++l) ranked.push_back(l);
  std::stable_sort(ranked.begin(), ranked.end(), [&](int a, int b) { return score[size_t(a)] > score[size_t(b)]; });
  std::printf("layer  cosine(in, out)  skip rank\n");
  for (int l = 0; l < n_layer; ++l) {
    const auto it = std::find(ranked.begin(), ranked.end(), l);
    if (it == ranked.end()) {
      std::printf("%5d  %15.4f  %s\n", l, score[size_t(l)], l == 0 ? "- (first layer)" : "- (last layer)");
    } else {
      std::printf("%5d  %15.4f  %d\n", l, score[size_t(l)], int(it - ranked.begin()) + 1);
    }
  }

  // The cost: perplexity on the same tokens (passes of 64 tokens) with the N most skippable left out.
  auto ppl = decode::perplexity_of(m, tokens, false);
  if (!ppl.is_ok()) return report_error("calibrate", ppl.status());
  const double base = *ppl;
  std::printf("\nperplexity on the calibration text: %.4f with every layer\n", base);
  std::printf("skip  layers left out                      perplexity  delta\n");
  std::vector<int> counts;
  for (int n = 1; n <= max_skip && n <= int(ranked.size()); n *= 2) counts.push_back(n);
  int n_auto = 0;
  for (int l : ranked) n_auto += score[size_t(l)] >= kAutoSkipCosine;
  for (int n : counts) {
    auto run = layers_to_run("--skip-layers", std::to_string(n), n_layer, &score, 0);
    if (!run.is_ok()) return report_error("calibrate", run.status());
    std::string ids;
    for (int l = 0; l < n_layer; ++l) {
      if (!(*run)[size_t(l)]) ids += (ids.empty() ? "" : ",") + std::to_string(l);
    }
    if (Status st = m.set_layer_mask(*run); !st.is_ok()) return report_error("calibrate", st);
    auto p = decode::perplexity_of(m, tokens, false);
    if (!p.is_ok()) return report_error("calibrate", p.status());
    std::printf("%4d  %-40s  %10.4f  %+.1f%%\n", n, ids.c_str(), *p, (*p / base - 1) * 100);
  }
  if (Status st = m.set_layer_mask({}); !st.is_ok()) return report_error("calibrate", st);
  std::printf("(--skip-layers auto leaves out the %d layers with cosine >= %.2f)\n", n_auto, kAutoSkipCosine);

  if (!no_exit) {
    // Early exit applies to one-token passes: scored one token per pass (slow).
    auto p1 = decode::perplexity_of(m, tokens, true);
    if (!p1.is_ok()) return report_error("calibrate", p1.status());
    std::printf("\nearly exit (one token per pass; min layer %d): perplexity %.4f with every layer\n", n_layer / 2, *p1);
    std::printf("threshold  layers run per token  exited  perplexity  delta\n");
    for (float thr : {0.95f, 0.98f, 0.99f, 0.995f}) {
      if (Status st = m.set_early_exit(thr, n_layer / 2); !st.is_ok()) return report_error("calibrate", st);
      const model::Model::LayerCounts c0 = m.layer_counts();
      auto p = decode::perplexity_of(m, tokens, true);
      if (!p.is_ok()) return report_error("calibrate", p.status());
      const model::Model::LayerCounts c1 = m.layer_counts();
      const double passes = double(std::max<int64_t>(1, c1.passes - c0.passes));
      std::printf("%9.3f  %20.2f  %5.1f%%  %10.4f  %+.1f%%\n", double(thr), double(c1.layers_run - c0.layers_run) / passes,
                  100.0 * double(c1.early_exits - c0.early_exits) / passes, *p, (*p / *p1 - 1) * 100);
    }
    (void)m.set_early_exit(0, 0);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "calibrate: %.2f s\n", s);
  return kExitOk;
}

}  // namespace sluice::app
