#include "stream/io.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace sluice::stream {

const char* io_kind_name(IoKind k) {
  switch (k) {
    case IoKind::kAuto: return "auto";
    case IoKind::kUring: return "io_uring";
    case IoKind::kPread: return "pread";
  }
  return "?";
}

AlignedRange align_range(uint64_t offset, uint64_t len) {
  AlignedRange r;
  r.offset = offset / kIoAlign * kIoAlign;
  r.skip = offset - r.offset;
  r.len = (r.skip + len + kIoAlign - 1) / kIoAlign * kIoAlign;
  return r;
}

Status FileReader::read(uint64_t offset, uint64_t len, void* dst) {
  SLUICE_ASSIGN_OR_RETURN(Ticket t, submit(offset, len, dst));
  return wait(t);
}

namespace {

int64_t mtime_ns(const struct stat& st) { return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

std::string errno_text(int e) { return std::string(std::strerror(e)); }

Status check_request(const FileReader& r, uint64_t offset, uint64_t len, const void* dst) {
  if (offset > r.file_size() || (offset == r.file_size() && len > 0)) {
    return io_error(r.path() + ": read at offset " + std::to_string(offset) + " is beyond the end of the file (" +
                    std::to_string(r.file_size()) + " bytes)");
  }
  if (r.direct() && (offset % kIoAlign || len % kIoAlign || reinterpret_cast<uintptr_t>(dst) % kIoAlign)) {
    return invalid_argument(r.path() + ": O_DIRECT read needs offset, length and buffer aligned to " +
                            std::to_string(kIoAlign) + " bytes");
  }
  return Status::ok();
}

// One logical read, split into chunks that complete in any order.
struct Request {
  uint64_t offset = 0;
  uint64_t expected = 0;  // bytes inside the file
  uint8_t* dst = nullptr;
  uint64_t pending_chunks = 0;
  Status status;
};

class UringReader final : public FileReader {
 public:
  UringReader(const IoOptions& o) : opts_(o) {}
  ~UringReader() override {
    // Drain what is in flight so the kernel never writes into freed buffers.
    while (inflight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_, &cqe) < 0) break;
      io_uring_cqe_seen(&ring_, cqe);
      --inflight_;
    }
    if (ring_ok_) io_uring_queue_exit(&ring_);
    if (fd_ >= 0) ::close(fd_);
  }

  Status init() {
    int rc = io_uring_queue_init(opts_.queue_depth, &ring_, 0);
    if (rc < 0) return unsupported("io_uring unavailable: " + errno_text(-rc));
    ring_ok_ = true;
    return Status::ok();
  }

  Result<Ticket> submit(uint64_t offset, uint64_t len, void* dst) override {
    SLUICE_RETURN_IF_ERROR(check_request(*this, offset, len, dst));
    const Ticket t = next_ticket_++;
    Request& rq = requests_[t];
    rq.offset = offset;
    rq.expected = expected_bytes(offset, len);
    rq.dst = static_cast<uint8_t*>(dst);
    // Chunks cover the bytes inside the file; with O_DIRECT the last one is rounded up to the
    // alignment (the kernel stops at EOF).
    uint64_t covered = direct_ ? (rq.expected + kIoAlign - 1) / kIoAlign * kIoAlign : rq.expected;
    for (uint64_t pos = 0; pos < covered; pos += opts_.chunk_bytes) {
      queue_.push_back({t, pos, std::min<uint64_t>(opts_.chunk_bytes, covered - pos)});
      ++rq.pending_chunks;
    }
    pump();
    return t;
  }

  Status wait(Ticket t) override {
    auto it = requests_.find(t);
    if (it == requests_.end()) return invalid_argument(path_ + ": unknown or already waited read ticket");
    while (it->second.pending_chunks > 0) {
      pump();
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc < 0) return io_error(path_ + ": io_uring wait failed: " + errno_text(-rc));
      complete(cqe);
      io_uring_cqe_seen(&ring_, cqe);
      --inflight_;
    }
    Status st = std::move(it->second.status);
    requests_.erase(it);
    return st;
  }

 private:
  struct Chunk {
    Ticket ticket;
    uint64_t pos;  // offset within the request
    uint64_t len;
  };

  void pump() {
    bool queued = false;
    while (!queue_.empty() && inflight_ < opts_.queue_depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;
      Chunk c = queue_.front();
      queue_.pop_front();
      Request& rq = requests_[c.ticket];
      io_uring_prep_read(sqe, fd_, rq.dst + c.pos, unsigned(c.len), rq.offset + c.pos);
      chunks_[next_chunk_id_] = c;
      io_uring_sqe_set_data64(sqe, next_chunk_id_++);
      ++inflight_;
      queued = true;
    }
    if (queued) io_uring_submit(&ring_);
  }

  void complete(io_uring_cqe* cqe) {
    auto ci = chunks_.find(io_uring_cqe_get_data64(cqe));
    if (ci == chunks_.end()) return;
    Chunk c = ci->second;
    chunks_.erase(ci);
    Request& rq = requests_[c.ticket];
    const uint64_t want = c.pos >= rq.expected ? 0 : std::min(c.len, rq.expected - c.pos);
    if (cqe->res < 0) {
      if (rq.status.is_ok()) {
        rq.status = io_error(path_ + ": read of " + std::to_string(c.len) + " bytes at offset " +
                             std::to_string(rq.offset + c.pos) + " failed: " + errno_text(-cqe->res));
      }
    } else if (uint64_t(cqe->res) < want) {
      if (uint64_t(cqe->res) > 0 && rq.status.is_ok()) {
        // A short read inside the file: read the rest (regular files rarely do this, but may).
        const uint64_t got = uint64_t(cqe->res);
        if (!direct_ || got % kIoAlign == 0) {
          queue_.push_front({c.ticket, c.pos + got, c.len - got});
          --rq.pending_chunks;
          ++rq.pending_chunks;
          return;
        }
      }
      if (rq.status.is_ok()) {
        rq.status = io_error(path_ + ": short read at offset " + std::to_string(rq.offset + c.pos) + ": got " +
                             std::to_string(cqe->res) + " of " + std::to_string(want) +
                             " bytes (file truncated or changed while running?)");
      }
    }
    --rq.pending_chunks;
  }

  IoOptions opts_;
  io_uring ring_{};
  bool ring_ok_ = false;
  uint32_t inflight_ = 0;
  Ticket next_ticket_ = 1;
  uint64_t next_chunk_id_ = 1;
  std::unordered_map<Ticket, Request> requests_;
  std::unordered_map<uint64_t, Chunk> chunks_;
  std::deque<Chunk> queue_;
};

// pread on a worker thread so the caller still overlaps I/O with compute.
class PreadReader final : public FileReader {
 public:
  PreadReader() : worker_([this] { run(); }) {}
  ~PreadReader() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    if (fd_ >= 0) ::close(fd_);
  }

  Result<Ticket> submit(uint64_t offset, uint64_t len, void* dst) override {
    SLUICE_RETURN_IF_ERROR(check_request(*this, offset, len, dst));
    std::lock_guard<std::mutex> lk(mu_);
    const Ticket t = next_ticket_++;
    Request& rq = requests_[t];
    rq.offset = offset;
    rq.expected = expected_bytes(offset, len);
    rq.dst = static_cast<uint8_t*>(dst);
    rq.pending_chunks = 1;
    queue_.push_back(t);
    cv_.notify_all();
    return t;
  }

  Status wait(Ticket t) override {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = requests_.find(t);
    if (it == requests_.end()) return invalid_argument(path_ + ": unknown or already waited read ticket");
    done_cv_.wait(lk, [&] { return it->second.pending_chunks == 0; });
    Status st = std::move(it->second.status);
    requests_.erase(it);
    return st;
  }

 private:
  void run() {
    for (;;) {
      Ticket t;
      Request rq;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        t = queue_.front();
        queue_.pop_front();
        rq = requests_[t];  // fields are not modified while queued
      }
      Status st = do_read(rq);
      {
        std::lock_guard<std::mutex> lk(mu_);
        Request& r = requests_[t];
        r.status = std::move(st);
        r.pending_chunks = 0;
      }
      done_cv_.notify_all();
    }
  }

  Status do_read(const Request& rq) const {
    const uint64_t covered = direct_ ? (rq.expected + kIoAlign - 1) / kIoAlign * kIoAlign : rq.expected;
    uint64_t done = 0;
    while (done < rq.expected) {
      ssize_t n = ::pread(fd_, rq.dst + done, covered - done, off_t(rq.offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return io_error(path_ + ": read at offset " + std::to_string(rq.offset + done) + " failed: " + errno_text(errno));
      }
      if (n == 0) {
        return io_error(path_ + ": short read at offset " + std::to_string(rq.offset + done) + ": got " +
                        std::to_string(done) + " of " + std::to_string(rq.expected) +
                        " bytes (file truncated or changed while running?)");
      }
      done += uint64_t(n);
    }
    return Status::ok();
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  bool stop_ = false;
  Ticket next_ticket_ = 1;
  std::unordered_map<Ticket, Request> requests_;
  std::deque<Ticket> queue_;
  std::thread worker_;
};

}  // namespace

Status FileReader::check_unchanged() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return io_error(path_ + ": stat failed: " + errno_text(errno));
  struct stat by_path {};
  const bool replaced = ::stat(path_.c_str(), &by_path) != 0 || by_path.st_ino != st.st_ino || by_path.st_dev != st.st_dev;
  if (replaced || uint64_t(st.st_size) != size_ || mtime_ns(st) != mtime_ns_) {
    return io_error(path_ + ": the model file changed while running (size " + std::to_string(size_) + " -> " +
                    std::to_string(replaced ? by_path.st_size : st.st_size) + (replaced ? ", replaced" : "") +
                    "); restart to load the new file");
  }
  return Status::ok();
}

Result<std::unique_ptr<FileReader>> FileReader::open(const std::string& path, const IoOptions& opts) {
  if (opts.queue_depth == 0 || opts.chunk_bytes == 0 || opts.chunk_bytes % kIoAlign) {
    return invalid_argument("io: queue depth must be > 0 and chunk size a positive multiple of 4096");
  }
  bool direct = opts.direct;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0 && direct && errno == EINVAL) {  // filesystem without O_DIRECT (tmpfs)
    direct = false;
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) return io_error(path + ": cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return io_error(path + ": stat failed: " + errno_text(e));
  }
  std::unique_ptr<FileReader> r;
  if (opts.kind != IoKind::kPread) {
    auto u = std::make_unique<UringReader>(opts);
    Status s = u->init();
    if (s.is_ok()) {
      r = std::move(u);
    } else if (opts.kind == IoKind::kUring) {
      ::close(fd);
      return s;
    }
  }
  if (!r) r = std::make_unique<PreadReader>();
  r->path_ = path;
  r->fd_ = fd;
  r->kind_ = dynamic_cast<UringReader*>(r.get()) ? IoKind::kUring : IoKind::kPread;
  r->direct_ = direct;
  r->size_ = uint64_t(st.st_size);
  r->mtime_ns_ = mtime_ns(st);
  return r;
}

}  // namespace sluice::stream
