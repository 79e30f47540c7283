// GGUF file access: parse and validate (reader), and write (writer). Knows bytes and metadata,
// nothing about models. Every count, length and offset is checked against the file size before
// use; violations become a Status naming file, field and value.
//
// On-disk layout (little endian, versions 2 and 3):
//   magic "GGUF" u32 | version u32 | n_tensors u64 | n_kv u64
//   n_kv x { key: string | value_type u32 | value }
//   n_tensors x { name: string | n_dims u32 | dims u64[n_dims] | type u32 | offset u64 }
//   padding to general.alignment (default 32) | tensor data (each offset relative to here,
//   multiple of alignment)
//   string = u64 length + bytes (no terminator); array = elem_type u32 + count u64 + elems.
#pragma once

#include <cstdint>
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
const char* value_type_name(ValueType t);

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

  static Value u32(uint32_t v);
  static Value i32(int32_t v);
  static Value u64(uint64_t v);
  static Value f32(float v);
  static Value boolean(bool v);
  static Value str(std::string v);
  static Value array(ValueType elem, std::vector<Value> items);
  static Value string_array(const std::vector<std::string>& v);
  static Value f32_array(const std::vector<float>& v);
  static Value i32_array(const std::vector<int32_t>& v);
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  quant::Type type = quant::Type::kF32;
  std::vector<uint64_t> shape;  // ne[0] (innermost, contiguous) first, as in the file
  uint64_t offset = 0;          // relative to the start of the data section
  uint64_t nbytes = 0;          // computed from type and shape, validated against file size
  uint64_t n_elements() const;
};

// A parsed, validated GGUF file, mapped read-only. Movable, not copyable.
class File {
 public:
  static Result<File> open(const std::string& path);
  // Parse from memory (for fuzzing and tests); `bytes` must outlive the File.
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
  // Typed getters: error if missing or of an incompatible type (integers convert if in range).
  Result<uint64_t> get_uint(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Pointer to a tensor's bytes inside the mapping (nbytes long), or nullptr when opened by
  // parse() from a prefix. Absolute file offset = data_offset() + info.offset.
  const uint8_t* tensor_data(const TensorInfo& info) const;

 private:
  File() = default;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t size_ = 0;
  const uint8_t* base_ = nullptr;
  void* map_ = nullptr;  // non-null when this File owns an mmap of size_ bytes
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
};

// Writes a GGUF v3 file: metadata, tensor infos, aligned data. Tensor bytes are produced by a
// callback so tens of GB can be streamed without holding them in memory.
class Writer {
 public:
  explicit Writer(uint64_t alignment = 32) : alignment_(alignment) {}
  void add(std::string key, Value value);
  // shape: ne[0] first. `nbytes` is derived from type and shape.
  Status add_tensor(std::string name, quant::Type type, std::vector<uint64_t> shape);
  // fill(index, dst, nbytes) writes tensor `index`'s bytes into dst.
  using FillFn = Status (*)(void* ctx, size_t index, uint8_t* dst, uint64_t nbytes);
  Status write(const std::string& path, FillFn fill, void* ctx) const;
  // Convenience for small files: tensors' bytes given in order of add_tensor.
  Status write(const std::string& path, const std::vector<std::vector<uint8_t>>& data) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

 private:
  uint64_t alignment_;
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
};

}  // namespace sluice::gguf
