#include "stream/probe.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <vector>

#include "stream/plan.h"

namespace sluice::stream {

std::string DiskProbe::describe() const {
  if (!measured) return "not measured (file too small to probe)";
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%.2f GB/s (%d %s reads of %s, queue depth %u x %s, %d block%s in flight; per block median %.2f, "
                "%.2f-%.2f GB/s; %.2f s)",
                bytes_per_s / 1e9, blocks, direct ? "O_DIRECT" : "buffered", format_bytes(block_bytes).c_str(),
                queue_depth, format_bytes(chunk_bytes).c_str(), blocks_in_flight, blocks_in_flight == 1 ? "" : "s",
                median_bytes_per_s / 1e9, min_bytes_per_s / 1e9, max_bytes_per_s / 1e9, seconds);
  return buf;
}

namespace {

using Clock = FileReader::Clock;

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Status check_options(const ProbeOptions& opts) {
  if (opts.block_bytes == 0 || opts.block_bytes % kIoAlign || opts.max_blocks < 1) {
    return invalid_argument("disk probe: block size must be a positive multiple of 4096 and blocks >= 1");
  }
  return Status::ok();
}

Result<DiskProbe> probe_from(FileReader& reader, const IoOptions& io, const ProbeOptions& opts, Clock::time_point t0) {
  DiskProbe p;
  p.direct = reader.direct();
  const uint64_t size = reader.file_size();
  if (size < opts.min_file_bytes) return p;
  uint64_t block = opts.block_bytes;
  if (size < 2 * block) block = std::max<uint64_t>(kIoAlign, size / 4 / kIoAlign * kIoAlign);
  const uint64_t span = size / kIoAlign * kIoAlign - block;  // last aligned start that fits
  const int n = int(std::min<uint64_t>(uint64_t(opts.max_blocks), std::max<uint64_t>(1, size / block)));

  // The reader's depth, as the streamers see it: pread runs at most 4 workers.
  const uint64_t chunk = std::max<uint64_t>(kIoAlign, io.chunk_bytes);
  const uint32_t depth = std::max<uint32_t>(1, reader.kind() == IoKind::kPread ? std::min<uint32_t>(io.queue_depth, 4)
                                                                               : io.queue_depth);
  // Blocks submitted at once: while the probe waits for the oldest, the others must still hold
  // `depth` requests, so the queue stays full when it completes (the streamers queue whole layers).
  const uint64_t requests_per_block = (block + chunk - 1) / chunk;
  const int window = int(std::min<uint64_t>(std::max<uint64_t>((depth + requests_per_block - 1) / requests_per_block + 1, 2),
                                            uint64_t(n)));

  struct Free {
    void operator()(uint8_t* q) const { std::free(q); }
  };
  const uint64_t buf_bytes = block * uint64_t(window);
  std::unique_ptr<uint8_t, Free> buf(static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, buf_bytes)));
  if (!buf) return out_of_memory("disk probe: cannot allocate " + format_bytes(buf_bytes));

  std::deque<FileReader::Ticket> q;  // submitted, oldest first
  std::vector<Clock::time_point> submitted, completed;
  uint64_t done_bytes = 0;
  int next = 0, most = 0;
  Status error;
  // A block is submitted while the limit is not reached and the blocks already queued, at the rate
  // measured so far, would not take the probe past it. The first block always is.
  auto may_submit = [&](Clock::time_point now) {
    if (next >= n || q.size() >= size_t(window)) return false;
    if (next == 0) return true;
    const double elapsed = secs(now - t0);
    if (elapsed > opts.max_seconds) return false;
    if (done_bytes > 0) {
      const double rate = double(done_bytes) / std::max(secs(now - submitted.front()), 1e-9);
      if (elapsed + double(q.size() + 1) * double(block) / rate > opts.max_seconds) return false;
    }
    return true;
  };
  for (;;) {
    while (error.is_ok() && may_submit(Clock::now())) {
      // Evenly spread, aligned: blocks never overlap, so no block is served from a cache another
      // one filled (the drive's, or the page cache without O_DIRECT).
      const uint64_t off = n > 1 ? span / uint64_t(n - 1) * uint64_t(next) / kIoAlign * kIoAlign : 0;
      uint8_t* dst = buf.get() + uint64_t(next % window) * block;
      submitted.push_back(Clock::now());
      auto t = reader.submit(off, block, dst);
      if (!t.is_ok()) {
        submitted.pop_back();
        error = t.status();
        break;
      }
      q.push_back(*t);
      ++next;
      most = std::max(most, int(q.size()));
    }
    if (q.empty()) break;
    // Every submitted read is waited for, also after an error: the buffer outlives them all.
    Clock::time_point c{};
    Status st = reader.wait(q.front(), &c);
    q.pop_front();
    if (!st.is_ok()) {
      if (error.is_ok()) error = std::move(st);
      continue;
    }
    completed.push_back(c);
    done_bytes += block;
  }
  if (!error.is_ok()) return error;

  // Per block, a sliding rate: for the k-th completion (in time order), the `window` blocks that
  // completed since the (k - window)-th, over that time; the first full window counts from the
  // first submit, and the partial ones before it are left out (blocks that share the device
  // complete late while the queue fills). Blocks that complete in bunches (a parallel device, the
  // page cache) then do not read as infinitely fast (a block submitted after a window's start
  // completes inside it), and one stalled block moves only the rates whose windows span it.
  std::vector<Clock::time_point> sorted = completed;
  std::sort(sorted.begin(), sorted.end());
  const size_t w = std::min(size_t(window), sorted.size());
  std::vector<double> rates;
  for (size_t k = w - 1; k < sorted.size(); ++k) {
    const Clock::time_point from = k >= w ? sorted[k - w] : submitted.front();
    rates.push_back(double(block) * double(w) / std::max(secs(sorted[k] - from), 1e-9));
  }
  std::sort(rates.begin(), rates.end());
  const size_t m = rates.size();
  p.measured = true;
  p.blocks = int(completed.size());
  p.block_bytes = block;
  p.blocks_in_flight = most;
  p.queue_depth = depth;
  p.chunk_bytes = chunk;
  p.bytes = done_bytes;
  p.bytes_per_s = double(done_bytes) / std::max(secs(sorted.back() - submitted.front()), 1e-9);
  p.median_bytes_per_s = m % 2 ? rates[m / 2] : 0.5 * (rates[m / 2 - 1] + rates[m / 2]);
  p.min_bytes_per_s = rates.front();
  p.max_bytes_per_s = rates.back();
  p.seconds = secs(Clock::now() - t0);
  return p;
}

}  // namespace

Result<DiskProbe> probe_disk(const std::string& path, const IoOptions& io, const ProbeOptions& opts) {
  SLUICE_RETURN_IF_ERROR(check_options(opts));
  const auto t0 = Clock::now();
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<FileReader> reader, FileReader::open(path, io));
  return probe_from(*reader, io, opts, t0);
}

Result<DiskProbe> probe_reader(FileReader& reader, const IoOptions& io, const ProbeOptions& opts) {
  SLUICE_RETURN_IF_ERROR(check_options(opts));
  return probe_from(reader, io, opts, Clock::now());
}

}  // namespace sluice::stream
