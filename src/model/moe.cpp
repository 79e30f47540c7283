#include "model/moe.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"

namespace sluice::model {

void route_experts(std::span<const float> logits, int n_tokens, int n_expert, int n_used, bool norm, float scale,
                   MoeRouting& out) {
  SLUICE_CHECK(n_used >= 1 && n_used <= n_expert, "route_experts: n_used outside [1, n_expert]");
  SLUICE_CHECK(logits.size() == size_t(n_tokens) * size_t(n_expert), "route_experts: logits size mismatch");
  out.n_tokens = n_tokens;
  out.n_used = n_used;
  out.experts.resize(size_t(n_tokens) * size_t(n_used));
  out.weights.resize(out.experts.size());
  std::vector<float> p(static_cast<size_t>(n_expert));
  std::vector<int32_t> order(static_cast<size_t>(n_expert));
  for (int t = 0; t < n_tokens; ++t) {
    const float* z = logits.data() + size_t(t) * size_t(n_expert);
    const float mx = *std::max_element(z, z + n_expert);
    double sum = 0;
    for (int e = 0; e < n_expert; ++e) sum += p[size_t(e)] = std::exp(z[e] - mx);
    const float inv = float(1.0 / sum);
    for (int e = 0; e < n_expert; ++e) p[size_t(e)] *= inv;
    for (int e = 0; e < n_expert; ++e) order[size_t(e)] = e;
    std::partial_sort(order.begin(), order.begin() + n_used, order.end(), [&](int32_t a, int32_t b) {
      return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
    });
    int32_t* ex = out.experts.data() + size_t(t) * size_t(n_used);
    float* w = out.weights.data() + size_t(t) * size_t(n_used);
    float wsum = 0;
    for (int k = 0; k < n_used; ++k) {
      ex[k] = order[size_t(k)];
      w[k] = p[size_t(ex[k])];
      wsum += w[k];
    }
    // llama.cpp clamps the sum at the smallest normal f16 before dividing.
    const float div = norm ? std::max(wsum, 6.103515625e-5f) : 1.0f;
    for (int k = 0; k < n_used; ++k) w[k] = w[k] / div * scale;
  }
}

void distinct_experts(const MoeRouting& r, std::vector<bool>& mark, std::vector<int32_t>& out) {
  out.clear();
  for (int32_t e : r.experts) {
    if (!mark[size_t(e)]) {
      mark[size_t(e)] = true;
      out.push_back(e);
    }
  }
  for (int32_t e : out) mark[size_t(e)] = false;
  std::sort(out.begin(), out.end());
}

uint64_t count_chosen(std::span<const int32_t> predicted, std::span<const ExpertBatch> batches,
                      std::vector<bool>& mark) {
  for (const ExpertBatch& b : batches) mark[size_t(b.expert)] = true;
  uint64_t hit = 0;
  for (int32_t e : predicted) hit += mark[size_t(e)] ? 1 : 0;
  for (const ExpertBatch& b : batches) mark[size_t(b.expert)] = false;
  return hit;
}

void group_by_expert(const MoeRouting& r, int n_expert, std::vector<ExpertBatch>& out) {
  // Index of each expert's batch in `out`, -1 while unused.
  std::vector<int32_t> slot(static_cast<size_t>(n_expert), -1);
  for (int32_t e : r.experts) slot[size_t(e)] = 0;
  size_t n = 0;
  for (int e = 0; e < n_expert; ++e)
    if (slot[size_t(e)] == 0) slot[size_t(e)] = int32_t(n++);
  out.resize(n);
  for (int e = 0; e < n_expert; ++e) {
    if (slot[size_t(e)] < 0) continue;
    ExpertBatch& b = out[size_t(slot[size_t(e)])];
    b.expert = e;
    b.rows.clear();
    b.weights.clear();
  }
  for (int t = 0; t < r.n_tokens; ++t) {
    for (int k = 0; k < r.n_used; ++k) {
      const size_t i = size_t(t) * size_t(r.n_used) + size_t(k);
      ExpertBatch& b = out[size_t(slot[size_t(r.experts[i])])];
      b.rows.push_back(t);
      b.weights.push_back(r.weights[i]);
    }
  }
}

}  // namespace sluice::model
