// Sampler: each filter against a hand-computed distribution, penalty sign handling, seeding,
// and draw frequencies against the distribution (bounded sample counts, 6-sigma tolerance).
#include "decode/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>

#include "test_util.h"

namespace sluice::decode {
namespace {

// Logits whose softmax is exactly `probs` (up to float rounding).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

SamplerParams plain(float temp = 1.0f) {
  SamplerParams p;
  p.temperature = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  return p;
}

std::vector<int32_t> ids(const std::vector<Candidate>& d) {
  std::vector<int32_t> out;
  for (const auto& c : d) out.push_back(c.id);
  return out;
}

TEST(SamplerValidate, RejectsOutOfRangeValuesNamingTheFlag) {
  auto bad = [](auto mutate, const char* flag) {
    SamplerParams p;
    mutate(p);
    Status st = validate(p);
    EXPECT_FALSE(st.is_ok()) << flag;
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find(flag), std::string::npos) << st.message();
  };
  bad([](SamplerParams& p) { p.temperature = -0.1f; }, "--temp");
  bad([](SamplerParams& p) { p.temperature = NAN; }, "--temp");
  bad([](SamplerParams& p) { p.temperature = INFINITY; }, "--temp");
  bad([](SamplerParams& p) { p.top_k = -1; }, "--top-k");
  bad([](SamplerParams& p) { p.top_p = 0.0f; }, "--top-p");
  bad([](SamplerParams& p) { p.top_p = 1.5f; }, "--top-p");
  bad([](SamplerParams& p) { p.min_p = -0.01f; }, "--min-p");
  bad([](SamplerParams& p) { p.min_p = 1.01f; }, "--min-p");
  bad([](SamplerParams& p) { p.repeat_penalty = 0.0f; }, "--repeat-penalty");
  bad([](SamplerParams& p) { p.repeat_last_n = -1; }, "--repeat-last-n");
  EXPECT_TRUE(validate(SamplerParams{}).is_ok());
  EXPECT_TRUE(validate(plain(0.0f)).is_ok());
}

TEST(Sampler, TemperatureZeroIsArgmaxWithTiesToLowestId) {
  Sampler s(plain(0.0f), 6);
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 2.9f, 0.0f, 1.0f}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f, 0.0f, 3.0f}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{-5.0f, -5.0f, -5.0f, -5.0f, -5.0f, -5.0f}), 0);
  // Greedy ignores the other filters and the seed.
  SamplerParams p = plain(0.0f);
  p.top_k = 2;
  p.top_p = 0.1f;
  p.seed = 12345;
  Sampler s2(p, 4);
  EXPECT_EQ(s2.sample(std::vector<float>{1.0f, 2.0f, 7.0f, 7.0f}), 2);
  auto d = s2.distribution(std::vector<float>{1.0f, 2.0f, 7.0f, 7.0f});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].p, 1.0f);
}

TEST(Sampler, NanLogitIsNeverChosen) {
  Sampler s(plain(0.0f), 3);
  EXPECT_EQ(s.sample(std::vector<float>{NAN, 1.0f, 0.5f}), 1);
}

// sample() at temperature 0 takes a shortcut (no candidate list) unless a penalty applies; it must
// pick what distribution() picks: random logits from a small set of values (many ties), NaN,
// -inf and +inf among them, with and without a penalty in force.
TEST(Sampler, GreedyShortcutPicksWhatTheDistributionPicks) {
  std::mt19937_64 rng(20261125);
  const float values[] = {NAN, -INFINITY, INFINITY, -1.0f, 0.0f, 0.5f, 2.0f, 2.0f};
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + int(rng() % 40);
    std::vector<float> l(static_cast<size_t>(n));
    for (float& v : l) v = rng() % 3 == 0 ? values[rng() % 8] : float(int(rng() % 7)) * 0.5f;
    SamplerParams p = plain(0.0f);
    p.repeat_penalty = trial % 2 ? 1.3f : 1.0f;
    p.repeat_last_n = 4;
    Sampler s(p, n);
    if (trial % 4 == 1) s.accept(int32_t(rng() % uint64_t(n)));  // the penalty path
    const int32_t want = s.distribution(l)[0].id;
    ASSERT_EQ(s.sample(l), want) << "trial " << trial;
  }
}

// distribution() takes the top k in one pass over the logits (a heap, blocks of 16 below the bar
// skipped) and sorts a whole vocabulary by radix; it must return exactly what the reference
// (every token a candidate, a comparison sort) returns: the same candidates in the same order,
// the same logits and probabilities to the bit. Fresh logits with many ties, NaN, +-inf and +-0,
// or normal draws; vocabularies around the 16-float blocks and a large one; every filter, with
// penalties above and below 1 in force.
TEST(Sampler, DistributionEqualsTheReferenceBitForBit) {
  std::mt19937_64 rng(test::test_seed() ^ 0x5a3e1eull);
  const float specials[] = {NAN, -INFINITY, INFINITY, 0.0f, -0.0f, 1.5f, 1.5f, -2.0f};
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = trial % 100 == 0 ? 20000 + int(rng() % 50) : 1 + int(rng() % 70);
    std::vector<float> l(static_cast<size_t>(n));
    const bool tied = trial % 2 == 0;
    for (float& v : l) v = tied ? (rng() % 3 == 0 ? specials[rng() % 8] : float(int(rng() % 9)) * 0.25f) : normal(rng);
    SamplerParams p = plain(trial % 5 == 0 ? 0.0f : (trial % 5 == 1 ? 0.7f : 1.0f));
    const int ks[] = {0, 1, 2, 5, 40, n, n + 3};
    p.top_k = ks[rng() % 7];
    p.top_p = rng() % 2 ? 1.0f : 0.9f;
    p.min_p = rng() % 2 ? 0.0f : 0.05f;
    p.repeat_penalty = trial % 3 == 0 ? 1.0f : (trial % 3 == 1 ? 1.3f : 0.8f);
    p.repeat_last_n = 8;
    Sampler s(p, n);
    for (int h = int(rng() % 12); h > 0; --h) s.accept(int32_t(rng() % uint64_t(n)));
    const std::vector<Candidate> got = s.distribution(l), want = s.distribution_reference(l);
    ASSERT_EQ(got.size(), want.size()) << "trial " << trial << " n " << n << " k " << p.top_k;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].id, want[i].id) << "trial " << trial << " rank " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i].logit), std::bit_cast<uint32_t>(want[i].logit)) << "trial " << trial;
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i].p), std::bit_cast<uint32_t>(want[i].p)) << "trial " << trial;
    }
  }
}

// log_sum_exp (SSE exponentials summed in double per 16 logits) against the double-precision sum
// over fresh logits: vocabularies around the 16-float blocks and a 128k one, narrow and wide
// ranges (terms that underflow), -inf and NaN entries; within 1e-6 (relative, 1 at least). And
// the edge cases: none or all -inf give -inf, a +inf gives +inf.
TEST(Sampler, LogSumExpIsWithin1e6OfTheDoubleSum) {
  std::mt19937_64 rng(test::test_seed() ^ 0x15eull);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = trial % 50 == 0 ? 128256 : 1 + int(rng() % 70);
    const float spread = trial % 3 == 0 ? 3.0f : (trial % 3 == 1 ? 30.0f : 300.0f);
    std::normal_distribution<float> normal(trial % 4 == 0 ? 50.0f : 0.0f, spread);
    std::vector<float> l(static_cast<size_t>(n));
    for (float& v : l) v = normal(rng);
    if (trial % 5 == 1) l[rng() % l.size()] = -INFINITY;
    if (trial % 5 == 2 && n > 1) l[rng() % l.size()] = NAN;
    float mx = -INFINITY;
    for (float v : l) mx = v > mx ? v : mx;
    double sum = 0;
    for (float v : l) sum += std::isnan(v) ? 0.0 : std::exp(double(v) - double(mx));
    const double want = mx == -INFINITY ? -INFINITY : double(mx) + std::log(sum), got = log_sum_exp(l);
    if (want == -INFINITY) {
      EXPECT_EQ(got, want) << "trial " << trial;
      continue;
    }
    ASSERT_NEAR(got, want, 1e-6 * std::max(1.0, std::abs(want))) << "trial " << trial << " n " << n;
  }
  EXPECT_EQ(log_sum_exp({}), -INFINITY);
  const std::vector<float> none = {-INFINITY, NAN, -INFINITY};
  EXPECT_EQ(log_sum_exp(none), -INFINITY);
  std::vector<float> inf(40, 1.0f);
  inf[33] = INFINITY;
  EXPECT_EQ(log_sum_exp(inf), INFINITY);
  const std::vector<float> one = {2.5f};
  EXPECT_DOUBLE_EQ(log_sum_exp(one), 2.5);
}

// most_likely (one pass, a heap of k) against a full stable sort by the sampler's order (larger
// logit first, ties to the lower id, NaN as -inf) on fresh logits with many ties and specials.
TEST(Sampler, MostLikelyIsTheFrontOfAFullSort) {
  std::mt19937_64 rng(test::test_seed() ^ 0x70bull);
  const float specials[] = {NAN, -INFINITY, INFINITY, 0.0f, -0.0f, 1.5f, 1.5f, -2.0f};
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = trial % 100 == 0 ? 20000 + int(rng() % 50) : 1 + int(rng() % 70);
    std::vector<float> l(static_cast<size_t>(n));
    const bool tied = trial % 2 == 0;
    for (float& v : l) v = tied ? (rng() % 3 == 0 ? specials[rng() % 8] : float(int(rng() % 9)) * 0.25f) : normal(rng);
    std::vector<int32_t> order(l.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    const auto key = [&](int32_t i) { return std::isnan(l[size_t(i)]) ? -INFINITY : l[size_t(i)]; };
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
    const size_t ks[] = {1, 2, 3, 20, size_t(n)};
    const size_t k = std::min(ks[rng() % 5], size_t(n));
    const std::vector<Candidate> got = most_likely(l, k);
    ASSERT_EQ(got.size(), k) << "trial " << trial;
    for (size_t i = 0; i < k; ++i) {
      ASSERT_EQ(got[i].id, order[i]) << "trial " << trial << " rank " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i].logit), std::bit_cast<uint32_t>(key(order[i]))) << "trial " << trial;
    }
  }
}

TEST(Sampler, TopKKeepsTheKLargestRenormalised) {
  SamplerParams p = plain();
  p.top_k = 2;
  Sampler s(p, 5);
  auto d = s.distribution(std::vector<float>{0.0f, 2.0f, 1.0f, 3.0f, -1.0f});
  EXPECT_EQ(ids(d), (std::vector<int32_t>{3, 1}));
  const double e = std::exp(1.0);  // p(3)/p(1) = e^(3-2)
  EXPECT_NEAR(d[0].p, e / (1 + e), 1e-6);
  EXPECT_NEAR(d[1].p, 1 / (1 + e), 1e-6);
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  const auto logits = logits_of({0.125, 0.5, 0.125, 0.25});  // sorted: 1 (.5), 3 (.25), 0, 2
  auto kept = [&](float top_p) {
    SamplerParams p = plain();
    p.top_p = top_p;
    return ids(Sampler(p, 4).distribution(logits));
  };
  EXPECT_EQ(kept(0.3f), (std::vector<int32_t>{1}));
  EXPECT_EQ(kept(0.49f), (std::vector<int32_t>{1}));
  EXPECT_EQ(kept(0.51f), (std::vector<int32_t>{1, 3}));  // the token crossing p is kept
  EXPECT_EQ(kept(0.74f), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(kept(0.76f), (std::vector<int32_t>{1, 3, 0}));  // tie 0/2 broken to the lower id
  EXPECT_EQ(kept(1.0f), (std::vector<int32_t>{1, 3, 0, 2}));
  // Survivors renormalised: {.5, .25} -> {2/3, 1/3}.
  SamplerParams p = plain();
  p.top_p = 0.6f;
  auto d = Sampler(p, 4).distribution(logits);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d[0].p, 2.0 / 3, 1e-6);
  EXPECT_NEAR(d[1].p, 1.0 / 3, 1e-6);
}

TEST(Sampler, TopPIsComputedAfterTopKAtTemperatureOne) {
  // After top-k 2 the survivors are {.5, .25} -> {2/3, 1/3}; top-p 0.6 then keeps only one.
  // Temperature must not change which tokens survive.
  const auto logits = logits_of({0.125, 0.5, 0.125, 0.25});
  for (float temp : {0.5f, 1.0f, 3.0f}) {
    SamplerParams p = plain(temp);
    p.top_k = 2;
    p.top_p = 0.6f;
    EXPECT_EQ(ids(Sampler(p, 4).distribution(logits)), (std::vector<int32_t>{1})) << temp;
  }
}

TEST(Sampler, MinPThresholdIsRelativeToTheMostLikely) {
  const auto logits = logits_of({0.125, 0.5, 0.125, 0.25});
  auto kept = [&](float min_p) {
    SamplerParams p = plain();
    p.min_p = min_p;
    return ids(Sampler(p, 4).distribution(logits));
  };
  EXPECT_EQ(kept(0.6f), (std::vector<int32_t>{1}));            // needs p >= .30
  EXPECT_EQ(kept(0.4f), (std::vector<int32_t>{1, 3}));         // needs p >= .20
  EXPECT_EQ(kept(0.2f), (std::vector<int32_t>{1, 3, 0, 2}));   // needs p >= .10
  EXPECT_EQ(kept(1.0f), (std::vector<int32_t>{1}));            // only the maximum
}

TEST(Sampler, TemperatureScalesTheSurvivors) {
  const auto logits = std::vector<float>{1.0f, 3.0f, 2.0f};
  for (float temp : {0.25f, 1.0f, 2.0f}) {
    auto d = Sampler(plain(temp), 3).distribution(logits);
    ASSERT_EQ(ids(d), (std::vector<int32_t>{1, 2, 0}));
    double z = 0;
    for (float l : logits) z += std::exp(l / temp);
    EXPECT_NEAR(d[0].p, std::exp(3.0 / temp) / z, 1e-6) << temp;
    EXPECT_NEAR(d[1].p, std::exp(2.0 / temp) / z, 1e-6) << temp;
    EXPECT_NEAR(d[2].p, std::exp(1.0 / temp) / z, 1e-6) << temp;
  }
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeOncePerToken) {
  SamplerParams p = plain();
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 8;
  Sampler s(p, 5);
  for (int32_t t : {0, 1, 0, 0, 4}) s.accept(t);  // 0 repeats: still penalised once
  auto d = s.distribution(std::vector<float>{3.0f, -1.0f, 1.0f, 0.5f, 0.0f});
  std::map<int32_t, float> logit;
  for (const auto& c : d) logit[c.id] = c.logit;
  EXPECT_FLOAT_EQ(logit[0], 1.5f);   // 3 / 2
  EXPECT_FLOAT_EQ(logit[1], -2.0f);  // -1 * 2
  EXPECT_FLOAT_EQ(logit[2], 1.0f);   // not seen
  EXPECT_FLOAT_EQ(logit[3], 0.5f);   // not seen
  EXPECT_FLOAT_EQ(logit[4], 0.0f);   // 0 * 2
}

TEST(Sampler, RepetitionPenaltyLooksOnlyAtTheLastN) {
  SamplerParams p = plain(0.0f);
  p.repeat_penalty = 10.0f;
  p.repeat_last_n = 2;
  Sampler s(p, 3);
  const std::vector<float> logits{2.0f, 1.9f, 1.0f};
  s.accept(0);
  EXPECT_EQ(s.sample(logits), 1);  // 0 penalised to 0.2
  s.accept(2);
  s.accept(2);                     // 0 left the window of 2
  EXPECT_EQ(s.sample(logits), 0);
  s.reset_history();
  EXPECT_EQ(s.sample(logits), 0);

  p.repeat_last_n = 0;  // disabled
  Sampler off(p, 3);
  off.accept(0);
  EXPECT_EQ(off.sample(logits), 0);
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDifferent) {
  const std::vector<float> logits(100, 0.0f);  // uniform over 100 tokens
  auto draw = [&](uint64_t seed) {
    SamplerParams p = plain();
    p.seed = seed;
    Sampler s(p, 100);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits));
    return out;
  };
  const uint64_t seed = test::test_seed();
  EXPECT_EQ(draw(seed), draw(seed)) << "seed " << seed;
  EXPECT_NE(draw(seed), draw(seed + 1)) << "seed " << seed;  // 100^-64 chance of a false failure
  // Pinned sequence: the draw must not depend on the platform's distributions.
  EXPECT_EQ(draw(42), draw(42));
  std::set<int32_t> distinct;
  for (int32_t t : draw(7)) distinct.insert(t);
  EXPECT_GT(distinct.size(), 30u);  // 64 uniform draws over 100 hit > 30 distinct almost surely
}

TEST(Sampler, DrawFrequenciesMatchTheDistribution) {
  // p = {.5, .3, .15, .05}; top-k 3 then leaves {.5, .3, .15} / .95.
  const auto logits = logits_of({0.15, 0.5, 0.05, 0.3});
  SamplerParams p = plain();
  p.top_k = 3;
  p.seed = test::test_seed();
  Sampler s(p, 4);
  constexpr int kDraws = 20000;
  std::vector<int> count(4, 0);
  for (int i = 0; i < kDraws; ++i) count[size_t(s.sample(logits))]++;
  EXPECT_EQ(count[2], 0) << "top-k must exclude the least likely token";
  const double expected[4] = {0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95};
  for (int t : {0, 1, 3}) {
    const double f = double(count[size_t(t)]) / kDraws;
    const double sigma = std::sqrt(expected[t] * (1 - expected[t]) / kDraws);
    EXPECT_NEAR(f, expected[t], 6 * sigma) << "token " << t << " seed " << p.seed;
  }
}

TEST(Sampler, HighTemperatureFlattensLowTemperatureSharpens) {
  const auto logits = logits_of({0.7, 0.2, 0.1});
  auto top_share = [&](float temp) {
    SamplerParams p = plain(temp);
    p.seed = test::test_seed();
    Sampler s(p, 3);
    int n0 = 0;
    for (int i = 0; i < 4000; ++i) n0 += s.sample(logits) == 0;
    return n0 / 4000.0;
  };
  // Expected shares: T=0.3 -> ~0.98, T=1 -> 0.7, T=3 -> ~0.46; 6-sigma bands are disjoint.
  const double cold = top_share(0.3f), warm = top_share(1.0f), hot = top_share(3.0f);
  EXPECT_GT(cold, 0.95);
  EXPECT_NEAR(warm, 0.7, 0.05);
  EXPECT_LT(hot, 0.55);
}

}  // namespace
}  // namespace sluice::decode
