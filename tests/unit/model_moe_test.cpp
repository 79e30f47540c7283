// Expert routing (model/moe.h) against llama.cpp's build_moe_ffn semantics, computed by hand:
// softmax over all experts, top-k by probability, optional renormalization, scale; and the
// grouping of tokens into per-expert batches.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "model/moe.h"
#include "test_util.h"

namespace sluice::model {
namespace {

TEST(MoeRouting, SoftmaxTopKAndNormalization) {
  // One token, 4 experts: probabilities of logits {1, 3, 2, 0}.
  const std::vector<float> z = {1, 3, 2, 0};
  double sum = 0;
  for (float v : z) sum += std::exp(double(v));
  const double p1 = std::exp(3.0) / sum, p2 = std::exp(2.0) / sum;
  MoeRouting r;
  route_experts(z, 1, 4, 2, /*norm=*/false, 1.0f, r);
  ASSERT_EQ(r.experts, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(r.weights[0], p1, 1e-6);
  EXPECT_NEAR(r.weights[1], p2, 1e-6);
  route_experts(z, 1, 4, 2, /*norm=*/true, 1.0f, r);
  EXPECT_NEAR(r.weights[0], p1 / (p1 + p2), 1e-6);
  EXPECT_NEAR(r.weights[1], p2 / (p1 + p2), 1e-6);
  route_experts(z, 1, 4, 2, /*norm=*/true, 2.5f, r);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.5, 1e-5);
  // Top-1 renormalized is weight 1; every expert chosen keeps the softmax order.
  route_experts(z, 1, 4, 1, true, 1.0f, r);
  EXPECT_EQ(r.experts[0], 1);
  EXPECT_FLOAT_EQ(r.weights[0], 1.0f);
  route_experts(z, 1, 4, 4, false, 1.0f, r);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 2, 0, 3}));
}

TEST(MoeRouting, TiesPickTheLowerExpertAndLargeLogitsStayFinite) {
  const std::vector<float> z = {5, 7, 7, 7, 1000, -1000};
  MoeRouting r;
  route_experts(std::span<const float>(z).first(4), 1, 4, 2, true, 1.0f, r);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.5f);
  const std::vector<float> big = {1000, -1000, 999};
  route_experts(big, 1, 3, 2, true, 1.0f, r);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{0, 2}));
  EXPECT_TRUE(std::isfinite(r.weights[0]) && std::isfinite(r.weights[1]));
  EXPECT_NEAR(r.weights[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

TEST(MoeRouting, GroupsTokensByExpertInAscendingOrder) {
  // 5 tokens, 6 experts, top-2, random logits: every (token, expert, weight) appears exactly once,
  // in the batch of its expert, rows ascending, experts ascending, no empty batch.
  const int n = 5, x = 6, k = 2;
  const auto z = test::random_floats(size_t(n * x), 2.0f, 77);
  MoeRouting r;
  route_experts(z, n, x, k, true, 1.0f, r);
  std::vector<ExpertBatch> b;
  group_by_expert(r, x, b);
  size_t total = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (i > 0) { EXPECT_LT(b[i - 1].expert, b[i].expert); }
    ASSERT_FALSE(b[i].rows.empty());
    ASSERT_EQ(b[i].rows.size(), b[i].weights.size());
    for (size_t j = 0; j < b[i].rows.size(); ++j) {
      if (j > 0) { EXPECT_LT(b[i].rows[j - 1], b[i].rows[j]); }
      const int t = b[i].rows[j];
      bool found = false;
      for (int s = 0; s < k; ++s)
        found |= r.experts[size_t(t * k + s)] == b[i].expert && r.weights[size_t(t * k + s)] == b[i].weights[j];
      EXPECT_TRUE(found) << "token " << t << " expert " << b[i].expert;
    }
    total += b[i].rows.size();
  }
  EXPECT_EQ(total, size_t(n * k));
  // Reuse with fewer experts in play leaves no stale batch.
  const std::vector<float> one = {0, 9, 0, 0, 0, 0};
  route_experts(one, 1, x, 1, true, 1.0f, r);
  group_by_expert(r, x, b);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].expert, 1);
  EXPECT_EQ(b[0].rows, (std::vector<int32_t>{0}));
}

}  // namespace
}  // namespace sluice::model
