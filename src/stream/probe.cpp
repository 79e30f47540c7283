#include "stream/probe.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "stream/plan.h"

namespace sluice::stream {

std::string DiskProbe::describe() const {
  if (!measured) return "not measured (file too small to probe)";
  char buf[192];
  std::snprintf(buf, sizeof buf, "%.2f GB/s (median of %d %s reads of %s, %.2f-%.2f GB/s, %.2f s)", bytes_per_s / 1e9,
                blocks, direct ? "O_DIRECT" : "buffered", format_bytes(block_bytes).c_str(), min_bytes_per_s / 1e9,
                max_bytes_per_s / 1e9, seconds);
  return buf;
}

Result<DiskProbe> probe_disk(const std::string& path, const IoOptions& io, const ProbeOptions& opts) {
  if (opts.block_bytes == 0 || opts.block_bytes % kIoAlign || opts.max_blocks < 1) {
    return invalid_argument("disk probe: block size must be a positive multiple of 4096 and blocks >= 1");
  }
  const auto t0 = std::chrono::steady_clock::now();
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<FileReader> reader, FileReader::open(path, io));
  DiskProbe p;
  p.direct = reader->direct();
  const uint64_t size = reader->file_size();
  if (size < opts.min_file_bytes) return p;
  uint64_t block = opts.block_bytes;
  if (size < 2 * block) block = std::max<uint64_t>(kIoAlign, size / 4 / kIoAlign * kIoAlign);
  const uint64_t span = size / kIoAlign * kIoAlign - block;  // last aligned start that fits
  const int n = int(std::min<uint64_t>(uint64_t(opts.max_blocks), std::max<uint64_t>(1, size / block)));

  struct Free {
    void operator()(uint8_t* q) const { std::free(q); }
  };
  std::unique_ptr<uint8_t, Free> buf(static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, block)));
  if (!buf) return out_of_memory("disk probe: cannot allocate " + format_bytes(block));
  std::vector<double> rates;
  for (int i = 0; i < n; ++i) {
    // Evenly spread, aligned: successive blocks never overlap, so no block is served from a cache
    // the previous one filled (the drive's, or the page cache without O_DIRECT).
    const uint64_t off = n > 1 ? span / uint64_t(n - 1) * uint64_t(i) / kIoAlign * kIoAlign : 0;
    const auto b0 = std::chrono::steady_clock::now();
    SLUICE_RETURN_IF_ERROR(reader->read(off, block, buf.get()));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
    rates.push_back(double(block) / std::max(s, 1e-9));
    p.bytes += block;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > opts.max_seconds) break;
  }
  std::sort(rates.begin(), rates.end());
  const size_t m = rates.size();
  p.measured = true;
  p.blocks = int(m);
  p.block_bytes = block;
  p.bytes_per_s = m % 2 ? rates[m / 2] : 0.5 * (rates[m / 2 - 1] + rates[m / 2]);
  p.min_bytes_per_s = rates.front();
  p.max_bytes_per_s = rates.back();
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

}  // namespace sluice::stream
