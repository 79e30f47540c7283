// `sluice inspect`: a description of a GGUF file built from its metadata and tensor infos only
// (no weights are read). One report feeds both the text and the JSON rendering.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"

namespace sluice::app {

// Role of a tensor in the per-layer byte summary: "attn_q", "attn_k", "attn_v", "attn_output",
// "ffn_gate", "ffn_up", "ffn_down", "norms", "experts", "other" for blk.N.* tensors;
// "token_embd", "output", "output_norm", "other" outside layers. Biases count with their weight.
struct TensorRole {
  int layer = -1;    // -1: not a blk.N tensor
  std::string role;
};
TensorRole tensor_role(const std::string& name);

struct LayerBytes {
  int layer = -1;
  uint64_t total = 0;
  std::map<std::string, uint64_t> by_role;
};

struct InspectReport {
  std::string path;            // the file given (the first shard of a split model)
  uint32_t version = 0;        // version, size, alignment, data offset: of that file
  uint64_t file_bytes = 0;
  uint64_t alignment = 0;
  uint64_t data_offset = 0;
  std::vector<gguf::Shard> shards;  // every file of the model; one unless split (gguf-split)
  std::string architecture;                              // "" if absent
  std::vector<std::pair<std::string, std::string>> hparams;  // "<arch>.*" keys (prefix removed), rendered
  std::vector<std::pair<std::string, std::string>> general;  // "general.*" keys, rendered
  std::string tokenizer_model, tokenizer_pre;
  uint64_t vocab_size = 0, n_merges = 0;
  std::vector<const gguf::TensorInfo*> tensors;          // file order
  std::vector<LayerBytes> layers;                        // by layer index
  std::map<std::string, uint64_t> non_layer;             // role -> bytes
  std::map<std::string, uint64_t> by_type;               // type name -> bytes
  uint64_t tensor_bytes = 0;
};

InspectReport make_report(const gguf::File& file);
std::string render_text(const InspectReport& report);
nlohmann::json render_json(const InspectReport& report);
// A metadata value as a short string: scalars in full, strings quoted (long ones cut),
// arrays as "[n x type]" with the first few items.
std::string render_value(const gguf::Value& v);

}  // namespace sluice::app
