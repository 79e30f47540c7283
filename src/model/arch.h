// Architectures as data. An architecture is the list of per-layer tensors it carries (with
// whether each is required), its RoPE layout, and nothing else: the layer loop in forward is
// shared, and optional pieces (biases, Q/K norms, rope frequency factors) switch on when their
// tensors are present. Adding an architecture is a table entry plus whatever is truly new.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "backend/backend.h"

namespace sluice::model {

// Per-layer tensors, named blk.<i>.<suffix> in GGUF files.
enum class LayerTensor {
  kAttnNorm,  // attn_norm.weight    [n_embd]                       f32
  kWq,        // attn_q.weight       [n_embd, n_head * head_dim]
  kWk,        // attn_k.weight       [n_embd, n_head_kv * head_dim]
  kWv,        // attn_v.weight       [n_embd, n_head_kv * head_dim]
  kWo,        // attn_output.weight  [n_head * head_dim, n_embd]
  kBq,        // attn_q.bias         [n_head * head_dim]             f32
  kBk,        // attn_k.bias         [n_head_kv * head_dim]          f32
  kBv,        // attn_v.bias         [n_head_kv * head_dim]          f32
  kQNorm,     // attn_q_norm.weight  [head_dim]                      f32 (per-head RMSNorm)
  kKNorm,     // attn_k_norm.weight  [head_dim]                      f32
  kFfnNorm,   // ffn_norm.weight     [n_embd]                        f32
  kWGate,     // ffn_gate.weight     [n_embd, n_ff]
  kWUp,       // ffn_up.weight       [n_embd, n_ff]
  kWDown,     // ffn_down.weight     [n_ff, n_embd]
  // Mixture of experts (n_expert > 0): a router and stacked experts instead of the dense FFN.
  kGateInp,    // ffn_gate_inp.weight       [n_embd, n_expert]                 (router; f32 in practice)
  kGateExps,   // ffn_gate_exps.weight      [n_embd, n_ff_exp, n_expert]
  kUpExps,     // ffn_up_exps.weight        [n_embd, n_ff_exp, n_expert]
  kDownExps,   // ffn_down_exps.weight      [n_ff_exp, n_embd, n_expert]
  kGateInpSh,  // ffn_gate_inp_shexp.weight [n_embd]                           (shared expert's gate)
  kGateSh,     // ffn_gate_shexp.weight     [n_embd, n_ff_shexp]
  kUpSh,       // ffn_up_shexp.weight       [n_embd, n_ff_shexp]
  kDownSh,     // ffn_down_shexp.weight     [n_ff_shexp, n_embd]
  // Gemma 3: RMSNorms of each block's output before it joins the residual stream.
  kPostAttnNorm,  // post_attention_norm.weight [n_embd]                      f32
  kPostFfnNorm,   // post_ffw_norm.weight       [n_embd]                      f32
};
const char* layer_tensor_suffix(LayerTensor t);  // "attn_q.weight"

struct LayerTensorSpec {
  LayerTensor tensor;
  bool required;
};

// Mixture-of-experts routing of an architecture (llama.cpp's build_moe_ffn with softmax gating):
// probabilities = softmax(router logits) over all experts, the top n_expert_used are chosen, and
// their weights are the probabilities, renormalized to sum 1 where norm_weights.
struct MoeSpec {
  bool supported = false;    // the architecture may have experts (<arch>.expert_count > 0)
  bool required = false;     // it must have them (qwen3moe, qwen2moe)
  bool norm_weights = false;
};

// The feed-forward block's gated activation: act(W_gate x) * (W_up x).
enum class FfnActivation {
  kSilu,      // SwiGLU (llama, mistral, qwen)
  kGeluTanh,  // GeGLU with GELU's tanh approximation (gemma3)
};

// Gemma 3 (llama.cpp's gemma3 graph): token embeddings scaled by sqrt(n_embd), GeGLU, a
// post-attention and a post-FFN RMSNorm (their tensors in the arch table), Q/K norms, and layers
// that alternate sliding-window (local) and global attention, each kind with its own RoPE base
// (<arch>.attention.sliding_window, .attention.sliding_window_pattern, .rope.freq_base_swa).
struct GemmaSpec {
  bool embd_scale = false;      // x = token_embd[id] * sqrt(n_embd)
  bool sliding_window = false;  // reads the sliding-window keys (a window of 0 or absent: all global)
};

struct ArchSpec {
  std::string_view name;  // general.architecture
  backend::RopeMode rope_mode;
  std::span<const LayerTensorSpec> layer_tensors;  // attention (and its norm)
  std::span<const LayerTensorSpec> dense_ffn;      // ffn_norm + the dense FFN
  std::span<const LayerTensorSpec> moe_ffn;        // ffn_norm + router + experts (+ shared expert)
  MoeSpec moe;
  FfnActivation ffn_act = FfnActivation::kSilu;
  GemmaSpec gemma = {};
};

// nullptr when the architecture is not supported.
const ArchSpec* find_arch(std::string_view name);
// "llama, mistral, qwen2, qwen3": for error messages.
std::string supported_archs();

}  // namespace sluice::model
