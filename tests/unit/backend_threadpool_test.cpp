// The pool behind every CPU op: each index is visited exactly once, across many back-to-back jobs
// (the decode pattern), for several pool sizes and grains.
#include <atomic>
#include <vector>

#include "core/threadpool.h"
#include "test_util.h"

namespace sluice::core {
namespace {

TEST(ThreadPool, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 5, 64, 1000}) {
      for (int64_t grain : {1, 7, 64}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int ith) {
          ASSERT_GE(ith, 0);
          ASSERT_LT(ith, threads);
          for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
      }
    }
  }
}

TEST(ThreadPool, ManyBackToBackJobs) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 20000; ++job) {
    pool.parallel_for(16, 1, [&](int64_t b, int64_t e, int) { total.fetch_add(e - b); });
  }
  EXPECT_EQ(total.load(), 20000 * 16);
}

}  // namespace
}  // namespace sluice::core
