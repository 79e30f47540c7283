// The main of every test executable: GoogleTest's, plus a listener that prints the random seed
// (test_util.h) after a failed test, so any failure on fresh random data can be replayed with
// SLUICE_TEST_SEED=<seed>.
#include <gtest/gtest.h>

#include <cstdio>

#include "test_util.h"

namespace {

class SeedOnFailure : public testing::EmptyTestEventListener {
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result() == nullptr || !info.result()->Failed()) return;
    std::printf("%s.%s failed; its random data replays with SLUICE_TEST_SEED=%llu\n", info.test_suite_name(),
                info.name(), static_cast<unsigned long long>(sluice::test::test_seed()));
    std::fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new SeedOnFailure);  // GoogleTest owns it
  return RUN_ALL_TESTS();
}
