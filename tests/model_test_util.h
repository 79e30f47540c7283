// Greedy generation for tests that compare two ways of running the same model (streamed vs
// resident, one backend vs another): the tokens and the first position's logits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace sluice::test {

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<float> first_logits;
};

// Prefill of `prompt`, then n greedy steps (argmax, lowest id on ties).
inline GreedyRun greedy_run(model::Model& m, std::vector<int32_t> prompt, int n) {
  GreedyRun r;
  std::vector<float> logits(static_cast<size_t>(m.n_vocab()));
  for (int i = 0; i < n; ++i) {
    Status st = m.eval(prompt, logits);
    EXPECT_TRUE(st.is_ok()) << st.message();
    if (!st.is_ok()) return r;
    if (i == 0) r.first_logits = logits;
    int32_t best = 0;
    for (int32_t v = 1; v < m.n_vocab(); ++v) best = logits[size_t(v)] > logits[size_t(best)] ? v : best;
    r.tokens.push_back(best);
    prompt = {best};
  }
  return r;
}

// Teacher forcing: prefill of `prompt`, then `forced` fed one token at a time; per step the
// model's own argmax and how far the forced token scores below it, as a share of the logit spread
// (0 where they agree).
struct ForcedRun {
  std::vector<int32_t> tokens;
  std::vector<double> gaps;
  std::vector<float> first_logits;
};
inline ForcedRun teacher_forced_run(model::Model& m, std::vector<int32_t> prompt, const std::vector<int32_t>& forced) {
  ForcedRun r;
  std::vector<float> logits(static_cast<size_t>(m.n_vocab()));
  for (size_t i = 0; i < forced.size(); ++i) {
    Status st = m.eval(prompt, logits);
    EXPECT_TRUE(st.is_ok()) << st.message();
    if (!st.is_ok()) return r;
    if (i == 0) r.first_logits = logits;
    const auto hi = std::max_element(logits.begin(), logits.end());  // lowest id on ties
    const auto lo = std::min_element(logits.begin(), logits.end());
    const int32_t best = int32_t(hi - logits.begin());
    r.tokens.push_back(best);
    r.gaps.push_back(double(*hi - logits[size_t(forced[i])]) / std::max(double(*hi - *lo), 1e-30));
    prompt = {forced[i]};
  }
  return r;
}

}  // namespace sluice::test
