// Start-up disk probe: how fast this machine reads this model file with the reader the streamer
// will use (O_DIRECT, queue_depth requests of chunk_bytes in flight), so the planner predicts
// with a measured disk bandwidth instead of a default. Reads a few blocks spread over the file
// itself (no scratch file, same filesystem and device) and takes the median block rate, which
// shrugs off one slow block (a cold extent, a neighbour's burst).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "stream/io.h"

namespace sluice::stream {

struct ProbeOptions {
  uint64_t block_bytes = 32ull << 20;  // one timed read: several chunks, so queue depth matters
  int max_blocks = 8;                  // 256 MiB at most
  double max_seconds = 0.5;            // stop early on a slow disk (start-up must stay under 1 s)
  uint64_t min_file_bytes = 4ull << 20;  // below this the probe is skipped (nothing worth streaming)
};

struct DiskProbe {
  bool measured = false;       // false: skipped (file too small); bytes_per_s is then 0
  double bytes_per_s = 0;      // median over blocks
  double min_bytes_per_s = 0, max_bytes_per_s = 0;
  int blocks = 0;
  uint64_t block_bytes = 0;
  uint64_t bytes = 0;          // read in all
  double seconds = 0;          // wall time of the probe
  bool direct = false;         // false: the filesystem refused O_DIRECT, so this is the page cache
  std::string describe() const;  // "1.05 GB/s (median of 8 O_DIRECT reads of 32.0 MiB, 0.27 s)"
};

// Reads up to max_blocks blocks at evenly spread offsets of `path` through a FileReader opened
// with `io`. Files smaller than block_bytes x 2 use blocks of a quarter of the file (aligned);
// files below min_file_bytes are not probed. Errors: I/O (names the file), bad options.
Result<DiskProbe> probe_disk(const std::string& path, const IoOptions& io, const ProbeOptions& opts = {});

}  // namespace sluice::stream
