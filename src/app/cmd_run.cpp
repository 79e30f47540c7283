// sluice run -m MODEL -p PROMPT [-n N] [--chat [--system TEXT]] [sampling flags]: streams the
// continuation to stdout as it is produced; stderr ends with load time, prefill and decode
// tok/s and the weight bandwidth per decoded token.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "app/commands.h"
#include "app/common.h"
#include "stream/cpu_streamer.h"

namespace sluice::app {

int cmd_run(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt", "sluice run"};
  ModelFlags mf;
  SamplingFlags sf;
  std::string prompt, system, template_name;
  int n_predict = 128;
  bool chat = false;
  add_model_flags(app, mf);
  app.add_option("-p,--prompt", prompt, "prompt text")->required();
  app.add_option("-n,--n-predict", n_predict, "tokens to generate; -1 = until end of generation or context full")
      ->check(CLI::Range(-1, 1 << 24))
      ->capture_default_str();
  app.add_flag("--chat", chat, "wrap the prompt as one user turn in the model's chat template");
  app.add_option("--system", system, "system message (implies --chat)");
  app.add_option("--chat-template", template_name, "override the template family: chatml|llama3|mistral|llama2|gemma");
  add_sampling_flags(app, sf);
  // CPU streaming (docs/STREAMING.md): with --ram-budget the weights always go through the
  // streamer, which keeps as many layers resident as the budget allows and reads the rest from disk.
  std::string ram_budget_text;
  int n_slots = 2;
  bool show_plan = false;
  app.add_option("--ram-budget", ram_budget_text,
                 "RAM for weights (K/M/G suffixes); layers beyond it are streamed from disk each token");
  app.add_option("--slots", n_slots, "RAM slots for streamed layers (prefetch depth = slots - 1)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_flag("--plan", show_plan, "print the placement plan and predicted token time, then exit");
  if (auto rc = parse_flags(app, argc, argv)) return *rc;
  std::optional<uint64_t> ram_budget;
  if (!ram_budget_text.empty()) {
    auto b = stream::parse_byte_size(ram_budget_text);
    if (!b.is_ok()) return report_error("run", invalid_argument("--ram-budget: " + b.status().message()));
    ram_budget = *b;
  }

  auto sampling = resolve_sampling(sf);
  if (!sampling.is_ok()) return report_error("run", sampling.status());
  auto meta = open_model_meta(mf.model_path);
  if (!meta.is_ok()) return report_error("run", meta.status());
  const model::Tokenizer& tok = *meta->tokenizer;
  stream::CpuStreamOptions stream_opts;
  stream_opts.n_slots = n_slots;
  if (show_plan) {
    auto layout = stream::layout_of(*meta->file);
    if (!layout.is_ok()) return report_error("run", layout.status());
    uint64_t all = layout->globals.bytes;
    for (const auto& u : layout->layers) all += u.bytes;
    stream_opts.ram_budget = ram_budget.value_or(all);
    auto plan = stream::plan_cpu(*layout, stream_opts);
    if (!plan.is_ok()) return report_error("run", plan.status());
    std::printf("plan (CPU only, default bandwidths: disk %.1f GB/s, CPU %.0f GB/s):\n%s", stream_opts.bw.disk / 1e9,
                stream_opts.bw.cpu / 1e9, plan->describe().c_str());
    return kExitOk;
  }

  std::string text = prompt;
  if (chat || !system.empty() || !template_name.empty()) {
    auto tmpl = chat_template_for(*meta->file, template_name);
    if (!tmpl.is_ok()) return report_error("run", tmpl.status());
    std::vector<model::ChatMessage> messages;
    if (!system.empty()) messages.push_back({"system", system});
    messages.push_back({"user", prompt});
    auto formatted = tmpl->apply(messages, true);
    if (!formatted.is_ok()) return report_error("run", formatted.status());
    text = *formatted;
  }
  const std::vector<int32_t> tokens = tok.encode(text, tok.add_bos_default(), /*parse_special=*/true);
  if (tokens.empty()) return report_error("run", invalid_argument("the prompt is empty after tokenization"));

  // Checked before loading weights when the context size is known from -c, and again after.
  auto check_fits = [&](int n_ctx) -> Status {
    if (int64_t(tokens.size()) > n_ctx) {
      return invalid_argument("prompt is " + std::to_string(tokens.size()) + " tokens, longer than the context (" +
                              std::to_string(n_ctx) + "); use a larger -c or a shorter prompt");
    }
    if (n_predict > 0 && int64_t(tokens.size()) + n_predict > n_ctx) {
      return invalid_argument("-n " + std::to_string(n_predict) + " is beyond the context: prompt " +
                              std::to_string(tokens.size()) + " + " + std::to_string(n_predict) + " tokens > context " +
                              std::to_string(n_ctx) + "; use a larger -c or a smaller -n");
    }
    return Status::ok();
  };
  if (mf.n_ctx > 0) {
    if (Status st = check_fits(mf.n_ctx); !st.is_ok()) return report_error("run", st);
  }

  double load_s = 0;
  stream::CpuLayerStreamer* streamer = nullptr;  // owned by the model
  Result<std::unique_ptr<model::Model>> model = invalid_argument("not loaded");
  if (ram_budget) {
    stream_opts.ram_budget = *ram_budget;
    model::LoadOptions lo;
    lo.n_ctx = mf.n_ctx;
    lo.n_threads = mf.n_threads;
    lo.backend = backend_kind(mf);
    lo.layer_source = stream::cpu_streaming_source(mf.model_path, stream_opts, &streamer);
    const auto t0 = std::chrono::steady_clock::now();
    model = model::Model::load(mf.model_path, lo);
    load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else {
    model = load_weights(mf, load_s);
  }
  if (!model.is_ok()) return report_error("run", model.status());
  model::Model& m = **model;
  if (Status st = check_fits(m.n_ctx()); !st.is_ok()) return report_error("run", st);

  if (!sf.seed_given && sampling->temperature > 0) {
    std::fprintf(stderr, "seed: %llu\n", static_cast<unsigned long long>(sampling->seed));
  }
  decode::Sampler sampler(*sampling, m.n_vocab());
  decode::GenerateOptions opts;
  opts.n_predict = n_predict;
  auto gen = decode::generate(m, tok, sampler, tokens, opts, print_to_stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!gen.is_ok()) return report_error("run", gen.status());

  if (gen->stop == decode::StopReason::kContextFull) {
    std::fprintf(stderr, "note: stopped because the context is full (%d tokens); use a larger -c for longer output\n",
                 m.n_ctx());
  }
  std::fprintf(stderr, "stop:    %s after %zu tokens\n", decode::stop_reason_name(gen->stop), gen->tokens.size());
  print_stats(stderr, load_s, gen->timings, m.weight_bytes_per_token(), m.backend_name());
  if (streamer) {
    const stream::StreamStats& ss = streamer->stats();
    const auto& st = gen->timings;
    const double per_tok = ss.decode_passes ? double(ss.decode_bytes_read) / double(ss.decode_passes) : 0;
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::fprintf(stderr,
                 "stream:  %.1f MB from disk per decoded token (%s, %d slots), disk %.2f GB/s, stall %.2f ms/token "
                 "(%.0f%% of decode); weights in RAM %.1f MB; peak RSS %.1f MB\n",
                 per_tok / 1e6, streamer->reader().direct() ? "O_DIRECT" : "buffered", streamer->plan().plan.n_slots,
                 st.decode_s > 0 ? double(ss.decode_bytes_read) / st.decode_s / 1e9 : 0.0,
                 ss.decode_passes ? ss.decode_stall_seconds / double(ss.decode_passes) * 1e3 : 0.0,
                 st.decode_s > 0 ? 100.0 * ss.decode_stall_seconds / st.decode_s : 0.0,
                 double(streamer->owned_bytes()) / 1e6, double(ru.ru_maxrss) * 1024 / 1e6);
  }
  return kExitOk;
}

}  // namespace sluice::app
