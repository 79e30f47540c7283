// sluice perplexity -m MODEL -f TEXT [-c CTX] [--chunks N]: perplexity over non-overlapping
// windows of n_ctx tokens, scored as llama.cpp's perplexity tool scores them so the numbers
// compare: each window starts from an empty cache (its first token replaced by BOS when the
// model adds one), and only the second half is scored -- every scored token sees at least
// n_ctx/2 tokens of context. Prints the running PPL per window and the final estimate with
// its standard error.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "app/commands.h"
#include "app/common.h"
#include "app/speculation.h"

namespace sluice::app {
namespace {

// Logits are requested for this many positions per eval call: bounds memory at
// kScoreBatch x n_vocab floats however large the context.
constexpr int kScoreBatch = 128;

// -log softmax(logits)[target], in double for the sum over a whole vocabulary.
double negative_log_likelihood(const float* logits, int n_vocab, int32_t target) {
  float max = logits[0];
  for (int i = 1; i < n_vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - max);
  return std::log(sum) + max - double(logits[target]);
}

}  // namespace

int cmd_perplexity(int argc, char** argv) {
  CLI::App app{"Perplexity of a model over a text file", "sluice perplexity"};
  ModelFlags mf;
  std::string text_path;
  int max_chunks = -1;
  add_model_flags(app, mf, /*default_ctx=*/512);
  app.add_option("-f,--file", text_path, "text file to score")->required();
  app.add_option("--chunks", max_chunks, "score at most this many windows; -1 = all")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str();
  StreamFlags stf;
  add_stream_flags(app, stf);
  SpecFlags spf;  // --skip-layers / --early-exit: the perplexity cost of the lossy modes
  add_layer_skip_flags(app, spf);
  if (auto rc = parse_flags(app, argc, argv)) return *rc;
  if (auto st = resolve_stream_flags(stf); !st.is_ok()) return report_error("perplexity", st.status());
  if (mf.n_ctx < 4) {
    return report_error("perplexity", invalid_argument("-c must be at least 4 for perplexity, got " +
                                                       std::to_string(mf.n_ctx)));
  }
  if (max_chunks == 0) return report_error("perplexity", invalid_argument("--chunks must be -1 or >= 1, got 0"));

  std::ifstream in(text_path, std::ios::binary);
  if (!in) return report_error("perplexity", io_error("cannot read text file '" + text_path + "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  auto meta = open_model_meta(mf.model_path);
  if (!meta.is_ok()) return report_error("perplexity", meta.status());
  if (Status st = plan_layer_skip(spf, *meta->file, mf.model_path, stf); !st.is_ok()) return report_error("perplexity", st);
  if (stf.show_plan) {
    if (Status st = print_plan(mf, stf, *meta->file); !st.is_ok()) return report_error("perplexity", st);
    return kExitOk;
  }
  const model::Tokenizer& tok = *meta->tokenizer;
  const bool add_bos = tok.add_bos_default() && tok.bos() >= 0;
  const std::vector<int32_t> tokens = tok.encode(text, add_bos, /*parse_special=*/false);
  const int n_ctx = mf.n_ctx;
  int n_chunks = int(tokens.size() / size_t(n_ctx));
  if (n_chunks == 0) {
    return report_error("perplexity", invalid_argument("'" + text_path + "' is " + std::to_string(tokens.size()) +
                                                       " tokens; one window needs -c " + std::to_string(n_ctx) +
                                                       " tokens (use a smaller -c or a longer text)"));
  }
  if (max_chunks > 0) n_chunks = std::min(n_chunks, max_chunks);

  auto loaded = load_model(mf, stf);
  if (!loaded.is_ok()) return report_error("perplexity", loaded.status());
  model::Model& m = *loaded->model;
  const double load_s = loaded->load_s;
  if (m.n_ctx() < n_ctx) {
    return report_error("perplexity", invalid_argument("the model's context holds " + std::to_string(m.n_ctx()) +
                                                       " tokens, less than -c " + std::to_string(n_ctx)));
  }
  if (Status st = apply_layer_flags(m, spf, mf.model_path); !st.is_ok()) return report_error("perplexity", st);
  // Early exit applies to one-token passes: with it, scored tokens are evaluated one per pass.
  const int score_batch = spf.early_exit > 0 ? 1 : kScoreBatch;
  const int n_vocab = m.n_vocab();
  const int first = n_ctx / 2;
  std::fprintf(stderr, "perplexity: %zu tokens, %d windows of %d, scoring the last %d predictions of each\n",
               tokens.size(), n_chunks, n_ctx, n_ctx - 1 - first);

  std::vector<float> logits(size_t(kScoreBatch) * size_t(n_vocab));
  double sum = 0, sum_sq = 0;
  int64_t count = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> window(tokens.begin() + int64_t(c) * n_ctx, tokens.begin() + int64_t(c + 1) * n_ctx);
    if (add_bos) window[0] = tok.bos();
    m.truncate(0);
    // Unscored context: only the last token's logits are produced (and ignored).
    if (Status st = m.eval(std::span(window.data(), size_t(first)), std::span(logits.data(), size_t(n_vocab)));
        !st.is_ok()) {
      return report_error("perplexity", st);
    }
    // Logits at position j predict token j + 1, for j in [first, n_ctx - 1).
    for (int j = first; j < n_ctx - 1; j += score_batch) {
      const int n = std::min(score_batch, n_ctx - 1 - j);
      std::span<float> out(logits.data(), size_t(n) * size_t(n_vocab));
      if (Status st = m.eval(std::span(window.data() + j, size_t(n)), out); !st.is_ok()) {
        return report_error("perplexity", st);
      }
      for (int i = 0; i < n; ++i) {
        const double nll = negative_log_likelihood(out.data() + size_t(i) * size_t(n_vocab), n_vocab, window[size_t(j + i + 1)]);
        sum += nll;
        sum_sq += nll * nll;
        ++count;
      }
    }
    std::printf("[%d]%.4f,", c + 1, std::exp(sum / double(count)));
    std::fflush(stdout);
    if (c == 0) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "perplexity: %.2f s per window, about %.1f s in all\n", s, s * n_chunks);
    }
  }
  std::printf("\n");
  const double mean = sum / double(count);
  const double ppl = std::exp(mean);
  // Standard error of the mean NLL, carried to PPL to first order: d(exp(x)) = exp(x) dx.
  const double var = count > 1 ? std::max(0.0, (sum_sq / double(count) - mean * mean) * double(count) / double(count - 1)) : 0.0;
  const double ppl_err = ppl * std::sqrt(var / double(count));
  std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl_err);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "load:    %.3f s\nscored:  %lld tokens in %.2f s (%.1f tok/s evaluated)\n", load_s,
               static_cast<long long>(count), s, double(n_chunks) * (n_ctx - 1) / s);
  // Every eval here is a batch (no decode step): the stream stats are per pass.
  print_layer_counts(stderr, m, spf);
  if (Status st = finish_stream(stderr, *loaded, decode::Timings{}); !st.is_ok()) return report_error("perplexity", st);
  return kExitOk;
}

}  // namespace sluice::app
