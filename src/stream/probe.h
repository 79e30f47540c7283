// Start-up disk probe: how fast this machine reads this model file with the reader the streamer
// will use (O_DIRECT, queue_depth requests of chunk_bytes in flight), so the planner predicts
// with a measured disk bandwidth instead of a default. Reads a few blocks spread over the file
// itself (no scratch file, same filesystem and device).
//
// Queue depth: the streamers keep the reader's queue full (the device streamer has two staging
// buffers of a layer being read at once, the CPU streamer n_slots - 1 slots, each far larger than
// queue_depth x chunk_bytes), so the probe does too: it keeps several blocks submitted, enough
// that queue_depth x chunk_bytes stay queued behind the block it waits for, and never lets the
// queue drain between blocks. Its figure is the aggregate rate (bytes / wall time from the first
// submit to the last byte). Blocks that are read one after another (the probe before issue 10)
// let the queue run dry at the end of every block and under-report a disk that needs depth: on
// the GPU machine 1.03 GB/s against the 1.72 GB/s the streamer got.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "stream/io.h"

namespace sluice::stream {

struct ProbeOptions {
  uint64_t block_bytes = 32ull << 20;  // one block: several chunks
  int max_blocks = 8;                  // 256 MiB at most
  double max_seconds = 0.5;            // stop submitting early on a slow disk (start-up must stay under 1 s)
  uint64_t min_file_bytes = 4ull << 20;  // below this the probe is skipped (nothing worth streaming)
};

struct DiskProbe {
  bool measured = false;       // false: skipped (file too small); the rates are then 0
  double bytes_per_s = 0;      // aggregate: bytes / (last byte - first submit); the planner's disk term
  // Per block, at full queue depth: the rate over the last blocks_in_flight completions up to
  // this block's (a sliding aggregate; from the first full window on). Median, min and max; one
  // slow block moves only the few windows that span it, not the median.
  double median_bytes_per_s = 0;
  double min_bytes_per_s = 0, max_bytes_per_s = 0;
  int blocks = 0;
  uint64_t block_bytes = 0;
  int blocks_in_flight = 0;    // most blocks submitted at once
  uint32_t queue_depth = 0;    // requests the reader keeps in flight (pread: worker threads)
  uint64_t chunk_bytes = 0;    // one request
  uint64_t bytes = 0;          // read in all
  double seconds = 0;          // wall time of the probe (open included)
  bool direct = false;         // false: the filesystem refused O_DIRECT, so this is the page cache
  // "1.11 GB/s (8 O_DIRECT reads of 32.0 MiB, queue depth 8 x 4.0 MiB, 2 blocks in flight;
  // per block median 1.21, 1.01-1.22 GB/s; 0.24 s)"
  std::string describe() const;
};

// Reads up to max_blocks blocks at evenly spread offsets of `path` through a FileReader opened
// with `io`. Files smaller than block_bytes x 2 use blocks of a quarter of the file (aligned);
// files below min_file_bytes are not probed. No block is submitted once max_seconds have passed
// or once the blocks already queued would take it past max_seconds (the first is always read).
// Errors: I/O (names the file), bad options.
Result<DiskProbe> probe_disk(const std::string& path, const IoOptions& io, const ProbeOptions& opts = {});

// The same on a reader already open (tests: a reader stub with a known latency). `io` gives the
// queue depth and chunk size the reader was opened with.
Result<DiskProbe> probe_reader(FileReader& reader, const IoOptions& io, const ProbeOptions& opts = {});

}  // namespace sluice::stream
