// Access trace of the streaming pipelines: one CSV row per interval of work (a disk read into a
// slot, a stall, a layer's compute, later an H2D copy or a GPU kernel span), so a timeline shows
// what overlapped and what waited. The format is documented in docs/STREAMING.md and read by
// bench/plot/timeline.py; every pipeline (CPU now, GPU later) writes the same columns and only
// adds lanes.
//
//   t_start_us,t_end_us,lane,layer,tensor,tier,bytes
//
// Times are microseconds since the writer was opened (steady clock). Rows are appended from any
// thread, buffered, and written in batches, so the hot path costs a lock and a copy, not a write.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace sluice::stream {

// Lane names in use (free text; the plot groups rows by lane):
//   "load"         reads of the resident weights at start-up
//   "disk slot K"  an O_DIRECT read of a layer into RAM slot K (submit -> last byte arrived)
//   "stall"        compute waiting for a slot's read
//   "cpu"          the CPU computing one layer (acquire -> release)
// Reserved for the GPU pipeline: "h2d slot K" (copy into VRAM slot K), "gpu" (kernels of a layer).
struct TraceEvent {
  int64_t t_start_us = 0;
  int64_t t_end_us = 0;
  std::string lane;
  int layer = -1;      // -1: not a layer (load, output head)
  std::string tensor;  // tensor or unit name: "blk.3", "blk.3.ffn_up.weight", "resident"
  std::string tier;    // where the bytes came from: "disk", "ram", "vram"
  uint64_t bytes = 0;
};

class TraceWriter {
 public:
  using Clock = std::chrono::steady_clock;

  // Creates (truncates) `path` and writes the header. Error (kIo) names the path.
  static Result<std::unique_ptr<TraceWriter>> open(const std::string& path);
  ~TraceWriter();  // flushes; an error here is lost, so callers flush() first to report it

  // Microseconds since open().
  int64_t us(Clock::time_point t) const;
  int64_t now_us() const { return us(Clock::now()); }

  // Thread-safe. Rows are written when the buffer is full and at flush().
  void append(TraceEvent e);
  // Writes the buffered rows and flushes the file. Error (kIo) names the path; sticky.
  Status flush();

  uint64_t events() const;
  const std::string& path() const { return path_; }

  static constexpr const char* kHeader = "t_start_us,t_end_us,lane,layer,tensor,tier,bytes";

 private:
  TraceWriter() = default;
  Status write_locked();  // under mu_

  std::string path_;
  Clock::time_point epoch_;
  mutable std::mutex mu_;
  FILE* file_ = nullptr;
  std::vector<TraceEvent> buffer_;
  uint64_t n_events_ = 0;
  Status status_;
};

// A CSV field: as is, or quoted (RFC 4180) when it holds a comma, quote or line break.
std::string csv_field(const std::string& s);

}  // namespace sluice::stream
