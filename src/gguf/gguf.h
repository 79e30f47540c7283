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
  uint64_t offset = 0;          // relative to the start of the data section of its shard's file
  uint64_t nbytes = 0;          // computed from type and shape, validated against file size
  uint32_t shard = 0;           // index into File::shards(): the file holding the bytes (0 unless split)
  uint64_t n_elements() const;
  uint64_t row_bytes() const;   // bytes of one ne[0] row
  uint64_t n_rows() const { return shape.empty() ? 0 : n_elements() / shape[0]; }
};

// "[576, 49152]" (ne[0] first).
std::string shape_string(const std::vector<uint64_t>& shape);

// Split models (llama.cpp's gguf-split, tools/gguf-split/gguf-split.cpp): one model in several
// GGUF files ("shards") named <prefix>-00001-of-00003.gguf, <prefix>-00002-of-00003.gguf, ...
// Each shard is a complete GGUF file with its own header, alignment and data section. The first
// holds all of the model's metadata; every shard carries the three keys below; a tensor's bytes
// lie in exactly one shard.
inline constexpr std::string_view kSplitNo = "split.no";                     // u16, 0-based index
inline constexpr std::string_view kSplitCount = "split.count";               // u16, number of shards
inline constexpr std::string_view kSplitTensorsCount = "split.tensors.count";  // i32, over all shards
inline constexpr uint64_t kMaxShards = 65535;  // split.count is a u16 in gguf-split

// One file of a model: the only one, or one shard of a split model.
struct Shard {
  std::string path;
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;  // absolute file offset of this file's data section
  uint64_t size = 0;         // bytes of the file
  uint64_t n_tensors = 0;    // tensors whose bytes lie in this file
};

// A shard held in memory, for File::parse_shards.
struct ShardBytes {
  const uint8_t* bytes = nullptr;
  uint64_t size = 0;
  std::string name;  // used in error messages
};

// The paths of all `count` shards of the split model `path` belongs to, given that `path` is
// shard `no` (0-based), by gguf-split's naming: "<prefix>-%05d-of-%05d.gguf" with no + 1 and
// count. Error (kInvalidArgument) when the name does not end that way.
Result<std::vector<std::string>> split_paths(const std::string& path, uint64_t no, uint64_t count);

// A parsed, validated GGUF model, mapped read-only: one file, or all shards of a split model as
// one logical file (metadata of the first shard, the tensors of all). Movable, not copyable.
class File {
 public:
  // mmaps `path` and parses it. When it is the first shard of a split model (split.count > 1),
  // the other shards are found by name (split_paths) and loaded too, each with every check a
  // single file gets, plus: each shard's split.no is its position and split.count and
  // split.tensors.count equal the first's, no tensor name occurs twice, the shards hold
  // split.tensors.count tensors in all. Errors name the offending file: kIo (cannot open/map, a
  // missing shard), kCorruptFile (a corrupt shard, or shards that do not belong together),
  // kUnsupported, kInvalidArgument (a shard other than the first given, an unrecognised name).
  static Result<File> open(const std::string& path);
  // Parse from memory (for fuzzing and tests): `size` is the whole file; `bytes` must outlive
  // the File. `name` is used in error messages. One file: split keys are not followed.
  static Result<File> parse(const uint8_t* bytes, uint64_t size, std::string name);
  // A split model from memory: shards[k] is shard k, with the checks open() applies. A single
  // entry without split.count > 1 is an ordinary file.
  static Result<File> parse_shards(const std::vector<ShardBytes>& shards);

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  // The files of the model, in shard order; one entry unless split.
  const std::vector<Shard>& shards() const { return shards_; }
  bool is_split() const { return shards_.size() > 1; }
  // Of the first (or only) file: the path the model was opened by, and that file's header. A
  // tensor's bytes lie in shards()[info.shard]: use file_offset(), not data_offset() + offset.
  const std::string& path() const { return shards_.front().path; }
  uint32_t version() const { return shards_.front().version; }
  uint64_t alignment() const { return shards_.front().alignment; }
  uint64_t data_offset() const { return shards_.front().data_offset; }
  uint64_t file_size() const { return shards_.front().size; }

  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  // Typed getters: error naming file and key if missing or of an incompatible type. Integers
  // convert between signed and unsigned when in range; get_float also accepts integers.
  Result<uint64_t> get_uint(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;

  // Every tensor of the model: shard 0's in file order, then shard 1's, ...
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Absolute offset of a tensor's first byte in its file, shards()[info.shard].path.
  uint64_t file_offset(const TensorInfo& info) const { return shards_[info.shard].data_offset + info.offset; }
  // Pointer to a tensor's bytes (nbytes long) inside its shard's mapping or parsed buffer.
  // `info` must come from this File.
  const uint8_t* tensor_data(const TensorInfo& info) const;
  // Drops this process's mapped pages of [p, p + n) (whole pages inside the range) once a copy
  // is all that is read, so they leave the resident set; a later read faults them in again from
  // the file. The range must lie in one shard's mapping (a tensor's bytes do). No-op for a File
  // parsed from memory, or a range outside every mapping.
  void release(const void* p, uint64_t n) const;

 private:
  friend class Parser;
  friend class ShardSet;
  // Where a shard's bytes are: a mapping this File owns (map != nullptr) or a caller's buffer.
  struct Region {
    const uint8_t* base = nullptr;
    void* map = nullptr;
    uint64_t size = 0;
  };
  File() = default;
  void unmap();
  std::vector<Shard> shards_;    // never empty once parsed
  std::vector<Region> regions_;  // one per shard
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
