// Token sampling from logits: repetition penalty, then greedy (temperature 0) or the filter
// chain top-k -> top-p -> min-p -> temperature -> draw. The order and the semantics of each
// filter follow llama.cpp's default sampler chain, so the same flags mean the same thing:
//   - repetition penalty: each distinct token among the last `repeat_last_n` accepted tokens
//     has its logit divided by the penalty when positive, multiplied when <= 0 (dividing a
//     negative logit would make the token *more* likely);
//   - top-p keeps the smallest prefix of the sorted distribution whose mass reaches p (the
//     token that crosses p is kept), computed on the distribution left by top-k at
//     temperature 1;
//   - min-p keeps tokens whose probability is at least min_p times the most likely one's;
//   - temperature scales the surviving logits last, so it changes the draw but not which
//     tokens survive.
// Draws are reproducible: the generator is a seeded mt19937_64 and uniforms are made from its
// raw bits (std::uniform_real_distribution is implementation-defined).
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

#include "core/status.h"

namespace sluice::decode {

struct SamplerParams {
  float temperature = 0.8f;     // 0: greedy (argmax, ties to the lowest id)
  int top_k = 40;               // 0: disabled
  float top_p = 0.95f;          // 1: disabled; in (0, 1]
  float min_p = 0.05f;          // 0: disabled; in [0, 1]
  float repeat_penalty = 1.0f;  // 1: disabled; > 0
  int repeat_last_n = 64;       // accepted tokens the penalty looks back over; 0: disabled
  uint64_t seed = 0;
};

// Error naming the offending parameter and value (the CLI turns it into exit code 2).
Status validate(const SamplerParams& p);

struct Candidate {
  int32_t id;
  float logit;  // after the penalty (and temperature, in distribution())
  float p;      // probability among the surviving candidates
};

// For log-probabilities of raw logits (a server's `logprobs`), NaN taken as -inf in both:
// log(sum(exp(x))) = max + log(sum(exp(x - max))), the exponentials in 4-float SSE blocks (Cephes'
// expf polynomial, within 2 ulp of exp in float) summed in double per 16 logits: within 1e-6 of
// the double-precision sum. -inf when every logit is -inf (or none), +inf when one is +inf.
double log_sum_exp(std::span<const float> logits);
// The k (<= the vocabulary) largest logits, largest first, ties to the lower id (the sampler's
// order), in one pass with a heap of k: what a full sort would put first, without the sort.
std::vector<Candidate> most_likely(std::span<const float> logits, size_t k);

class Sampler {
 public:
  // `p` must have passed validate() (checked).
  Sampler(const SamplerParams& p, int n_vocab);

  // Picks the next token from `logits` (n_vocab floats). Does not record it: call accept()
  // for every token that becomes part of the context (prompt tokens included, as llama.cpp's
  // tools do, so the penalty sees the prompt).
  int32_t sample(std::span<const float> logits);
  void accept(int32_t token);
  void reset_history() { history_.clear(); }

  // The candidates a draw chooses from, most likely first, probabilities summing to 1 (one
  // candidate with p = 1 when greedy). sample() draws from it. Top-k takes the k most likely in
  // one pass over the logits (a heap of k, the k-th logit as the bar a token must clear), a
  // candidate list of the whole vocabulary only where no top-k applies.
  std::vector<Candidate> distribution(std::span<const float> logits) const;
  // The same, the straightforward way (every token a candidate, then sorted): the reference the
  // tests hold distribution() to.
  std::vector<Candidate> distribution_reference(std::span<const float> logits) const;

  const SamplerParams& params() const { return params_; }
  // A uniform draw in [0, 1) from this sampler's generator (speculative decoding's acceptance
  // test and residual draws share the seeded stream, so a run replays from --seed).
  double draw_uniform() { return uniform(); }

 private:
  std::vector<Candidate> penalized(std::span<const float> logits) const;
  // The distinct in-vocabulary tokens of the history the penalty applies to (none without one).
  std::vector<int32_t> penalized_ids() const;
  float penalize(float logit) const;
  // The k (1 .. vocabulary) most likely candidates after the penalty, most likely first.
  std::vector<Candidate> top_candidates(std::span<const float> logits, size_t k) const;
  // The filters after top-k (top-p, min-p, temperature) on candidates sorted most likely first.
  std::vector<Candidate> finish(std::vector<Candidate> cands) const;
  double uniform();  // [0, 1) with 53 random bits

  SamplerParams params_;
  int n_vocab_;
  std::mt19937_64 rng_;
  std::deque<int32_t> history_;  // last repeat_last_n accepted tokens, oldest first
};

}  // namespace sluice::decode
