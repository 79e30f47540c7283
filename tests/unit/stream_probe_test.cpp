// The start-up disk probe on a file of the real disk: a positive aggregate rate and a median block
// rate within the min..max of its blocks, reads that stay inside the file, small files skipped,
// the time limit honoured, bad options rejected. On reader stubs with a known latency: the probe
// keeps several blocks (the reader's queue depth) in flight, and its figures are the stub's rate.
#include "stream/probe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <unordered_map>
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
  EXPECT_GT(p->median_bytes_per_s, 0);
  EXPECT_LE(p->min_bytes_per_s, p->median_bytes_per_s);
  EXPECT_GE(p->max_bytes_per_s, p->median_bytes_per_s);
  // Defaults: queue depth 8 x 4 MiB (pread: 4 workers); a 4 MiB block is one request, so 9 (5)
  // blocks keep the depth queued behind the one waited for: all 5 at once.
  auto reader = FileReader::open(path, IoOptions{});
  ASSERT_TRUE(reader.is_ok());
  const uint32_t depth = (*reader)->kind() == IoKind::kPread ? 4 : IoOptions{}.queue_depth;
  EXPECT_EQ(p->queue_depth, depth);
  EXPECT_EQ(p->chunk_bytes, IoOptions{}.chunk_bytes);
  EXPECT_EQ(p->blocks_in_flight, 5);
  EXPECT_NE(p->describe().find("GB/s"), std::string::npos);
  EXPECT_NE(p->describe().find("queue depth " + std::to_string(depth) + " x 4.0 MiB"), std::string::npos)
      << p->describe();
}

TEST_F(StreamProbe, AggregateRateOnAWarmFileIsSane) {
  // Buffered reads of a file just written (page cache): the aggregate over overlapped blocks is
  // not below a quarter of the median block rate (it is the rate of the same reads, counted end
  // to end). Page-cache reads take a few ms here, so one descheduling on a shared machine can
  // halve the aggregate: the best of 3 attempts counts. A 2-core AVX-512 VM (2026-11-29) gave
  // 0.40 in every attempt (aggregate 8.9-9.9 GB/s against block medians of 22.7-28.5: the first
  // block of each probe reads at ~2.6 GB/s, and the whole probe lasts 10 ms).
  const std::string path = make_file(100ull << 20);
  IoOptions io;
  io.direct = false;
  io.queue_depth = 4;
  io.chunk_bytes = 2ull << 20;
  ProbeOptions po;
  po.block_bytes = 6ull << 20;
  po.max_blocks = 16;
  po.max_seconds = 10;
  double best_ratio = 0;
  std::string seen;
  for (int attempt = 0; attempt < 3 && best_ratio < 0.25; ++attempt) {
    auto p = probe_disk(path, io, po);
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    EXPECT_FALSE(p->direct);
    EXPECT_NE(p->describe().find("buffered"), std::string::npos);
    EXPECT_EQ(p->blocks, 16);
    EXPECT_EQ(p->blocks_in_flight, 3) << "3 requests per block, depth 4: 2 blocks queued behind the waited one";
    EXPECT_GT(p->bytes_per_s, 0);
    EXPECT_GT(p->median_bytes_per_s, 0);
    EXPECT_LE(p->seconds, 10);
    best_ratio = std::max(best_ratio, p->bytes_per_s / p->median_bytes_per_s);
    seen += p->describe() + "\n";
  }
  EXPECT_GE(best_ratio, 0.25) << seen;
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

// A reader without a file: each read completes `latency` after it was submitted (parallel: any
// number at once, like a deep device queue) or after the previous one completed (serial: one at a
// time), and reports that instant as its completion. Counts reads submitted and not yet waited.
class StubReader final : public FileReader {
 public:
  using FileReader::submit;
  using FileReader::wait;
  StubReader(uint64_t size, std::chrono::milliseconds latency, bool serial) : latency_(latency), serial_(serial) {
    OpenFile f;
    f.path = "stub";
    f.size = size;
    f.direct = true;
    files_.push_back(f);
    kind_ = IoKind::kUring;
  }
  Result<Ticket> submit(uint32_t file, uint64_t offset, uint64_t len, void*) override {
    if (file != 0 || offset + len > file_size()) return io_error("stub: read beyond the end");
    std::lock_guard<std::mutex> lk(mu_);
    const Clock::time_point start = serial_ ? std::max(Clock::now(), last_done_) : Clock::now();
    last_done_ = start + latency_;
    done_[next_] = last_done_;
    max_outstanding_ = std::max(max_outstanding_, int(done_.size()));
    ++submits_;
    return next_++;
  }
  Status wait(Ticket t, Clock::time_point* completed) override {
    Clock::time_point at;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = done_.find(t);
      if (it == done_.end()) return invalid_argument("stub: unknown ticket");
      at = it->second;
      done_.erase(it);
    }
    std::this_thread::sleep_until(at);
    if (completed) *completed = at;
    if (t == fail_ticket_) return io_error("stub: read " + std::to_string(t) + " failed");
    return Status::ok();
  }
  bool is_done(Ticket t) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = done_.find(t);
    return it == done_.end() || Clock::now() >= it->second;
  }
  int max_outstanding() const { return max_outstanding_; }
  size_t outstanding() {
    std::lock_guard<std::mutex> lk(mu_);
    return done_.size();
  }
  Ticket fail_ticket_ = 0;  // this read's wait() fails
  int submits() const { return submits_; }

 private:
  std::chrono::milliseconds latency_;
  bool serial_;
  std::mutex mu_;
  Ticket next_ = 1;
  Clock::time_point last_done_{};
  std::unordered_map<Ticket, Clock::time_point> done_;
  int max_outstanding_ = 0, submits_ = 0;
};

TEST(StreamProbeStub, KeepsTheReadersQueueDepthInFlight) {
  // 4 MiB blocks of one 4 MiB request each, queue depth 2: 3 blocks at once, so 2 requests stay
  // queued while the oldest is waited for. A device that serves any number in parallel in 40 ms
  // then delivers ~3 blocks per 40 ms; one block at a time (the old probe) would see 1.
  const uint64_t block = 4ull << 20;
  StubReader r(64ull << 20, std::chrono::milliseconds(40), /*serial=*/false);
  IoOptions io;
  io.queue_depth = 2;
  io.chunk_bytes = 4ull << 20;
  ProbeOptions po;
  po.block_bytes = block;
  po.max_blocks = 6;
  po.max_seconds = 10;
  auto p = probe_reader(r, io, po);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->blocks, 6);
  EXPECT_EQ(r.submits(), 6);
  EXPECT_EQ(r.max_outstanding(), 3);
  EXPECT_EQ(p->blocks_in_flight, 3);
  EXPECT_EQ(r.max_outstanding() * block, io.queue_depth * io.chunk_bytes + block);
  const double one_at_a_time = double(block) / 0.040;
  EXPECT_GT(p->bytes_per_s, 1.8 * one_at_a_time) << p->describe();  // ~3x, less the host's wake-ups
  EXPECT_LE(p->bytes_per_s, 3.05 * one_at_a_time) << p->describe();
  // Three blocks complete within microseconds of each other: the per-block rates still count
  // 40 ms for each window of three.
  EXPECT_GT(p->median_bytes_per_s, 1.8 * one_at_a_time) << p->describe();
  EXPECT_LE(p->max_bytes_per_s, 3.05 * one_at_a_time) << p->describe();
  EXPECT_NE(p->describe().find("queue depth 2 x 4.0 MiB, 3 blocks in flight"), std::string::npos) << p->describe();
}

TEST(StreamProbeStub, OverlappedBlocksAreNotCountedTwice) {
  // A device that serves one read at a time, 20 ms each: overlapping submissions must not make
  // a block look slower (waiting behind the previous one) or faster; every rate is block / 20 ms.
  const uint64_t block = 4ull << 20;
  StubReader r(64ull << 20, std::chrono::milliseconds(20), /*serial=*/true);
  IoOptions io;  // depth 8 x 4 MiB: 9 blocks wanted, capped at the 5 probed
  ProbeOptions po;
  po.block_bytes = block;
  po.max_blocks = 5;
  po.max_seconds = 10;
  auto p = probe_reader(r, io, po);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->blocks, 5);
  EXPECT_EQ(r.max_outstanding(), 5);
  const double rate = double(block) / 0.020;
  EXPECT_NEAR(p->median_bytes_per_s / rate, 1.0, 0.05) << p->describe();
  EXPECT_NEAR(p->bytes_per_s / rate, 1.0, 0.05) << p->describe();
}

TEST(StreamProbeStub, StopsSubmittingWhenTheQueuedBlocksWouldPassTheLimit) {
  // 100 ms per read, one at a time, limit 0.25 s: after the first block the rate is known and a
  // block is queued only while the queue would finish by the limit, so the probe ends near it
  // instead of after the 8 blocks (0.8 s) or a whole window past it.
  StubReader r(64ull << 20, std::chrono::milliseconds(100), /*serial=*/true);
  IoOptions io;
  io.queue_depth = 1;
  io.chunk_bytes = 4ull << 20;
  ProbeOptions po;
  po.block_bytes = 4ull << 20;
  po.max_blocks = 8;
  po.max_seconds = 0.25;
  auto p = probe_reader(r, io, po);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_GE(p->blocks, 2);
  EXPECT_LE(p->blocks, 3);
  EXPECT_LT(p->seconds, 0.45);
}

TEST(StreamProbeStub, AReadErrorIsReturnedAfterEveryReadWasWaitedFor) {
  // The second of three blocks in flight fails: the error comes back, and no read is left in
  // flight into the probe's buffer, which is freed on return.
  StubReader r(64ull << 20, std::chrono::milliseconds(5), /*serial=*/false);
  r.fail_ticket_ = 2;
  IoOptions io;
  io.queue_depth = 2;
  ProbeOptions po;
  po.block_bytes = 4ull << 20;
  po.max_seconds = 10;
  auto p = probe_reader(r, io, po);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("read 2 failed"), std::string::npos) << p.status().message();
  EXPECT_EQ(r.outstanding(), 0u);
  EXPECT_LT(r.submits(), 8) << "no block is submitted after the error";
}

}  // namespace
}  // namespace sluice::stream
