// GGUF v3 writer. The header is serialized in memory (metadata is small next to weights); tensor
// bytes are streamed: the caller fills one chunk while a background thread writes the previous
// one, so a multi-GB file is bounded by max(fill speed, disk speed), never by memory.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>

#include "gguf/gguf.h"

namespace sluice::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr uint32_t kVersion = 3;
constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

class Buffer {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> bytes;
};

bool valid_type(ValueType t) { return static_cast<uint32_t>(t) <= static_cast<uint32_t>(ValueType::kF64); }

// Serializes a value's payload (not its type id). Validates what the reader would reject.
Status put_value(Buffer& b, const Value& v, const std::string& key, uint32_t depth) {
  switch (v.type) {
    case ValueType::kU8: b.put<uint8_t>(static_cast<uint8_t>(v.u)); break;
    case ValueType::kU16: b.put<uint16_t>(static_cast<uint16_t>(v.u)); break;
    case ValueType::kU32: b.put<uint32_t>(static_cast<uint32_t>(v.u)); break;
    case ValueType::kU64: b.put<uint64_t>(v.u); break;
    case ValueType::kI8: b.put<int8_t>(static_cast<int8_t>(v.i)); break;
    case ValueType::kI16: b.put<int16_t>(static_cast<int16_t>(v.i)); break;
    case ValueType::kI32: b.put<int32_t>(static_cast<int32_t>(v.i)); break;
    case ValueType::kI64: b.put<int64_t>(v.i); break;
    case ValueType::kF32: b.put<float>(static_cast<float>(v.f)); break;
    case ValueType::kF64: b.put<double>(v.f); break;
    case ValueType::kBool: b.put<uint8_t>(v.u != 0 ? 1 : 0); break;
    case ValueType::kString: b.put_string(v.s); break;
    case ValueType::kArray: {
      if (!valid_type(v.elem_type)) return invalid_argument("gguf writer: key '" + key + "': invalid array element type");
      if (v.elem_type == ValueType::kArray && depth + 1 >= kMaxArrayDepth) {
        return invalid_argument("gguf writer: key '" + key + "': arrays nested too deeply");
      }
      b.put<uint32_t>(static_cast<uint32_t>(v.elem_type));
      b.put<uint64_t>(v.items.size());
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (v.items[i].type != v.elem_type) {
          return invalid_argument("gguf writer: key '" + key + "': array item " + std::to_string(i) + " has type " +
                                  value_type_name(v.items[i].type) + ", array declares " +
                                  value_type_name(v.elem_type));
        }
        SLUICE_RETURN_IF_ERROR(put_value(b, v.items[i], key, depth + 1));
      }
      break;
    }
    default:
      return invalid_argument("gguf writer: key '" + key + "': invalid value type " +
                              std::to_string(static_cast<uint32_t>(v.type)));
  }
  return Status::ok();
}

// Writes buffers on a background thread. Buffer slots are reused round-robin: slot k % n may be
// refilled once job k - n has been written.
class AsyncSink {
 public:
  AsyncSink(int fd, const std::string& path) : fd_(fd), path_(path), thread_([this] { run(); }) {}
  ~AsyncSink() { (void)finish(); }

  // Blocks until fewer than `max_in_flight` jobs are queued. Returns the first write error.
  Status wait_slots(size_t max_in_flight) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return queue_.size() < max_in_flight || !error_.is_ok(); });
    return error_;
  }
  void submit(const uint8_t* p, size_t n) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back({p, n});
    }
    cv_.notify_all();
  }
  Status finish() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return error_;
  }

 private:
  struct Job {
    const uint8_t* p;
    size_t n;
  };
  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty() || stop_; });
        if (queue_.empty()) return;
        job = queue_.front();
      }
      Status st = write_all(job.p, job.n);
      {
        std::lock_guard lock(mu_);
        queue_.pop_front();
        if (!st.is_ok() && error_.is_ok()) error_ = st;
      }
      cv_.notify_all();
    }
  }
  Status write_all(const uint8_t* p, size_t n) {
    {
      std::lock_guard lock(mu_);
      if (!error_.is_ok()) return Status::ok();  // already failed: drop the rest
    }
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min<size_t>(n, 1u << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        return io_error(path_ + ": write failed: " + std::strerror(errno));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return Status::ok();
  }

  int fd_;
  const std::string& path_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_ = false;
  Status error_;
  std::thread thread_;  // last: started after the members it uses exist
};

}  // namespace

void Writer::add(std::string key, Value value) {
  for (auto& kv : kv_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kv_.push_back({std::move(key), std::move(value)});
}

Status Writer::add_tensor(std::string name, quant::Type type, std::vector<uint64_t> shape) {
  const std::string where = "gguf writer: tensor '" + name + "': ";
  if (name.empty() || name.size() > kMaxTensorNameBytes) {
    return invalid_argument(where + "name length " + std::to_string(name.size()) + " is outside 1.." +
                            std::to_string(kMaxTensorNameBytes));
  }
  if (tensor_index_.count(name)) return invalid_argument(where + "duplicate tensor name");
  if (shape.empty() || shape.size() > kMaxDims) {
    return invalid_argument(where + "n_dims " + std::to_string(shape.size()) + " is outside 1..4");
  }
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (d == 0 || d > kInt64Max / n) return invalid_argument(where + "bad shape " + shape_string(shape));
    n *= d;
  }
  const quant::TypeTraits& tt = quant::traits(type);
  const auto block_elems = static_cast<uint64_t>(tt.block_elems);
  const auto block_bytes = static_cast<uint64_t>(tt.block_bytes);
  if (shape[0] % block_elems != 0) {
    return invalid_argument(where + "ne[0] " + std::to_string(shape[0]) + " is not a multiple of " + tt.name +
                            "'s block of " + std::to_string(block_elems));
  }
  if (n / block_elems > kInt64Max / block_bytes) return invalid_argument(where + "byte size overflows");
  TensorInfo info;
  info.name = std::move(name);
  info.type = type;
  info.shape = std::move(shape);
  info.nbytes = n / block_elems * block_bytes;
  info.offset = data_bytes_;
  data_bytes_ = align_up(info.offset + info.nbytes, alignment_);
  tensor_index_.emplace(info.name, tensors_.size());
  tensors_.push_back(std::move(info));
  return Status::ok();
}

Result<std::vector<uint8_t>> Writer::header_bytes() const {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 || alignment_ > kMaxAlignment) {
    return invalid_argument("gguf writer: alignment " + std::to_string(alignment_) + " is not a power of two in 1.." +
                            std::to_string(kMaxAlignment));
  }
  bool has_alignment_key = false;
  for (const auto& kv : kv_) {
    if (kv.key == "general.alignment") {
      if (kv.value.type != ValueType::kU32 || kv.value.u != alignment_) {
        return invalid_argument("gguf writer: general.alignment must be the u32 " + std::to_string(alignment_) +
                                " given to the Writer");
      }
      has_alignment_key = true;
    }
  }
  const bool auto_alignment = !has_alignment_key && alignment_ != kDefaultAlignment;
  Buffer b;
  b.put<uint32_t>(kMagic);
  b.put<uint32_t>(kVersion);
  b.put<uint64_t>(tensors_.size());
  b.put<uint64_t>(kv_.size() + (auto_alignment ? 1 : 0));
  for (const auto& kv : kv_) {
    if (kv.key.empty() || kv.key.size() > kMaxKeyBytes) {
      return invalid_argument("gguf writer: key length " + std::to_string(kv.key.size()) + " is outside 1.." +
                              std::to_string(kMaxKeyBytes));
    }
    b.put_string(kv.key);
    b.put<uint32_t>(static_cast<uint32_t>(kv.value.type));
    SLUICE_RETURN_IF_ERROR(put_value(b, kv.value, kv.key, 0));
  }
  if (auto_alignment) {
    b.put_string("general.alignment");
    b.put<uint32_t>(static_cast<uint32_t>(ValueType::kU32));
    b.put<uint32_t>(static_cast<uint32_t>(alignment_));
  }
  for (const auto& t : tensors_) {
    b.put_string(t.name);
    b.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (uint64_t d : t.shape) b.put<uint64_t>(d);
    b.put<uint32_t>(static_cast<uint32_t>(t.type));
    b.put<uint64_t>(t.offset);
  }
  b.bytes.resize(align_up(b.bytes.size(), alignment_), 0);
  return std::move(b.bytes);
}

uint64_t Writer::file_bytes() const {
  auto h = header_bytes();
  return h.is_ok() ? h->size() + data_bytes_ : 0;
}

Status Writer::write(const std::string& path, const FillFn& fill) const {
  SLUICE_ASSIGN_OR_RETURN(std::vector<uint8_t> header, header_bytes());
  // Chunk = whole rows, at most max(chunk_bytes_, one row), plus room for alignment padding.
  auto chunk_of = [&](const TensorInfo& t) {
    const uint64_t row = t.row_bytes();
    return std::min(t.nbytes, std::max<uint64_t>(row, chunk_bytes_ / row * row));
  };
  uint64_t max_chunk = 0;
  for (const auto& t : tensors_) max_chunk = std::max(max_chunk, chunk_of(t));
  constexpr size_t kSlots = 2;
  const uint64_t slot_bytes = max_chunk + alignment_;
  std::vector<std::unique_ptr<uint8_t[]>> slots;
  if (!tensors_.empty()) {
    for (size_t i = 0; i < kSlots; ++i) slots.emplace_back(new uint8_t[slot_bytes]);  // uninitialized on purpose
  }

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(path + ": cannot create: " + std::strerror(errno));
  Status st;
  {
    AsyncSink sink(fd, path);
    sink.submit(header.data(), header.size());
    uint64_t job = 0;
    for (size_t i = 0; i < tensors_.size() && st.is_ok(); ++i) {
      const TensorInfo& t = tensors_[i];
      const uint64_t chunk = chunk_of(t);
      for (uint64_t off = 0; off < t.nbytes && st.is_ok(); off += chunk) {
        st = sink.wait_slots(kSlots);  // the slot about to be reused is no longer queued
        if (!st.is_ok()) break;
        uint8_t* dst = slots[job++ % kSlots].get();
        const uint64_t n = std::min(chunk, t.nbytes - off);
        st = fill(i, off, dst, n);
        if (!st.is_ok()) break;
        uint64_t len = n;
        if (off + n == t.nbytes) {  // zero padding up to the next tensor's aligned offset
          const uint64_t pad = align_up(t.offset + t.nbytes, alignment_) - (t.offset + t.nbytes);
          std::memset(dst + n, 0, pad);
          len += pad;
        }
        sink.submit(dst, len);
      }
    }
    Status fin = sink.finish();
    if (st.is_ok()) st = fin;
  }
  if (::close(fd) != 0 && st.is_ok()) st = io_error(path + ": close failed: " + std::strerror(errno));
  if (!st.is_ok()) ::unlink(path.c_str());  // never leave a half-written file that looks valid
  return st;
}

Status Writer::write(const std::string& path, const std::vector<std::vector<uint8_t>>& data) const {
  if (data.size() != tensors_.size()) {
    return invalid_argument("gguf writer: " + std::to_string(data.size()) + " data buffers for " +
                            std::to_string(tensors_.size()) + " tensors");
  }
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i].size() != tensors_[i].nbytes) {
      return invalid_argument("gguf writer: tensor '" + tensors_[i].name + "' needs " +
                              std::to_string(tensors_[i].nbytes) + " bytes, given " + std::to_string(data[i].size()));
    }
  }
  return write(path, [&](size_t index, uint64_t offset, uint8_t* dst, uint64_t nbytes) {
    std::memcpy(dst, data[index].data() + offset, nbytes);
    return Status::ok();
  });
}

}  // namespace sluice::gguf
