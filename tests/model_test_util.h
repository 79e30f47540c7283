// Greedy generation for tests that compare two ways of running the same model (streamed vs
// resident, one backend vs another): the tokens and the first position's logits.
#pragma once

#include <gtest/gtest.h>

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

}  // namespace sluice::test
