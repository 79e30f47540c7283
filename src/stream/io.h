// Disk tier reader: byte ranges of one file into caller buffers, asynchronously, bypassing the
// page cache (O_DIRECT) so that the engine's own buffers, not the kernel's, decide what stays in
// RAM. io_uring keeps several large requests in flight (NVMe needs queue depth to reach its
// bandwidth); a small pool of pread worker threads is the fallback where io_uring is unavailable.
//
// Reads progress on their own: a completion thread (io_uring) or the workers (pread) refill the
// queue as requests finish, so a range far larger than queue_depth x chunk_bytes (a 500 MB layer
// of a 70B model) keeps queue_depth requests in flight while the caller computes, instead of
// advancing only inside wait().
//
// O_DIRECT contract: destination, offset and length aligned to kIoAlign. align_range() turns
// any byte range into the enclosing aligned one.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace sluice::stream {

inline constexpr uint64_t kIoAlign = 4096;

enum class IoKind { kAuto, kUring, kPread };
const char* io_kind_name(IoKind k);

struct IoOptions {
  IoKind kind = IoKind::kAuto;   // kAuto: io_uring if the kernel allows it, else pread
  bool direct = true;            // O_DIRECT (falls back to buffered if the filesystem refuses)
  uint32_t queue_depth = 8;      // requests in flight (io_uring; pread: worker threads, at most 4)
  uint64_t chunk_bytes = 4ull << 20;  // one request's size (<= 1 GiB); larger ranges are split
};

// The aligned superset of [offset, offset + len): read `len` bytes at `offset` into an aligned
// buffer, the wanted bytes start `skip` bytes in.
struct AlignedRange {
  uint64_t offset = 0;
  uint64_t len = 0;
  uint64_t skip = 0;
};
AlignedRange align_range(uint64_t offset, uint64_t len);

class FileReader {
 public:
  using Ticket = uint64_t;
  using Clock = std::chrono::steady_clock;
  virtual ~FileReader() = default;
  static Result<std::unique_ptr<FileReader>> open(const std::string& path, const IoOptions& opts);

  // Queues a read of [offset, offset + len) into dst (aligned as above when direct()). Bytes past
  // the end of the file are not read; a range that starts beyond it is an error.
  virtual Result<Ticket> submit(uint64_t offset, uint64_t len, void* dst) = 0;
  // Blocks until the read completes; an I/O error or a short read inside the file is an error
  // naming file, offset and byte counts. Each ticket is waited for once. *completed (optional)
  // receives when the last byte arrived, which can be well before wait() was called (traces).
  virtual Status wait(Ticket t, Clock::time_point* completed) = 0;
  Status wait(Ticket t) { return wait(t, nullptr); }
  // Non-blocking: true once every request of the read has completed (or the ticket is not in
  // flight any more). The read still has to be wait()ed for to collect its status.
  virtual bool is_done(Ticket t) = 0;
  Status read(uint64_t offset, uint64_t len, void* dst);

  // Error if the file's size or modification time changed since open (model replaced while
  // running): the engine must not compute on a mix of two files.
  Status check_unchanged() const;

  IoKind kind() const { return kind_; }
  bool direct() const { return direct_; }
  uint64_t file_size() const { return size_; }
  const std::string& path() const { return path_; }

 protected:
  FileReader() = default;
  std::string path_;
  int fd_ = -1;
  IoKind kind_ = IoKind::kPread;
  bool direct_ = false;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
  // Expected bytes of a read: what lies inside the file.
  uint64_t expected_bytes(uint64_t offset, uint64_t len) const { return offset >= size_ ? 0 : std::min(len, size_ - offset); }
};

}  // namespace sluice::stream
