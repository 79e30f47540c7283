// The access trace writer: header, one well-formed row per event, appends from many threads all
// kept, batches larger than the buffer, CSV quoting, and an unwritable path as an error.
#include "stream/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "test_util.h"

namespace sluice::stream {
namespace {

std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("sluice_trace_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> v;
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

TEST(StreamTrace, ConcurrentAppendsAreAllWrittenAsRows) {
  const std::string path = temp_path("concurrent.csv");
  constexpr int kThreads = 4, kPerThread = 5000;  // 20000 rows: more than one write batch
  {
    auto w = TraceWriter::open(path);
    ASSERT_TRUE(w.is_ok()) << w.status().message();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const int64_t now = (*w)->now_us();
          (*w)->append({now, now + 1, "disk slot " + std::to_string(t), i, "blk." + std::to_string(i), "disk",
                        uint64_t(i) * 4096});
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ((*w)->events(), uint64_t(kThreads) * kPerThread);
    ASSERT_TRUE((*w)->flush().is_ok());
  }
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), size_t(kThreads) * kPerThread + 1);
  EXPECT_EQ(lines[0], "t_start_us,t_end_us,lane,layer,tensor,tier,bytes");
  std::set<std::pair<std::string, int>> seen;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f;
    std::stringstream ss(lines[i]);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    ASSERT_EQ(f.size(), 7u) << lines[i];
    EXPECT_LE(std::stoll(f[0]), std::stoll(f[1]));
    EXPECT_GE(std::stoll(f[0]), 0);
    EXPECT_EQ(f[4], "blk." + f[3]);
    EXPECT_EQ(std::stoull(f[6]), std::stoull(f[3]) * 4096);
    seen.insert({f[2], std::stoi(f[3])});
  }
  EXPECT_EQ(seen.size(), size_t(kThreads) * kPerThread) << "every (lane, layer) row exactly once";
  std::filesystem::remove(path);
}

TEST(StreamTrace, DestructorFlushesAndFieldsAreQuoted) {
  const std::string path = temp_path("quoted.csv");
  {
    auto w = TraceWriter::open(path);
    ASSERT_TRUE(w.is_ok());
    (*w)->append({0, 5, "cpu", -1, "odd,name \"x\"", "ram", 7});
  }
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], "0,5,cpu,-1,\"odd,name \"\"x\"\"\",ram,7");
  EXPECT_EQ(csv_field("plain"), "plain");
  std::filesystem::remove(path);
}

TEST(StreamTrace, UnwritablePathIsAnErrorNamingIt) {
  auto w = TraceWriter::open("/nonexistent-dir/trace.csv");
  ASSERT_FALSE(w.is_ok());
  EXPECT_EQ(w.status().code(), ErrorCode::kIo);
  EXPECT_NE(w.status().message().find("/nonexistent-dir/trace.csv"), std::string::npos);
}

TEST(StreamTrace, TimesCountFromOpen) {
  const std::string path = temp_path("times.csv");
  auto w = TraceWriter::open(path);
  ASSERT_TRUE(w.is_ok());
  const int64_t a = (*w)->now_us();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const int64_t b = (*w)->now_us();
  EXPECT_GE(a, 0);
  EXPECT_GE(b - a, 2000);
  EXPECT_LT(a, 10'000'000) << "epoch is the open, not the clock's origin";
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sluice::stream
