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
    Shard& sh = f.shards_.front();
    SLUICE_RETURN_IF_ERROR(read(&sh.version, "version"));
    if (sh.version != 2 && sh.version != 3) {
      const uint32_t swapped = __builtin_bswap32(sh.version);
      std::string hint = swapped >= 1 && swapped <= 3 ? " (a big-endian file?)" : "";
      return fail(ErrorCode::kUnsupported, "version",
                  std::to_string(sh.version) + " is not supported (only 2 and 3)" + hint, 4);
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
    f.shards_.front().alignment = v->u;
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
    Shard& sh = f.shards_.front();
    sh.n_tensors = f.tensors_.size();
    const uint64_t header_end = pos_;
    const uint64_t pad = (sh.alignment - header_end % sh.alignment) % sh.alignment;
    sh.data_offset = header_end + pad;  // header_end <= size_ < 2^63, no overflow
    if (f.tensors_.empty()) return Status::ok();
    if (sh.data_offset > size_) {
      where_ = "data section";
      return fail(ErrorCode::kCorruptFile, "start", "offset " + std::to_string(sh.data_offset) +
                  " is past the end of the file (" + std::to_string(size_) + " bytes)", header_end);
    }
    const uint64_t data_size = size_ - sh.data_offset;
    for (size_t t = 0; t < f.tensors_.size(); ++t) {
      const TensorInfo& info = f.tensors_[t];
      where_ = "tensor '" + info.name + "'";
      if (info.offset % sh.alignment != 0) {
        return fail(ErrorCode::kCorruptFile, "offset", std::to_string(info.offset) +
                    " is not a multiple of the alignment " + std::to_string(sh.alignment), offset_at_[t]);
      }
      if (info.offset > data_size || info.nbytes > data_size - info.offset) {
        return fail(ErrorCode::kCorruptFile, "offset",
                    "data [" + std::to_string(info.offset) + ", +" + std::to_string(info.nbytes) +
                        ") extends past the end of the data section (" + std::to_string(data_size) +
                        " bytes from file offset " + std::to_string(sh.data_offset) + "); file truncated?",
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
  f.shards_.push_back(Shard{});
  f.shards_.front().path = std::move(name);
  f.shards_.front().size = size;
  f.regions_.push_back(Region{bytes, nullptr, size});
  Parser parser(bytes, size, f.shards_.front().path);
  SLUICE_RETURN_IF_ERROR(parser.parse(f));
  return f;
}

namespace {

// One file, mapped and parsed; split keys not followed.
Result<File> open_one(const std::string& path) {
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
  Result<File> r = File::parse(static_cast<const uint8_t*>(map), size, path);
  if (!r.is_ok()) {
    if (map) ::munmap(map, size);
    return r.status();
  }
  return r;
}

std::string shard_suffix(uint64_t no, uint64_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05llu-of-%05llu.gguf", static_cast<unsigned long long>(no + 1),
                static_cast<unsigned long long>(count));
  return buf;
}

// A shard's split keys. `count` is 1 for a file without split.count.
struct SplitKeys {
  bool present = false;
  uint64_t no = 0, count = 1, tensors = 0;
};

Result<SplitKeys> split_keys(const File& f, bool required) {
  SplitKeys k;
  if (!f.find(kSplitCount)) {
    if (!required) return k;
    return corrupt_file(f.path() + ": metadata key '" + std::string(kSplitCount) +
                        "': missing, so this file is not a shard of a split model");
  }
  k.present = true;
  SLUICE_ASSIGN_OR_RETURN(k.count, f.get_uint(kSplitCount));
  if (k.count == 0 || k.count > kMaxShards) {
    return corrupt_file(f.path() + ": metadata key '" + std::string(kSplitCount) + "': " + std::to_string(k.count) +
                        " is outside 1.." + std::to_string(kMaxShards));
  }
  if (k.count == 1 && !required && !f.find(kSplitNo)) return k;
  SLUICE_ASSIGN_OR_RETURN(k.no, f.get_uint(kSplitNo));
  if (k.no >= k.count) {
    return corrupt_file(f.path() + ": metadata key '" + std::string(kSplitNo) + "': " + std::to_string(k.no) +
                        " is not below split.count " + std::to_string(k.count));
  }
  if (k.count == 1 && !f.find(kSplitTensorsCount)) return k;
  SLUICE_ASSIGN_OR_RETURN(const int64_t n, f.get_int(kSplitTensorsCount));
  if (n < 0) {
    return corrupt_file(f.path() + ": metadata key '" + std::string(kSplitTensorsCount) + "': " + std::to_string(n) +
                        " is negative");
  }
  k.tensors = static_cast<uint64_t>(n);
  return k;
}

std::string ordinal(uint64_t k, uint64_t count) { return "shard " + std::to_string(k + 1) + " of " + std::to_string(count); }

}  // namespace

Result<std::vector<std::string>> split_paths(const std::string& path, uint64_t no, uint64_t count) {
  if (count == 0 || no >= count) {
    return invalid_argument(path + ": shard index " + std::to_string(no) + " is not below the count " +
                            std::to_string(count));
  }
  const std::string suffix = shard_suffix(no, count);
  if (path.size() <= suffix.size() || path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return invalid_argument(path + ": the name of " + ordinal(no, count) + " of a split model must end in \"" + suffix +
                            "\" (llama.cpp's gguf-split naming), else the other shards cannot be found");
  }
  const std::string prefix = path.substr(0, path.size() - suffix.size());
  std::vector<std::string> out;
  out.reserve(count);
  for (uint64_t k = 0; k < count; ++k) out.push_back(prefix + shard_suffix(k, count));
  return out;
}

// Joins the parsed shards of a split model into one File (friend of File). Each part was
// parsed with every single-file check; what remains is whether they belong together.
class ShardSet {
 public:
  static Result<File> join(std::vector<File> parts) {
    if (parts.empty()) return invalid_argument("gguf: no shards given");
    const std::string first = parts.front().path();
    SLUICE_ASSIGN_OR_RETURN(const SplitKeys k0, split_keys(parts.front(), false));
    if (k0.count <= 1 && parts.size() == 1) return std::move(parts.front());
    if (k0.no != 0) {
      return invalid_argument(first + ": is " + ordinal(k0.no, k0.count) + " of a split model (split.no = " +
                              std::to_string(k0.no) + "); open the first shard");
    }
    if (!k0.present) {
      return corrupt_file(first + ": metadata key '" + std::string(kSplitCount) + "': missing, but " +
                          std::to_string(parts.size()) + " shards given");
    }
    if (k0.count != parts.size()) {
      return corrupt_file(first + ": metadata key '" + std::string(kSplitCount) + "': " + std::to_string(k0.count) +
                          " shards, but " + std::to_string(parts.size()) + " given");
    }
    File out = std::move(parts.front());
    for (uint64_t k = 1; k < parts.size(); ++k) {
      File& part = parts[k];
      const std::string& p = part.path();
      const std::string where = " (" + ordinal(k, k0.count) + " of " + first + ")";
      SLUICE_ASSIGN_OR_RETURN(const SplitKeys ks, split_keys(part, true));
      if (ks.count != k0.count) {
        return corrupt_file(p + ": metadata key '" + std::string(kSplitCount) + "': " + std::to_string(ks.count) +
                            ", the first shard " + first + " says " + std::to_string(k0.count) +
                            ": not a shard of the same model");
      }
      if (ks.no != k) {
        return corrupt_file(p + ": metadata key '" + std::string(kSplitNo) + "': " + std::to_string(ks.no) +
                            ", expected " + std::to_string(k) + where + ": a shard of another split, or renamed");
      }
      if (ks.tensors != k0.tensors) {
        return corrupt_file(p + ": metadata key '" + std::string(kSplitTensorsCount) + "': " +
                            std::to_string(ks.tensors) + ", the first shard " + first + " says " +
                            std::to_string(k0.tensors) + ": a shard of another model");
      }
      const uint32_t index = static_cast<uint32_t>(k);
      for (TensorInfo& t : part.tensors_) {
        if (auto it = out.tensor_index_.find(t.name); it != out.tensor_index_.end()) {
          return corrupt_file(p + ": tensor '" + t.name + "': also in " + out.shards_[out.tensors_[it->second].shard].path +
                              where + ": shards of different models?");
        }
        t.shard = index;
        out.tensor_index_.emplace(t.name, out.tensors_.size());
        out.tensors_.push_back(std::move(t));
      }
      // The mapping moves to `out`; the part must not unmap it.
      out.shards_.push_back(std::move(part.shards_.front()));
      out.regions_.push_back(part.regions_.front());
      part.regions_.clear();
    }
    if (out.tensors_.size() != k0.tensors) {
      return corrupt_file(first + ": metadata key '" + std::string(kSplitTensorsCount) + "': " +
                          std::to_string(k0.tensors) + ", but the " + std::to_string(k0.count) + " shards hold " +
                          std::to_string(out.tensors_.size()) + " tensors: a shard of another model, or a damaged one");
    }
    return out;
  }
};

Result<File> File::parse_shards(const std::vector<ShardBytes>& shards) {
  std::vector<File> parts;
  parts.reserve(shards.size());
  for (const ShardBytes& s : shards) {
    SLUICE_ASSIGN_OR_RETURN(File f, parse(s.bytes, s.size, s.name));
    parts.push_back(std::move(f));
  }
  return ShardSet::join(std::move(parts));
}

Result<File> File::open(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(File first, open_one(path));
  SLUICE_ASSIGN_OR_RETURN(const SplitKeys k0, split_keys(first, false));
  if (k0.count <= 1) return first;
  if (k0.no != 0) {
    auto paths = split_paths(path, k0.no, k0.count);
    return invalid_argument(path + ": is " + ordinal(k0.no, k0.count) + " of a split model (split.no = " +
                            std::to_string(k0.no) + "); open the first shard" +
                            (paths.is_ok() ? ", " + paths->front() : std::string()));
  }
  auto paths = split_paths(path, 0, k0.count);
  if (!paths.is_ok()) {
    return invalid_argument(path + ": metadata key '" + std::string(kSplitCount) + "': " + std::to_string(k0.count) +
                            " shards, but the file name does not end in \"" + shard_suffix(0, k0.count) +
                            "\" (llama.cpp's gguf-split naming), so the other shards cannot be found");
  }
  std::vector<File> parts;
  parts.reserve(k0.count);
  parts.push_back(std::move(first));
  for (uint64_t k = 1; k < k0.count; ++k) {
    const std::string& p = (*paths)[k];
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 && errno == ENOENT) {
      return io_error(p + ": " + ordinal(k, k0.count) + " of " + path + " is missing");
    }
    Result<File> part = open_one(p);
    if (!part.is_ok()) {
      return Status(part.status().code(),
                    part.status().message() + " (" + ordinal(k, k0.count) + " of " + path + ")");
    }
    parts.push_back(std::move(part).value());
  }
  return ShardSet::join(std::move(parts));
}

File::File(File&& o) noexcept { *this = std::move(o); }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    unmap();
    shards_ = std::move(o.shards_);
    regions_ = std::move(o.regions_);
    kv_ = std::move(o.kv_);
    tensors_ = std::move(o.tensors_);
    kv_index_ = std::move(o.kv_index_);
    tensor_index_ = std::move(o.tensor_index_);
    o.shards_.clear();
    o.regions_.clear();  // the mappings are ours now
  }
  return *this;
}

File::~File() { unmap(); }

void File::unmap() {
  for (Region& r : regions_) {
    if (r.map) ::munmap(r.map, r.size);
    r.map = nullptr;
  }
  regions_.clear();
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
  if (n == 0) return;
  const auto b = reinterpret_cast<uintptr_t>(p);
  for (const Region& r : regions_) {
    const auto base = reinterpret_cast<uintptr_t>(r.map);
    if (!r.map || b < base || b + n > base + r.size) continue;
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t first = (b + page - 1) / page * page, last = (b + n) / page * page;
    // Advice only: a failure leaves the pages mapped, which is still correct.
    if (last > first) (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
    return;
  }
}

const uint8_t* File::tensor_data(const TensorInfo& info) const {
  SLUICE_CHECK(info.shard < shards_.size(), "tensor_data: TensorInfo '" + info.name + "' does not belong to " + path());
  const Shard& sh = shards_[info.shard];
  SLUICE_CHECK(info.offset <= sh.size && sh.data_offset + info.offset + info.nbytes <= sh.size,
               "tensor_data: TensorInfo '" + info.name + "' does not belong to " + sh.path);
  return regions_[info.shard].base + sh.data_offset + info.offset;
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
  if (!v) return missing(path(), key);
  if (v->is_unsigned()) return v->u;
  if (v->is_signed()) {
    if (v->i < 0) {
      return corrupt_file(path() + ": metadata key '" + std::string(key) + "': value " + std::to_string(v->i) +
                          " is negative, expected an unsigned integer");
    }
    return static_cast<uint64_t>(v->i);
  }
  return wrong_type(path(), key, *v, "an unsigned integer");
}

Result<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(path(), key);
  if (v->is_signed()) return v->i;
  if (v->is_unsigned()) {
    if (v->u > kInt64Max) {
      return corrupt_file(path() + ": metadata key '" + std::string(key) + "': value " + std::to_string(v->u) +
                          " does not fit a signed 64-bit integer");
    }
    return static_cast<int64_t>(v->u);
  }
  return wrong_type(path(), key, *v, "an integer");
}

Result<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(path(), key);
  if (v->is_float()) return v->f;
  if (v->is_signed()) return static_cast<double>(v->i);
  if (v->is_unsigned()) return static_cast<double>(v->u);
  return wrong_type(path(), key, *v, "a number");
}

Result<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(path(), key);
  if (v->type != ValueType::kString) return wrong_type(path(), key, *v, "string");
  return v->s;
}

Result<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(path(), key);
  if (v->type != ValueType::kBool) return wrong_type(path(), key, *v, "bool");
  return v->u != 0;
}

}  // namespace sluice::gguf
