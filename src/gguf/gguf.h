// GGUF file access: parse and validate (reader), and write (writer). Knows bytes and metadata,
// nothing about models. Every count, length and offset is checked against the file size before
// use; violations become a Status naming file, field and value.
//
// On-disk layout (little endian, versions 2 and 3; version 1 used u32 counts and is rejected):
//   magic "GGUF" u32 | version u32 | n_tensors u64 | n_kv u64
//   n_kv x { key: string | value_type u32 | value }
//   n_tensors x { name: string | n_dims u32 | dims u64[n_dims] | type u32 | offset u64 }
//   padding to general.alignment (default 32) | tensor data (each offset relative to here,
//   multiple of alignment)
//   string = u64 length + bytes (no terminator); array = elem_type u32 + count u64 + elems.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "quant/quant.h"

namespace sluice::gguf {

enum class ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
// "u8", "string", "array", ...; "invalid" for an id outside the enum.
const char* value_type_name(ValueType t);

inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr uint32_t kMaxDims = 4;
inline constexpr size_t kMaxTensorNameBytes = 63;   // ggml's name buffer is 64 bytes with NUL
inline constexpr size_t kMaxKeyBytes = 65535;        // the format's limit on key length
inline constexpr uint64_t kMaxAlignment = 1u << 24;  // sanity bound; real files use 32..4096
inline constexpr uint32_t kMaxArrayDepth = 8;        // nested arrays deeper than this are rejected
// Bound on metadata array items over the whole file (largest real vocabularies need ~1M). An
// item costs sizeof(Value) in memory, so this caps what a hostile file can make us allocate.
inline constexpr uint64_t kMaxMetadataItems = 1u << 24;

// A metadata value. Scalars are widened (integers to i64/u64, floats to f64) but the original
// type is kept so a writer can round-trip it. Arrays hold their element type and items.
struct Value {
  ValueType type = ValueType::kU32;
  uint64_t u = 0;          // kU8 kU16 kU32 kU64 kBool
  int64_t i = 0;           // kI8 kI16 kI32 kI64
  double f = 0;            // kF32 kF64
  std::string s;           // kString
  ValueType elem_type = ValueType::kU8;  // kArray
  std::vector<Value> items;              // kArray (nested arrays allowed)

  static Value u8(uint8_t v);
  static Value i8(int8_t v);
  static Value u16(uint16_t v);
  static Value i16(int16_t v);
  static Value u32(uint32_t v);
  static Value i32(int32_t v);
  static Value u64(uint64_t v);
  static Value i64(int64_t v);
  static Value f32(float v);
  static Value f64(double v);
  static Value boolean(bool v);
  static Value str(std::string v);
  static Value array(ValueType elem, std::vector<Value> items);
  static Value string_array(const std::vector<std::string>& v);
  static Value f32_array(const std::vector<float>& v);
  static Value i32_array(const std::vector<int32_t>& v);

  bool is_unsigned() const;  // kU8 kU16 kU32 kU64
  bool is_signed() const;    // kI8 kI16 kI32 kI64
  bool is_float() const;     // kF32 kF64
};
bool operator==(const Value& a, const Value& b);  // same type and same (widened) contents

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  quant::Type type = quant::Type::kF32;
  std::vector<uint64_t> shape;  // ne[0] (innermost, contiguous) first, as in the file; 1..4 dims
  uint64_t offset = 0;          // relative to the start of the data section
  uint64_t nbytes = 0;          // computed from type and shape, validated against file size
  uint64_t n_elements() const;
  uint64_t row_bytes() const;   // bytes of one ne[0] row
  uint64_t n_rows() const { return shape.empty() ? 0 : n_elements() / shape[0]; }
};

// "[576, 49152]" (ne[0] first).
std::string shape_string(const std::vector<uint64_t>& shape);

// A parsed, validated GGUF file, mapped read-only. Movable, not copyable.
class File {
 public:
  // mmaps `path` and parses it. Errors: kIo (cannot open/map), kCorruptFile, kUnsupported.
  static Result<File> open(const std::string& path);
  // Parse from memory (for fuzzing and tests): `size` is the whole file; `bytes` must outlive
  // the File. `name` is used in error messages.
  static Result<File> parse(const uint8_t* bytes, uint64_t size, std::string name);

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute file offset of data section
  uint64_t file_size() const { return size_; }

  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  // Typed getters: error naming file and key if missing or of an incompatible type. Integers
  // convert between signed and unsigned when in range; get_float also accepts integers.
  Result<uint64_t> get_uint(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Pointer to a tensor's bytes (nbytes long) inside the mapping or the parsed buffer.
  // Absolute file offset = data_offset() + info.offset. `info` must come from this File.
  const uint8_t* tensor_data(const TensorInfo& info) const;
  // Drops this process's mapped pages of [p, p + n) (whole pages inside the range) once a copy
  // is all that is read, so they leave the resident set; a later read faults them in again from
  // the file. No-op for a File parsed from memory, or a range outside the mapping.
  void release(const void* p, uint64_t n) const;

 private:
  friend class Parser;
  File() = default;
  void unmap();
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  uint64_t size_ = 0;
  const uint8_t* base_ = nullptr;
  void* map_ = nullptr;  // non-null when this File owns an mmap of size_ bytes
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Writes a GGUF v3 file: metadata, tensor infos, aligned data. Tensor bytes are produced by a
// callback in chunks so tens of GB can be streamed without holding them in memory; producing
// the next chunk overlaps writing the previous one.
class Writer {
 public:
  explicit Writer(uint64_t alignment = kDefaultAlignment) : alignment_(alignment) {}
  // Adds or replaces a metadata key. general.alignment is emitted automatically when the
  // alignment is not the default.
  void add(std::string key, Value value);
  // shape: ne[0] first. `nbytes` is derived from type and shape. Errors on an invalid name,
  // duplicate name, bad shape, or ne[0] not a multiple of the type's block.
  Status add_tensor(std::string name, quant::Type type, std::vector<uint64_t> shape);

  // fill(index, offset, dst, nbytes): write bytes [offset, offset+nbytes) of tensor `index`
  // into dst. Chunks cover whole rows (offset and nbytes are multiples of the tensor's row
  // bytes) and arrive in order; chunk size is at most max(chunk_bytes, one row).
  using FillFn = std::function<Status(size_t index, uint64_t offset, uint8_t* dst, uint64_t nbytes)>;
  Status write(const std::string& path, const FillFn& fill) const;
  // Convenience for small files: tensors' bytes given in order of add_tensor.
  Status write(const std::string& path, const std::vector<std::vector<uint8_t>>& data) const;

  void set_chunk_bytes(uint64_t bytes) { chunk_bytes_ = bytes; }
  uint64_t alignment() const { return alignment_; }
  const std::vector<KeyValue>& metadata() const { return kv_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Size of the whole file write() produces.
  uint64_t file_bytes() const;
  // Header (metadata + tensor infos + padding), exactly as written at the start of the file.
  Result<std::vector<uint8_t>> header_bytes() const;

 private:
  uint64_t alignment_;
  uint64_t chunk_bytes_ = 64ull << 20;
  uint64_t data_bytes_ = 0;  // end of the last tensor, padded to alignment
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace sluice::gguf
