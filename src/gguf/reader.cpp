// GGUF reader: maps the file and validates every count, length and offset against the bytes
// that remain before it is used, so a hostile file yields a Status, never a crash or a huge
// allocation. Error messages read "<file>: <where>: <field>: <problem> (at byte N)".
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "gguf/gguf.h"

namespace sluice::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF is read by memcpy of little-endian fields");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Smallest on-disk size of one value of type t (an array is at least elem_type + count).
uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kBool: return 1;
    case ValueType::kU16: case ValueType::kI16: return 2;
    case ValueType::kU32: case ValueType::kI32: case ValueType::kF32: return 4;
    case ValueType::kU64: case ValueType::kI64: case ValueType::kF64: return 8;
    case ValueType::kString: return 8;
    case ValueType::kArray: return 12;
  }
  return 1;
}

bool valid_value_type(uint32_t raw) { return raw <= static_cast<uint32_t>(ValueType::kF64); }

}  // namespace

// Friend of File: fills it field by field. One Parser per parse; not reusable.
class Parser {
 public:
  Parser(const uint8_t* data, uint64_t size, const std::string& name) : data_(data), size_(size), name_(name) {}

  Status parse(File& f) {
    SLUICE_RETURN_IF_ERROR(parse_header(f));
    SLUICE_RETURN_IF_ERROR(parse_metadata(f));
    SLUICE_RETURN_IF_ERROR(resolve_alignment(f));
    SLUICE_RETURN_IF_ERROR(parse_tensor_infos(f));
    return check_tensor_layout(f);
  }

 private:
  uint64_t remaining() const { return size_ - pos_; }

  Status fail(ErrorCode code, const std::string& field, const std::string& problem, uint64_t at) const {
    std::string m = name_ + ": ";
    if (!where_.empty()) m += where_ + ": ";
    m += field + ": " + problem + " (at byte " + std::to_string(at) + ")";
    return Status(code, std::move(m));
  }
  Status truncated(const std::string& field, uint64_t need) const {
    return fail(ErrorCode::kCorruptFile, field,
                "file truncated: needs " + std::to_string(need) + " bytes, only " + std::to_string(remaining()) +
                    " remain in a file of " + std::to_string(size_) + " bytes",
                pos_);
  }

  // `suffix` is appended to `field` only on the error path (no allocation per value read).
  template <typename T>
  Status read(T* out, const std::string& field, const char* suffix = "") {
    if (remaining() < sizeof(T)) return truncated(field + suffix, sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }

  // Reads a u64 length and that many bytes; `limit` is a format limit checked first.
  Status read_string(std::string* out, const std::string& field, uint64_t limit) {
    uint64_t at = pos_;
    uint64_t len = 0;
    SLUICE_RETURN_IF_ERROR(read(&len, field, " length"));
    if (len > limit) {
      return fail(ErrorCode::kCorruptFile, field + " length",
                  std::to_string(len) + " exceeds the limit of " + std::to_string(limit) + " bytes", at);
    }
    if (len > remaining()) {
      return fail(ErrorCode::kCorruptFile, field + " length",
                  std::to_string(len) + " exceeds the " + std::to_string(remaining()) + " bytes remaining in the file",
                  at);
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status::ok();
  }

  Status read_value(ValueType t, Value* out, uint32_t depth, const std::string& field) {
    out->type = t;
    switch (t) {
      case ValueType::kU8: { uint8_t v = 0; SLUICE_RETURN_IF_ERROR(read(&v, field)); out->u = v; break; }
      case ValueType::kU16: { uint16_t v = 0; SLUICE_RETURN_IF_ERROR(read(&v, field)); out->u = v; break; }
      case ValueType::kU32: { uint32_t v = 0; SLUICE_RETURN_IF_ERROR(read(&v, field)); out->u = v; break; }
      case ValueType::kU64: { uint64_t v = 0; SLUICE_RETURN_IF_ERROR(read(&v, field)); out->u = v; break; }
      case ValueType::kI8: { int8_t v = 0; SLUICE_RETURN_IF_ERROR(read(&v, field)); out->i = v; break; }
      case ValueType::kI16: { int16_t v = 0; SLUICE_RETURN_IF_ERROR(read(&v, field)); out->i = v; break; }
      case ValueType::kI32: { int32_t v = 0; SLUICE_RETURN_IF_ERROR(read(&v, field)); out->i = v; break; }
      case ValueType::kI64: { int64_t v = 0; SLUICE_RETURN_IF_ERROR(read(&v, field)); out->i = v; break; }
      case ValueType::kF32: { float v = 0; SLUICE_RETURN_IF_ERROR(read(&v, field)); out->f = v; break; }
      case ValueType::kF64: { double v = 0; SLUICE_RETURN_IF_ERROR(read(&v, field)); out->f = v; break; }
      case ValueType::kBool: {
        uint8_t v = 0;
        SLUICE_RETURN_IF_ERROR(read(&v, field));
        out->u = v != 0;
        break;
      }
      case ValueType::kString:
        return read_string(&out->s, field, std::numeric_limits<uint64_t>::max());
      case ValueType::kArray:
        return read_array(out, depth, field);
    }
    return Status::ok();
  }

  Status read_array(Value* out, uint32_t depth, const std::string& field) {
    uint64_t at = pos_;
    uint32_t raw_elem = 0;
    SLUICE_RETURN_IF_ERROR(read(&raw_elem, field + " element type"));
    if (!valid_value_type(raw_elem)) {
      return fail(ErrorCode::kCorruptFile, field + " element type", "type id " + std::to_string(raw_elem) +
                  " is not a GGUF value type (0..12)", at);
    }
    const auto elem = static_cast<ValueType>(raw_elem);
    if (elem == ValueType::kArray && depth + 1 >= kMaxArrayDepth) {
      return fail(ErrorCode::kCorruptFile, field + " element type",
                  "arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels", at);
    }
    out->elem_type = elem;
    at = pos_;
    uint64_t count = 0;
    SLUICE_RETURN_IF_ERROR(read(&count, field + " count"));
    const uint64_t min_bytes = min_value_bytes(elem);
    if (count > remaining() / min_bytes) {
      return fail(ErrorCode::kCorruptFile, field + " count",
                  std::to_string(count) + " items of " + value_type_name(elem) + " (at least " +
                      std::to_string(min_bytes) + " bytes each) cannot fit in the " + std::to_string(remaining()) +
                      " bytes remaining (truncated file?)",
                  at);
    }
    if (count > kMaxMetadataItems - items_) {
      return fail(ErrorCode::kCorruptFile, field + " count",
                  std::to_string(count) + " items exceed the limit of " + std::to_string(kMaxMetadataItems) +
                      " metadata array items per file",
                  at);
    }
    items_ += count;
    // Bounded by the remaining bytes and the item limit checked above.
    out->items.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      // Element field names are built only on the error path to keep large vocabularies fast.
      Status st = read_value(elem, &out->items[i], depth + 1, field);
      if (!st.is_ok()) {
        return Status(st.code(), st.message() + " [" + field + " item " + std::to_string(i) + "]");
      }
    }
    return Status::ok();
  }

  Status parse_header(File& f) {
    where_ = "header";
    uint32_t magic = 0;
    SLUICE_RETURN_IF_ERROR(read(&magic, "magic"));
    if (magic != kMagic) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%08x", magic);
      return fail(ErrorCode::kCorruptFile, "magic", std::string("is ") + hex + ", expected \"GGUF\" (0x46554747)", 0);
    }
    SLUICE_RETURN_IF_ERROR(read(&f.version_, "version"));
    if (f.version_ != 2 && f.version_ != 3) {
      const uint32_t swapped = __builtin_bswap32(f.version_);
      std::string hint = swapped >= 1 && swapped <= 3 ? " (a big-endian file?)" : "";
      return fail(ErrorCode::kUnsupported, "version",
                  std::to_string(f.version_) + " is not supported (only 2 and 3)" + hint, 4);
    }
    SLUICE_RETURN_IF_ERROR(read(&n_tensors_, "n_tensors"));
    SLUICE_RETURN_IF_ERROR(read(&n_kv_, "n_kv"));
    // Each tensor info is at least name length + n_dims + type + offset = 24 bytes; each
    // key/value at least key length + value type + 1 byte = 13 bytes.
    if (n_kv_ > remaining() / 13) {
      return fail(ErrorCode::kCorruptFile, "n_kv",
                  std::to_string(n_kv_) + " key/value pairs cannot fit in the " + std::to_string(remaining()) +
                      " bytes remaining (truncated file?)",
                  16);
    }
    if (n_tensors_ > remaining() / 24) {
      return fail(ErrorCode::kCorruptFile, "n_tensors",
                  std::to_string(n_tensors_) + " tensor infos cannot fit in the " + std::to_string(remaining()) +
                      " bytes remaining (truncated file?)",
                  8);
    }
    return Status::ok();
  }

  Status parse_metadata(File& f) {
    f.kv_.reserve(n_kv_);  // bounded by remaining bytes / 13
    for (uint64_t k = 0; k < n_kv_; ++k) {
      where_ = "metadata[" + std::to_string(k) + "]";
      uint64_t at = pos_;
      KeyValue kv;
      SLUICE_RETURN_IF_ERROR(read_string(&kv.key, "key", kMaxKeyBytes));
      if (kv.key.empty()) return fail(ErrorCode::kCorruptFile, "key", "is empty", at);
      where_ = "metadata key '" + kv.key + "'";
      if (f.kv_index_.count(kv.key)) {
        return fail(ErrorCode::kCorruptFile, "key", "duplicate key (first at metadata[" +
                    std::to_string(f.kv_index_.find(kv.key)->second) + "])", at);
      }
      at = pos_;
      uint32_t raw_type = 0;
      SLUICE_RETURN_IF_ERROR(read(&raw_type, "value type"));
      if (!valid_value_type(raw_type)) {
        return fail(ErrorCode::kCorruptFile, "value type",
                    "type id " + std::to_string(raw_type) + " is not a GGUF value type (0..12)", at);
      }
      SLUICE_RETURN_IF_ERROR(read_value(static_cast<ValueType>(raw_type), &kv.value, 0, "value"));
      f.kv_index_.emplace(kv.key, f.kv_.size());
      f.kv_.push_back(std::move(kv));
    }
    where_.clear();
    return Status::ok();
  }

  Status resolve_alignment(File& f) {
    where_ = "metadata key 'general.alignment'";
    const Value* v = f.find("general.alignment");
    if (!v) return Status::ok();
    if (!v->is_unsigned()) {
      return fail(ErrorCode::kCorruptFile, "value", std::string("has type ") + value_type_name(v->type) +
                  ", expected an unsigned integer", pos_);
    }
    if (v->u == 0 || (v->u & (v->u - 1)) != 0 || v->u > kMaxAlignment) {
      return fail(ErrorCode::kCorruptFile, "value",
                  std::to_string(v->u) + " is not a power of two in 1.." + std::to_string(kMaxAlignment), pos_);
    }
    f.alignment_ = v->u;
    where_.clear();
    return Status::ok();
  }

  Status parse_tensor_infos(File& f) {
    f.tensors_.reserve(n_tensors_);  // bounded by remaining bytes / 24
    for (uint64_t t = 0; t < n_tensors_; ++t) {
      where_ = "tensor[" + std::to_string(t) + "]";
      uint64_t at = pos_;
      TensorInfo info;
      SLUICE_RETURN_IF_ERROR(read_string(&info.name, "name", kMaxTensorNameBytes));
      if (info.name.empty()) return fail(ErrorCode::kCorruptFile, "name", "is empty", at);
      where_ = "tensor '" + info.name + "'";
      if (f.tensor_index_.count(info.name)) {
        return fail(ErrorCode::kCorruptFile, "name", "duplicate tensor name (first at tensor[" +
                    std::to_string(f.tensor_index_.find(info.name)->second) + "])", at);
      }
      at = pos_;
      uint32_t n_dims = 0;
      SLUICE_RETURN_IF_ERROR(read(&n_dims, "n_dims"));
      if (n_dims == 0 || n_dims > kMaxDims) {
        return fail(ErrorCode::kCorruptFile, "n_dims", std::to_string(n_dims) + " is outside 1.." +
                    std::to_string(kMaxDims), at);
      }
      info.shape.resize(n_dims);
      uint64_t n_elements = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        at = pos_;
        const std::string field = "ne[" + std::to_string(d) + "]";
        SLUICE_RETURN_IF_ERROR(read(&info.shape[d], field));
        const uint64_t ne = info.shape[d];
        if (ne == 0 || ne > kInt64Max) {
          return fail(ErrorCode::kCorruptFile, field, std::to_string(ne) + " is outside 1..2^63-1", at);
        }
        if (n_elements > kInt64Max / ne) {
          return fail(ErrorCode::kCorruptFile, "shape", "element count of " + shape_string(info.shape) +
                      " overflows 2^63-1", at);
        }
        n_elements *= ne;
      }
      at = pos_;
      uint32_t raw_type = 0;
      SLUICE_RETURN_IF_ERROR(read(&raw_type, "type"));
      const quant::TypeTraits* tt = quant::type_traits(raw_type);
      if (!tt) {
        return fail(ErrorCode::kUnsupported, "type", "type id " + std::to_string(raw_type) +
                    " is unknown or unsupported", at);
      }
      info.type = tt->type;
      const uint64_t block_elems = static_cast<uint64_t>(tt->block_elems);
      const uint64_t block_bytes = static_cast<uint64_t>(tt->block_bytes);
      if (info.shape[0] % block_elems != 0) {
        return fail(ErrorCode::kCorruptFile, "ne[0]", std::to_string(info.shape[0]) +
                    " is not a multiple of the block size " + std::to_string(block_elems) + " of " + tt->name, at);
      }
      const uint64_t n_blocks = n_elements / block_elems;
      if (n_blocks > kInt64Max / block_bytes) {
        return fail(ErrorCode::kCorruptFile, "shape", "byte size of " + shape_string(info.shape) + " " + tt->name +
                    " overflows 2^63-1", at);
      }
      info.nbytes = n_blocks * block_bytes;
      at = pos_;
      SLUICE_RETURN_IF_ERROR(read(&info.offset, "offset"));
      f.tensor_index_.emplace(info.name, f.tensors_.size());
      f.tensors_.push_back(std::move(info));
      offset_at_.push_back(at);
    }
    where_.clear();
    return Status::ok();
  }

  Status check_tensor_layout(File& f) {
    const uint64_t header_end = pos_;
    const uint64_t pad = (f.alignment_ - header_end % f.alignment_) % f.alignment_;
    f.data_offset_ = header_end + pad;  // header_end <= size_ < 2^63, no overflow
    if (f.tensors_.empty()) return Status::ok();
    if (f.data_offset_ > size_) {
      where_ = "data section";
      return fail(ErrorCode::kCorruptFile, "start", "offset " + std::to_string(f.data_offset_) +
                  " is past the end of the file (" + std::to_string(size_) + " bytes)", header_end);
    }
    const uint64_t data_size = size_ - f.data_offset_;
    for (size_t t = 0; t < f.tensors_.size(); ++t) {
      const TensorInfo& info = f.tensors_[t];
      where_ = "tensor '" + info.name + "'";
      if (info.offset % f.alignment_ != 0) {
        return fail(ErrorCode::kCorruptFile, "offset", std::to_string(info.offset) +
                    " is not a multiple of the alignment " + std::to_string(f.alignment_), offset_at_[t]);
      }
      if (info.offset > data_size || info.nbytes > data_size - info.offset) {
        return fail(ErrorCode::kCorruptFile, "offset",
                    "data [" + std::to_string(info.offset) + ", +" + std::to_string(info.nbytes) +
                        ") extends past the end of the data section (" + std::to_string(data_size) +
                        " bytes from file offset " + std::to_string(f.data_offset_) + "); file truncated?",
                    offset_at_[t]);
      }
    }
    // Overlapping tensors would alias each other's bytes: reject.
    std::vector<size_t> order(f.tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return f.tensors_[a].offset < f.tensors_[b].offset; });
    for (size_t i = 1; i < order.size(); ++i) {
      const TensorInfo& prev = f.tensors_[order[i - 1]];
      const TensorInfo& cur = f.tensors_[order[i]];
      if (cur.offset < prev.offset + prev.nbytes) {
        where_ = "tensor '" + cur.name + "'";
        return fail(ErrorCode::kCorruptFile, "offset", std::to_string(cur.offset) + " overlaps tensor '" + prev.name +
                    "' [" + std::to_string(prev.offset) + ", +" + std::to_string(prev.nbytes) + ")",
                    offset_at_[order[i]]);
      }
    }
    where_.clear();
    return Status::ok();
  }

  const uint8_t* data_;
  uint64_t size_;
  const std::string& name_;
  uint64_t pos_ = 0;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  uint64_t items_ = 0;             // metadata array items so far (kMaxMetadataItems)
  std::vector<uint64_t> offset_at_;  // file position of each tensor's offset field
  std::string where_;              // section being parsed, for messages
};

Result<File> File::parse(const uint8_t* bytes, uint64_t size, std::string name) {
  static constexpr uint8_t kEmpty[1] = {0};
  if (!bytes) {
    bytes = kEmpty;
    size = 0;
  }
  if (size > kInt64Max) return corrupt_file(name + ": size " + std::to_string(size) + " is not plausible");
  File f;
  f.path_ = std::move(name);
  f.base_ = bytes;
  f.size_ = size;
  Parser parser(bytes, size, f.path_);
  SLUICE_RETURN_IF_ERROR(parser.parse(f));
  return f;
}

Result<File> File::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return io_error(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return io_error(path + ": not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return io_error(path + ": cannot map " + std::to_string(size) + " bytes: " + std::strerror(e));
    }
  }
  ::close(fd);  // the mapping keeps the file referenced
  Result<File> r = parse(static_cast<const uint8_t*>(map), size, path);
  if (!r.is_ok()) {
    if (map) ::munmap(map, size);
    return r.status();
  }
  r->map_ = map;
  return r;
}

File::File(File&& o) noexcept { *this = std::move(o); }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    size_ = o.size_;
    base_ = o.base_;
    map_ = o.map_;
    kv_ = std::move(o.kv_);
    tensors_ = std::move(o.tensors_);
    kv_index_ = std::move(o.kv_index_);
    tensor_index_ = std::move(o.tensor_index_);
    o.map_ = nullptr;
    o.base_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

File::~File() { unmap(); }

void File::unmap() {
  if (map_) ::munmap(map_, size_);
  map_ = nullptr;
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void File::release(const void* p, uint64_t n) const {
  if (!map_ || n == 0) return;
  const auto b = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(map_);
  if (b < base || b + n > base + size_) return;
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (b + page - 1) / page * page, last = (b + n) / page * page;
  // Advice only: a failure leaves the pages mapped, which is still correct.
  if (last > first) (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

const uint8_t* File::tensor_data(const TensorInfo& info) const {
  SLUICE_CHECK(info.offset <= size_ && data_offset_ + info.offset + info.nbytes <= size_,
               "tensor_data: TensorInfo '" + info.name + "' does not belong to " + path_);
  return base_ + data_offset_ + info.offset;
}

namespace {
Status missing(const std::string& path, std::string_view key) {
  return corrupt_file(path + ": metadata key '" + std::string(key) + "': missing");
}
Status wrong_type(const std::string& path, std::string_view key, const Value& v, const char* expected) {
  return corrupt_file(path + ": metadata key '" + std::string(key) + "': has type " + value_type_name(v.type) +
                      ", expected " + expected);
}
}  // namespace

Result<uint64_t> File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(path_, key);
  if (v->is_unsigned()) return v->u;
  if (v->is_signed()) {
    if (v->i < 0) {
      return corrupt_file(path_ + ": metadata key '" + std::string(key) + "': value " + std::to_string(v->i) +
                          " is negative, expected an unsigned integer");
    }
    return static_cast<uint64_t>(v->i);
  }
  return wrong_type(path_, key, *v, "an unsigned integer");
}

Result<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(path_, key);
  if (v->is_signed()) return v->i;
  if (v->is_unsigned()) {
    if (v->u > kInt64Max) {
      return corrupt_file(path_ + ": metadata key '" + std::string(key) + "': value " + std::to_string(v->u) +
                          " does not fit a signed 64-bit integer");
    }
    return static_cast<int64_t>(v->u);
  }
  return wrong_type(path_, key, *v, "an integer");
}

Result<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(path_, key);
  if (v->is_float()) return v->f;
  if (v->is_signed()) return static_cast<double>(v->i);
  if (v->is_unsigned()) return static_cast<double>(v->u);
  return wrong_type(path_, key, *v, "a number");
}

Result<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != ValueType::kString) return wrong_type(path_, key, *v, "string");
  return v->s;
}

Result<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != ValueType::kBool) return wrong_type(path_, key, *v, "bool");
  return v->u != 0;
}

}  // namespace sluice::gguf
