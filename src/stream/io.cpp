#include "stream/io.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

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

namespace {

int64_t mtime_ns(const struct stat& st) { return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

std::string errno_text(int e) { return std::string(std::strerror(e)); }

Status check_request(const FileReader& r, uint32_t file, uint64_t offset, uint64_t len, const void* dst) {
  if (file >= r.n_files()) {
    return invalid_argument(r.path() + ": read of file index " + std::to_string(file) + ", the reader holds " +
                            std::to_string(r.n_files()) + " files");
  }
  if (offset > r.file_size(file) || (offset == r.file_size(file) && len > 0)) {
    return io_error(r.path(file) + ": read at offset " + std::to_string(offset) + " is beyond the end of the file (" +
                    std::to_string(r.file_size(file)) + " bytes)");
  }
  if (r.direct(file) && (offset % kIoAlign || len % kIoAlign || reinterpret_cast<uintptr_t>(dst) % kIoAlign)) {
    return invalid_argument(r.path(file) + ": O_DIRECT read needs offset, length and buffer aligned to " +
                            std::to_string(kIoAlign) + " bytes");
  }
  return Status::ok();
}

// One logical read, split into chunks that complete in any order. Guarded by the reader's mutex;
// offset, expected and dst do not change after submit, so workers read them unlocked.
struct Request {
  uint32_t file = 0;      // index into the reader's files
  uint64_t offset = 0;
  uint64_t expected = 0;  // bytes inside the file
  uint64_t covered = 0;   // bytes requested: expected, rounded up to kIoAlign with O_DIRECT
  uint8_t* dst = nullptr;
  uint64_t pending_chunks = 0;
  FileReader::Clock::time_point completed{};
  Status status;
};

struct Chunk {
  FileReader::Ticket ticket = 0;
  uint64_t pos = 0;  // offset within the request
  uint64_t len = 0;
};

// Chunks cover the bytes inside the file; with O_DIRECT the last one is rounded up to the
// alignment (the kernel stops at EOF).
template <typename Push>
void split(FileReader::Ticket t, Request& rq, uint64_t chunk_bytes, Push push) {
  for (uint64_t pos = 0; pos < rq.covered; pos += chunk_bytes) {
    push(Chunk{t, pos, std::min<uint64_t>(chunk_bytes, rq.covered - pos)});
    ++rq.pending_chunks;
  }
  if (rq.pending_chunks == 0) rq.completed = FileReader::Clock::now();  // nothing inside the file
}

std::string short_read_text(const std::string& path, uint64_t offset, uint64_t got, uint64_t want) {
  return path + ": short read at offset " + std::to_string(offset) + ": got " + std::to_string(got) + " of " +
         std::to_string(want) + " bytes (file truncated or changed while running?)";
}

// io_uring: the caller's thread submits, a completion thread reaps completions and refills the
// submission queue from the chunk queue. The submission ring is touched only under mu_; the
// completion ring only by the completion thread (liburing allows this split across threads).
class UringReader final : public FileReader {
 public:
  using FileReader::submit;
  using FileReader::wait;
  explicit UringReader(const IoOptions& o) : opts_(o) {}
  ~UringReader() override {
    if (reaper_.joinable()) {
      std::unique_lock<std::mutex> lk(mu_);
      stopping_ = true;
      queue_.clear();  // never submitted: nothing to drain
      // Drain what is in flight so the kernel never writes into freed buffers.
      done_cv_.wait(lk, [&] { return inflight_ == 0 || reaper_exited_; });
      if (!reaper_exited_) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe) {
          io_uring_prep_nop(sqe);
          io_uring_sqe_set_data64(sqe, kWakeId);
          io_uring_submit(&ring_);
        }
      }
      lk.unlock();
      reaper_.join();
    }
    if (ring_ok_) io_uring_queue_exit(&ring_);
    close_files();
  }

  Status init() {
    int rc = io_uring_queue_init(opts_.queue_depth, &ring_, 0);
    if (rc < 0) return unsupported("io_uring unavailable: " + errno_text(-rc));
    ring_ok_ = true;
    reaper_ = std::thread([this] { reap(); });
    return Status::ok();
  }

  Result<Ticket> submit(uint32_t file, uint64_t offset, uint64_t len, void* dst) override {
    SLUICE_RETURN_IF_ERROR(check_request(*this, file, offset, len, dst));
    std::lock_guard<std::mutex> lk(mu_);
    if (!ring_status_.is_ok()) return ring_status_;
    const Ticket t = next_ticket_++;
    Request& rq = requests_[t];
    rq.file = file;
    rq.offset = offset;
    rq.expected = expected_bytes(file, offset, len);
    rq.covered = files_[file].direct ? (rq.expected + kIoAlign - 1) / kIoAlign * kIoAlign : rq.expected;
    rq.dst = static_cast<uint8_t*>(dst);
    split(t, rq, opts_.chunk_bytes, [&](Chunk c) { queue_.push_back(c); });
    pump();
    return t;
  }

  Status wait(Ticket t, Clock::time_point* completed) override {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = requests_.find(t);
    if (it == requests_.end()) return invalid_argument(path() + ": unknown or already waited read ticket");
    done_cv_.wait(lk, [&] { return it->second.pending_chunks == 0; });
    Status st = std::move(it->second.status);
    if (completed) *completed = it->second.completed;
    requests_.erase(it);
    return st;
  }

  bool is_done(Ticket t) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = requests_.find(t);
    return it == requests_.end() || it->second.pending_chunks == 0;
  }

 private:
  static constexpr uint64_t kWakeId = 0;  // chunk ids start at 1

  // Under mu_: moves queued chunks into the submission ring while fewer than queue_depth are in
  // flight (so the completion ring, twice the depth, never overflows).
  void pump() {
    bool queued = false;
    while (!queue_.empty() && inflight_ < opts_.queue_depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;
      Chunk c = queue_.front();
      queue_.pop_front();
      Request& rq = requests_[c.ticket];
      io_uring_prep_read(sqe, files_[rq.file].fd, rq.dst + c.pos, unsigned(c.len), rq.offset + c.pos);
      chunks_[next_chunk_id_] = c;
      io_uring_sqe_set_data64(sqe, next_chunk_id_++);
      ++inflight_;
      queued = true;
    }
    if (queued) io_uring_submit(&ring_);
  }

  void reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      std::lock_guard<std::mutex> lk(mu_);
      if (rc < 0) {
        // The ring itself failed: fail every read still pending, and every later submit.
        ring_status_ = io_error(path() + ": io_uring wait failed: " + errno_text(-rc));
        for (auto& [t, rq] : requests_) {
          if (rq.pending_chunks > 0 && rq.status.is_ok()) rq.status = ring_status_;
          rq.pending_chunks = 0;
        }
        queue_.clear();
        reaper_exited_ = true;
        done_cv_.notify_all();
        return;
      }
      const uint64_t id = io_uring_cqe_get_data64(cqe);
      io_uring_cqe_seen(&ring_, cqe);
      if (id == kWakeId) {
        reaper_exited_ = true;
        return;
      }
      complete(id, cqe->res);
      --inflight_;
      if (!stopping_) pump();
      done_cv_.notify_all();
    }
  }

  // Under mu_.
  void complete(uint64_t id, int res) {
    auto ci = chunks_.find(id);
    if (ci == chunks_.end()) return;
    Chunk c = ci->second;
    chunks_.erase(ci);
    Request& rq = requests_[c.ticket];
    const uint64_t want = c.pos >= rq.expected ? 0 : std::min(c.len, rq.expected - c.pos);
    if (res < 0) {
      if (rq.status.is_ok()) {
        rq.status = io_error(files_[rq.file].path + ": read of " + std::to_string(c.len) + " bytes at offset " +
                             std::to_string(rq.offset + c.pos) + " failed: " + errno_text(-res));
      }
    } else if (uint64_t(res) < want) {
      const uint64_t got = uint64_t(res);
      if (got > 0 && rq.status.is_ok() && (!files_[rq.file].direct || got % kIoAlign == 0)) {
        // A short read inside the file: read the rest (regular files rarely do this, but may).
        // The chunk stays pending.
        queue_.push_front({c.ticket, c.pos + got, c.len - got});
        return;
      }
      if (rq.status.is_ok()) rq.status = io_error(short_read_text(files_[rq.file].path, rq.offset + c.pos, got, want));
    }
    if (--rq.pending_chunks == 0) rq.completed = Clock::now();
  }

  IoOptions opts_;
  io_uring ring_{};
  bool ring_ok_ = false;
  std::mutex mu_;
  std::condition_variable done_cv_;
  uint32_t inflight_ = 0;
  bool stopping_ = false;
  bool reaper_exited_ = false;
  Status ring_status_;
  Ticket next_ticket_ = 1;
  uint64_t next_chunk_id_ = 1;
  std::unordered_map<Ticket, Request> requests_;  // node-based: references stay valid
  std::unordered_map<uint64_t, Chunk> chunks_;
  std::deque<Chunk> queue_;
  std::thread reaper_;  // last: started after everything it touches exists
};

// pread on a few worker threads, one chunk at a time each, so the caller overlaps I/O with
// compute and the device still sees several requests at once.
class PreadReader final : public FileReader {
 public:
  using FileReader::submit;
  using FileReader::wait;
  explicit PreadReader(const IoOptions& o) : chunk_bytes_(o.chunk_bytes) {
    const uint32_t n = std::max<uint32_t>(1, std::min<uint32_t>(o.queue_depth, 4));
    for (uint32_t i = 0; i < n; ++i) workers_.emplace_back([this] { run(); });
  }
  ~PreadReader() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      queue_.clear();
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();  // a chunk being read finishes first
    close_files();
  }

  Result<Ticket> submit(uint32_t file, uint64_t offset, uint64_t len, void* dst) override {
    SLUICE_RETURN_IF_ERROR(check_request(*this, file, offset, len, dst));
    std::lock_guard<std::mutex> lk(mu_);
    const Ticket t = next_ticket_++;
    Request& rq = requests_[t];
    rq.file = file;
    rq.offset = offset;
    rq.expected = expected_bytes(file, offset, len);
    rq.covered = files_[file].direct ? (rq.expected + kIoAlign - 1) / kIoAlign * kIoAlign : rq.expected;
    rq.dst = static_cast<uint8_t*>(dst);
    split(t, rq, chunk_bytes_, [&](Chunk c) { queue_.push_back({c, &rq}); });
    cv_.notify_all();
    return t;
  }

  Status wait(Ticket t, Clock::time_point* completed) override {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = requests_.find(t);
    if (it == requests_.end()) return invalid_argument(path() + ": unknown or already waited read ticket");
    done_cv_.wait(lk, [&] { return it->second.pending_chunks == 0; });
    Status st = std::move(it->second.status);
    if (completed) *completed = it->second.completed;
    requests_.erase(it);
    return st;
  }

  bool is_done(Ticket t) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = requests_.find(t);
    return it == requests_.end() || it->second.pending_chunks == 0;
  }

 private:
  struct Job {
    Chunk chunk;
    Request* rq;  // stays valid: a request is erased only after its last chunk completed
  };

  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        job = queue_.front();
        queue_.pop_front();
      }
      Status st = do_read(*job.rq, job.chunk);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!st.is_ok() && job.rq->status.is_ok()) job.rq->status = std::move(st);
        if (--job.rq->pending_chunks == 0) job.rq->completed = Clock::now();
      }
      done_cv_.notify_all();
    }
  }

  Status do_read(const Request& rq, const Chunk& c) const {
    const uint64_t want = c.pos >= rq.expected ? 0 : std::min(c.len, rq.expected - c.pos);
    uint64_t done = 0;
    const OpenFile& f = files_[rq.file];
    while (done < want) {
      const uint64_t at = c.pos + done;
      ssize_t n = ::pread(f.fd, rq.dst + at, c.len - done, off_t(rq.offset + at));
      if (n < 0) {
        if (errno == EINTR) continue;
        return io_error(f.path + ": read at offset " + std::to_string(rq.offset + at) + " failed: " + errno_text(errno));
      }
      if (n == 0) return io_error(short_read_text(f.path, rq.offset + c.pos, done, want));
      done += uint64_t(n);
    }
    return Status::ok();
  }

  uint64_t chunk_bytes_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  bool stop_ = false;
  Ticket next_ticket_ = 1;
  std::unordered_map<Ticket, Request> requests_;
  std::deque<Job> queue_;
  std::vector<std::thread> workers_;  // last: started after everything they touch exists
};

}  // namespace

void FileReader::close_files() {
  for (OpenFile& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
    f.fd = -1;
  }
}

Status FileReader::read(uint64_t offset, uint64_t len, void* dst) {
  SLUICE_ASSIGN_OR_RETURN(Ticket t, submit(offset, len, dst));
  return wait(t);
}

Status FileReader::check_unchanged() const {
  for (const OpenFile& f : files_) {
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) return io_error(f.path + ": stat failed: " + errno_text(errno));
    struct stat by_path {};
    const bool replaced =
        ::stat(f.path.c_str(), &by_path) != 0 || by_path.st_ino != st.st_ino || by_path.st_dev != st.st_dev;
    if (replaced || uint64_t(st.st_size) != f.size || mtime_ns(st) != f.mtime_ns) {
      return io_error(f.path + ": the model file changed while running (size " + std::to_string(f.size) + " -> " +
                      std::to_string(replaced ? by_path.st_size : st.st_size) + (replaced ? ", replaced" : "") +
                      "); restart to load the new file");
    }
  }
  return Status::ok();
}

Result<std::unique_ptr<FileReader>> FileReader::open(const std::string& path, const IoOptions& opts) {
  return open(std::vector<std::string>{path}, opts);
}

Result<std::unique_ptr<FileReader>> FileReader::open(const std::vector<std::string>& paths, const IoOptions& opts) {
  // One io_uring request carries at most 2^32 - 1 bytes; 1 GiB is far beyond any useful chunk.
  if (opts.queue_depth == 0 || opts.chunk_bytes == 0 || opts.chunk_bytes % kIoAlign || opts.chunk_bytes > (1ull << 30)) {
    return invalid_argument("io: queue depth must be > 0 and chunk size a multiple of 4096 in (0, 1 GiB]");
  }
  if (paths.empty()) return invalid_argument("io: no file to read");
  std::vector<OpenFile> files;
  auto close_all = [&] {
    for (OpenFile& f : files) ::close(f.fd);
  };
  for (const std::string& path : paths) {
    OpenFile f;
    f.path = path;
    f.direct = opts.direct;
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (f.direct ? O_DIRECT : 0));
    if (f.fd < 0 && f.direct && errno == EINVAL) {  // filesystem without O_DIRECT (tmpfs)
      f.direct = false;
      f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (f.fd < 0) {
      const int e = errno;
      close_all();
      return io_error(path + ": cannot open: " + errno_text(e));
    }
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) {
      const int e = errno;
      ::close(f.fd);
      close_all();
      return io_error(path + ": stat failed: " + errno_text(e));
    }
    f.size = uint64_t(st.st_size);
    f.mtime_ns = mtime_ns(st);
    files.push_back(std::move(f));
  }
  std::unique_ptr<FileReader> r;
  if (opts.kind != IoKind::kPread) {
    auto u = std::make_unique<UringReader>(opts);
    Status s = u->init();
    if (s.is_ok()) {
      r = std::move(u);
    } else if (opts.kind == IoKind::kUring) {
      close_all();
      return s;
    }
  }
  if (!r) r = std::make_unique<PreadReader>(opts);
  r->files_ = std::move(files);
  r->kind_ = dynamic_cast<UringReader*>(r.get()) ? IoKind::kUring : IoKind::kPread;
  return r;
}

}  // namespace sluice::stream
