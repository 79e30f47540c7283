#include "model/arch.h"

namespace sluice::model {
namespace {

using LT = LayerTensor;
using RM = backend::RopeMode;

// Llama 2/3/3.1/3.2, SmolLM2, Mistral: pre-norm attention + SwiGLU. Some fine-tunes carry Q/K/V
// biases; they are used when present.
constexpr LayerTensorSpec kLlamaLayer[] = {
    {LT::kAttnNorm, true}, {LT::kWq, true},   {LT::kWk, true},      {LT::kWv, true},
    {LT::kWo, true},       {LT::kBq, false},  {LT::kBk, false},     {LT::kBv, false},
    {LT::kFfnNorm, true},  {LT::kWGate, true}, {LT::kWUp, true},    {LT::kWDown, true},
};

// Qwen2: Q/K/V always carry biases.
constexpr LayerTensorSpec kQwen2Layer[] = {
    {LT::kAttnNorm, true}, {LT::kWq, true},   {LT::kWk, true},      {LT::kWv, true},
    {LT::kWo, true},       {LT::kBq, true},   {LT::kBk, true},      {LT::kBv, true},
    {LT::kFfnNorm, true},  {LT::kWGate, true}, {LT::kWUp, true},    {LT::kWDown, true},
};

// Qwen3: no biases; per-head RMSNorm on Q and K before RoPE.
constexpr LayerTensorSpec kQwen3Layer[] = {
    {LT::kAttnNorm, true}, {LT::kWq, true},    {LT::kWk, true},     {LT::kWv, true},
    {LT::kWo, true},       {LT::kQNorm, true}, {LT::kKNorm, true},  {LT::kFfnNorm, true},
    {LT::kWGate, true},    {LT::kWUp, true},   {LT::kWDown, true},
};

constexpr ArchSpec kArchs[] = {
    {"llama", RM::kNormal, kLlamaLayer},
    {"mistral", RM::kNormal, kLlamaLayer},
    {"qwen2", RM::kNeox, kQwen2Layer},
    {"qwen3", RM::kNeox, kQwen3Layer},
};

}  // namespace

const char* layer_tensor_suffix(LayerTensor t) {
  switch (t) {
    case LT::kAttnNorm: return "attn_norm.weight";
    case LT::kWq: return "attn_q.weight";
    case LT::kWk: return "attn_k.weight";
    case LT::kWv: return "attn_v.weight";
    case LT::kWo: return "attn_output.weight";
    case LT::kBq: return "attn_q.bias";
    case LT::kBk: return "attn_k.bias";
    case LT::kBv: return "attn_v.bias";
    case LT::kQNorm: return "attn_q_norm.weight";
    case LT::kKNorm: return "attn_k_norm.weight";
    case LT::kFfnNorm: return "ffn_norm.weight";
    case LT::kWGate: return "ffn_gate.weight";
    case LT::kWUp: return "ffn_up.weight";
    case LT::kWDown: return "ffn_down.weight";
  }
  return "?";
}

const ArchSpec* find_arch(std::string_view name) {
  for (const auto& a : kArchs)
    if (a.name == name) return &a;
  return nullptr;
}

std::string supported_archs() {
  std::string s;
  for (const auto& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += a.name;
  }
  return s;
}

}  // namespace sluice::model
