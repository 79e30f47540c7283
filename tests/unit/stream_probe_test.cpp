// The start-up disk probe on a file of the real disk: a positive median bandwidth within the
// min..max of its blocks, reads that stay inside the file, small files skipped, the time limit
// honoured, bad options rejected.
#include "stream/probe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "test_util.h"

namespace sluice::stream {
namespace {

class StreamProbe : public ::testing::Test {
 protected:
  // On the source tree's disk, not tmpfs, so O_DIRECT is exercised where the filesystem allows.
  std::string make_file(uint64_t bytes) {
    const auto dir = std::filesystem::path(test::source_dir()) / "build-test-io";
    std::filesystem::create_directories(dir);
    const std::string p = (dir / ("probe_" + std::to_string(::getpid()) + "_" + std::to_string(n_++) + ".bin")).string();
    std::vector<char> data(bytes, 'x');
    std::ofstream(p, std::ios::binary).write(data.data(), std::streamsize(data.size()));
    paths_.push_back(p);
    return p;
  }
  void TearDown() override {
    for (const auto& p : paths_) std::filesystem::remove(p);
  }
  int n_ = 0;
  std::vector<std::string> paths_;
};

TEST_F(StreamProbe, MeasuresAMedianInsideTheBlockRange) {
  const std::string path = make_file((24ull << 20) + 12345);  // not a multiple of the alignment
  ProbeOptions po;
  po.block_bytes = 4ull << 20;
  po.max_blocks = 5;
  po.max_seconds = 10;
  auto p = probe_disk(path, IoOptions{}, po);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_TRUE(p->measured);
  EXPECT_EQ(p->blocks, 5);
  EXPECT_EQ(p->block_bytes, 4ull << 20);
  EXPECT_EQ(p->bytes, 20ull << 20);
  EXPECT_GT(p->bytes_per_s, 0);
  EXPECT_LE(p->min_bytes_per_s, p->bytes_per_s);
  EXPECT_GE(p->max_bytes_per_s, p->bytes_per_s);
  EXPECT_NE(p->describe().find("GB/s"), std::string::npos);
}

TEST_F(StreamProbe, SmallFilesAreShortenedOrSkipped) {
  ProbeOptions po;  // 32 MiB blocks by default
  auto small = probe_disk(make_file(10ull << 20), IoOptions{}, po);
  ASSERT_TRUE(small.is_ok()) << small.status().message();
  EXPECT_TRUE(small->measured);
  EXPECT_LE(small->block_bytes, (10ull << 20) / 4) << "blocks shrink to a quarter of a small file";
  EXPECT_LE(small->bytes, 10ull << 20);
  auto tiny = probe_disk(make_file(100000), IoOptions{}, po);
  ASSERT_TRUE(tiny.is_ok()) << tiny.status().message();
  EXPECT_FALSE(tiny->measured);
  EXPECT_EQ(tiny->bytes_per_s, 0);
  EXPECT_NE(tiny->describe().find("not measured"), std::string::npos);
}

TEST_F(StreamProbe, StopsAtTheTimeLimit) {
  const std::string path = make_file(16ull << 20);
  ProbeOptions po;
  po.block_bytes = 1ull << 20;
  po.max_blocks = 16;
  po.max_seconds = 0;  // one block, then the limit is already passed
  auto p = probe_disk(path, IoOptions{}, po);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->blocks, 1);
}

TEST_F(StreamProbe, BadOptionsAndMissingFileAreErrors) {
  ProbeOptions po;
  po.block_bytes = 1000;
  EXPECT_EQ(probe_disk(make_file(1 << 20), IoOptions{}, po).status().code(), ErrorCode::kInvalidArgument);
  auto missing = probe_disk("/nonexistent/model.gguf", IoOptions{});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);
}

}  // namespace
}  // namespace sluice::stream
