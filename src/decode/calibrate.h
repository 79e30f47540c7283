// Layer-skip calibration (docs/SPECULATIVE.md): how much each layer changes the residual stream
// on a calibration text, measured as the mean over tokens of the cosine similarity of the layer's
// input and output hidden state. A layer whose output is nearly its input (cosine near 1) is a
// candidate to skip (--skip-layers, self-draft's --draft-layers); perplexity_of measures what
// skipping costs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace sluice::decode {

// Fed by LoadOptions::on_layer (the residual stream after each layer of each pass). Layer 0's
// input (the embeddings) is not seen: its score is 0 (never a candidate).
class LayerCosine {
 public:
  LayerCosine(int n_layer, int n_embd) : n_embd_(n_embd), sum_(size_t(n_layer)), count_(size_t(n_layer)) {}
  void on_layer(int layer, std::span<const float> hidden);
  // Per layer, the mean cosine similarity of input and output over every token seen.
  std::vector<double> mean() const;

 private:
  int n_embd_;
  std::vector<double> sum_;
  std::vector<int64_t> count_;
  std::vector<float> prev_;  // the previous layer's output (this layer's input)
  int prev_layer_ = -1;
};

// Perplexity of `tokens` under the model's current layer mask / early exit: the cache is cleared,
// tokens[0] is context, every later token is scored. one_token_passes: each token in its own pass
// (what early exit applies to; slow), else passes of up to 64 tokens.
Result<double> perplexity_of(model::Model& m, std::span<const int32_t> tokens, bool one_token_passes);

}  // namespace sluice::decode
