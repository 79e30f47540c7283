// The disk-tier reader against plain file contents: every backend (io_uring, pread), direct and
// buffered, aligned ranges, many requests in flight, several files through one reader (split
// models), and the faults (short read, file changed).
#include "stream/io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "test_util.h"

namespace sluice::stream {
namespace {

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : size(n), p(static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, (n + kIoAlign - 1) / kIoAlign * kIoAlign))) {}
  ~AlignedBuf() { std::free(p); }
  size_t size;
  uint8_t* p;
};

class StreamIo : public ::testing::TestWithParam<std::tuple<IoKind, bool>> {
 protected:
  void SetUp() override {
    // A file on the real disk (not tmpfs), so O_DIRECT is exercised where the filesystem allows.
    dir_ = std::filesystem::path(test::source_dir()) / "build-test-io";
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / ("io_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".bin")).string();
    std::mt19937_64 rng(test::test_seed());
    data_.resize(size_t(5) * 1024 * 1024 + 12345);  // deliberately not a multiple of 4096
    for (auto& b : data_) b = uint8_t(rng());
    std::ofstream(path_, std::ios::binary).write(reinterpret_cast<const char*>(data_.data()), std::streamsize(data_.size()));
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::unique_ptr<FileReader> open_reader() {
    IoOptions o;
    o.kind = std::get<0>(GetParam());
    o.direct = std::get<1>(GetParam());
    o.chunk_bytes = 256 * 1024;  // several chunks per request
    o.queue_depth = 4;
    auto r = FileReader::open(path_, o);
    if (!r.is_ok()) {
      if (o.kind == IoKind::kUring && r.status().code() == ErrorCode::kUnsupported) return nullptr;
      ADD_FAILURE() << r.status().message();
      return nullptr;
    }
    return std::move(r).value();
  }

  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::string path_;
  std::vector<uint8_t> data_;
};

TEST_P(StreamIo, ReadsArbitraryRangesThroughAlignedSupersets) {
  auto r = open_reader();
  if (!r) GTEST_SKIP() << "io_uring not available on this kernel";
  std::mt19937_64 rng(test::test_seed() + 1);
  for (int i = 0; i < 50; ++i) {
    uint64_t off = rng() % data_.size();
    uint64_t len = 1 + rng() % std::min<uint64_t>(data_.size() - off, 3 << 20);
    AlignedRange a = align_range(off, len);
    ASSERT_EQ(a.offset % kIoAlign, 0u);
    ASSERT_EQ(a.len % kIoAlign, 0u);
    AlignedBuf buf(a.len);
    ASSERT_TRUE(r->read(a.offset, a.len, buf.p).is_ok());
    ASSERT_EQ(0, std::memcmp(buf.p + a.skip, data_.data() + off, len)) << "offset " << off << " len " << len;
  }
}

TEST_P(StreamIo, ManyRequestsInFlightCompleteInAnyWaitOrder) {
  auto r = open_reader();
  if (!r) GTEST_SKIP() << "io_uring not available on this kernel";
  constexpr uint64_t kPiece = 1 << 20;
  const uint64_t n = data_.size() / kPiece + 1;
  std::vector<std::unique_ptr<AlignedBuf>> bufs;
  std::vector<FileReader::Ticket> tickets;
  for (uint64_t i = 0; i < n; ++i) {
    bufs.push_back(std::make_unique<AlignedBuf>(kPiece));
    auto t = r->submit(i * kPiece, kPiece, bufs.back()->p);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    tickets.push_back(*t);
  }
  for (uint64_t k = n; k-- > 0;) {  // reverse order
    ASSERT_TRUE(r->wait(tickets[k]).is_ok());
    const uint64_t want = std::min<uint64_t>(kPiece, data_.size() - k * kPiece);
    ASSERT_EQ(0, std::memcmp(bufs[k]->p, data_.data() + k * kPiece, want)) << "piece " << k;
  }
  EXPECT_FALSE(r->wait(tickets[0]).is_ok()) << "a ticket is waited for once";
}

// A read of many more chunks than the queue holds completes while the caller does nothing (a
// layer of hundreds of MB must keep streaming while the CPU computes), and reports when its last
// byte arrived.
TEST_P(StreamIo, LargeReadProgressesWithoutTheCaller) {
  IoOptions o;
  o.kind = std::get<0>(GetParam());
  o.direct = std::get<1>(GetParam());
  o.chunk_bytes = 64 * 1024;  // 5 MiB = 81 chunks through a queue of 2
  o.queue_depth = 2;
  auto opened = FileReader::open(path_, o);
  if (!opened.is_ok()) {
    ASSERT_EQ(o.kind, IoKind::kUring) << opened.status().message();
    GTEST_SKIP() << "io_uring not available on this kernel";
  }
  FileReader& r = **opened;
  const AlignedRange a = align_range(0, data_.size());
  AlignedBuf buf(a.len);
  const auto t0 = FileReader::Clock::now();
  auto t = r.submit(a.offset, a.len, buf.p);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  const auto deadline = t0 + std::chrono::seconds(20);
  while (!r.is_done(*t) && FileReader::Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(r.is_done(*t)) << "the read did not progress without wait()";
  FileReader::Clock::time_point done{};
  ASSERT_TRUE(r.wait(*t, &done).is_ok());
  EXPECT_GE(done, t0);
  EXPECT_LE(done, FileReader::Clock::now());
  ASSERT_EQ(0, std::memcmp(buf.p, data_.data(), data_.size()));
}

TEST_P(StreamIo, ShortReadAndChangedFileAreErrors) {
  auto r = open_reader();
  if (!r) GTEST_SKIP() << "io_uring not available on this kernel";
  EXPECT_TRUE(r->check_unchanged().is_ok());
  AlignedBuf buf(1 << 20);
  auto beyond = r->read((data_.size() / kIoAlign + 1) * kIoAlign, kIoAlign, buf.p);
  EXPECT_FALSE(beyond.is_ok());
  // Truncate behind the reader's back: reads of the lost part fail, never return stale bytes.
  std::filesystem::resize_file(path_, 1 << 20);
  Status s = r->read(2 << 20, 1 << 20, buf.p);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("short read"), std::string::npos) << s.message();
  Status c = r->check_unchanged();
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.message().find("changed while running"), std::string::npos) << c.message();
}

// Several files through one reader (the shards of a split model): reads name their file, run
// interleaved in one queue, land with each file's bytes; a file index out of range, a read past
// the end of the shorter file and a change to the second file are errors naming that file.
TEST_P(StreamIo, SeveralFilesThroughOneReader) {
  const std::string second = path_ + ".second";
  std::vector<uint8_t> other(size_t(3) * 1024 * 1024 + 777);
  std::mt19937_64 rng(test::test_seed() + 2);
  for (auto& b : other) b = uint8_t(rng());
  std::ofstream(second, std::ios::binary).write(reinterpret_cast<const char*>(other.data()), std::streamsize(other.size()));
  IoOptions o;
  o.kind = std::get<0>(GetParam());
  o.direct = std::get<1>(GetParam());
  o.chunk_bytes = 256 * 1024;
  o.queue_depth = 4;
  auto opened = FileReader::open(std::vector<std::string>{path_, second}, o);
  if (!opened.is_ok()) {
    std::filesystem::remove(second);
    ASSERT_EQ(o.kind, IoKind::kUring) << opened.status().message();
    GTEST_SKIP() << "io_uring not available on this kernel";
  }
  FileReader& r = **opened;
  ASSERT_EQ(r.n_files(), 2u);
  EXPECT_EQ(r.file_size(0), data_.size());
  EXPECT_EQ(r.file_size(1), other.size());
  EXPECT_EQ(r.path(1), second);
  const std::vector<uint8_t>* files[] = {&data_, &other};
  struct Read {
    uint32_t file;
    AlignedRange a;
    uint64_t off, len;
    std::unique_ptr<AlignedBuf> buf;
    FileReader::Ticket t;
  };
  std::vector<Read> reads;
  for (int i = 0; i < 24; ++i) {
    Read rd;
    rd.file = uint32_t(i % 2);
    const uint64_t size = files[rd.file]->size();
    rd.off = rng() % size;
    rd.len = 1 + rng() % std::min<uint64_t>(size - rd.off, 1 << 20);
    rd.a = align_range(rd.off, rd.len);
    rd.buf = std::make_unique<AlignedBuf>(rd.a.len);
    auto t = r.submit(rd.file, rd.a.offset, rd.a.len, rd.buf->p);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    rd.t = *t;
    reads.push_back(std::move(rd));
  }
  for (auto& rd : reads) {
    ASSERT_TRUE(r.wait(rd.t).is_ok());
    ASSERT_EQ(0, std::memcmp(rd.buf->p + rd.a.skip, files[rd.file]->data() + rd.off, rd.len))
        << "file " << rd.file << " offset " << rd.off;
  }
  AlignedBuf buf(kIoAlign);
  auto bad = r.submit(2, 0, kIoAlign, buf.p);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("file index 2"), std::string::npos) << bad.status().message();
  // Inside the first file, beyond the end of the second.
  auto beyond = r.submit(1, (other.size() / kIoAlign + 1) * kIoAlign, kIoAlign, buf.p);
  ASSERT_FALSE(beyond.is_ok());
  EXPECT_NE(beyond.status().message().find(second + ": read at offset"), std::string::npos)
      << beyond.status().message();
  EXPECT_TRUE(r.check_unchanged().is_ok());
  std::filesystem::resize_file(second, 1 << 20);
  const Status c = r.check_unchanged();
  EXPECT_NE(c.message().find(second + ": the model file changed while running"), std::string::npos) << c.message();
  std::filesystem::remove(second);
}

INSTANTIATE_TEST_SUITE_P(Readers, StreamIo,
                         ::testing::Combine(::testing::Values(IoKind::kUring, IoKind::kPread), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(io_kind_name(std::get<0>(info.param))) == "io_uring"
                                      ? std::string("uring") + (std::get<1>(info.param) ? "_direct" : "_buffered")
                                      : std::string("pread") + (std::get<1>(info.param) ? "_direct" : "_buffered");
                         });

TEST(StreamIoOpen, MissingFileAndBadOptions) {
  auto r = FileReader::open("/nonexistent/model.gguf", {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("/nonexistent/model.gguf"), std::string::npos);
  IoOptions o;
  o.chunk_bytes = 1000;
  EXPECT_FALSE(FileReader::open("/dev/null", o).is_ok());
  o.chunk_bytes = 2ull << 30;  // beyond what one io_uring request can carry
  EXPECT_FALSE(FileReader::open("/dev/null", o).is_ok());
}

TEST(StreamIoOpen, UnalignedDirectReadIsRejected) {
  auto r = FileReader::open("/proc/self/exe", {});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  if (!(*r)->direct()) GTEST_SKIP() << "filesystem refused O_DIRECT";
  std::vector<uint8_t> buf(8192);
  EXPECT_FALSE((*r)->read(1, 4096, buf.data() + 1).is_ok());
}

}  // namespace
}  // namespace sluice::stream
