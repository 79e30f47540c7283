#include "decode/calibrate.h"

#include <algorithm>
#include <cmath>

namespace sluice::decode {

void LayerCosine::on_layer(int layer, std::span<const float> hidden) {
  const size_t d = size_t(n_embd_);
  if (layer < 0 || size_t(layer) >= sum_.size() || hidden.size() % d != 0) return;
  if (layer > 0 && prev_layer_ == layer - 1 && prev_.size() == hidden.size()) {
    for (size_t t = 0; t < hidden.size() / d; ++t) {
      double dot = 0, a = 0, b = 0;
      for (size_t i = 0; i < d; ++i) {
        const double x = prev_[t * d + i], y = hidden[t * d + i];
        dot += x * y, a += x * x, b += y * y;
      }
      if (a > 0 && b > 0) {
        sum_[size_t(layer)] += dot / std::sqrt(a * b);
        ++count_[size_t(layer)];
      }
    }
  }
  prev_.assign(hidden.begin(), hidden.end());
  prev_layer_ = layer;
}

std::vector<double> LayerCosine::mean() const {
  std::vector<double> m(sum_.size(), 0.0);
  for (size_t l = 0; l < m.size(); ++l) m[l] = count_[l] > 0 ? sum_[l] / double(count_[l]) : 0.0;
  return m;
}

Result<double> perplexity_of(model::Model& m, std::span<const int32_t> tokens, bool one_token_passes) {
  if (tokens.size() < 2) return invalid_argument("perplexity needs at least 2 tokens");
  if (int64_t(tokens.size()) > m.n_ctx()) {
    return invalid_argument("perplexity text of " + std::to_string(tokens.size()) + " tokens exceeds the context " +
                            std::to_string(m.n_ctx()));
  }
  const size_t nv = size_t(m.n_vocab());
  const size_t chunk = one_token_passes ? 1 : 64;
  std::vector<float> logits(chunk * nv);
  m.truncate(0);
  double nll = 0;
  int64_t count = 0;
  // Logits at position j predict token j + 1.
  for (size_t j = 0; j + 1 < tokens.size(); j += chunk) {
    const size_t n = std::min(chunk, tokens.size() - 1 - j);
    std::span<float> out(logits.data(), n * nv);
    SLUICE_RETURN_IF_ERROR(m.eval(tokens.subspan(j, n), out));
    for (size_t i = 0; i < n; ++i) {
      const float* row = out.data() + i * nv;
      const float mx = *std::max_element(row, row + nv);
      double sum = 0;
      for (size_t v = 0; v < nv; ++v) sum += std::exp(double(row[v]) - mx);
      nll += std::log(sum) + mx - double(row[size_t(tokens[j + i + 1])]);
      ++count;
    }
  }
  m.truncate(0);
  return std::exp(nll / double(count));
}

}  // namespace sluice::decode
