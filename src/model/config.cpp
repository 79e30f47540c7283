#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "gguf/gguf.h"
#include "model/arch.h"

namespace sluice::model {
namespace {

// Upper bounds that no real model approaches; they keep products of dimensions far from overflow.
constexpr uint64_t kMaxDim = 1u << 20;
constexpr int kMaxRot = 2048;  // the CPU RoPE keeps n_rot/2 angles on the stack
constexpr uint64_t kMaxExperts = 512;

class Reader {
 public:
  Reader(const gguf::File& f, std::string_view arch) : f_(f), prefix_(std::string(arch) + ".") {}
  std::string key(std::string_view k) const { return prefix_ + std::string(k); }
  bool has(std::string_view k) const { return f_.find(key(k)) != nullptr; }

  // A dimension in [1, kMaxDim].
  Result<int> dim(std::string_view k) const {
    auto v = f_.get_uint(key(k));
    if (!v) return v.status();
    if (*v < 1 || *v > kMaxDim) return bad(k, std::to_string(*v), "must be in [1, " + std::to_string(kMaxDim) + "]");
    return int(*v);
  }
  Result<int> dim_or(std::string_view k, int dflt) const { return has(k) ? dim(k) : Result<int>(dflt); }
  Result<float> positive(std::string_view k) const {
    auto v = f_.get_float(key(k));
    if (!v) return v.status();
    if (!(std::isfinite(*v) && *v > 0)) return bad(k, std::to_string(*v), "must be a finite number > 0");
    return float(*v);
  }
  Status bad(std::string_view k, const std::string& value, const std::string& why) const {
    return invalid_argument(f_.path() + ": " + key(k) + " = " + value + ": " + why);
  }

 private:
  const gguf::File& f_;
  std::string prefix_;
};

// Expert count, top-k and routing of a mixture-of-experts model; n_expert stays 0 for dense ones.
Status read_experts(const gguf::File& file, const ArchSpec& arch, const Reader& r, Config& c) {
  if (!r.has("expert_count")) {
    if (arch.moe.required) return r.bad("expert_count", "absent", "a " + c.arch + " model has experts");
    return Status::ok();
  }
  auto n = file.get_uint(r.key("expert_count"));
  if (!n) return n.status();
  if (*n == 0 && !arch.moe.required) return Status::ok();  // dense files may state 0 experts
  if (!arch.moe.supported) {
    return unsupported(file.path() + ": " + r.key("expert_count") + " = " + std::to_string(*n) +
                       ": experts are not supported for architecture " + c.arch);
  }
  if (*n < 2 || *n > kMaxExperts) {
    return r.bad("expert_count", std::to_string(*n), "must be in [2, " + std::to_string(kMaxExperts) + "]");
  }
  c.n_expert = int(*n);
  SLUICE_ASSIGN_OR_RETURN(c.n_expert_used, r.dim("expert_used_count"));
  if (c.n_expert_used > c.n_expert) {
    return r.bad("expert_used_count", std::to_string(c.n_expert_used),
                 "must be at most expert_count = " + std::to_string(c.n_expert));
  }
  c.expert_weights_norm = arch.moe.norm_weights;
  if (r.has("expert_weights_scale")) {
    auto s = file.get_float(r.key("expert_weights_scale"));
    if (!s) return s.status();
    if (!std::isfinite(*s) || *s < 0) return r.bad("expert_weights_scale", std::to_string(*s), "must be finite and >= 0");
    if (*s != 0) c.expert_weights_scale = float(*s);
  }
  return Status::ok();
}

// Gemma 3's sliding-window layers and their RoPE base (llama.cpp's gemma3 hyper-parameters).
Status read_sliding_window(const gguf::File& file, const Reader& r, Config& c) {
  if (!r.has("attention.sliding_window")) return Status::ok();  // every layer global
  auto w = file.get_uint(r.key("attention.sliding_window"));
  if (!w) return w.status();
  if (*w == 0) return Status::ok();
  if (*w > kMaxDim) return r.bad("attention.sliding_window", std::to_string(*w), "must be at most " + std::to_string(kMaxDim));
  c.n_swa = int(*w);
  c.swa_layers.assign(size_t(c.n_layer), false);
  const gguf::Value* pat = file.find(r.key("attention.sliding_window_pattern"));
  if (pat != nullptr && pat->type == gguf::ValueType::kArray) {
    // One entry per layer: true (or nonzero) for a sliding-window layer.
    if (pat->items.size() != size_t(c.n_layer)) {
      return r.bad("attention.sliding_window_pattern", "an array of " + std::to_string(pat->items.size()),
                   "must have one entry per layer (" + std::to_string(c.n_layer) + ")");
    }
    for (size_t l = 0; l < pat->items.size(); ++l) {
      const gguf::Value& v = pat->items[l];
      if (!(v.is_unsigned() || v.is_signed())) {
        return r.bad("attention.sliding_window_pattern", std::string("an array of ") + gguf::value_type_name(v.type),
                     "must hold bools or integers");
      }
      c.swa_layers[l] = v.is_unsigned() ? v.u != 0 : v.i != 0;
    }
  } else {
    // A period P: in each run of P layers the last is global (llama.cpp's default for gemma3: 6).
    uint64_t period = 6;
    if (pat != nullptr) {
      auto p = file.get_uint(r.key("attention.sliding_window_pattern"));
      if (!p) return p.status();
      if (*p > kMaxDim) return r.bad("attention.sliding_window_pattern", std::to_string(*p), "too large");
      period = *p;
    }
    for (int l = 0; l < c.n_layer; ++l) c.swa_layers[size_t(l)] = period == 0 || uint64_t(l) % period < period - 1;
  }
  if (r.has("rope.freq_base_swa")) {
    SLUICE_ASSIGN_OR_RETURN(c.rope_freq_base_swa, r.positive("rope.freq_base_swa"));
  }
  return Status::ok();
}

}  // namespace

Result<Config> read_config(const gguf::File& file, const ArchSpec& arch) {
  Config c;
  c.arch = std::string(arch.name);
  c.rope_mode = arch.rope_mode;
  Reader r(file, arch.name);
  SLUICE_ASSIGN_OR_RETURN(c.n_layer, r.dim("block_count"));
  SLUICE_ASSIGN_OR_RETURN(c.n_embd, r.dim("embedding_length"));
  SLUICE_RETURN_IF_ERROR(read_experts(file, arch, r, c));
  if (!c.moe() || r.has("feed_forward_length")) {
    SLUICE_ASSIGN_OR_RETURN(c.n_ff, r.dim("feed_forward_length"));
  }
  if (c.moe()) {
    // llama (Mixtral) states the expert size as feed_forward_length; Qwen MoE files as
    // expert_feed_forward_length (llama.cpp falls back to feed_forward_length / expert_used_count).
    if (r.has("expert_feed_forward_length")) {
      SLUICE_ASSIGN_OR_RETURN(c.n_ff_exp, r.dim("expert_feed_forward_length"));
    } else if (c.n_ff > 0) {
      c.n_ff_exp = arch.name == "llama" ? c.n_ff : c.n_ff / c.n_expert_used;
    }
    if (c.n_ff_exp < 1) return r.bad("expert_feed_forward_length", "absent", "needed for a mixture-of-experts model");
    if (std::any_of(arch.moe_ffn.begin(), arch.moe_ffn.end(),
                    [](const LayerTensorSpec& t) { return t.tensor == LayerTensor::kGateSh; })) {
      SLUICE_ASSIGN_OR_RETURN(c.n_ff_shexp, r.dim_or("expert_shared_feed_forward_length", c.n_ff));
      if (c.n_ff_shexp < 1) return r.bad("expert_shared_feed_forward_length", "absent", "needed for the shared expert");
    }
  }
  SLUICE_ASSIGN_OR_RETURN(c.n_head, r.dim("attention.head_count"));
  SLUICE_ASSIGN_OR_RETURN(c.n_head_kv, r.dim_or("attention.head_count_kv", c.n_head));
  SLUICE_ASSIGN_OR_RETURN(c.n_ctx_train, r.dim("context_length"));
  SLUICE_ASSIGN_OR_RETURN(c.rms_eps, r.positive("attention.layer_norm_rms_epsilon"));
  if (r.has("rope.freq_base")) {
    SLUICE_ASSIGN_OR_RETURN(c.rope_freq_base, r.positive("rope.freq_base"));
  }

  if (c.n_head % c.n_head_kv != 0) {
    return r.bad("attention.head_count_kv", std::to_string(c.n_head_kv),
                 "must divide attention.head_count = " + std::to_string(c.n_head));
  }
  if (!r.has("attention.key_length") && c.n_embd % c.n_head != 0) {
    return r.bad("attention.head_count", std::to_string(c.n_head),
                 "must divide embedding_length = " + std::to_string(c.n_embd));
  }
  SLUICE_ASSIGN_OR_RETURN(c.head_dim, r.dim_or("attention.key_length", c.n_embd / c.n_head));
  SLUICE_ASSIGN_OR_RETURN(c.head_dim_v, r.dim_or("attention.value_length", c.head_dim));
  if (c.head_dim_v != c.head_dim) {
    return unsupported(file.path() + ": " + r.key("attention.value_length") + " = " + std::to_string(c.head_dim_v) +
                       " differs from key_length = " + std::to_string(c.head_dim) + " (not supported)");
  }
  SLUICE_ASSIGN_OR_RETURN(c.n_rot, r.dim_or("rope.dimension_count", c.head_dim));
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0 || c.n_rot > kMaxRot) {
    return r.bad("rope.dimension_count", std::to_string(c.n_rot),
                 "must be even and <= head dim " + std::to_string(c.head_dim));
  }

  // RoPE scaling: only linear position interpolation (and Llama 3.1's frequency factors, which
  // come as the rope_freqs.weight tensor) are implemented.
  std::string scaling = "none";
  if (r.has("rope.scaling.type")) {
    SLUICE_ASSIGN_OR_RETURN(scaling, file.get_string(r.key("rope.scaling.type")));
  }
  if (scaling == "linear") {
    SLUICE_ASSIGN_OR_RETURN(float factor, r.positive("rope.scaling.factor"));
    c.rope_freq_scale = 1.0f / factor;
  } else if (scaling == "none") {
    if (r.has("rope.scale_linear")) {  // older files
      SLUICE_ASSIGN_OR_RETURN(float factor, r.positive("rope.scale_linear"));
      c.rope_freq_scale = 1.0f / factor;
    }
  } else {
    return unsupported(file.path() + ": " + r.key("rope.scaling.type") + " = \"" + scaling +
                       "\" is not supported (linear or none)");
  }

  const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (!embd) return invalid_argument(file.path() + ": missing tensor token_embd.weight");
  if (embd->shape.size() < 2 || embd->shape[1] < 1 || embd->shape[1] > (1u << 24)) {
    return invalid_argument(file.path() + ": tensor token_embd.weight has shape " + gguf::shape_string(embd->shape) +
                            ", expected [" + std::to_string(c.n_embd) + ", n_vocab]");
  }
  c.n_vocab = int(embd->shape[1]);

  c.ffn_act = arch.ffn_act;
  c.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
  if (arch.gemma.embd_scale) c.embd_scale = std::sqrt(float(c.n_embd));
  if (arch.gemma.sliding_window) {
    SLUICE_RETURN_IF_ERROR(read_sliding_window(file, r, c));
    // Gemma 3 27B (62 layers) scales queries by 1/sqrt(n_embd / n_head) (its
    // query_pre_attn_scalar), the other sizes by 1/sqrt(head_dim); the GGUF has no key for it, so
    // this follows llama.cpp, which tells the sizes apart by layer count.
    if (c.n_layer == 62) c.attn_scale = 1.0f / std::sqrt(float(c.n_embd / c.n_head));
    // Final-logit soft-capping (Gemma 2) is not implemented: refuse a file that asks for it.
    if (r.has("final_logit_softcapping")) {
      auto cap = file.get_float(r.key("final_logit_softcapping"));
      if (!cap) return cap.status();
      if (*cap != 0) {
        return unsupported(file.path() + ": " + r.key("final_logit_softcapping") + " = " + std::to_string(*cap) +
                           ": final-logit soft-capping is not supported");
      }
    }
  }
  return c;
}

}  // namespace sluice::model
