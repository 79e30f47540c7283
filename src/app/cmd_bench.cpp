// sluice bench -m MODEL [-p 512] [-n 128] [-r 5] [-t T] [--json|--csv]: llama-bench-style
// throughput. pp<N>: one batched eval of N tokens into an empty cache; tg<N>: N single-token
// evals from an empty cache. Tokens are fixed pseudo-random ids (speed does not depend on
// them). Each test runs once unmeasured (warm-up: page cache, allocations), then -r times.
// tg also reports weight GB/s: weight bytes read per decoded token x tok/s, the number to hold
// against the memory (or link) bandwidth. On the CUDA backend the device's copy bandwidth is
// measured once per run and tg rows give the ratio to it (the roofline of a weight-bound decode);
// on the CPU the bound column stays empty. --ram-budget benchmarks the streamed model.
// --spec-k 1,2,4,8,16: speculative decoding's verification pass (docs/SPECULATIVE.md): after a
// --spec-ctx token prefill, the time of one pass of K + 1 tokens with every token's logits, per
// K, against a one-token decode pass, and the effective tok/s that pass time gives at a few
// acceptance rates (draft time not included: the target's side of the trade).
// --batch-seqs 1,8,32: batched decode (what `sluice serve` runs, llama-batched-bench's S_TG):
// N sequences, each filled with --batch-ctx positions, then passes that decode one token of every
// sequence; the time per pass and the aggregate tok/s, next to the N = 1 row.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "app/commands.h"
#include "app/common.h"
#include "app/speculation.h"
#include "backend/backend.h"

namespace sluice::app {
namespace {

struct BenchResult {
  std::string test;  // "pp512", "tg128"
  int n_tokens = 0;
  std::vector<double> tok_s;  // one per repetition
  double mean = 0, stdev = 0, median = 0;
  double weight_gb_s = 0;     // tg only: mean tok/s x bytes per token
  double bound_ratio = 0;     // tg on CUDA: weight_gb_s / device copy GB/s; 0: not measured
};

void finish(BenchResult& r) {
  const size_t n = r.tok_s.size();
  double sum = 0;
  for (double v : r.tok_s) sum += v;
  r.mean = sum / double(n);
  double ss = 0;
  for (double v : r.tok_s) ss += (v - r.mean) * (v - r.mean);
  r.stdev = n > 1 ? std::sqrt(ss / double(n - 1)) : 0.0;
  std::vector<double> sorted = r.tok_s;
  std::sort(sorted.begin(), sorted.end());
  r.median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

Result<double> time_prefill(model::Model& m, const std::vector<int32_t>& tokens, std::span<float> logits) {
  m.truncate(0);
  const auto t0 = std::chrono::steady_clock::now();
  SLUICE_RETURN_IF_ERROR(m.eval(tokens, logits));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Result<double> time_decode(model::Model& m, const std::vector<int32_t>& tokens, std::span<float> logits) {
  m.truncate(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int32_t t : tokens) {
    const int32_t one[1] = {t};
    SLUICE_RETURN_IF_ERROR(m.eval(one, logits));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string format_size(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / double(1ull << 20));
  }
  return buf;
}

std::string format_params(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull) {
    std::snprintf(buf, sizeof buf, "%.2f B", double(n) / 1e9);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f M", double(n) / 1e6);
  }
  return buf;
}

// Median of pass times in seconds, as milliseconds.
double median_ms(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] * 1e3;
}

// The verification pass per K: one K + 1 token eval (every token's logits) at position spec_ctx,
// rolled back after each; K = 0 is the one-token decode pass it replaces.
Status bench_spec(model::Model& m, std::vector<int> ks, int spec_ctx, int reps, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> any_token(0, m.n_vocab() - 1);
  std::vector<int32_t> ctx(static_cast<size_t>(spec_ctx));
  for (auto& t : ctx) t = any_token(rng);
  m.truncate(0);
  std::vector<float> last(size_t(m.n_vocab()));
  SLUICE_RETURN_IF_ERROR(m.eval(ctx, last));
  ks.insert(ks.begin(), 0);
  std::vector<double> ms;
  // As generate_speculative runs them: every row as a one-token pass would compute it.
  const bool was_invariant = m.row_invariant();
  m.set_row_invariant(true);
  struct Restore {
    model::Model& m;
    bool on;
    ~Restore() { m.set_row_invariant(on); }
  } restore{m, was_invariant};
  for (int k : ks) {
    std::vector<int32_t> batch(size_t(k) + 1);
    for (auto& t : batch) t = any_token(rng);
    SLUICE_ASSIGN_OR_RETURN(const std::span<float> logits, m.logits_buffer(batch.size() * size_t(m.n_vocab())));
    std::vector<double> times;
    for (int i = 0; i <= reps; ++i) {  // the first is the warm-up
      const auto t0 = std::chrono::steady_clock::now();
      SLUICE_RETURN_IF_ERROR(m.eval(batch, logits));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      m.truncate(spec_ctx);
      if (i > 0) times.push_back(s);
    }
    ms.push_back(median_ms(std::move(times)));
  }
  std::printf("\nspeculative verification pass (median of %d; after %d positions; %s backend):\n", reps, spec_ctx,
              m.backend_name());
  std::printf("| %3s | %6s | %10s | %7s | %7s | %8s | %8s | %8s | %8s |\n", "K", "tokens", "ms/pass", "x K=0",
              "x K=1", "tok/s@.5", "tok/s@.7", "tok/s@.8", "tok/s@.9");
  std::printf("| --: | -----: | ---------: | ------: | ------: | -------: | -------: | -------: | -------: |\n");
  const double k1 = ks.size() > 1 && ks[1] == 1 ? ms[1] : 0;
  for (size_t i = 0; i < ks.size(); ++i) {
    const int k = ks[i];
    char r1[16] = "-";
    if (k1 > 0) std::snprintf(r1, sizeof r1, "%.2f", ms[i] / k1);
    std::printf("| %3d | %6d | %10.2f | %7.2f | %7s |", k, k + 1, ms[i], ms[i] / ms[0], r1);
    for (double a : {0.5, 0.7, 0.8, 0.9}) {
      // Expected tokens of a pass: the accepted prefix plus the target's own token.
      const double tokens = (1 - std::pow(a, k + 1)) / (1 - a);
      std::printf(" %8.1f |", tokens / (ms[i] * 1e-3));
    }
    std::printf("\n");
  }
  std::printf("(K = 0: one-token decode pass; tok/s@a: expected tokens per pass (1 - a^(K+1)) / (1 - a) at acceptance "
              "rate a over the pass time, draft time not included)\n");
  m.truncate(0);
  return Status::ok();
}

// Batched decode over n sequences of `ctx` positions each, per n: the median pass time of `reps`
// passes (after a warm-up pass), each pass one token for every sequence, rolled back after it.
Status bench_batch(model::Model& m, const std::vector<int>& ns, int ctx, int reps, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> any_token(0, m.n_vocab() - 1);
  std::vector<double> ms;
  for (int n : ns) {
    // The sequences of this n, freed (sequence 0 emptied) on every way out.
    struct Seqs {
      model::Model& m;
      std::vector<int> ids;
      ~Seqs() {
        for (int s : ids) s == 0 ? m.seq_truncate(0, 0) : m.seq_free(s);
      }
    } seqs{m, {}};
    std::vector<int32_t> prompt(static_cast<size_t>(ctx)), step(static_cast<size_t>(n));
    std::vector<float> last(size_t(m.n_vocab()));
    m.seq_truncate(0, 0);
    for (int i = 0; i < n; ++i) {
      // Sequence 0 is always open; the others are made (as `sluice serve` does).
      auto s = i == 0 ? Result<int>(0) : m.seq_new();
      if (!s.is_ok()) return s.status();
      seqs.ids.push_back(*s);
      for (auto& t : prompt) t = any_token(rng);
      // Prompts in chunks the pass limit (--ubatch) allows.
      for (int p = 0; p < ctx; p += m.max_batch()) {
        const std::span<const int32_t> chunk(prompt.data() + p, size_t(std::min(m.max_batch(), ctx - p)));
        const model::Model::SeqTokens item{*s, chunk, false};
        SLUICE_RETURN_IF_ERROR(m.eval_batch({&item, 1}, last));
      }
    }
    std::vector<model::Model::SeqTokens> items(static_cast<size_t>(n));
    SLUICE_ASSIGN_OR_RETURN(const std::span<float> logits, m.logits_buffer(size_t(n) * size_t(m.n_vocab())));
    std::vector<double> times;
    for (int r = 0; r <= reps; ++r) {  // the first is the warm-up
      for (auto& t : step) t = any_token(rng);
      for (int i = 0; i < n; ++i) items[size_t(i)] = {seqs.ids[size_t(i)], std::span<const int32_t>(&step[size_t(i)], 1), false};
      const auto t0 = std::chrono::steady_clock::now();
      SLUICE_RETURN_IF_ERROR(m.eval_batch(items, logits));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (int sq : seqs.ids) m.seq_truncate(sq, ctx);
      if (r > 0) times.push_back(s);
    }
    ms.push_back(median_ms(std::move(times)));
  }
  std::printf("\nbatched decode (median of %d passes; every sequence at %d positions; %s backend):\n", reps, ctx,
              m.backend_name());
  std::printf("| %9s | %10s | %12s | %11s | %11s |\n", "sequences", "ms/pass", "tok/s (all)", "x 1 seq ms", "x 1 seq t/s");
  std::printf("| --------: | ---------: | -----------: | ----------: | ----------: |\n");
  for (size_t i = 0; i < ns.size(); ++i) {
    const double tok_s = double(ns[i]) / (ms[i] * 1e-3);
    const double tok_s0 = double(ns[0]) / (ms[0] * 1e-3);
    std::printf("| %9d | %10.2f | %12.1f | %11.2f | %11.2f |\n", ns[i], ms[i], tok_s, ms[i] / ms[0], tok_s / tok_s0);
  }
  return Status::ok();
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  CLI::App app{"Prefill and decode throughput (llama-bench style)", "sluice bench"};
  std::string model_path;
  int n_prompt = 512, n_gen = 128, reps = 5, n_threads = 0;
  bool json = false, csv = false;
  std::vector<int> spec_k;
  int spec_ctx = 256;
  std::vector<int> batch_seqs;
  int batch_ctx = 128;
  app.add_option("-m,--model", model_path, "GGUF model file (of a split model: the first shard)")->required();
  app.add_option("-p,--n-prompt", n_prompt, "prompt tokens for the pp test; 0 = skip")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("-n,--n-gen", n_gen, "generated tokens for the tg test; 0 = skip")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("-r,--repetitions", reps, "measured repetitions per test")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("-t,--threads", n_threads, "CPU threads (0: all physical cores)")->check(CLI::Range(0, 4096));
  app.add_option("--spec-k", spec_k, "verification pass time for these K (tokens drafted; a pass carries K + 1)")
      ->delimiter(',')
      ->check(CLI::Range(1, 255));
  app.add_option("--spec-ctx", spec_ctx, "context positions filled before the --spec-k passes")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--batch-seqs", batch_seqs, "batched decode: one pass decodes a token of each of N sequences, per N")
      ->delimiter(',')
      ->check(CLI::Range(1, 512));
  app.add_option("--batch-ctx", batch_ctx, "positions of every sequence before the --batch-seqs passes")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  std::string skip_kernels;
  app.add_option("--skip-kernels", skip_kernels,
                 "CUDA diagnostic: leave these kernel kinds out (norm,addnorm,rope,attn,glu,gemv); the time a token "
                 "saves is what they cost in its context; outputs are meaningless");
  auto* json_flag = app.add_flag("--json", json, "JSON output");
  app.add_flag("--csv", csv, "CSV output")->excludes(json_flag);
  ModelFlags mf;
  add_ubatch_flag(app, mf);
  add_backend_flags(app, mf);
  StreamFlags stf;
  add_stream_flags(app, stf);
  SpecFlags spf;  // --skip-layers / --early-exit: their speed (their cost: sluice calibrate)
  add_layer_skip_flags(app, spf);
  if (auto rc = parse_flags(app, argc, argv)) return *rc;
  if (auto st = resolve_stream_flags(stf); !st.is_ok()) return report_error("bench", st.status());
  if (!skip_kernels.empty()) {
    auto mask = parse_skip_kernels(skip_kernels);
    if (!mask.is_ok()) return report_error("bench", mask.status());
    if (backend_kind(mf) != model::BackendKind::kCuda) {
      return report_error("bench", invalid_argument("--skip-kernels leaves out CUDA kernels: it needs --backend cuda"));
    }
    mf.skip_kernels = *mask;
    std::fprintf(stderr, "bench: leaving out every %s launch: outputs are meaningless (a diagnostic)\n",
                 skip_kernel_names(*mask).c_str());
  }
  if (n_prompt == 0 && n_gen == 0 && spec_k.empty() && batch_seqs.empty()) return report_error("bench", invalid_argument("-p and -n are both 0: nothing to run"));

  auto meta = open_model_meta(model_path);
  if (!meta.is_ok()) return report_error("bench", meta.status());
  if (Status st = plan_layer_skip(spf, *meta->file, model_path, stf); !st.is_ok()) return report_error("bench", st);
  const ModelSummary summary = summarize(*meta->file);
  mf.model_path = model_path;
  mf.n_ctx = std::max(n_prompt, n_gen);
  if (!spec_k.empty()) {
    mf.n_ctx = std::max(mf.n_ctx, spec_ctx + 1 + *std::max_element(spec_k.begin(), spec_k.end()));
    stf.decode_batch = *std::max_element(spec_k.begin(), spec_k.end()) + 1;
  }
  if (!batch_seqs.empty()) {
    // One pool for every sequence of the largest batch, planned for passes of that many tokens.
    const int most = *std::max_element(batch_seqs.begin(), batch_seqs.end());
    mf.n_ctx = std::max(mf.n_ctx, batch_ctx + 1);
    mf.max_sequences = most;
    mf.kv_positions = std::max(most * (batch_ctx + 16), mf.n_ctx);  // also one whole context (-p/-n/--spec-k)
    stf.decode_batch = std::max(stf.decode_batch, most);
  }
  mf.n_threads = n_threads;
  if (stf.show_plan) {
    if (Status st = print_plan(mf, stf, *meta->file); !st.is_ok()) return report_error("bench", st);
    return kExitOk;
  }
  auto loaded = load_model(mf, stf);
  if (!loaded.is_ok()) return report_error("bench", loaded.status());
  model::Model& m = *loaded->model;
  const double load_s = loaded->load_s;
  if (Status st = apply_layer_flags(m, spf, model_path); !st.is_ok()) return report_error("bench", st);
  const std::string backend = m.backend_name();
  // The roofline of a decode that reads every weight once from VRAM: device-to-device copy
  // bandwidth (bytes read + written), measured once. A failure only leaves the bound empty. A
  // streamed model's bound is the copy engine's and the CPU's (its stream: and plan: lines), and
  // its plan leaves no room for the measurement's buffers: no VRAM bound there.
  double bound_gb_s = 0;
  if (backend == "cuda" && !loaded->device_streamer && !loaded->expert_streamer) {
    auto bw = backend::cuda_copy_bandwidth(0);
    if (bw.is_ok()) {
      bound_gb_s = *bw / 1e9;
    } else {
      std::fprintf(stderr, "bench: copy bandwidth not measured: %s\n", bw.status().message().c_str());
    }
  }
  if (m.n_ctx() < mf.n_ctx) {
    return report_error("bench", invalid_argument("the model's context holds " + std::to_string(m.n_ctx()) +
                                                  " tokens; -p/-n need " + std::to_string(mf.n_ctx)));
  }

  std::mt19937 rng(1234);  // fixed: every run benchmarks the same ids
  std::uniform_int_distribution<int32_t> any_token(0, m.n_vocab() - 1);
  // As a generation loop takes them: in the model's fastest host memory (pinned on a GPU).
  auto logits_buf = m.logits_buffer(size_t(m.n_vocab()));
  if (!logits_buf.is_ok()) return report_error("bench", logits_buf.status());
  const std::span<float> logits = *logits_buf;
  std::vector<BenchResult> results;
  auto run = [&](const char* kind, int n, auto timer) -> Status {
    if (n == 0) return Status::ok();
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (auto& t : tokens) t = any_token(rng);
    BenchResult r;
    r.test = std::string(kind) + std::to_string(n);
    r.n_tokens = n;
    SLUICE_ASSIGN_OR_RETURN(double warm, timer(m, tokens, logits));
    (void)warm;
    for (int i = 0; i < reps; ++i) {
      SLUICE_ASSIGN_OR_RETURN(double s, timer(m, tokens, logits));
      r.tok_s.push_back(double(n) / s);
    }
    finish(r);
    if (std::string(kind) == "tg") {
      r.weight_gb_s = r.mean * double(m.weight_bytes_per_token()) / 1e9;
      if (bound_gb_s > 0) r.bound_ratio = r.weight_gb_s / bound_gb_s;
    }
    results.push_back(r);
    return Status::ok();
  };
  if (Status st = run("pp", n_prompt, time_prefill); !st.is_ok()) return report_error("bench", st);
  if (Status st = run("tg", n_gen, time_decode); !st.is_ok()) return report_error("bench", st);
  if (!spec_k.empty()) {
    if (Status st = bench_spec(m, spec_k, spec_ctx, reps, rng); !st.is_ok()) return report_error("bench", st);
  }
  if (!batch_seqs.empty()) {
    if (m.max_sequences() < *std::max_element(batch_seqs.begin(), batch_seqs.end())) {
      return report_error("bench", unsupported("this model runs " + std::to_string(m.max_sequences()) +
                                                " sequence(s) at once; --batch-seqs needs more"));
    }
    if (Status st = bench_batch(m, batch_seqs, batch_ctx, reps, rng); !st.is_ok()) return report_error("bench", st);
  }

  const int threads = n_threads;  // 0: model/ chose (all physical cores)
  const std::string threads_str = n_threads > 0 ? std::to_string(n_threads) : "auto";
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : results) {
      out.push_back({{"model", summary.description}, {"model_size", summary.n_bytes},
                     {"model_n_params", summary.n_params}, {"backend", backend}, {"threads", threads},
                     {"test", r.test}, {"n_tokens", r.n_tokens}, {"samples_ts", r.tok_s}, {"avg_ts", r.mean},
                     {"stddev_ts", r.stdev}, {"median_ts", r.median},
                     {"weight_bytes_per_token", m.weight_bytes_per_token()}, {"weight_gb_s", r.weight_gb_s},
                     {"bound_gb_s", bound_gb_s > 0 ? nlohmann::json(bound_gb_s) : nlohmann::json(nullptr)},
                     {"bound_ratio", r.bound_ratio > 0 ? nlohmann::json(r.bound_ratio) : nlohmann::json(nullptr)},
                     {"load_s", load_s}});
    }
    std::printf("%s\n", out.dump(1).c_str());
  } else if (csv) {
    // Empty fields where there is no bound (CPU) or no ratio (pp rows), as in the JSON's nulls.
    std::printf("model,size_bytes,params,backend,threads,test,avg_ts,stddev_ts,median_ts,weight_gb_s,bound_gb_s,"
                "bound_ratio\n");
    for (const auto& r : results) {
      char bound[32] = "", ratio[32] = "";
      if (bound_gb_s > 0) std::snprintf(bound, sizeof bound, "%.3f", bound_gb_s);
      if (r.bound_ratio > 0) std::snprintf(ratio, sizeof ratio, "%.4f", r.bound_ratio);
      std::printf("\"%s\",%llu,%llu,%s,%d,%s,%.3f,%.3f,%.3f,%.3f,%s,%s\n", summary.description.c_str(),
                  static_cast<unsigned long long>(summary.n_bytes), static_cast<unsigned long long>(summary.n_params),
                  backend.c_str(), threads, r.test.c_str(), r.mean, r.stdev, r.median, r.weight_gb_s, bound, ratio);
    }
  } else if (!results.empty()) {
    std::printf("| %-24s | %10s | %10s | %-7s | %7s | %6s | %19s | %10s | %11s | %10s |\n", "model", "size", "params",
                "backend", "threads", "test", "t/s", "median t/s", "weight GB/s", "% of bound");
    std::printf("| %s | %s: | %s: | %s | %s: | %s: | %s: | %s: | %s: | %s: |\n", std::string(24, '-').c_str(),
                std::string(9, '-').c_str(), std::string(9, '-').c_str(), std::string(7, '-').c_str(),
                std::string(6, '-').c_str(), std::string(5, '-').c_str(), std::string(17, '-').c_str(),
                std::string(9, '-').c_str(), std::string(10, '-').c_str(), std::string(9, '-').c_str());
    for (const auto& r : results) {
      char ts[64], gbs[32], pct[32] = "-";
      if (r.bound_ratio > 0) std::snprintf(pct, sizeof pct, "%.1f%%", 100.0 * r.bound_ratio);
      std::snprintf(ts, sizeof ts, "%.2f ± %.2f", r.mean, r.stdev);
      if (r.weight_gb_s > 0) {
        std::snprintf(gbs, sizeof gbs, "%.2f", r.weight_gb_s);
      } else {
        std::snprintf(gbs, sizeof gbs, "-");
      }
      std::printf("| %-24s | %10s | %10s | %-7s | %7s | %6s | %19s | %10.2f | %11s | %10s |\n",
                  summary.description.c_str(), format_size(summary.n_bytes).c_str(),
                  format_params(summary.n_params).c_str(), backend.c_str(), threads_str.c_str(), r.test.c_str(), ts,
                  r.median, gbs, pct);
    }
    if (bound_gb_s > 0) std::printf("bound: device copy bandwidth %.1f GB/s (read + write)\n", bound_gb_s);
  }
  std::fprintf(stderr, "load %.3f s; weights read per decoded token: %.1f MB\n", load_s,
               double(m.weight_bytes_per_token()) / 1e6);
  // bench's decode timings are its own; the streamer's counters cover every repetition.
  decode::Timings all;
  for (const auto& r : results) {
    if (r.test.rfind("tg", 0) == 0) {
      all.n_decode = r.n_tokens * (reps + 1);
      for (double v : r.tok_s) all.decode_s += double(r.n_tokens) / v;
      all.decode_s *= double(reps + 1) / double(reps);  // the warm-up run, at the measured mean
    }
  }
  if (Status st = finish_stream(stderr, *loaded, all); !st.is_ok()) return report_error("bench", st);
  return kExitOk;
}

}  // namespace sluice::app
