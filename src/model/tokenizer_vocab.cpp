// Reads tokenizer.ggml.* metadata into a VocabSpec. Every error names the key and the value
// (or element index) at fault; shape and range checks that do not need the file live in
// Tokenizer::from_vocab so hand-built specs get them too.
#include <string>

#include "gguf/gguf.h"
#include "model/tokenizer.h"

namespace sluice::model {
namespace {

using gguf::Value;
using gguf::ValueType;

std::string where(const gguf::File& f, std::string_view key) { return f.path() + ": " + std::string(key); }

Status wrong_type(const gguf::File& f, std::string_view key, const Value& v, const char* expected) {
  std::string got = gguf::value_type_name(v.type);
  if (v.type == ValueType::kArray) got += std::string(" of ") + gguf::value_type_name(v.elem_type);
  return corrupt_file(where(f, key) + " has type " + got + ", expected " + expected);
}

// Array of strings; missing = empty when !required.
Result<std::vector<std::string>> string_array(const gguf::File& f, std::string_view key, bool required) {
  const Value* v = f.find(key);
  if (!v) {
    if (required) return corrupt_file(where(f, key) + " is missing");
    return std::vector<std::string>{};
  }
  if (v->type != ValueType::kArray || v->elem_type != ValueType::kString) {
    return wrong_type(f, key, *v, "array of string");
  }
  std::vector<std::string> out;
  out.reserve(v->items.size());
  for (const Value& item : v->items) out.push_back(item.s);
  return out;
}

Result<std::vector<TokenType>> type_array(const gguf::File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (!v) return std::vector<TokenType>{};
  if (v->type != ValueType::kArray) return wrong_type(f, key, *v, "array of int32");
  std::vector<TokenType> out;
  out.reserve(v->items.size());
  for (size_t i = 0; i < v->items.size(); ++i) {
    const Value& item = v->items[i];
    int64_t t = 0;
    if (item.is_signed()) {
      t = item.i;
    } else if (item.is_unsigned()) {
      t = item.u > 1000 ? 1000 : static_cast<int64_t>(item.u);
    } else {
      return wrong_type(f, key, *v, "array of int32");
    }
    if (t < 0 || t > static_cast<int64_t>(TokenType::kByte)) {
      return corrupt_file(where(f, key) + "[" + std::to_string(i) + "] = " + std::to_string(t) +
                          " is not a token type (0..6)");
    }
    out.push_back(static_cast<TokenType>(t));
  }
  return out;
}

Result<std::vector<float>> float_array(const gguf::File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (!v) return std::vector<float>{};
  if (v->type != ValueType::kArray || !(v->items.empty() || v->items[0].is_float())) {
    return wrong_type(f, key, *v, "array of float32");
  }
  std::vector<float> out;
  out.reserve(v->items.size());
  for (const Value& item : v->items) {
    if (!item.is_float()) return wrong_type(f, key, *v, "array of float32");
    out.push_back(static_cast<float>(item.f));
  }
  return out;
}

// Optional token id: -1 when absent. Range is checked against the vocabulary in from_vocab.
Result<int32_t> token_id(const gguf::File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (!v) return int32_t{-1};
  if (!v->is_unsigned() && !v->is_signed()) return wrong_type(f, key, *v, "an integer");
  // Some converters write -1 (as i32) or 0xFFFFFFFF for "no such token".
  if ((v->is_signed() && v->i == -1) || (v->is_unsigned() && v->u == 0xFFFFFFFFull)) return int32_t{-1};
  const bool in_range = v->is_unsigned() ? v->u <= INT32_MAX : (v->i >= 0 && v->i <= INT32_MAX);
  if (!in_range) {
    const std::string shown = v->is_unsigned() ? std::to_string(v->u) : std::to_string(v->i);
    return corrupt_file(where(f, key) + " = " + shown + " is not a valid token id");
  }
  return static_cast<int32_t>(v->is_unsigned() ? static_cast<int64_t>(v->u) : v->i);
}

// Optional bool: -1 when absent.
Result<int> flag(const gguf::File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (!v) return -1;
  if (v->type != ValueType::kBool) return wrong_type(f, key, *v, "bool");
  return v->u != 0 ? 1 : 0;
}

Result<std::string> optional_string(const gguf::File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (!v) return std::string{};
  if (v->type != ValueType::kString) return wrong_type(f, key, *v, "string");
  return v->s;
}

}  // namespace

Result<VocabSpec> read_vocab(const gguf::File& f) {
  VocabSpec spec;
  const Value* model = f.find("tokenizer.ggml.model");
  if (!model) return corrupt_file(where(f, "tokenizer.ggml.model") + " is missing");
  if (model->type != ValueType::kString) return wrong_type(f, "tokenizer.ggml.model", *model, "string");
  spec.model = model->s;
  SLUICE_ASSIGN_OR_RETURN(spec.pre, optional_string(f, "tokenizer.ggml.pre"));
  SLUICE_ASSIGN_OR_RETURN(spec.tokens, string_array(f, "tokenizer.ggml.tokens", /*required=*/true));
  SLUICE_ASSIGN_OR_RETURN(spec.types, type_array(f, "tokenizer.ggml.token_type"));
  SLUICE_ASSIGN_OR_RETURN(spec.scores, float_array(f, "tokenizer.ggml.scores"));
  SLUICE_ASSIGN_OR_RETURN(spec.merges, string_array(f, "tokenizer.ggml.merges", /*required=*/false));
  SLUICE_ASSIGN_OR_RETURN(spec.bos, token_id(f, "tokenizer.ggml.bos_token_id"));
  SLUICE_ASSIGN_OR_RETURN(spec.eos, token_id(f, "tokenizer.ggml.eos_token_id"));
  SLUICE_ASSIGN_OR_RETURN(spec.eot, token_id(f, "tokenizer.ggml.eot_token_id"));
  SLUICE_ASSIGN_OR_RETURN(spec.eom, token_id(f, "tokenizer.ggml.eom_token_id"));
  SLUICE_ASSIGN_OR_RETURN(spec.unk, token_id(f, "tokenizer.ggml.unknown_token_id"));
  SLUICE_ASSIGN_OR_RETURN(spec.pad, token_id(f, "tokenizer.ggml.padding_token_id"));
  SLUICE_ASSIGN_OR_RETURN(spec.add_bos, flag(f, "tokenizer.ggml.add_bos_token"));
  SLUICE_ASSIGN_OR_RETURN(spec.add_space_prefix, flag(f, "tokenizer.ggml.add_space_prefix"));
  // Errors found later (ids out of range, bad merges) do not name the file; say it here.
  const size_t n = spec.tokens.size();
  const auto check_len = [&](const char* key, size_t len) -> Status {
    if (len != 0 && len != n) {
      return corrupt_file(where(f, key) + " has " + std::to_string(len) + " entries but tokenizer.ggml.tokens has " +
                          std::to_string(n));
    }
    return Status::ok();
  };
  SLUICE_RETURN_IF_ERROR(check_len("tokenizer.ggml.token_type", spec.types.size()));
  SLUICE_RETURN_IF_ERROR(check_len("tokenizer.ggml.scores", spec.scores.size()));
  return spec;
}

}  // namespace sluice::model
