// core/progress.h driven by a fake clock and sink: rate-limited '\r' frames on a terminal, exactly
// one summary line otherwise, and progress_bar's lazy start and finish.
#include "core/progress.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sluice::core {
namespace {

struct Fake {
  std::vector<std::string> writes;
  double t = 100.0;
  ProgressOutput out(bool terminal) {
    ProgressOutput o;
    o.write = [this](std::string_view s) { writes.emplace_back(s); };
    o.terminal = terminal;
    o.now = [this] { return t; };
    return o;
  }
};

TEST(Progress, NotATerminalPrintsExactlyOneSummaryLine) {
  Fake f;
  {
    Progress p("writing x.gguf", 4ull << 30, f.out(false));
    for (int i = 0; i < 64; ++i) {
      f.t += 0.5;
      p.advance(64ull << 20);
    }
    EXPECT_TRUE(f.writes.empty());
    p.finish();
    p.finish();  // idempotent
  }              // and the destructor adds nothing
  ASSERT_EQ(f.writes.size(), 1u);
  // 4 GiB in 32 s.
  EXPECT_EQ(f.writes[0], "writing x.gguf: 4.00 GiB in 32.00 s, 0.13 GB/s\n");
}

TEST(Progress, TerminalRedrawsAtMostEveryTenthOfASecond) {
  Fake f;
  Progress p("load", 1000ull << 20, f.out(true));
  for (int i = 0; i < 100; ++i) {  // 100 chunks in 0.5 s: at most 5 frames
    f.t += 0.005;
    p.advance(5ull << 20);
  }
  EXPECT_LE(f.writes.size(), 5u);
  EXPECT_GE(f.writes.size(), 4u);
  for (const auto& w : f.writes) {
    EXPECT_EQ(w[0], '\r');
    EXPECT_EQ(w.find('\n'), std::string::npos);
  }
  // 500 of 1000 MiB after 0.5 s: half done, ETA 0:01.
  f.t += 0.2;
  p.set(500ull << 20);
  const std::string& last = f.writes.back();
  EXPECT_NE(last.find(" 50%"), std::string::npos) << last;
  EXPECT_NE(last.find("500.0 MiB / 1000.0 MiB"), std::string::npos) << last;
  EXPECT_NE(last.find("ETA 0:01"), std::string::npos) << last;
  EXPECT_NE(last.find("[############............]"), std::string::npos) << last;
  const size_t before = f.writes.size();
  p.finish();
  ASSERT_EQ(f.writes.size(), before + 1);
  EXPECT_EQ(f.writes.back().back(), '\n');
  EXPECT_EQ(f.writes.back()[0], '\r');
}

TEST(Progress, FormatsLargeSizesAndLongEtas) {
  Fake f;
  Progress p("pin", 100ull << 30, f.out(true));
  f.t += 10;
  p.set(1ull << 30);  // 1 GiB in 10 s: 99 GiB left, ~990 s
  EXPECT_NE(f.writes.back().find("1.00 GiB / 100.00 GiB"), std::string::npos) << f.writes.back();
  EXPECT_NE(f.writes.back().find("ETA 16:30"), std::string::npos) << f.writes.back();
  f.t += 1000;
  p.set(2ull << 30);  // 2 GiB in 1010 s: 98 GiB left, ~49490 s = 13:44:50
  EXPECT_NE(f.writes.back().find("ETA 13:44:50"), std::string::npos) << f.writes.back();
}

TEST(Progress, StoppedShortSaysHowFar) {
  Fake f;
  {
    Progress p("load", 2ull << 30, f.out(false));
    f.t += 1;
    p.advance(1ull << 30);
  }
  ASSERT_EQ(f.writes.size(), 1u);
  EXPECT_EQ(f.writes[0], "load: 1.00 GiB of 2.00 GiB in 1.00 s, 1.07 GB/s\n");
}

TEST(Progress, BarStartsAtFirstReportAndFinishesAtTotal) {
  Fake f;
  {
    ProgressFn fn = progress_bar("pinning", f.out(false));
    EXPECT_TRUE(f.writes.empty());
  }
  EXPECT_TRUE(f.writes.empty());  // never reported: nothing printed
  ProgressFn fn = progress_bar("pinning", f.out(false));
  fn(0, 300);
  f.t += 2;
  fn(100, 300);
  fn(300, 300);
  ASSERT_EQ(f.writes.size(), 1u);
  EXPECT_NE(f.writes[0].find("pinning: 0.0 MiB in 2.00 s"), std::string::npos) << f.writes[0];
  fn(300, 300);  // reports after the end change nothing
  EXPECT_EQ(f.writes.size(), 1u);
}

}  // namespace
}  // namespace sluice::core
