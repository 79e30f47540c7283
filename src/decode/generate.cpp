#include "decode/generate.h"

#include <chrono>

namespace sluice::decode {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

Status prefill(model::Model& model, Sampler& sampler, std::span<const int32_t> prompt, std::span<float> logits,
               Generation& gen) {
  for (int32_t t : prompt) sampler.accept(t);
  const auto t0 = Clock::now();
  if (Status st = model.eval(prompt, logits); !st.is_ok()) {
    return Status(st.code(), "prefill of " + std::to_string(prompt.size()) + " tokens: " + st.message());
  }
  gen.timings.n_prompt = int(prompt.size());
  gen.timings.prefill_s = seconds_since(t0);
  return Status::ok();
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kEndOfGeneration: return "end of generation";
    case StopReason::kMaxTokens: return "token limit";
    case StopReason::kContextFull: return "context full";
    case StopReason::kStoppedByCaller: return "stopped";
  }
  return "unknown";
}

Result<Generation> generate(model::Model& model, const model::Tokenizer& tokenizer, Sampler& sampler,
                            std::span<const int32_t> prompt, const GenerateOptions& opts,
                            const TextCallback& on_text) {
  if (prompt.empty()) return invalid_argument("empty prompt: nothing to evaluate");
  const int n_ctx = model.n_ctx();
  const int n_past = model.n_past();
  if (n_past + int64_t(prompt.size()) > n_ctx) {
    return invalid_argument("prompt of " + std::to_string(prompt.size()) + " tokens does not fit in the context: " +
                            std::to_string(n_past) + " of " + std::to_string(n_ctx) +
                            " positions already used (use a larger -c or a shorter prompt)");
  }

  Generation gen;
  SLUICE_ASSIGN_OR_RETURN(const std::span<float> logits, model.logits_buffer(size_t(model.n_vocab())));
  SLUICE_RETURN_IF_ERROR(prefill(model, sampler, prompt, logits, gen));

  model::Detokenizer detok(tokenizer);
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return true;
    gen.text += piece;
    return on_text ? on_text(piece) : true;
  };

  while (true) {
    if (opts.n_predict >= 0 && int(gen.tokens.size()) >= opts.n_predict) {
      gen.stop = StopReason::kMaxTokens;
      break;
    }
    const auto t_step = Clock::now();
    const int32_t tok = sampler.sample(logits);
    sampler.accept(tok);
    gen.tokens.push_back(tok);
    gen.pending = tok;

    if (tokenizer.is_end_of_generation(tok)) {
      gen.stop = StopReason::kEndOfGeneration;
      break;
    }
    // Control tokens (<|im_start|>, ...) structure the conversation; they are not text.
    if (!tokenizer.is_control(tok) && !emit(detok.push(tok))) {
      gen.stop = StopReason::kStoppedByCaller;
      break;
    }
    // Nothing would read the logits of a token past the limit, so it is not evaluated.
    if (opts.n_predict >= 0 && int(gen.tokens.size()) >= opts.n_predict) {
      gen.stop = StopReason::kMaxTokens;
      break;
    }
    if (model.n_past() >= n_ctx) {
      gen.stop = StopReason::kContextFull;
      break;
    }
    const int32_t one[1] = {tok};
    if (Status st = model.eval(one, logits); !st.is_ok()) {
      return Status(st.code(), "decode at position " + std::to_string(model.n_past()) + ": " + st.message());
    }
    gen.pending.reset();
    gen.timings.n_decode++;
    gen.timings.decode_s += seconds_since(t_step);
  }
  if (gen.stop != StopReason::kStoppedByCaller) emit(detok.flush());
  return gen;
}

}  // namespace sluice::decode
