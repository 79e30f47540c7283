// Disk-tier bandwidth: sequential read of one file with sluice's reader (io_uring + O_DIRECT at
// several queue depths, pread worker) against plain buffered reads from a cold page cache, and
// warm (page cache) reads as the RAM ceiling. Prints a table; median of the runs.
//
// usage: bench_io FILE [--runs N] [--max-bytes BYTES]
// The cold-cache rows evict the file with posix_fadvise(DONTNEED) before each run (no root needed).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "stream/io.h"

namespace {

using sluice::stream::FileReader;
using sluice::stream::IoKind;
using sluice::stream::IoOptions;
using sluice::stream::kIoAlign;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void evict(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Reads [0, bytes) through a ring of `depth` buffers of `chunk` bytes; returns GB/s or < 0.
double run_reader(const std::string& path, IoKind kind, bool direct, uint32_t depth, uint64_t chunk, uint64_t bytes) {
  IoOptions o;
  o.kind = kind;
  o.direct = direct;
  o.queue_depth = depth;
  o.chunk_bytes = chunk;
  auto r = FileReader::open(path, o);
  if (!r.is_ok()) {
    std::fprintf(stderr, "%s\n", r.status().message().c_str());
    return -1;
  }
  std::vector<uint8_t*> bufs(depth);
  for (auto& b : bufs) b = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, chunk));
  std::vector<FileReader::Ticket> tickets(depth, 0);
  const uint64_t n = (bytes + chunk - 1) / chunk;
  const double t0 = now();
  bool ok = true;
  for (uint64_t i = 0; i < n + depth && ok; ++i) {
    const uint64_t slot = i % depth;
    if (i >= depth) ok = (*r)->wait(tickets[slot]).is_ok();
    if (i < n && ok) {
      auto t = (*r)->submit(i * chunk, chunk, bufs[slot]);
      ok = t.is_ok();
      if (ok) tickets[slot] = *t;
    }
  }
  const double dt = now() - t0;
  for (auto b : bufs) std::free(b);
  return ok ? double(bytes) / dt / 1e9 : -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE [--runs N] [--max-bytes BYTES]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  int runs = 3;
  uint64_t max_bytes = UINT64_MAX;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--runs")) runs = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--max-bytes")) max_bytes = std::strtoull(argv[i + 1], nullptr, 10);
  }
  auto probe = FileReader::open(path, {});
  if (!probe.is_ok()) {
    std::fprintf(stderr, "bench_io: %s\n", probe.status().message().c_str());
    return 2;
  }
  const uint64_t chunk4m = 4ull << 20;
  const uint64_t bytes = std::min((*probe)->file_size(), max_bytes) / chunk4m * chunk4m;
  if (bytes == 0) {
    std::fprintf(stderr, "bench_io: %s is smaller than 4 MiB\n", path.c_str());
    return 2;
  }
  probe->reset();

  struct Row {
    const char* name;
    IoKind kind;
    bool direct;
    uint32_t depth;
    bool cold;
  };
  const Row rows[] = {
      {"io_uring O_DIRECT, qd 1", IoKind::kUring, true, 1, true},
      {"io_uring O_DIRECT, qd 4", IoKind::kUring, true, 4, true},
      {"io_uring O_DIRECT, qd 8", IoKind::kUring, true, 8, true},
      {"io_uring O_DIRECT, qd 16", IoKind::kUring, true, 16, true},
      {"pread worker O_DIRECT", IoKind::kPread, true, 2, true},
      {"buffered pread, cold cache", IoKind::kPread, false, 2, true},
      {"buffered pread, warm cache", IoKind::kPread, false, 2, false},
  };
  std::printf("file %s, %.2f GB read per run, 4 MiB requests, median of %d runs\n", path.c_str(), bytes / 1e9, runs);
  std::printf("| %-28s | %8s | %8s |\n", "reader", "GB/s", "vs best");
  std::printf("|%s|%s|%s|\n", std::string(30, '-').c_str(), std::string(10, '-').c_str(), std::string(10, '-').c_str());
  std::vector<double> results;
  for (const Row& row : rows) {
    std::vector<double> v;
    if (!row.cold) run_reader(path, row.kind, row.direct, row.depth, chunk4m, bytes);  // warm it
    for (int r = 0; r < runs; ++r) {
      if (row.cold) evict(path);
      v.push_back(run_reader(path, row.kind, row.direct, row.depth, chunk4m, bytes));
    }
    results.push_back(median(v));
  }
  const double best_cold = *std::max_element(results.begin(), results.end() - 1);
  for (size_t i = 0; i < results.size(); ++i) {
    std::printf("| %-28s | %8.2f | %7.0f%% |\n", rows[i].name, results[i], 100.0 * results[i] / best_cold);
  }
  return 0;
}
