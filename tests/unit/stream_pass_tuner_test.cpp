#include "stream/pass_tuner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "test_util.h"

namespace sluice::stream {
namespace {

// A 32-token pass of the 70B on the H200 host as measured (docs/SERVING.md): a CPU layer ~23 ms,
// a copy ~9.4 ms hidden behind the CPU, 57 streamed layers, the GPU's layers ~45 ms in all.
double pass_ms(int cpu) { return std::max(23.0 * cpu, 9.4 * (57 - cpu)) + 45.0; }

// Feeds the tuner until it settles (at most `limit` passes), each pass's time f(count) times a
// noise factor; returns the passes used (limit + 1 if it never settled).
int drive(CountTuner& t, const std::function<double(int)>& f, double noise, std::mt19937& rng, int limit = 400) {
  std::uniform_real_distribution<double> u(1 - noise, 1 + noise);
  for (int i = 0; i < limit; ++i) {
    if (t.settled()) return i;
    t.observe(f(t.count()) * 1e-3 * u(rng));
  }
  return t.settled() ? limit : limit + 1;
}

// The exact minimum of pass_ms over 0 .. 57: the copy and CPU terms cross at 16.5.
int best_count() {
  int best = 0;
  for (int c = 1; c <= 57; ++c) best = pass_ms(c) < pass_ms(best) ? c : best;
  return best;
}

// A clear valley at 8, 10% a step.
double valley_ms(int c) { return 100.0 + 10.0 * std::abs(c - 8); }

TEST(CountTuner, WalksDownToTheFastestCount) {
  std::mt19937 rng(uint32_t(test::test_seed()));
  CountTuner t(11, 20);
  EXPECT_EQ(t.count(), 11);
  const int passes = drive(t, valley_ms, 0, rng);
  EXPECT_TRUE(t.settled());
  EXPECT_EQ(t.count(), 8) << t.describe();
  // 11 (the planner's), 10, 9, 8, then 7 and 6 (slower: the patience of one, then stop) at three
  // passes each.
  EXPECT_EQ(passes, 18) << t.describe();
  EXPECT_EQ(t.counts_measured(), 6);
  EXPECT_EQ(t.describe().rfind("11 -> 8 (settled; 11: 130.0 ms, 10: 120.0 ms", 0), 0u) << t.describe();
}

TEST(CountTuner, WalksUpWhenOneFewerIsNoFaster) {
  std::mt19937 rng(uint32_t(test::test_seed()));
  CountTuner t(5, 20);
  drive(t, valley_ms, 0, rng);
  EXPECT_TRUE(t.settled());
  // 5, then 4 and 3 (slower), then up 6, 7, 8, and 9 and 10 slower: settles on 8.
  EXPECT_EQ(t.count(), 8) << t.describe();
  EXPECT_EQ(t.counts_measured(), 8) << t.describe();
}

TEST(CountTuner, TheMeasuredSeventyBPassStopsWithinTheMargin) {
  // pass_ms: 19 -> 18 -> 17 are 4.8% and 5.0% faster; 16 is 1.3% faster than 17, under the 2%
  // margin, and 15 slower than 17, so the tuner stops at 17, one layer from the optimum.
  std::mt19937 rng(uint32_t(test::test_seed()));
  ASSERT_EQ(best_count(), 16);
  CountTuner t(19, 57);
  drive(t, pass_ms, 0, rng);
  EXPECT_EQ(t.count(), 17) << t.describe();
  EXPECT_EQ(t.counts_measured(), 5) << t.describe();
}

TEST(CountTuner, StaysWhenNeitherNeighbourIsFasterByTheMargin) {
  std::mt19937 rng(uint32_t(test::test_seed()));
  // Flat within 1%: the planner's count stands (after trying two fewer and two more).
  CountTuner t(10, 20);
  drive(t, [](int c) { return 100.0 * (1 + 0.005 * std::abs(c - 9)); }, 0, rng);
  EXPECT_TRUE(t.settled());
  EXPECT_EQ(t.count(), 10) << t.describe();
  EXPECT_EQ(t.counts_measured(), 5) << t.describe();
  // Without patience: one fewer and one more.
  CountTuner t0(10, 20, {.samples = 3, .min_gain = 0.02, .patience = 0});
  drive(t0, [](int c) { return 100.0 * (1 + 0.005 * std::abs(c - 9)); }, 0, rng);
  EXPECT_EQ(t0.count(), 10) << t0.describe();
  EXPECT_EQ(t0.counts_measured(), 3) << t0.describe();
}

TEST(CountTuner, NoisyPassesLandNearTheMinimum) {
  // 1% noise per pass (the median of three): from above or at the optimum the walk ends at 16 or
  // 17, never slower than where it started, and always settles.
  std::mt19937 rng(uint32_t(test::test_seed()));
  for (int start : {17, 19, 22}) {
    for (int trial = 0; trial < 100; ++trial) {
      CountTuner t(start, 57);
      const int passes = drive(t, pass_ms, 0.01, rng);
      ASSERT_LE(passes, 400) << t.describe();
      EXPECT_TRUE(t.count() == 16 || t.count() == 17) << "start " << start << ": " << t.describe();
      EXPECT_LE(pass_ms(t.count()), pass_ms(start)) << t.describe();
    }
  }
}

// The pass model's curve (bench/e2e/pass_model.py --cpu-ms 22.1 --copy-ms 10.3, 3 slots, 20 layers
// resident) for 0 .. 40 CPU layers: the rates of the 32-token passes of an H100 host's 70B run at 32
// concurrent (2026-12-08), where the walk without patience stopped at 21 (pass_tuner.h).
double h100_model_ms(int c) {
  static constexpr double kMs[] = {618.9, 608.6, 598.3, 588.0, 577.7, 567.4, 557.1, 546.8, 536.5, 526.2, 519.5,
                                   509.2, 498.9, 488.6, 478.3, 477.4, 468.1, 457.8, 459.0, 480.5, 502.0, 523.5,
                                   545.0, 566.5, 588.0, 609.5, 631.0, 652.5, 674.0, 695.5, 717.0, 738.3, 759.5,
                                   780.7, 801.9, 823.1, 844.3, 865.5, 886.7, 907.9, 929.1};
  return kMs[c];
}

// The mean settled pass time over `trials` walks from each start, per-pass noise +-`noise`.
double mean_settled_ms(int patience, double noise, int trials, std::mt19937& rng) {
  double sum = 0;
  int n = 0;
  for (int start : {19, 21, 22, 24}) {
    for (int trial = 0; trial < trials; ++trial) {
      CountTuner t(start, 40, {.samples = 3, .min_gain = 0.02, .patience = patience});
      EXPECT_LE(drive(t, h100_model_ms, noise, rng), 400) << t.describe();
      sum += h100_model_ms(t.count());
      ++n;
    }
  }
  return sum / n;
}

TEST(CountTuner, PatienceCarriesTheWalkPastANoisyStep) {
  // Per-pass noise of +-4% on the measured slope (~4% a layer): without patience a median that
  // reads a step as flat ends the walk early, on average several layers above the minimum
  // (457.8 ms at 17); with the default patience of one the walk ends within 1% of it on average.
  std::mt19937 rng(uint32_t(test::test_seed()));
  const double with = mean_settled_ms(1, 0.04, 200, rng);
  const double without = mean_settled_ms(0, 0.04, 200, rng);
  EXPECT_LT(with, 457.8 * 1.01) << "patience 1: " << with << " ms, none: " << without << " ms";
  std::printf("mean settled pass: patience 1 %.1f ms, none %.1f ms\n", with, without);
  EXPECT_GT(without, 457.8 * 1.03) << "patience 1: " << with << " ms, none: " << without << " ms";
  // Noise-free, both walk down from 22 to 18 (17 is 0.3% faster: under the margin).
  for (int patience : {0, 1}) {
    CountTuner t(22, 40, {.samples = 3, .min_gain = 0.02, .patience = patience});
    drive(t, h100_model_ms, 0, rng);
    EXPECT_EQ(t.count(), 18) << t.describe();
  }
}

TEST(CountTuner, EdgesOfTheRange) {
  std::mt19937 rng(uint32_t(test::test_seed()));
  {
    CountTuner t(0, 4);  // 0 first, then 1 (fewer is impossible)
    drive(t, [](int c) { return 100.0 - 10 * c; }, 0, rng);
    EXPECT_EQ(t.count(), 4) << t.describe();  // up to the top, then nothing further
    EXPECT_TRUE(t.settled());
  }
  {
    CountTuner t(4, 4);
    drive(t, [](int c) { return 100.0 - 10 * c; }, 0, rng);
    EXPECT_EQ(t.count(), 4) << t.describe();  // 3 and 2 slower, 5 out of range
    EXPECT_EQ(t.counts_measured(), 3);
  }
  {
    CountTuner t(1, 4);  // 0 slower, then (nothing below 0) up: 2, 3, 4 faster each
    drive(t, [](int c) { return 100.0 - 10 * c; }, 0, rng);
    EXPECT_EQ(t.count(), 4) << t.describe();
    EXPECT_EQ(t.counts_measured(), 5) << t.describe();
  }
  {
    CountTuner t(7, 0);  // clamped; nothing to choose
    EXPECT_EQ(t.count(), 0);
    EXPECT_TRUE(t.settled());
    EXPECT_FALSE(t.observe(1.0));
  }
  {
    CountTuner t(-3, 5);
    EXPECT_EQ(t.count(), 0);
  }
}

TEST(CountTuner, IgnoresTimesThatAreNotPositive) {
  CountTuner t(5, 10, {.samples = 1, .min_gain = 0.02});
  EXPECT_FALSE(t.observe(0));
  EXPECT_FALSE(t.observe(-1));
  EXPECT_FALSE(t.observe(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(t.observe(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(t.counts_measured(), 0);
  EXPECT_TRUE(t.observe(1.0));  // one sample per count: measured, and the next count is tried
  EXPECT_EQ(t.count(), 4);
}

TEST(CountTuner, MedianRejectsOneOutlier) {
  // One pass in three much slower: the median ignores it (the first count's 10x is counted, as
  // no count has a median yet; later ones over 4x are dropped, IdleGapsAreNotPassTimes), and one
  // fewer (faster by 5%) is still taken.
  CountTuner t(5, 10);
  t.observe(1.0);
  t.observe(10.0);
  t.observe(1.0);
  ASSERT_EQ(t.count(), 4);
  t.observe(0.95);
  t.observe(3.5);
  t.observe(0.95);
  EXPECT_EQ(t.count(), 3);
}

TEST(CountTuner, IdleGapsAreNotPassTimes) {
  // Once a count is measured, a time over 4x the best median is an idle gap, not a pass: ignored.
  CountTuner t(5, 10);
  t.observe(1.0);
  t.observe(1.0);
  t.observe(1.0);
  ASSERT_EQ(t.count(), 4);
  EXPECT_FALSE(t.observe(4.5));
  EXPECT_FALSE(t.observe(30.0));
  t.observe(0.9);
  t.observe(0.9);
  EXPECT_TRUE(t.observe(3.9));  // the third sample (under 4x): 4 measured at median 0.9, faster
  EXPECT_EQ(t.count(), 3);
  EXPECT_NE(t.describe().find("4: 900.0 ms"), std::string::npos) << t.describe();
}

// A tuner for a size whose planner count is `planned`, settled at the valley's bottom `best`.
CountTuner settled_at(int planned, int best, int max_count = 57) {
  std::mt19937 rng(uint32_t(test::test_seed()));
  CountTuner t(planned, max_count);
  drive(t, [best](int c) { return 100.0 + 10.0 * std::abs(c - best); }, 0, rng);
  EXPECT_TRUE(t.settled());
  EXPECT_EQ(t.count(), best) << t.describe();
  return t;
}

TEST(CountTuner, NewSizesStartFromTheNearestSettledSizesCorrection) {
  std::map<int, CountTuner> tuners;
  EXPECT_EQ(corrected_start(20, 32, 57, tuners), 20);  // nothing tuned yet: the planner's count
  tuners.emplace(32, settled_at(19, 17));              // the planner was 2 too high at 32 tokens
  EXPECT_EQ(corrected_start(20, 30, 57, tuners), 18);
  EXPECT_EQ(corrected_start(1, 30, 57, tuners), 0);    // clamped
  EXPECT_EQ(corrected_start(20, 16, 57, tuners), 20);  // 32 is not within a quarter of 16
  EXPECT_EQ(corrected_start(20, 40, 57, tuners), 18);  // 32 is 8 away: within a quarter of 40
  tuners.emplace(35, settled_at(15, 18));              // +3 at 35 tokens, nearer to 34
  EXPECT_EQ(corrected_start(20, 34, 57, tuners), 23);
  EXPECT_EQ(corrected_start(20, 33, 57, tuners), 18);  // 32 is nearer
  EXPECT_EQ(corrected_start(56, 34, 57, tuners), 57);  // clamped to the candidates
  CountTuner moving(10, 57);                           // not settled: no correction taken from it
  tuners.emplace(31, moving);
  EXPECT_EQ(corrected_start(20, 31, 57, tuners), 18);
}

TEST(CountTuner, DescribeNamesThePlannerWhereItStartedElsewhere) {
  CountTuner t(17, 57);
  EXPECT_EQ(t.planned(), 17);
  t.set_planned(19);
  EXPECT_EQ(t.planned(), 19);
  EXPECT_EQ(t.describe().rfind("17 .. 17 (tuning; planner 19;", 0), 0u) << t.describe();
}

TEST(CountTuner, BadOptionsAreProgrammingErrors) {
  EXPECT_DEATH(CountTuner(1, 2, {.samples = 0, .min_gain = 0.02}), "samples");
  EXPECT_DEATH(CountTuner(1, -1), "negative");
  EXPECT_DEATH(CountTuner(1, 2, {.samples = 3, .min_gain = 0.02, .patience = -1}), "patience");
}

}  // namespace
}  // namespace sluice::stream
