// sluice run -m MODEL -p PROMPT [-n N] [--chat [--system TEXT]] [sampling flags]: streams the
// continuation to stdout as it is produced; stderr ends with load time, prefill and decode
// tok/s and the weight bandwidth per decoded token.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <vector>

#include "app/commands.h"
#include "app/common.h"
#include "app/speculation.h"

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
  StreamFlags stf;
  add_stream_flags(app, stf);
  SpecFlags spf;
  add_spec_flags(app, spf);
  if (auto rc = parse_flags(app, argc, argv)) return *rc;
  auto setup = prepare_generation(mf, sf, spf, stf);
  if (!setup.is_ok()) return report_error("run", setup.status());
  const decode::SamplerParams& sampling = setup->sampling;
  const ModelMeta& meta = setup->meta;
  const model::Tokenizer& tok = *meta.tokenizer;
  if (stf.show_plan) {
    if (Status st = print_plan(mf, stf, *meta.file); !st.is_ok()) return report_error("run", st);
    return kExitOk;
  }

  std::string text = prompt;
  if (chat || !system.empty() || !template_name.empty()) {
    auto tmpl = chat_template_for(*meta.file, template_name);
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

  auto loaded = load_model(mf, stf);
  if (!loaded.is_ok()) return report_error("run", loaded.status());
  model::Model& m = *loaded->model;
  if (Status st = check_fits(m.n_ctx()); !st.is_ok()) return report_error("run", st);
  if (Status st = apply_layer_flags(m, spf, mf.model_path); !st.is_ok()) return report_error("run", st);
  auto spec = make_speculation(spf, mf, m, tok);
  if (!spec.is_ok()) return report_error("run", spec.status());

  if (!sf.seed_given && sampling.temperature > 0) {
    std::fprintf(stderr, "seed: %llu\n", static_cast<unsigned long long>(sampling.seed));
  }
  decode::Sampler sampler(sampling, m.n_vocab());
  decode::GenerateOptions opts;
  opts.n_predict = n_predict;
  decode::SpecStats spec_stats;
  auto gen = spec->drafter ? decode::generate_speculative(m, *spec->drafter, tok, sampler, tokens, opts, spec->options,
                                                          print_to_stdout, &spec_stats)
                           : decode::generate(m, tok, sampler, tokens, opts, print_to_stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!gen.is_ok()) return report_error("run", gen.status());

  if (gen->stop == decode::StopReason::kContextFull) {
    std::fprintf(stderr, "note: stopped because the context is full (%d tokens); use a larger -c for longer output\n",
                 m.n_ctx());
  }
  std::fprintf(stderr, "stop:    %s after %zu tokens\n", decode::stop_reason_name(gen->stop), gen->tokens.size());
  print_stats(stderr, loaded->load_s, gen->timings, m.weight_bytes_per_token(), m.backend_name());
  if (spec->drafter) std::fputs(spec_stats.describe(gen->timings).c_str(), stderr);
  print_layer_counts(stderr, m, spf);
  if (Status st = finish_stream(stderr, *loaded, gen->timings); !st.is_ok()) return report_error("run", st);
  return kExitOk;
}

}  // namespace sluice::app
