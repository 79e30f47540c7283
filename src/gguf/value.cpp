// Metadata values and tensor-info helpers shared by the reader and the writer.
#include <cmath>
#include <cstring>

#include "gguf/gguf.h"

namespace sluice::gguf {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kU8: return "u8";
    case ValueType::kI8: return "i8";
    case ValueType::kU16: return "u16";
    case ValueType::kI16: return "i16";
    case ValueType::kU32: return "u32";
    case ValueType::kI32: return "i32";
    case ValueType::kF32: return "f32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kU64: return "u64";
    case ValueType::kI64: return "i64";
    case ValueType::kF64: return "f64";
  }
  return "invalid";
}

namespace {
Value make_unsigned(ValueType t, uint64_t v) {
  Value x;
  x.type = t;
  x.u = v;
  return x;
}
Value make_signed(ValueType t, int64_t v) {
  Value x;
  x.type = t;
  x.i = v;
  return x;
}
Value make_float(ValueType t, double v) {
  Value x;
  x.type = t;
  x.f = v;
  return x;
}
}  // namespace

Value Value::u8(uint8_t v) { return make_unsigned(ValueType::kU8, v); }
Value Value::u16(uint16_t v) { return make_unsigned(ValueType::kU16, v); }
Value Value::u32(uint32_t v) { return make_unsigned(ValueType::kU32, v); }
Value Value::u64(uint64_t v) { return make_unsigned(ValueType::kU64, v); }
Value Value::boolean(bool v) { return make_unsigned(ValueType::kBool, v ? 1 : 0); }
Value Value::i8(int8_t v) { return make_signed(ValueType::kI8, v); }
Value Value::i16(int16_t v) { return make_signed(ValueType::kI16, v); }
Value Value::i32(int32_t v) { return make_signed(ValueType::kI32, v); }
Value Value::i64(int64_t v) { return make_signed(ValueType::kI64, v); }
Value Value::f32(float v) { return make_float(ValueType::kF32, v); }
Value Value::f64(double v) { return make_float(ValueType::kF64, v); }

Value Value::str(std::string v) {
  Value x;
  x.type = ValueType::kString;
  x.s = std::move(v);
  return x;
}

Value Value::array(ValueType elem, std::vector<Value> items) {
  Value x;
  x.type = ValueType::kArray;
  x.elem_type = elem;
  x.items = std::move(items);
  return x;
}

Value Value::string_array(const std::vector<std::string>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (const auto& s : v) items.push_back(str(s));
  return array(ValueType::kString, std::move(items));
}

Value Value::f32_array(const std::vector<float>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (float f : v) items.push_back(f32(f));
  return array(ValueType::kF32, std::move(items));
}

Value Value::i32_array(const std::vector<int32_t>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (int32_t i : v) items.push_back(i32(i));
  return array(ValueType::kI32, std::move(items));
}

bool Value::is_unsigned() const {
  return type == ValueType::kU8 || type == ValueType::kU16 || type == ValueType::kU32 || type == ValueType::kU64;
}
bool Value::is_signed() const {
  return type == ValueType::kI8 || type == ValueType::kI16 || type == ValueType::kI32 || type == ValueType::kI64;
}
bool Value::is_float() const { return type == ValueType::kF32 || type == ValueType::kF64; }

bool operator==(const Value& a, const Value& b) {
  if (a.type != b.type) return false;
  if (a.is_unsigned() || a.type == ValueType::kBool) return a.u == b.u;
  if (a.is_signed()) return a.i == b.i;
  // Bitwise, so NaN payloads round-trip and compare equal to themselves.
  if (a.is_float()) return std::memcmp(&a.f, &b.f, sizeof a.f) == 0;
  if (a.type == ValueType::kString) return a.s == b.s;
  if (a.type == ValueType::kArray) return a.elem_type == b.elem_type && a.items == b.items;
  return true;
}

uint64_t TensorInfo::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // overflow excluded by validation in reader and writer
  return n;
}

uint64_t TensorInfo::row_bytes() const {
  if (shape.empty()) return 0;
  int64_t r = quant::row_bytes(type, static_cast<int64_t>(shape[0]));
  return r < 0 ? 0 : static_cast<uint64_t>(r);
}

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace sluice::gguf
