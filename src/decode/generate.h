// Prompt -> batched prefill -> token-by-token decode, streaming text as it is produced.
//
// KV-cache invariant (what chat relies on): on return, the cache holds everything it held
// before, the prompt, and every sampled token except the last one (`Generation::pending`),
// which was sampled from the final logits but never evaluated. A caller continuing the
// conversation evaluates it (or, when it was end-of-generation, the template's end-of-turn
// text that stands for it) at the start of the next turn.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "decode/sampler.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace sluice::decode {

struct GenerateOptions {
  int n_predict = -1;  // most tokens to sample; -1: until end-of-generation or the context is full
};

enum class StopReason {
  kEndOfGeneration,  // the model sampled an end-of-generation token (EOS, <|im_end|>, ...)
  kMaxTokens,        // n_predict tokens sampled
  kContextFull,      // no position left in the KV cache for the next token
  kStoppedByCaller,  // the text callback returned false
};
const char* stop_reason_name(StopReason r);

struct Timings {
  int n_prompt = 0;        // tokens evaluated in the batched prefill
  double prefill_s = 0;
  int n_decode = 0;        // single-token evaluations after the prefill
  double decode_s = 0;     // their time, sampling included (what a user waits per token)
  double prefill_tok_s() const { return prefill_s > 0 ? n_prompt / prefill_s : 0; }
  double decode_tok_s() const { return decode_s > 0 ? n_decode / decode_s : 0; }
};

struct Generation {
  std::vector<int32_t> tokens;     // every sampled token, in order (a final EOG token included)
  std::string text;                // the text streamed to the callback (EOG tokens add none)
  StopReason stop = StopReason::kMaxTokens;
  std::optional<int32_t> pending;  // tokens.back() when not yet in the KV cache
  Timings timings;
};

// Receives each complete-UTF-8 piece of text as soon as it is decoded; return false to stop.
using TextCallback = std::function<bool(std::string_view piece)>;

// The prefill both generation loops (this one, speculative.h) start with: the prompt's tokens
// into the sampler's repetition history, one eval of the whole prompt into `logits` (n_vocab
// floats), its size and time into gen.timings. Error: the model's, prefixed with the prompt size.
Status prefill(model::Model& model, Sampler& sampler, std::span<const int32_t> prompt, std::span<float> logits,
               Generation& gen);

// Evaluates `prompt` (appended at model.n_past()) and samples until a stop condition.
// `sampler` must have been built for model.n_vocab(); prompt tokens are fed to its
// repetition history. Errors: empty prompt or prompt that does not fit in the remaining
// context (kInvalidArgument, nothing evaluated), or the model's eval error.
Result<Generation> generate(model::Model& model, const model::Tokenizer& tokenizer, Sampler& sampler,
                            std::span<const int32_t> prompt, const GenerateOptions& opts,
                            const TextCallback& on_text);

}  // namespace sluice::decode
