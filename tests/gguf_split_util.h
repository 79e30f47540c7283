// Test helper: writes a GGUF model as a split model exactly as llama.cpp's gguf-split does
// (tools/gguf-split/gguf-split.cpp in llama.cpp, `--split --split-max-tensors N`), with sluice's
// own Writer, so tests need no llama.cpp build:
//   - a new shard starts at every tensor index i > 0 with i % max_tensors == 0, tensors in the
//     input's order;
//   - shard 0 carries every metadata key of the input, in order, then split.no (u16),
//     split.tensors.count (i32), split.count (u16) (gguf-split sets split.count last: ggml's
//     gguf_set_val removes a key and appends it again); the other shards carry only those three;
//   - each shard is a GGUF v3 file with the default alignment (32): header padded to 32, each
//     tensor's data padded to 32 with zeros; a tensor's n_dims drops trailing dimensions of 1
//     (ggml_n_dims);
//   - names <prefix>-00001-of-0000N.gguf, ... (llama_split_path).
// tests/e2e/split.sh compares this with llama-gguf-split's output byte for byte when a llama.cpp
// build is at hand.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace sluice::test {

inline std::string split_name(const std::string& prefix, size_t no, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.gguf", no + 1, count);
  return prefix + buf;
}

// Writes the shards; returns their paths (first shard first).
inline Result<std::vector<std::string>> write_gguf_split(const gguf::File& in, const std::string& prefix,
                                                         size_t max_tensors) {
  if (max_tensors == 0) return invalid_argument("write_gguf_split: max_tensors must be > 0");
  if (in.is_split()) return invalid_argument(in.path() + ": already split");
  if (const gguf::Value* a = in.find("general.alignment"); a && a->u != gguf::kDefaultAlignment) {
    return unsupported(in.path() + ": general.alignment other than 32 is not handled by this helper");
  }
  const auto& tensors = in.tensors();
  const size_t n = tensors.size();
  const size_t count = n == 0 ? 1 : (n + max_tensors - 1) / max_tensors;
  std::vector<std::string> paths;
  for (size_t k = 0; k < count; ++k) {
    gguf::Writer w;
    if (k == 0) {
      for (const auto& kv : in.metadata()) w.add(kv.key, kv.value);
    }
    w.add(std::string(gguf::kSplitNo), gguf::Value::u16(uint16_t(k)));
    w.add(std::string(gguf::kSplitTensorsCount), gguf::Value::i32(int32_t(n)));
    w.add(std::string(gguf::kSplitCount), gguf::Value::u16(uint16_t(count)));
    const size_t first = k * max_tensors, last = std::min(n, first + max_tensors);
    std::vector<const gguf::TensorInfo*> mine;
    for (size_t i = first; i < last; ++i) {
      std::vector<uint64_t> shape = tensors[i].shape;
      while (shape.size() > 1 && shape.back() == 1) shape.pop_back();
      SLUICE_RETURN_IF_ERROR(w.add_tensor(tensors[i].name, tensors[i].type, shape));
      mine.push_back(&tensors[i]);
    }
    const std::string path = split_name(prefix, k, count);
    SLUICE_RETURN_IF_ERROR(w.write(path, [&](size_t index, uint64_t offset, uint8_t* dst, uint64_t nbytes) {
      std::memcpy(dst, in.tensor_data(*mine[index]) + offset, nbytes);
      return Status::ok();
    }));
    paths.push_back(path);
  }
  return paths;
}

}  // namespace sluice::test
