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
  return c;
}

}  // namespace sluice::model
