// Helpers for comparing sluice against llama.cpp fixtures: greedy decoding from token ids and the
// logits at the first generated position, through the public Model API only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace sluice::test {

inline int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());  // ties: lowest id
}

struct GreedyRun {
  std::vector<float> first_logits;  // logits after the prompt (n_vocab)
  std::vector<int32_t> tokens;      // n_gen greedy tokens
  Status status;
};

// Clears the cache, evaluates `prompt` in one batch, then decodes n_gen tokens greedily.
inline GreedyRun greedy(model::Model& m, const std::vector<int32_t>& prompt, int n_gen) {
  GreedyRun r;
  m.truncate(0);
  std::vector<float> logits(size_t(m.n_vocab()));
  r.status = m.eval(prompt, logits);
  if (!r.status.is_ok()) return r;
  r.first_logits = logits;
  for (int i = 0; i < n_gen; ++i) {
    const int32_t t = argmax(logits);
    r.tokens.push_back(t);
    if (i + 1 == n_gen) break;
    r.status = m.eval(std::span(&t, 1), logits);
    if (!r.status.is_ok()) return r;
  }
  return r;
}

}  // namespace sluice::test
