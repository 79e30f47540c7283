// Hyper-parameters of a model, read from GGUF metadata keys "<arch>.*" and validated, so that the
// layer loop can trust every dimension it is given.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace sluice::gguf {
class File;
}

namespace sluice::model {

struct ArchSpec;
enum class FfnActivation;

struct Config {
  std::string arch;             // general.architecture
  int n_layer = 0;              // <arch>.block_count
  int n_embd = 0;               // <arch>.embedding_length
  int n_ff = 0;                 // <arch>.feed_forward_length
  int n_head = 0;               // <arch>.attention.head_count
  int n_head_kv = 0;            // <arch>.attention.head_count_kv (default n_head)
  int head_dim = 0;             // <arch>.attention.key_length (default n_embd / n_head)
  int head_dim_v = 0;           // <arch>.attention.value_length (default head_dim)
  int n_rot = 0;                // <arch>.rope.dimension_count (default head_dim)
  int n_ctx_train = 0;          // <arch>.context_length
  int n_vocab = 0;              // token_embd.weight ne1
  float rms_eps = 0;            // <arch>.attention.layer_norm_rms_epsilon
  float rope_freq_base = 10000.0f;  // <arch>.rope.freq_base
  float rope_freq_scale = 1.0f;     // 1 / <arch>.rope.scaling.factor for linear scaling
  backend::RopeMode rope_mode = backend::RopeMode::kNormal;  // from the arch table
  // Mixture of experts (0 experts: a dense FFN of n_ff).
  int n_expert = 0;             // <arch>.expert_count
  int n_expert_used = 0;        // <arch>.expert_used_count (top-k)
  int n_ff_exp = 0;             // <arch>.expert_feed_forward_length (llama: feed_forward_length)
  int n_ff_shexp = 0;           // <arch>.expert_shared_feed_forward_length (qwen2moe; 0: none)
  bool expert_weights_norm = false;  // top-k weights renormalized to sum 1 (from the arch table)
  float expert_weights_scale = 1.0f; // <arch>.expert_weights_scale (0 or absent: 1)
  // Gemma 3 (ArchSpec::gemma); the defaults are every other architecture's behaviour.
  FfnActivation ffn_act{};      // from the arch table (SwiGLU unless stated)
  float embd_scale = 1.0f;      // token embeddings are multiplied by this (gemma3: sqrt(n_embd))
  float attn_scale = 0.0f;      // q.k scale (1/sqrt(head_dim); gemma3 27B: 1/sqrt(n_embd / n_head))
  int n_swa = 0;                // <arch>.attention.sliding_window (0: every layer global)
  // Sliding-window layers: <arch>.attention.sliding_window_pattern, a period P (layer l is local
  // unless l % P == P - 1; default 6 for gemma3) or one bool per layer. Empty: none.
  std::vector<bool> swa_layers;
  float rope_freq_base_swa = 10000.0f;  // <arch>.rope.freq_base_swa (local layers' RoPE base)
  float rope_freq_scale_swa = 1.0f;     // local layers are never position-scaled

  bool is_swa(int layer) const { return n_swa > 0 && size_t(layer) < swa_layers.size() && swa_layers[size_t(layer)]; }

  bool moe() const { return n_expert > 0; }
  // Widest FFN hidden activation a layer needs (dense, routed expert or shared expert).
  int n_ff_max() const { return moe() ? std::max(n_ff_exp, n_ff_shexp) : n_ff; }

  int n_embd_q() const { return n_head * head_dim; }
  int n_embd_k() const { return n_head_kv * head_dim; }
  int n_embd_v() const { return n_head_kv * head_dim_v; }
};

// Reads and validates the hyper-parameters of `arch` from `file`. Errors name the file and key.
Result<Config> read_config(const gguf::File& file, const ArchSpec& arch);

}  // namespace sluice::model
