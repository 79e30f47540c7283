#include "stream/trace.h"

#include <cerrno>
#include <cstring>

namespace sluice::stream {
namespace {

// Rows per batch written to the file: ~100 bytes each, so the buffer stays under a megabyte and a
// decode step (a few rows per layer) rarely pays for a write.
constexpr size_t kBatch = 8192;

}  // namespace

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

Result<std::unique_ptr<TraceWriter>> TraceWriter::open(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return io_error("--trace: cannot create '" + path + "': " + std::strerror(errno));
  std::unique_ptr<TraceWriter> w(new TraceWriter());
  w->path_ = path;
  w->file_ = f;
  w->epoch_ = Clock::now();
  w->buffer_.reserve(kBatch);
  if (std::fprintf(f, "%s\n", kHeader) < 0) return io_error("--trace: cannot write '" + path + "'");
  return w;
}

TraceWriter::~TraceWriter() {
  (void)flush();
  if (file_) std::fclose(file_);
}

int64_t TraceWriter::us(Clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - epoch_).count();
}

void TraceWriter::append(TraceEvent e) {
  std::lock_guard<std::mutex> lk(mu_);
  buffer_.push_back(std::move(e));
  ++n_events_;
  if (buffer_.size() >= kBatch) (void)write_locked();  // an error is kept and reported by flush()
}

Status TraceWriter::write_locked() {
  if (status_.is_ok()) {
    for (const TraceEvent& e : buffer_) {
      const int rc = std::fprintf(file_, "%lld,%lld,%s,%d,%s,%s,%llu\n", static_cast<long long>(e.t_start_us),
                                  static_cast<long long>(e.t_end_us), csv_field(e.lane).c_str(), e.layer,
                                  csv_field(e.tensor).c_str(), csv_field(e.tier).c_str(),
                                  static_cast<unsigned long long>(e.bytes));
      if (rc < 0) {
        status_ = io_error("--trace: cannot write '" + path_ + "': " + std::strerror(errno));
        break;
      }
    }
  }
  buffer_.clear();
  return status_;
}

Status TraceWriter::flush() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!file_) return status_;
  SLUICE_RETURN_IF_ERROR(write_locked());
  if (std::fflush(file_) != 0) status_ = io_error("--trace: cannot write '" + path_ + "': " + std::strerror(errno));
  return status_;
}

uint64_t TraceWriter::events() const {
  std::lock_guard<std::mutex> lk(mu_);
  return n_events_;
}

}  // namespace sluice::stream
