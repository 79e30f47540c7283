// Disk tier reader: byte ranges of a model's files into caller buffers, asynchronously, bypassing the
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
//
// Several files: a split model (gguf::File::shards()) is read through one reader that holds every
// shard open; a read names its file by index (the shard index) and an offset inside that file,
// and never spans two files. Each file is opened with O_DIRECT on its own (falling back to
// buffered where its filesystem refuses), so alignment is per file; requests of all files share
// one queue and its depth.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
  // Opens every path (at least one); file index k in submit() is paths[k].
  static Result<std::unique_ptr<FileReader>> open(const std::vector<std::string>& paths, const IoOptions& opts);
  static Result<std::unique_ptr<FileReader>> open(const std::string& path, const IoOptions& opts);

  // Queues a read of [offset, offset + len) of file `file` into dst (aligned as above when
  // direct(file)). Bytes past the end of the file are not read; a range that starts beyond it, or
  // a file index out of range, is an error.
  virtual Result<Ticket> submit(uint32_t file, uint64_t offset, uint64_t len, void* dst) = 0;
  // The same on file 0 (a reader of one file).
  Result<Ticket> submit(uint64_t offset, uint64_t len, void* dst) { return submit(0, offset, len, dst); }
  // Blocks until the read completes; an I/O error or a short read inside the file is an error
  // naming file, offset and byte counts. Each ticket is waited for once. *completed (optional)
  // receives when the last byte arrived, which can be well before wait() was called (traces).
  virtual Status wait(Ticket t, Clock::time_point* completed) = 0;
  Status wait(Ticket t) { return wait(t, nullptr); }
  // Non-blocking: true once every request of the read has completed (or the ticket is not in
  // flight any more). The read still has to be wait()ed for to collect its status.
  virtual bool is_done(Ticket t) = 0;
  Status read(uint64_t offset, uint64_t len, void* dst);

  // Error if any file's size or modification time changed since open, or a path now names
  // another file (model replaced while running): the engine must not compute on a mix of two
  // files.
  Status check_unchanged() const;

  IoKind kind() const { return kind_; }
  size_t n_files() const { return files_.size(); }
  bool direct(uint32_t file = 0) const { return files_[file].direct; }
  uint64_t file_size(uint32_t file = 0) const { return files_[file].size; }
  const std::string& path(uint32_t file = 0) const { return files_[file].path; }

 protected:
  struct OpenFile {
    std::string path;
    int fd = -1;
    bool direct = false;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
  };
  FileReader() = default;
  void close_files();  // subclasses call it once no read is in flight
  std::vector<OpenFile> files_;
  IoKind kind_ = IoKind::kPread;
  // Expected bytes of a read: what lies inside the file.
  uint64_t expected_bytes(uint32_t file, uint64_t offset, uint64_t len) const {
    const uint64_t size = files_[file].size;
    return offset >= size ? 0 : std::min(len, size - offset);
  }
};

}  // namespace sluice::stream
