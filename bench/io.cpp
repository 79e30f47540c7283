// Disk-tier bandwidth: sequential read of one file with sluice's reader (io_uring + O_DIRECT at
// several queue depths, pread worker) against plain buffered reads from a cold page cache, and
// warm (page cache) reads as the RAM ceiling. Prints a table; median of the runs.
//
// usage: bench_io FILE [--runs N] [--max-bytes BYTES] [--probe] [--ref NAME=GBPS]...
//   --probe      adds the start-up disk probe's figure (probe_disk() with the streamer's reader
//                options, as `sluice ... --plan` prints it) and its description under the table
//   --ref N=G    adds a row measured elsewhere (bench/io_compare.sh: fio) to the same table
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
#include "stream/probe.h"

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
  const char* usage = "usage: %s FILE [--runs N] [--max-bytes BYTES] [--probe] [--ref NAME=GBPS]...\n";
  if (argc < 2) {
    std::fprintf(stderr, usage, argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  int runs = 3;
  uint64_t max_bytes = UINT64_MAX;
  bool with_probe = false;
  struct Ref {
    std::string name;
    double gbps;
  };
  std::vector<Ref> refs;
  for (int i = 2; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--probe")) {
      with_probe = true;
    } else if (!std::strcmp(argv[i], "--runs") && has_value) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--max-bytes") && has_value) {
      max_bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--ref") && has_value) {
      const std::string r = argv[++i];
      const size_t eq = r.rfind('=');
      if (eq == std::string::npos || eq == 0) {
        std::fprintf(stderr, "bench_io: --ref wants NAME=GBPS, got '%s'\n", r.c_str());
        return 2;
      }
      refs.push_back({r.substr(0, eq), std::strtod(r.c_str() + eq + 1, nullptr)});
    } else {
      std::fprintf(stderr, usage, argv[0]);
      return 2;
    }
  }
  auto opened = FileReader::open(path, {});
  if (!opened.is_ok()) {
    std::fprintf(stderr, "bench_io: %s\n", opened.status().message().c_str());
    return 2;
  }
  const uint64_t chunk4m = 4ull << 20;
  const uint64_t bytes = std::min((*opened)->file_size(), max_bytes) / chunk4m * chunk4m;
  if (bytes == 0) {
    std::fprintf(stderr, "bench_io: %s is smaller than 4 MiB\n", path.c_str());
    return 2;
  }
  opened->reset();

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
  struct Measured {
    std::string name;
    double gbps;
    bool cold;  // a disk figure ("vs best" is relative to the best of these)
  };
  std::vector<Measured> results;
  for (const Row& row : rows) {
    std::vector<double> v;
    if (!row.cold) run_reader(path, row.kind, row.direct, row.depth, chunk4m, bytes);  // warm it
    for (int r = 0; r < runs; ++r) {
      if (row.cold) evict(path);
      v.push_back(run_reader(path, row.kind, row.direct, row.depth, chunk4m, bytes));
    }
    results.push_back({row.name, median(v), row.cold});
  }
  // The start-up probe exactly as the streamers run it: their IoOptions, default ProbeOptions.
  std::string probe_text;
  if (with_probe) {
    const sluice::stream::IoOptions io;
    std::vector<double> v;
    for (int r = 0; r < runs; ++r) {
      evict(path);
      auto p = sluice::stream::probe_disk(path, io);
      if (!p.is_ok()) {
        std::fprintf(stderr, "bench_io: probe: %s\n", p.status().message().c_str());
        v.push_back(-1);
        continue;
      }
      v.push_back(p->bytes_per_s / 1e9);
      probe_text = p->describe();
    }
    char name[64];
    std::snprintf(name, sizeof name, "start-up probe, qd %u", io.queue_depth);
    results.push_back({name, median(v), true});
  }
  for (const Ref& r : refs) results.push_back({r.name, r.gbps, true});

  double best_cold = 0;
  for (const Measured& r : results) {
    if (r.cold) best_cold = std::max(best_cold, r.gbps);
  }
  std::printf("file %s, %.2f GB read per run, 4 MiB requests, median of %d runs\n", path.c_str(), bytes / 1e9, runs);
  std::printf("| %-32s | %8s | %8s |\n", "reader", "GB/s", "vs best");
  std::printf("|%s|%s|%s|\n", std::string(34, '-').c_str(), std::string(10, '-').c_str(), std::string(10, '-').c_str());
  for (const Measured& r : results) {
    std::printf("| %-32s | %8.2f | %7.0f%% |\n", r.name.c_str(), r.gbps, best_cold > 0 ? 100.0 * r.gbps / best_cold : 0.0);
  }
  std::printf("vs best: of the best disk row (the warm-cache row is RAM)\n");
  if (with_probe) std::printf("start-up probe (last run): %s\n", probe_text.c_str());
  return 0;
}
