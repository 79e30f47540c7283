#include "decode/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_set>

namespace sluice::decode {
namespace {

// Strict weak order: higher logit first, ties to the lower id (so greedy and truncation are
// deterministic whatever the sort algorithm does with equal keys).
bool more_likely(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Softmax of cands[i].logit / temperature into cands[i].p; cands sorted, so [0] is the max.
void softmax_sorted(std::vector<Candidate>& cands, float temperature) {
  const float max = cands.front().logit;
  if (!std::isfinite(max)) {  // every logit -inf (or +inf at the top): the top one takes all
    for (auto& c : cands) c.p = 0;
    cands.front().p = 1;
    return;
  }
  double sum = 0;
  for (auto& c : cands) {
    c.p = static_cast<float>(std::exp(double(c.logit - max) / temperature));
    sum += c.p;
  }
  for (auto& c : cands) c.p = static_cast<float>(c.p / sum);
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

Status validate(const SamplerParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    return invalid_argument("--temp must be a finite number >= 0 (0 = greedy), got " + num(p.temperature));
  if (p.top_k < 0) return invalid_argument("--top-k must be >= 0 (0 = disabled), got " + std::to_string(p.top_k));
  if (!std::isfinite(p.top_p) || p.top_p <= 0 || p.top_p > 1)
    return invalid_argument("--top-p must be in (0, 1] (1 = disabled), got " + num(p.top_p));
  if (!std::isfinite(p.min_p) || p.min_p < 0 || p.min_p > 1)
    return invalid_argument("--min-p must be in [0, 1] (0 = disabled), got " + num(p.min_p));
  if (!std::isfinite(p.repeat_penalty) || p.repeat_penalty <= 0)
    return invalid_argument("--repeat-penalty must be a finite number > 0 (1 = disabled), got " +
                            num(p.repeat_penalty));
  if (p.repeat_last_n < 0)
    return invalid_argument("--repeat-last-n must be >= 0 (0 = disabled), got " + std::to_string(p.repeat_last_n));
  return Status::ok();
}

Sampler::Sampler(const SamplerParams& p, int n_vocab) : params_(p), n_vocab_(n_vocab), rng_(p.seed) {
  SLUICE_CHECK(validate(p).is_ok(), validate(p).message());
  SLUICE_CHECK(n_vocab > 0, "sampler needs a non-empty vocabulary");
}

void Sampler::accept(int32_t token) {
  if (params_.repeat_last_n == 0) return;
  history_.push_back(token);
  while (history_.size() > size_t(params_.repeat_last_n)) history_.pop_front();
}

std::vector<Candidate> Sampler::penalized(std::span<const float> logits) const {
  SLUICE_CHECK(logits.size() == size_t(n_vocab_),
               "logits has " + std::to_string(logits.size()) + " entries, vocabulary " + std::to_string(n_vocab_));
  std::vector<Candidate> cands(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    // NaN would break the sort's ordering; a NaN logit is treated as impossible.
    const float l = std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i];
    cands[i] = {int32_t(i), l, 0.0f};
  }
  if (params_.repeat_penalty != 1.0f && !history_.empty()) {
    // Each distinct token is penalised once, however often it repeats.
    std::unordered_set<int32_t> seen(history_.begin(), history_.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= n_vocab_) continue;
      float& l = cands[size_t(t)].logit;
      l = l <= 0 ? l * params_.repeat_penalty : l / params_.repeat_penalty;
    }
  }
  return cands;
}

std::vector<Candidate> Sampler::distribution(std::span<const float> logits) const {
  std::vector<Candidate> cands = penalized(logits);

  if (params_.temperature <= 0) {
    const auto best = std::min_element(cands.begin(), cands.end(), more_likely);
    return {Candidate{best->id, best->logit, 1.0f}};
  }

  // top-k: a partial sort is enough, and is what keeps a 150k vocabulary cheap per token.
  const size_t k = params_.top_k > 0 ? std::min(size_t(params_.top_k), cands.size()) : cands.size();
  std::partial_sort(cands.begin(), cands.begin() + ptrdiff_t(k), cands.end(), more_likely);
  cands.resize(k);

  if (params_.top_p < 1.0f) {
    softmax_sorted(cands, 1.0f);
    double cum = 0;
    size_t keep = cands.size();
    for (size_t i = 0; i < cands.size(); ++i) {
      cum += cands[i].p;
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cands.resize(keep);
  }

  if (params_.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p); the top one always stays.
    const float threshold = cands.front().logit + std::log(params_.min_p);
    size_t keep = 1;
    while (keep < cands.size() && cands[keep].logit >= threshold) ++keep;
    cands.resize(keep);
  }

  for (auto& c : cands) c.logit /= params_.temperature;
  softmax_sorted(cands, 1.0f);
  return cands;
}

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0 && (params_.repeat_penalty == 1.0f || history_.empty())) {
    // Greedy without a penalty to apply: the token distribution() would return (NaN treated as
    // impossible, ties to the lower id), without building its candidate list: 150k entries per
    // token and sequence were a large part of a 32-sequence server step.
    SLUICE_CHECK(logits.size() == size_t(n_vocab_),
                 "logits has " + std::to_string(logits.size()) + " entries, vocabulary " + std::to_string(n_vocab_));
    int32_t best = 0;
    float best_logit = std::isnan(logits[0]) ? -std::numeric_limits<float>::infinity() : logits[0];
    for (size_t i = 1; i < logits.size(); ++i) {
      if (logits[i] > best_logit) {  // false for NaN; strict, so a tie keeps the lower id
        best_logit = logits[i];
        best = int32_t(i);
      }
    }
    return best;
  }
  const std::vector<Candidate> dist = distribution(logits);
  if (dist.size() == 1) return dist.front().id;  // greedy or one survivor: no draw consumed
  const double u = uniform();
  double cum = 0;
  for (const auto& c : dist) {
    cum += c.p;
    if (u < cum) return c.id;
  }
  return dist.back().id;  // u within rounding of 1
}

}  // namespace sluice::decode
