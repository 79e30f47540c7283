// synth: shapes, type mixes, metadata, tokenizer section and the tensor list.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <random>
#include <unordered_set>

#include "app/synth.h"

namespace sluice::app {

namespace {

using gguf::KeyValue;
using gguf::Value;
using quant::Type;

// llama.cpp's llama_ftype numbering, stored as general.file_type.
uint32_t file_type_of(const TypeMix& mix) {
  if (mix.k_m) return 15;  // MOSTLY_Q4_K_M
  switch (mix.base) {
    case Type::kF32: return 0;
    case Type::kF16: return 1;
    case Type::kQ4_0: return 2;
    case Type::kQ4_1: return 3;
    case Type::kQ8_0: return 7;
    case Type::kQ5_0: return 8;
    case Type::kQ5_1: return 9;
    case Type::kQ2_K: return 10;
    case Type::kQ3_K: return 11;  // Q3_K_S: Q3_K everywhere
    case Type::kQ4_K: return 14;  // Q4_K_S
    case Type::kQ5_K: return 16;  // Q5_K_S
    case Type::kQ6_K: return 18;
    case Type::kBF16: return 32;
    default: return 0;
  }
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2 byte-level alphabet: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order, so every byte is a visible, unique, whitespace-free character.
std::vector<std::string> byte_tokens() {
  auto printable = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); };
  std::vector<std::string> t(256);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) append_utf8(t[b], printable(b) ? static_cast<uint32_t>(b) : next++);
  return t;
}

}  // namespace

std::vector<std::string> shape_names() {
  return {"llama-3-8b",      "llama-3-70b",    "mixtral-8x7b", "qwen3-30b-a3b",
          "qwen3-235b-a22b", "qwen2moe-a2.7b", "tiny",         "custom"};
}

Result<SynthShape> named_shape(std::string_view name) {
  SynthShape s;
  s.name = std::string(name);
  if (name == "llama-3-8b") {
    s.layers = 32, s.dim = 4096, s.ffn = 14336, s.heads = 32, s.kv_heads = 8, s.vocab = 128256;
    s.rope_theta = 500000.0f, s.ctx = 8192;
  } else if (name == "llama-3-70b") {
    s.layers = 80, s.dim = 8192, s.ffn = 28672, s.heads = 64, s.kv_heads = 8, s.vocab = 128256;
    s.rope_theta = 500000.0f, s.ctx = 8192;
  } else if (name == "mixtral-8x7b") {
    s.layers = 32, s.dim = 4096, s.ffn = 14336, s.heads = 32, s.kv_heads = 8, s.vocab = 32000;
    s.experts = 8, s.experts_used = 2, s.rope_theta = 1000000.0f, s.ctx = 32768;
  } else if (name == "qwen3-30b-a3b") {  // Qwen3-30B-A3B's config.json
    s.arch = "qwen3", s.layers = 48, s.dim = 2048, s.heads = 32, s.kv_heads = 4, s.head_dim = 128;
    s.experts = 128, s.experts_used = 8, s.ffn = 768, s.vocab = 151936;
    s.rope_theta = 1000000.0f, s.ctx = 40960, s.rms_eps = 1e-6f;
  } else if (name == "qwen3-235b-a22b") {
    s.arch = "qwen3", s.layers = 94, s.dim = 4096, s.heads = 64, s.kv_heads = 4, s.head_dim = 128;
    s.experts = 128, s.experts_used = 8, s.ffn = 1536, s.vocab = 151936;
    s.rope_theta = 1000000.0f, s.ctx = 40960, s.rms_eps = 1e-6f;
  } else if (name == "qwen2moe-a2.7b") {  // Qwen1.5-MoE-A2.7B
    s.arch = "qwen2", s.layers = 24, s.dim = 2048, s.heads = 16, s.kv_heads = 16;
    s.experts = 60, s.experts_used = 4, s.ffn = 1408, s.shared_ffn = 5632, s.vocab = 151936;
    s.rope_theta = 1000000.0f, s.ctx = 8192, s.rms_eps = 1e-6f;
  } else if (name == "tiny") {
    s.layers = 2, s.dim = 256, s.ffn = 512, s.heads = 4, s.kv_heads = 2, s.vocab = 1024;
  } else if (name != "custom") {
    std::string names;
    for (const auto& n : shape_names()) names += (names.empty() ? "" : ", ") + n;
    return invalid_argument("unknown shape '" + std::string(name) + "' (known: " + names + ")");
  }
  return s;
}

Status validate(const SynthShape& s) {
  auto bad = [](const std::string& opt, uint64_t v, const std::string& why) {
    return invalid_argument("--" + opt + " " + std::to_string(v) + ": " + why);
  };
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3" && s.arch != "gemma3") {
    return invalid_argument("--arch '" + s.arch + "': expected llama, qwen2, qwen3 or gemma3");
  }
  if (s.arch == "gemma3" && s.experts > 0) return bad("experts", s.experts, "gemma3 has no experts");
  if (s.arch != "gemma3" && s.sliding_window > 0) {
    return bad("sliding-window", s.sliding_window, "only gemma3 has sliding-window layers");
  }
  if (s.sliding_window > 0 && (s.swa_period < 1 || s.swa_period > 1000)) {
    return bad("swa-period", s.swa_period, "must be in 1..1000");
  }
  if (s.layers < 1 || s.layers > 1000) return bad("layers", s.layers, "must be in 1..1000");
  if (s.dim < 1 || s.dim > 65536) return bad("dim", s.dim, "must be in 1..65536");
  if (s.ffn < 1 || s.ffn > 262144) return bad("ffn", s.ffn, "must be in 1..262144");
  if (s.heads < 1 || s.heads > 1024) return bad("heads", s.heads, "must be in 1..1024");
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0) return bad("kv-heads", s.kv_heads, "must divide --heads");
  if (s.head_dim == 0 && s.dim % s.heads != 0) return bad("dim", s.dim, "must be a multiple of --heads");
  if (s.n_embd_head() % 2 != 0 || s.n_embd_head() > 1024) {
    return bad("head-dim", s.n_embd_head(), "must be even and at most 1024");
  }
  if (s.vocab < 260 || s.vocab > 1000000) return bad("vocab", s.vocab, "must be in 260..1000000");
  if (s.experts == 1 || s.experts > 512) return bad("experts", s.experts, "must be 0 (dense) or 2..512");
  if (s.experts > 0 && (s.experts_used < 1 || s.experts_used > s.experts)) {
    return bad("experts-used", s.experts_used, "must be in 1..--experts");
  }
  if (s.experts == 0 && s.experts_used != 0) return bad("experts-used", s.experts_used, "needs --experts");
  // llama.cpp's qwen2 and qwen2moe build q and the attention output n_embd wide.
  if (s.arch == "qwen2" && uint64_t{s.heads} * s.n_embd_head() != s.dim) {
    return bad("head-dim", s.n_embd_head(), "qwen2 needs --heads x head dim == --dim (llama.cpp's qwen2 attention is --dim wide)");
  }
  const bool qwen2moe = s.arch == "qwen2" && s.experts > 0;
  if (qwen2moe && s.shared_ffn == 0) {
    return invalid_argument("--shared-ffn: qwen2moe (--arch qwen2 with --experts) needs its shared expert's size (> 0)");
  }
  if (!qwen2moe && s.shared_ffn != 0) {
    return bad("shared-ffn", s.shared_ffn, "only qwen2moe (--arch qwen2 with --experts) has a shared expert");
  }
  if (s.shared_ffn > 262144) return bad("shared-ffn", s.shared_ffn, "must be at most 262144");
  if (!(s.route_skew >= 0) || s.route_skew > 8) {  // NaN too
    char v[32];
    std::snprintf(v, sizeof v, "%g", double(s.route_skew));
    return invalid_argument(std::string("--route-skew ") + v + ": must be in 0..8 (a Zipf exponent)");
  }
  if (s.route_skew > 0 && s.experts == 0) {
    return invalid_argument("--route-skew: needs --experts (it biases the MoE router)");
  }
  if (s.route_skew > 0 && s.dim < 4 * kRouteDims) {
    return bad("dim", s.dim, "--route-skew reserves " + std::to_string(kRouteDims) +
                                 " residual dims and needs --dim >= " + std::to_string(4 * kRouteDims));
  }
  if (s.ctx < 1) return bad("ctx", s.ctx, "must be positive");
  if (!(s.rope_theta > 0) || !std::isfinite(s.rope_theta)) return invalid_argument("--rope-theta must be positive");
  return Status::ok();
}

namespace {
std::string lowercase(std::string_view name) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}
}  // namespace

Result<quant::Type> parse_weight_format(std::string_view name, std::string_view option) {
  const std::string head = std::string(option) + " '" + std::string(name) + "': ";
  auto t = quant::type_from_name(lowercase(name));
  if (!t) return invalid_argument(head + "unknown format (e.g. q8_0, q6_k)");
  if (!quant::kernels(*t).vec_dot || !quant::kernels(*t).quantize_row) {
    return invalid_argument(head + "not a weight format");
  }
  return *t;
}

Result<TypeMix> parse_type_mix(std::string_view name) {
  const std::string lower = lowercase(name);
  if (lower == "q4_k_m") return TypeMix{lower, Type::kQ4_K, true, std::nullopt};
  if (!quant::type_from_name(lower)) {
    return invalid_argument("--type '" + std::string(name) + "': unknown (q4_k_m or a format name, e.g. q6_k)");
  }
  auto t = parse_weight_format(name, "--type");
  if (!t.is_ok()) return t.status();
  return TypeMix{lower, *t, false, std::nullopt};
}

void add_tokenizer(std::vector<KeyValue>& kv, uint32_t vocab, const std::string& pre, uint64_t seed) {
  std::vector<std::string> tokens = byte_tokens();
  const uint32_t n_special = std::clamp<uint32_t>(vocab / 500, 2, 256);
  const uint32_t n_merged_target = vocab - 256 - n_special;
  std::unordered_set<std::string> seen(tokens.begin(), tokens.end());
  // Pieces merges are built from: letters and the space marker (U+0120).
  std::vector<uint32_t> letters;
  for (int b = 'a'; b <= 'z'; ++b) letters.push_back(static_cast<uint32_t>(b));
  for (int b = 'A'; b <= 'Z'; ++b) letters.push_back(static_cast<uint32_t>(b));
  letters.push_back(' ');
  std::vector<uint32_t> mergeable = letters;  // token ids a merge's left side may use
  std::vector<std::string> merges;
  merges.reserve(n_merged_target);
  std::mt19937_64 rng(seed ^ 0x70CE11ull);
  uint64_t attempts = 0;
  while (merges.size() < n_merged_target && attempts++ < 64ull * n_merged_target + 1000) {
    const uint32_t a = mergeable[rng() % mergeable.size()];
    const uint32_t b = letters[rng() % letters.size()];
    std::string s = tokens[a] + tokens[b];
    if (s.size() > 24 || seen.count(s)) continue;
    merges.push_back(tokens[a] + " " + tokens[b]);
    seen.insert(s);
    mergeable.push_back(static_cast<uint32_t>(tokens.size()));
    tokens.push_back(std::move(s));
  }
  std::vector<int32_t> types(tokens.size(), 1);  // NORMAL
  const uint32_t bos = static_cast<uint32_t>(tokens.size());
  for (uint32_t i = 0; tokens.size() < vocab; ++i) {
    tokens.push_back(i == 0 ? "<|begin_of_text|>" : i == 1 ? "<|end_of_text|>"
                                                           : "<|reserved_special_token_" + std::to_string(i - 2) + "|>");
    types.push_back(3);  // CONTROL
  }
  kv.push_back({"tokenizer.ggml.model", Value::str("gpt2")});
  kv.push_back({"tokenizer.ggml.pre", Value::str(pre)});
  kv.push_back({"tokenizer.ggml.tokens", Value::string_array(tokens)});
  kv.push_back({"tokenizer.ggml.token_type", Value::i32_array(types)});
  kv.push_back({"tokenizer.ggml.merges", Value::string_array(merges)});
  kv.push_back({"tokenizer.ggml.bos_token_id", Value::u32(bos)});
  kv.push_back({"tokenizer.ggml.eos_token_id", Value::u32(bos + 1)});
  kv.push_back({"tokenizer.ggml.add_bos_token", Value::boolean(true)});
}

std::vector<double> route_targets(uint32_t experts, uint32_t experts_used, double exponent) {
  std::vector<double> p(experts);
  for (uint32_t r = 0; r < experts; ++r) p[r] = std::pow(double(r + 1), -exponent);
  // Water-filling: cap at 1/k, hand the excess to the uncapped ranks in proportion, repeat (a
  // rank capped stays capped, since every step only raises the others).
  const double cap = 1.0 / std::max<uint32_t>(experts_used, 1);
  std::vector<bool> capped(experts, false);
  for (uint32_t iter = 0; iter <= experts; ++iter) {
    double fixed = 0, free = 0;  // shares of the capped ranks, and of the others before scaling
    for (uint32_t r = 0; r < experts; ++r) {
      if (capped[r]) {
        fixed += cap;
      } else {
        free += p[r];
      }
    }
    const double scale = free > 0 ? (1.0 - fixed) / free : 0;
    bool changed = false;
    for (uint32_t r = 0; r < experts; ++r) {
      if (capped[r]) continue;
      p[r] *= scale;
      if (p[r] > cap * (1 + 1e-12)) capped[r] = changed = true;
    }
    for (uint32_t r = 0; r < experts; ++r) {
      if (capped[r]) p[r] = cap;
    }
    if (!changed) break;
  }
  return p;
}

Result<SynthPlan> make_plan(const SynthShape& s, const TypeMix& mix, uint64_t seed) {
  SLUICE_RETURN_IF_ERROR(validate(s));
  SynthPlan plan;
  const bool moe = s.experts > 0;
  const std::string arch = !moe ? s.arch : s.arch == "qwen3" ? "qwen3moe" : s.arch == "qwen2" ? "qwen2moe" : s.arch;
  // qwen2moe and qwen3moe size their experts with their own keys; llama (Mixtral) with
  // feed_forward_length.
  const bool expert_key = arch == "qwen3moe" || arch == "qwen2moe";
  const bool skew = moe && s.route_skew > 0;
  if (skew) plan.skew = RouteSkew{s.route_skew, kRouteDims, s.experts, s.experts_used};
  const uint32_t hd = s.n_embd_head();
  auto& kv = plan.metadata;
  auto a = [&](const std::string& k) { return arch + "." + k; };
  kv.push_back({"general.architecture", Value::str(arch)});
  kv.push_back({"general.name", Value::str("synthetic " + s.name)});
  kv.push_back({"general.file_type", Value::u32(file_type_of(mix))});
  kv.push_back({"general.quantization_version", Value::u32(2)});
  kv.push_back({a("context_length"), Value::u32(s.ctx)});
  kv.push_back({a("embedding_length"), Value::u32(s.dim)});
  kv.push_back({a("block_count"), Value::u32(s.layers)});
  if (expert_key) {
    // feed_forward_length is what converters copy from the HF intermediate_size; llama.cpp's
    // qwen2moe/qwen3moe graphs do not read it when the expert keys are present. The values
    // are the real models': Qwen3-MoE's intermediate_size is expert size x experts used (6144,
    // 12288), Qwen1.5-MoE's equals its shared expert (5632), and llama.cpp falls back to exactly
    // those relations when a key is missing.
    kv.push_back({a("feed_forward_length"), Value::u32(arch == "qwen2moe" ? s.shared_ffn : s.ffn * s.experts_used)});
    kv.push_back({a("expert_feed_forward_length"), Value::u32(s.ffn)});
    if (arch == "qwen2moe") kv.push_back({a("expert_shared_feed_forward_length"), Value::u32(s.shared_ffn)});
  } else {
    kv.push_back({a("feed_forward_length"), Value::u32(s.ffn)});
  }
  kv.push_back({a("attention.head_count"), Value::u32(s.heads)});
  kv.push_back({a("attention.head_count_kv"), Value::u32(s.kv_heads)});
  kv.push_back({a("rope.freq_base"), Value::f32(s.rope_theta)});
  kv.push_back({a("attention.layer_norm_rms_epsilon"), Value::f32(s.rms_eps)});
  kv.push_back({a("rope.dimension_count"), Value::u32(hd)});
  if (s.head_dim) {
    kv.push_back({a("attention.key_length"), Value::u32(hd)});
    kv.push_back({a("attention.value_length"), Value::u32(hd)});
  }
  kv.push_back({a("vocab_size"), Value::u32(s.vocab)});
  if (s.sliding_window > 0) {
    kv.push_back({a("attention.sliding_window"), Value::u32(s.sliding_window)});
    kv.push_back({a("attention.sliding_window_pattern"), Value::u32(s.swa_period)});
    kv.push_back({a("rope.freq_base_swa"), Value::f32(10000.0f)});
  }
  if (moe) {
    kv.push_back({a("expert_count"), Value::u32(s.experts)});
    kv.push_back({a("expert_used_count"), Value::u32(s.experts_used)});
  }
  // Not a llama.cpp key (readers ignore it): says the routers are biased (RouteSkew).
  if (skew) kv.push_back({"sluice.synth.route_skew", Value::f32(s.route_skew)});
  add_tokenizer(kv, s.vocab, s.vocab >= 128000 && arch == "llama" ? "llama-bpe" : "default", seed);

  // A row that is not a whole number of the format's blocks falls back as llama.cpp's quantizer
  // does (tensor_type_fallback), then to F16.
  auto pick = [&](Type want, uint64_t ne0) {
    auto fits = [&](Type t) { return ne0 % static_cast<uint64_t>(quant::traits(t).block_elems) == 0; };
    if (fits(want)) return want;
    ++plan.fallbacks;
    Type next = Type::kQ8_0;
    switch (want) {
      case Type::kQ2_K:
      case Type::kQ3_K: next = Type::kQ4_0; break;
      case Type::kQ4_K: next = Type::kQ5_0; break;
      case Type::kQ5_K: next = Type::kQ5_1; break;
      default: break;  // Q6_K -> Q8_0; 32-element formats that do not fit go on to F16
    }
    return fits(next) ? next : Type::kF16;
  };
  // q4_k_m follows llama.cpp's choices for LLAMA_FTYPE_MOSTLY_Q4_K_M (llama-quant.cpp): output
  // Q6_K; attn_v and every ffn_down* (ffn_down, ffn_down_exps, ffn_down_shexp; the layer is the
  // one in the name) Q6_K in the first and last eighth of the layers and every third layer
  // between; with exactly 8 experts (Mixtral) attn_v and attn_k Q8_0 in every layer and
  // attn_output Q5_K. Not followed, so dense files keep their bytes: llama.cpp's Q5_K attn_v in
  // the other layers of a model it types 70B (llama, 80 layers), and a tied token_embd taking
  // the output's Q6_K.
  auto more_bits = [&](uint32_t l) {
    const uint32_t n = s.layers;
    return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
  };
  const bool mixtral8 = s.experts == 8;
  auto matrix = [&](const std::string& name, std::vector<uint64_t> shape, Type km_type,
                    Reserved reserved = Reserved::kNone, std::optional<Type> forced = std::nullopt) {
    const Type want = forced ? *forced : mix.k_m ? km_type : mix.base;
    const float scale = 1.0f / std::sqrt(static_cast<float>(shape[0]));
    plan.tensors.push_back({name, pick(want, shape[0]), std::move(shape), TensorKind::kMatrix, scale,
                            skew ? reserved : Reserved::kNone});
  };
  auto f32 = [&](const std::string& name, uint64_t n, TensorKind kind, float scale,
                 Reserved reserved = Reserved::kNone) {
    plan.tensors.push_back({name, Type::kF32, {n}, kind, scale, skew ? reserved : Reserved::kNone});
  };
  const Type q4 = Type::kQ4_K, q6 = Type::kQ6_K;
  const uint64_t q_dim = uint64_t{s.heads} * hd, kv_dim = uint64_t{s.kv_heads} * hd;
  matrix("token_embd.weight", {s.dim, s.vocab}, q4, Reserved::kEmbedRows, mix.embd);
  if (s.rope_scaling) f32("rope_freqs.weight", hd / 2, TensorKind::kRopeFreqs, 0);
  f32("output_norm.weight", s.dim, TensorKind::kNorm, 0.05f);
  if (!s.tied_output) matrix("output.weight", {s.dim, s.vocab}, q6);
  for (uint32_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const Type down = more_bits(l) ? q6 : q4;
    f32(p + "attn_norm.weight", s.dim, TensorKind::kNorm, 0.05f);
    matrix(p + "attn_q.weight", {s.dim, q_dim}, q4);
    matrix(p + "attn_k.weight", {s.dim, kv_dim}, mixtral8 ? Type::kQ8_0 : q4);
    matrix(p + "attn_v.weight", {s.dim, kv_dim}, mixtral8 ? Type::kQ8_0 : down);
    matrix(p + "attn_output.weight", {q_dim, s.dim}, mixtral8 ? Type::kQ5_K : q4, Reserved::kZeroRows);
    if (s.arch == "qwen2") {
      f32(p + "attn_q.bias", q_dim, TensorKind::kBias, 0.02f);
      f32(p + "attn_k.bias", kv_dim, TensorKind::kBias, 0.02f);
      f32(p + "attn_v.bias", kv_dim, TensorKind::kBias, 0.02f);
    }
    if (s.arch == "qwen3" || s.arch == "gemma3") {
      f32(p + "attn_q_norm.weight", hd, TensorKind::kNorm, 0.05f);
      f32(p + "attn_k_norm.weight", hd, TensorKind::kNorm, 0.05f);
    }
    if (s.arch == "gemma3") f32(p + "post_attention_norm.weight", s.dim, TensorKind::kNorm, 0.05f);
    f32(p + "ffn_norm.weight", s.dim, TensorKind::kNorm, 0.05f, Reserved::kUnitGains);
    if (!moe) {
      matrix(p + "ffn_gate.weight", {s.dim, s.ffn}, q4);
      matrix(p + "ffn_up.weight", {s.dim, s.ffn}, q4);
      matrix(p + "ffn_down.weight", {s.ffn, s.dim}, down);
      if (s.arch == "gemma3") f32(p + "post_ffw_norm.weight", s.dim, TensorKind::kNorm, 0.05f);
      continue;
    }
    // The router stays F32, as llama.cpp's quantizer leaves it (and route skew computes it).
    plan.tensors.push_back({p + "ffn_gate_inp.weight", Type::kF32, {s.dim, s.experts},
                            skew ? TensorKind::kRouter : TensorKind::kMatrix,
                            1.0f / std::sqrt(static_cast<float>(s.dim)), Reserved::kNone, int(l)});
    matrix(p + "ffn_gate_exps.weight", {s.dim, s.ffn, s.experts}, q4);
    matrix(p + "ffn_up_exps.weight", {s.dim, s.ffn, s.experts}, q4);
    matrix(p + "ffn_down_exps.weight", {s.ffn, s.dim, s.experts}, down, Reserved::kZeroRows);
    if (arch == "qwen2moe") {
      // The shared expert's gate: sigmoid(w . x) scales its output; 1-D, so F32 (llama.cpp
      // quantizes only 2-D and 3-D tensors).
      plan.tensors.push_back({p + "ffn_gate_inp_shexp.weight", Type::kF32, {s.dim}, TensorKind::kMatrix,
                              1.0f / std::sqrt(static_cast<float>(s.dim))});
      matrix(p + "ffn_gate_shexp.weight", {s.dim, s.shared_ffn}, q4);
      matrix(p + "ffn_up_shexp.weight", {s.dim, s.shared_ffn}, q4);
      matrix(p + "ffn_down_shexp.weight", {s.shared_ffn, s.dim}, down, Reserved::kZeroRows);
    }
  }
  return plan;
}

}  // namespace sluice::app
