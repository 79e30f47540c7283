#include "model/arch.h"

namespace sluice::model {
namespace {

using LT = LayerTensor;
using RM = backend::RopeMode;

// Llama 2/3/3.1/3.2, SmolLM2, Mistral, Mixtral (llama with experts): pre-norm attention + SwiGLU.
// Some fine-tunes carry Q/K/V biases; they are used when present.
constexpr LayerTensorSpec kLlamaAttn[] = {
    {LT::kAttnNorm, true}, {LT::kWq, true},  {LT::kWk, true},  {LT::kWv, true},
    {LT::kWo, true},       {LT::kBq, false}, {LT::kBk, false}, {LT::kBv, false},
};

// Qwen2 (and Qwen2-MoE): Q/K/V always carry biases.
constexpr LayerTensorSpec kQwen2Attn[] = {
    {LT::kAttnNorm, true}, {LT::kWq, true}, {LT::kWk, true}, {LT::kWv, true},
    {LT::kWo, true},       {LT::kBq, true}, {LT::kBk, true}, {LT::kBv, true},
};

// Qwen3 (and Qwen3-MoE): no biases; per-head RMSNorm on Q and K before RoPE.
constexpr LayerTensorSpec kQwen3Attn[] = {
    {LT::kAttnNorm, true}, {LT::kWq, true},    {LT::kWk, true},    {LT::kWv, true},
    {LT::kWo, true},       {LT::kQNorm, true}, {LT::kKNorm, true},
};

constexpr LayerTensorSpec kDenseFfn[] = {
    {LT::kFfnNorm, true}, {LT::kWGate, true}, {LT::kWUp, true}, {LT::kWDown, true},
};

constexpr LayerTensorSpec kMoeFfn[] = {
    {LT::kFfnNorm, true}, {LT::kGateInp, true}, {LT::kGateExps, true}, {LT::kUpExps, true}, {LT::kDownExps, true},
};

// Qwen2-MoE: routed experts plus a shared expert whose output is scaled by sigmoid(gate . x).
constexpr LayerTensorSpec kMoeSharedFfn[] = {
    {LT::kFfnNorm, true},  {LT::kGateInp, true},   {LT::kGateExps, true}, {LT::kUpExps, true},
    {LT::kDownExps, true}, {LT::kGateInpSh, true}, {LT::kGateSh, true},   {LT::kUpSh, true},
    {LT::kDownSh, true},
};

// Gemma 3: Qwen3-style attention (Q/K norms, no biases) plus an RMSNorm of the attention output
// before the residual add; the FFN's output is normed the same way.
constexpr LayerTensorSpec kGemma3Attn[] = {
    {LT::kAttnNorm, true}, {LT::kWq, true},    {LT::kWk, true},    {LT::kWv, true},
    {LT::kWo, true},       {LT::kQNorm, true}, {LT::kKNorm, true}, {LT::kPostAttnNorm, true},
};
constexpr LayerTensorSpec kGemma3Ffn[] = {
    {LT::kFfnNorm, true}, {LT::kWGate, true}, {LT::kWUp, true}, {LT::kWDown, true}, {LT::kPostFfnNorm, true},
};

constexpr ArchSpec kArchs[] = {
    {"llama", RM::kNormal, kLlamaAttn, kDenseFfn, kMoeFfn, {true, false, true}},
    {"mistral", RM::kNormal, kLlamaAttn, kDenseFfn, {}, {}},
    {"qwen2", RM::kNeox, kQwen2Attn, kDenseFfn, {}, {}},
    {"qwen3", RM::kNeox, kQwen3Attn, kDenseFfn, {}, {}},
    {"qwen3moe", RM::kNeox, kQwen3Attn, {}, kMoeFfn, {true, true, true}},
    {"qwen2moe", RM::kNeox, kQwen2Attn, {}, kMoeSharedFfn, {true, true, false}},
    {"gemma3", RM::kNeox, kGemma3Attn, kGemma3Ffn, {}, {}, FfnActivation::kGeluTanh, {true, true}},
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
    case LT::kGateInp: return "ffn_gate_inp.weight";
    case LT::kGateExps: return "ffn_gate_exps.weight";
    case LT::kUpExps: return "ffn_up_exps.weight";
    case LT::kDownExps: return "ffn_down_exps.weight";
    case LT::kGateInpSh: return "ffn_gate_inp_shexp.weight";
    case LT::kGateSh: return "ffn_gate_shexp.weight";
    case LT::kUpSh: return "ffn_up_shexp.weight";
    case LT::kDownSh: return "ffn_down_shexp.weight";
    case LT::kPostAttnNorm: return "post_attention_norm.weight";
    case LT::kPostFfnNorm: return "post_ffw_norm.weight";
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
