// sluice chat -m MODEL: interactive chat over stdin (one line = one user turn; /exit or EOF
// ends). The KV cache is kept across turns: each turn evaluates only its own tokens, i.e. the
// template's end-of-turn text for the previous reply plus the new user turn (see
// ChatTemplate::continuation and the KV-cache invariant in decode/generate.h). With --self-draft
// or --draft-model every reply is decoded speculatively (docs/SPECULATIVE.md): a draft model is
// handed the tokens of the whole conversation so far, which it catches up on.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <vector>

#include "app/commands.h"
#include "app/common.h"
#include "app/speculation.h"

namespace sluice::app {
namespace {

constexpr std::string_view kExitCommand = "/exit";

}  // namespace

int cmd_chat(int argc, char** argv) {
  CLI::App app{"Interactive chat (reads one user turn per line from stdin; /exit or EOF ends)", "sluice chat"};
  ModelFlags mf;
  SamplingFlags sf;
  std::string system, template_name;
  int n_predict = -1;
  add_model_flags(app, mf);
  app.add_option("-n,--n-predict", n_predict, "most tokens per reply; -1 = until end of turn or context full")
      ->check(CLI::Range(-1, 1 << 24))
      ->capture_default_str();
  app.add_option("--system", system, "system message");
  app.add_option("--chat-template", template_name, "override the template family: chatml|llama3|mistral|llama2|gemma");
  add_sampling_flags(app, sf);
  StreamFlags stf;
  add_stream_flags(app, stf);
  SpecFlags spf;
  add_spec_flags(app, spf);
  if (auto rc = parse_flags(app, argc, argv)) return *rc;
  auto setup = prepare_generation(mf, sf, spf, stf);
  if (!setup.is_ok()) return report_error("chat", setup.status());
  const decode::SamplerParams& sampling = setup->sampling;
  const ModelMeta& meta = setup->meta;
  const model::Tokenizer& tok = *meta.tokenizer;
  auto tmpl = chat_template_for(*meta.file, template_name);
  if (!tmpl.is_ok()) return report_error("chat", tmpl.status());
  if (stf.show_plan) {
    if (Status st = print_plan(mf, stf, *meta.file); !st.is_ok()) return report_error("chat", st);
    return kExitOk;
  }

  auto loaded = load_model(mf, stf);
  if (!loaded.is_ok()) return report_error("chat", loaded.status());
  model::Model& m = *loaded->model;
  if (Status st = apply_layer_flags(m, spf, mf.model_path); !st.is_ok()) return report_error("chat", st);
  auto spec = make_speculation(spf, mf, m, tok);
  if (!spec.is_ok()) return report_error("chat", spec.status());
  if (!sf.seed_given && sampling.temperature > 0) {
    std::fprintf(stderr, "seed: %llu\n", static_cast<unsigned long long>(sampling.seed));
  }
  decode::Sampler sampler(sampling, m.n_vocab());
  decode::GenerateOptions opts;
  opts.n_predict = n_predict;

  const bool interactive = isatty(STDIN_FILENO) != 0;
  std::vector<model::ChatMessage> history;
  if (!system.empty()) history.push_back({"system", system});
  std::optional<decode::Generation> last;  // the previous turn's result
  std::vector<int32_t> cached;  // the tokens the KV cache holds (a draft model catches up on them)
  decode::Timings total;
  decode::SpecStats spec_stats;
  int rc = kExitOk;

  std::string line;
  while (true) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == kExitCommand) break;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;

    const std::vector<model::ChatMessage> turn{{"user", line}};
    std::vector<int32_t> tokens;
    std::string text;
    if (!last) {
      std::vector<model::ChatMessage> first = history;
      first.push_back(turn[0]);
      auto t = tmpl->apply(first, true);
      if (!t.is_ok()) return report_error("chat", t.status());
      tokens = tok.encode(*t, tok.add_bos_default(), /*parse_special=*/true);
    } else {
      // The previous reply's last sampled token is not in the cache yet. An end-of-turn token
      // is re-spelled by assistant_suffix(); any other token (reply cut by -n) goes first.
      if (last->pending && !tok.is_end_of_generation(*last->pending)) tokens.push_back(*last->pending);
      auto t = tmpl->continuation(history, turn, true);
      if (!t.is_ok()) return report_error("chat", t.status());
      const std::vector<int32_t> more = tok.encode(tmpl->assistant_suffix() + *t, false, /*parse_special=*/true);
      tokens.insert(tokens.end(), more.begin(), more.end());
    }
    if (m.n_past() + int64_t(tokens.size()) > m.n_ctx()) {
      std::fprintf(stderr,
                   "sluice chat: context full: this turn needs %zu tokens but only %d of %d positions are free; "
                   "start a new chat with a larger -c\n",
                   tokens.size(), m.n_ctx() - m.n_past(), m.n_ctx());
      rc = kExitBadInput;
      break;
    }

    // A draft model needs the conversation's tokens; a self-draft shares the target's cache.
    const bool own = spec->drafter && spec->drafter->own_context();
    auto gen = spec->drafter ? decode::generate_speculative(m, *spec->drafter, tok, sampler, tokens, opts,
                                                            spec->options, print_to_stdout, &spec_stats,
                                                            own ? std::span<const int32_t>(cached) : std::span<const int32_t>())
                             : decode::generate(m, tok, sampler, tokens, opts, print_to_stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (!gen.is_ok()) return report_error("chat", gen.status());
    if (own) {  // the KV-cache invariant (decode/generate.h): the turn and the reply but its pending token
      cached.insert(cached.end(), tokens.begin(), tokens.end());
      cached.insert(cached.end(), gen->tokens.begin(), gen->tokens.end() - (gen->pending ? 1 : 0));
    }
    accumulate(total, gen->timings);
    history.push_back(turn[0]);
    history.push_back({"assistant", gen->text});
    const bool context_full = gen->stop == decode::StopReason::kContextFull;
    last = std::move(gen).value();
    if (context_full) {
      std::fprintf(stderr, "note: the context is full (%d tokens); the conversation cannot continue (use a larger -c)\n",
                   m.n_ctx());
      break;
    }
  }
  std::fprintf(stderr, "turns:   %zu, %d of %d context positions used\n", (history.size() - !system.empty()) / 2,
               m.n_past(), m.n_ctx());
  print_stats(stderr, loaded->load_s, total, m.weight_bytes_per_token(), m.backend_name());
  if (spec->drafter) std::fputs(spec_stats.describe(total).c_str(), stderr);
  print_layer_counts(stderr, m, spf);
  if (Status st = finish_stream(stderr, *loaded, total); !st.is_ok()) return report_error("chat", st);
  return rc;
}

}  // namespace sluice::app
