// Tiny random-weight models of every supported architecture, written with gguf::Writer: the
// layer loop against an independent scalar forward pass, and load-time validation (missing
// tensor, wrong shape or type, unknown architecture, inconsistent hyper-parameters).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"
#include "test_util.h"

namespace sluice::model {
namespace {

struct Spec {
  std::string arch = "llama";
  int n_embd = 64, n_head = 4, n_head_kv = 2, n_ff = 96, n_layer = 2, n_vocab = 40, n_ctx = 128;
  int head_dim = 0;  // <arch>.attention.key_length when > 0 (else n_embd / n_head)
  int hd() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  // Gemma 3: embeddings scaled by sqrt(n_embd), GeGLU, post-attention/post-FFN norms, sliding-window
  // layers (window n_swa, every swa_period-th layer global) with RoPE base rope_base_swa, global
  // layers with rope_base.
  bool gemma = false;
  int n_swa = 0, swa_period = 0;
  float rope_base = 10000.0f, rope_base_swa = 10000.0f;
  bool is_swa(int l) const { return gemma && n_swa > 0 && l % swa_period < swa_period - 1; }
  bool bias = false, qk_norm = false, tied = false, freq_factors = false;
  bool neox = false;
  // Mixture of experts: n_expert > 0 replaces the dense FFN with a router and stacked experts of
  // n_ff rows each (written as <arch>.feed_forward_length for llama, expert_feed_forward_length
  // otherwise); n_ff_shexp > 0 adds qwen2moe's gated shared expert.
  int n_expert = 0, n_used = 0, n_ff_shexp = 0;
  bool norm_w = false;
};

// name -> (shape ne0 first, f32 values)
using Tensors = std::map<std::string, std::pair<std::vector<uint64_t>, std::vector<float>>>;

Tensors make_tensors(const Spec& s, uint64_t salt = 100) {
  Tensors t;
  auto add = [&](const std::string& name, std::vector<uint64_t> shape, float scale, float offset = 0) {
    uint64_t n = 1;
    for (auto d : shape) n *= d;
    auto v = test::random_floats(n, scale, ++salt);
    for (auto& x : v) x += offset;
    t[name] = {shape, v};
  };
  const uint64_t e = s.n_embd, q = uint64_t(s.n_head * s.hd()), kv = uint64_t(s.n_head_kv * s.hd());
  add("token_embd.weight", {e, uint64_t(s.n_vocab)}, 1.0f);
  add("output_norm.weight", {e}, 0.1f, 1.0f);
  if (!s.tied) add("output.weight", {e, uint64_t(s.n_vocab)}, 0.2f);
  if (s.freq_factors) add("rope_freqs.weight", {uint64_t(s.hd() / 2)}, 0.3f, 2.0f);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {e}, 0.1f, 1.0f);
    add(p + "attn_q.weight", {e, q}, 0.2f);
    add(p + "attn_k.weight", {e, kv}, 0.2f);
    add(p + "attn_v.weight", {e, kv}, 0.2f);
    add(p + "attn_output.weight", {q, e}, 0.2f);
    if (s.bias) {
      add(p + "attn_q.bias", {q}, 0.5f);
      add(p + "attn_k.bias", {kv}, 0.5f);
      add(p + "attn_v.bias", {kv}, 0.5f);
    }
    if (s.qk_norm) {
      add(p + "attn_q_norm.weight", {uint64_t(s.hd())}, 0.1f, 1.0f);
      add(p + "attn_k_norm.weight", {uint64_t(s.hd())}, 0.1f, 1.0f);
    }
    add(p + "ffn_norm.weight", {e}, 0.1f, 1.0f);
    if (s.gemma) {
      add(p + "post_attention_norm.weight", {e}, 0.1f, 1.0f);
      add(p + "post_ffw_norm.weight", {e}, 0.1f, 1.0f);
    }
    if (s.n_expert > 0) {
      const uint64_t f = uint64_t(s.n_ff), x = uint64_t(s.n_expert);
      add(p + "ffn_gate_inp.weight", {e, x}, 0.5f);
      add(p + "ffn_gate_exps.weight", {e, f, x}, 0.2f);
      add(p + "ffn_up_exps.weight", {e, f, x}, 0.2f);
      add(p + "ffn_down_exps.weight", {f, e, x}, 0.2f);
      if (s.n_ff_shexp > 0) {
        const uint64_t fs = uint64_t(s.n_ff_shexp);
        add(p + "ffn_gate_inp_shexp.weight", {e}, 0.3f);
        add(p + "ffn_gate_shexp.weight", {e, fs}, 0.2f);
        add(p + "ffn_up_shexp.weight", {e, fs}, 0.2f);
        add(p + "ffn_down_shexp.weight", {fs, e}, 0.2f);
      }
      continue;
    }
    add(p + "ffn_gate.weight", {e, uint64_t(s.n_ff)}, 0.2f);
    add(p + "ffn_up.weight", {e, uint64_t(s.n_ff)}, 0.2f);
    add(p + "ffn_down.weight", {uint64_t(s.n_ff), e}, 0.2f);
  }
  return t;
}

// Writes the model; `mutate` may edit metadata/tensors first (to break them).
std::string write_model(const Spec& s, const Tensors& t, const std::string& tag,
                        const std::map<std::string, gguf::Value>& extra_kv = {},
                        const std::map<std::string, quant::Type>& types = {}) {
  gguf::Writer w;
  const std::string a = s.arch;
  w.add("general.architecture", gguf::Value::str(a));
  w.add(a + ".block_count", gguf::Value::u32(uint32_t(s.n_layer)));
  w.add(a + ".context_length", gguf::Value::u32(uint32_t(s.n_ctx)));
  w.add(a + ".embedding_length", gguf::Value::u32(uint32_t(s.n_embd)));
  w.add(a + (s.n_expert > 0 && a != "llama" ? ".expert_feed_forward_length" : ".feed_forward_length"),
        gguf::Value::u32(uint32_t(s.n_ff)));
  if (s.n_expert > 0) {
    w.add(a + ".expert_count", gguf::Value::u32(uint32_t(s.n_expert)));
    w.add(a + ".expert_used_count", gguf::Value::u32(uint32_t(s.n_used)));
  }
  if (s.n_ff_shexp > 0) w.add(a + ".expert_shared_feed_forward_length", gguf::Value::u32(uint32_t(s.n_ff_shexp)));
  w.add(a + ".attention.head_count", gguf::Value::u32(uint32_t(s.n_head)));
  w.add(a + ".attention.head_count_kv", gguf::Value::u32(uint32_t(s.n_head_kv)));
  w.add(a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-5f));
  w.add(a + ".rope.freq_base", gguf::Value::f32(s.rope_base));
  if (s.head_dim > 0) w.add(a + ".attention.key_length", gguf::Value::u32(uint32_t(s.head_dim)));
  if (s.gemma && s.n_swa > 0) {
    w.add(a + ".attention.sliding_window", gguf::Value::u32(uint32_t(s.n_swa)));
    w.add(a + ".attention.sliding_window_pattern", gguf::Value::u32(uint32_t(s.swa_period)));
    w.add(a + ".rope.freq_base_swa", gguf::Value::f32(s.rope_base_swa));
  }
  for (const auto& [k, v] : extra_kv) w.add(k, v);
  std::vector<std::vector<uint8_t>> data;
  for (const auto& [name, tv] : t) {
    auto it = types.find(name);
    const quant::Type ty = it == types.end() ? quant::Type::kF32 : it->second;
    EXPECT_TRUE(w.add_tensor(name, ty, tv.first).is_ok()) << name;
    const int64_t ne0 = int64_t(tv.first[0]);
    const int64_t rows = int64_t(tv.second.size()) / ne0;
    const int64_t rb = quant::row_bytes(ty, ne0);
    std::vector<uint8_t> bytes(size_t(rb * rows));
    for (int64_t r = 0; r < rows; ++r)
      quant::kernels(ty).quantize_row(tv.second.data() + r * ne0, bytes.data() + r * rb, ne0);
    data.push_back(std::move(bytes));
  }
  const std::string path = std::filesystem::temp_directory_path().string() + "/sluice_model_" + tag + "_" +
                           std::to_string(::getpid()) + ".gguf";
  const Status st = w.write(path, data);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return path;
}

// Independent scalar forward pass (double accumulation, f32 weights, f32 cache): logits of every
// position for tokens at positions 0..n-1. For mixtures of experts, *min_margin receives the
// smallest router logit gap between a token's last chosen expert and the next one: below the
// implementation's own logit error a different (equally valid) expert may be chosen.
std::vector<float> reference_forward(const Spec& s, const Tensors& t, const std::vector<int32_t>& toks,
                                     double* min_margin = nullptr) {
  if (min_margin) *min_margin = 1e300;
  const int E = s.n_embd, H = s.n_head, KVH = s.n_head_kv, D = s.hd(), F = s.n_ff, V = s.n_vocab;
  const int n = int(toks.size());
  auto W = [&](const std::string& name) -> const std::vector<float>& { return t.at(name).second; };
  auto has = [&](const std::string& name) { return t.count(name) > 0; };
  auto norm = [](const float* x, const float* w, int len, float* y) {
    double ss = 0;
    for (int i = 0; i < len; ++i) ss += double(x[i]) * x[i];
    const double sc = 1.0 / std::sqrt(ss / len + 1e-5);
    for (int i = 0; i < len; ++i) y[i] = float(x[i] * sc * w[i]);
  };
  auto matvec = [](const std::vector<float>& w, const float* x, int in, int out, float* y) {
    for (int o = 0; o < out; ++o) {
      double acc = 0;
      for (int i = 0; i < in; ++i) acc += double(w[size_t(o * in + i)]) * x[i];
      y[o] = float(acc);
    }
  };
  auto rope = [&](float* v, int pos, double base) {
    for (int i = 0; i < D / 2; ++i) {
      double th = pos * std::pow(base, -2.0 * i / D);
      if (s.freq_factors) th /= W("rope_freqs.weight")[size_t(i)];
      const int i0 = s.neox ? i : 2 * i, i1 = s.neox ? i + D / 2 : 2 * i + 1;
      const double a = v[i0], b = v[i1];
      v[i0] = float(a * std::cos(th) - b * std::sin(th));
      v[i1] = float(a * std::sin(th) + b * std::cos(th));
    }
  };
  std::vector<float> x(size_t(n * E));
  for (int p = 0; p < n; ++p)
    std::memcpy(&x[size_t(p * E)], &W("token_embd.weight")[size_t(toks[size_t(p)] * E)], size_t(E) * 4);
  if (s.gemma)
    for (float& xi : x) xi = float(double(xi) * std::sqrt(double(E)));
  std::vector<std::vector<float>> K(size_t(s.n_layer)), Vc(size_t(s.n_layer));
  auto buf = [](int len) { return std::vector<float>(static_cast<size_t>(len)); };
  std::vector<float> xn = buf(E), q = buf(H * D), k = buf(KVH * D), v = buf(KVH * D), att = buf(H * D), o = buf(E);
  // y += scale * W_down . (silu(W_gate x) * (W_up x)) with [f, E] gate/up and [E, f] down matrices.
  auto swiglu_ffn = [&](const float* wg, const float* wu, const float* wd, int f, const float* xin, double scale,
                        float* y) {
    std::vector<double> h(static_cast<size_t>(f));
    for (int r = 0; r < f; ++r) {
      double a = 0, b = 0;
      for (int i = 0; i < E; ++i) {
        a += double(wg[size_t(r) * size_t(E) + size_t(i)]) * xin[i];
        b += double(wu[size_t(r) * size_t(E) + size_t(i)]) * xin[i];
      }
      const double g = float(a);
      h[size_t(r)] = s.gemma ? 0.5 * g * (1 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (g + 0.044715 * g * g * g))) * float(b)
                             : g / (1 + std::exp(-g)) * float(b);
    }
    for (int o2 = 0; o2 < E; ++o2) {
      double acc = 0;
      for (int r = 0; r < f; ++r) acc += double(wd[size_t(o2) * size_t(f) + size_t(r)]) * float(h[size_t(r)]);
      y[o2] += float(scale * float(acc));
    }
  };
  std::vector<float> ffn_out = buf(E);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const bool swa = s.is_swa(l);
    const double base = swa ? s.rope_base_swa : s.rope_base;
    for (int pos = 0; pos < n; ++pos) {
      float* xp = &x[size_t(pos * E)];
      norm(xp, W(p + "attn_norm.weight").data(), E, xn.data());
      matvec(W(p + "attn_q.weight"), xn.data(), E, H * D, q.data());
      matvec(W(p + "attn_k.weight"), xn.data(), E, KVH * D, k.data());
      matvec(W(p + "attn_v.weight"), xn.data(), E, KVH * D, v.data());
      if (has(p + "attn_q.bias")) {
        for (int i = 0; i < H * D; ++i) q[size_t(i)] += W(p + "attn_q.bias")[size_t(i)];
        for (int i = 0; i < KVH * D; ++i) k[size_t(i)] += W(p + "attn_k.bias")[size_t(i)];
        for (int i = 0; i < KVH * D; ++i) v[size_t(i)] += W(p + "attn_v.bias")[size_t(i)];
      }
      for (int h = 0; h < H; ++h) {
        if (s.qk_norm) norm(&q[size_t(h * D)], W(p + "attn_q_norm.weight").data(), D, &q[size_t(h * D)]);
        rope(&q[size_t(h * D)], pos, base);
      }
      for (int h = 0; h < KVH; ++h) {
        if (s.qk_norm) norm(&k[size_t(h * D)], W(p + "attn_k_norm.weight").data(), D, &k[size_t(h * D)]);
        rope(&k[size_t(h * D)], pos, base);
      }
      K[size_t(l)].insert(K[size_t(l)].end(), k.begin(), k.end());
      Vc[size_t(l)].insert(Vc[size_t(l)].end(), v.begin(), v.end());
      for (int h = 0; h < H; ++h) {
        const int kh = h / (H / KVH);
        // Keys [j0, pos]: all, or the last n_swa positions in a sliding-window layer.
        const int j0 = swa ? std::max(0, pos - s.n_swa + 1) : 0;
        std::vector<double> sc(static_cast<size_t>(pos + 1), 0.0);
        double mx = -1e300, sum = 0;
        for (int j = j0; j <= pos; ++j) {
          double d = 0;
          for (int i = 0; i < D; ++i) d += double(q[size_t(h * D + i)]) * K[size_t(l)][size_t((j * KVH + kh) * D + i)];
          sc[size_t(j)] = d / std::sqrt(double(D));
          mx = std::max(mx, sc[size_t(j)]);
        }
        for (int j = j0; j <= pos; ++j) sum += (sc[size_t(j)] = std::exp(sc[size_t(j)] - mx));
        for (int i = 0; i < D; ++i) {
          double acc = 0;
          for (int j = j0; j <= pos; ++j) acc += sc[size_t(j)] / sum * Vc[size_t(l)][size_t((j * KVH + kh) * D + i)];
          att[size_t(h * D + i)] = float(acc);
        }
      }
      matvec(W(p + "attn_output.weight"), att.data(), H * D, E, o.data());
      if (s.gemma) norm(o.data(), W(p + "post_attention_norm.weight").data(), E, o.data());
      for (int i = 0; i < E; ++i) xp[i] += o[size_t(i)];
      norm(xp, W(p + "ffn_norm.weight").data(), E, xn.data());
      if (s.gemma) {
        std::fill(ffn_out.begin(), ffn_out.end(), 0.0f);
        swiglu_ffn(W(p + "ffn_gate.weight").data(), W(p + "ffn_up.weight").data(), W(p + "ffn_down.weight").data(), F,
                   xn.data(), 1.0, ffn_out.data());
        norm(ffn_out.data(), W(p + "post_ffw_norm.weight").data(), E, ffn_out.data());
        for (int i = 0; i < E; ++i) xp[i] += ffn_out[size_t(i)];
        continue;
      }
      if (s.n_expert == 0) {
        swiglu_ffn(W(p + "ffn_gate.weight").data(), W(p + "ffn_up.weight").data(), W(p + "ffn_down.weight").data(), F,
                   xn.data(), 1.0, xp);
        continue;
      }
      // Router: softmax over all experts, the n_used most probable, weights renormalized (norm_w).
      const int X = s.n_expert;
      std::vector<float> z = buf(X);
      matvec(W(p + "ffn_gate_inp.weight"), xn.data(), E, X, z.data());
      std::vector<double> pr(static_cast<size_t>(X));
      double mx = -1e300, sum = 0;
      for (int e = 0; e < X; ++e) mx = std::max(mx, double(z[size_t(e)]));
      for (int e = 0; e < X; ++e) sum += pr[size_t(e)] = std::exp(double(z[size_t(e)]) - mx);
      std::vector<int> order(static_cast<size_t>(X));
      for (int e = 0; e < X; ++e) order[size_t(e)] = e;
      std::sort(order.begin(), order.end(), [&](int a, int b) { return pr[size_t(a)] > pr[size_t(b)]; });
      if (min_margin && s.n_used < X) {
        *min_margin = std::min(*min_margin, double(z[size_t(order[size_t(s.n_used - 1)])]) -
                                                double(z[size_t(order[size_t(s.n_used)])]));
      }
      double wsum = 0;
      for (int k = 0; k < s.n_used; ++k) wsum += pr[size_t(order[size_t(k)])] / sum;
      for (int k = 0; k < s.n_used; ++k) {
        const int ex = order[size_t(k)];
        const double wk = pr[size_t(ex)] / sum / (s.norm_w ? wsum : 1.0);
        const size_t off = size_t(ex) * size_t(F) * size_t(E);
        swiglu_ffn(W(p + "ffn_gate_exps.weight").data() + off, W(p + "ffn_up_exps.weight").data() + off,
                   W(p + "ffn_down_exps.weight").data() + off, F, xn.data(), wk, xp);
      }
      if (s.n_ff_shexp > 0) {
        double gs = 0;
        for (int i = 0; i < E; ++i) gs += double(W(p + "ffn_gate_inp_shexp.weight")[size_t(i)]) * xn[size_t(i)];
        swiglu_ffn(W(p + "ffn_gate_shexp.weight").data(), W(p + "ffn_up_shexp.weight").data(),
                   W(p + "ffn_down_shexp.weight").data(), s.n_ff_shexp, xn.data(), 1.0 / (1.0 + std::exp(-gs)), xp);
      }
    }
  }
  std::vector<float> logits(size_t(n * V));
  const auto& out = s.tied ? W("token_embd.weight") : W("output.weight");
  for (int pos = 0; pos < n; ++pos) {
    norm(&x[size_t(pos * E)], W("output_norm.weight").data(), E, xn.data());
    matvec(out, xn.data(), E, V, &logits[size_t(pos * V)]);
  }
  return logits;
}

// The weights as the model sees them once stored: each tensor named in `types` quantized to its
// format and dequantized again.
Tensors dequantized(const Tensors& t, const std::map<std::string, quant::Type>& types) {
  Tensors deq = t;
  for (auto& [name, tv] : deq) {
    auto it = types.find(name);
    if (it == types.end()) continue;
    const int64_t ne0 = int64_t(tv.first[0]);
    std::vector<uint8_t> row(size_t(quant::row_bytes(it->second, ne0)));
    for (size_t off = 0; off < tv.second.size(); off += size_t(ne0)) {
      quant::kernels(it->second).quantize_row(tv.second.data() + off, row.data(), ne0);
      quant::kernels(it->second).dequantize_row(row.data(), tv.second.data() + off, ne0);
    }
  }
  return deq;
}

struct Case {
  const char* name;
  Spec spec;
};

// Gemma 3 in miniature: head_dim 32 (q width 128 != n_embd 64, as the real model's 1024 != 640),
// GQA 4:1, tied embeddings, 3 layers of which 0 and 1 are sliding-window (window 5, RoPE base
// 10000) and 2 is global (base 1e6). The 12-token prompt is longer than the window.
Spec gemma3_spec() {
  Spec g;
  g.arch = "gemma3";
  g.gemma = true;
  g.qk_norm = true;
  g.neox = true;
  g.tied = true;
  g.head_dim = 32;
  g.n_head_kv = 1;
  g.n_layer = 3;
  g.n_swa = 5;
  g.swa_period = 3;
  g.rope_base = 1e6f;
  g.rope_base_swa = 10000.0f;
  return g;
}

std::vector<Case> cases() {
  Spec llama;
  Spec tied = llama;
  tied.tied = true;
  Spec factors = llama;
  factors.freq_factors = true;
  Spec mistral = llama;
  mistral.arch = "mistral";
  Spec qwen2;
  qwen2.arch = "qwen2";
  qwen2.bias = true;
  qwen2.neox = true;
  Spec qwen3;
  qwen3.arch = "qwen3";
  qwen3.qk_norm = true;
  qwen3.neox = true;
  // Mixtral: llama with 4 experts, top-2, renormalized weights.
  Spec mixtral = llama;
  mixtral.n_expert = 4, mixtral.n_used = 2, mixtral.norm_w = true, mixtral.n_ff = 48;
  // Qwen3-MoE: QK-norm, 8 experts, top-3, renormalized.
  Spec qwen3moe = qwen3;
  qwen3moe.arch = "qwen3moe";
  qwen3moe.n_expert = 8, qwen3moe.n_used = 3, qwen3moe.norm_w = true, qwen3moe.n_ff = 32;
  // Qwen2-MoE: biases, 6 experts, top-2, raw softmax weights, plus the gated shared expert.
  Spec qwen2moe = qwen2;
  qwen2moe.arch = "qwen2moe";
  qwen2moe.n_expert = 6, qwen2moe.n_used = 2, qwen2moe.n_ff = 32, qwen2moe.n_ff_shexp = 80;
  return {{"llama", llama},       {"llama_tied", tied}, {"llama_freq_factors", factors},
          {"mistral", mistral},   {"qwen2", qwen2},     {"qwen3", qwen3},
          {"mixtral", mixtral},   {"qwen3moe", qwen3moe}, {"qwen2moe", qwen2moe}, {"gemma3", gemma3_spec()}};
}

// The whole layer loop against the scalar reference, all positions of a 12-token prompt.
// Tolerance 5e-3: the backend keeps K/V in f16 and rounds q and the softmax weights to f16 for the
// attention products (as llama.cpp does); everything else is f32 with F32 weights.
TEST(ModelSynthetic, ForwardMatchesScalarReference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    std::vector<int32_t> toks;
    for (int i = 0; i < 12; ++i) toks.push_back((i * 7 + 3) % c.spec.n_vocab);
    // Random weights whose routing has no near-tie. The router's logits reach |z| ~ 8 here and
    // carry the backend's relative error (~1e-3, f16 attention) into their absolute value: with a
    // required gap of 1e-2, 5 seeds of 5000 chose another expert somewhere (seed 1158 at a gap of
    // 0.013: logits 4.602 vs 4.616, mixtral layer 1), so draws need a gap of 0.1 (no failure in
    // the same 5000 seeds).
    Tensors t;
    std::vector<float> ref;
    for (uint64_t salt = 100;; salt += 1000) {
      t = make_tensors(c.spec, salt);
      double margin = 0;
      ref = reference_forward(c.spec, t, toks, &margin);
      if (margin > 0.1) break;
      ASSERT_LT(salt, 100u + 50 * 1000) << "no tie-free routing in 50 draws";
    }
    const std::string path = write_model(c.spec, t, c.name);
    LoadOptions opts;
    opts.n_threads = 2;
    auto m = Model::load(path, opts);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    std::vector<float> logits(toks.size() * size_t(c.spec.n_vocab));
    ASSERT_TRUE((*m)->eval(toks, logits).is_ok());
    EXPECT_LT(test::normalized_error(logits.data(), ref.data(), ref.size()), 5e-3);
    std::filesystem::remove(path);
  }
}

Status load_status(const std::string& path) {
  auto m = Model::load(path, {});
  std::filesystem::remove(path);
  return m.is_ok() ? Status::ok() : m.status();
}

void expect_error(const Status& st, ErrorCode code, std::initializer_list<const char*> needles) {
  EXPECT_EQ(st.code(), code) << st.message();
  for (const char* n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << "'" << n << "' not in: " << st.message();
}

TEST(ModelSynthetic, MissingTensorIsNamed) {
  Spec s;
  Tensors t = make_tensors(s);
  t.erase("blk.1.ffn_up.weight");
  expect_error(load_status(write_model(s, t, "missing")), ErrorCode::kInvalidArgument,
               {"blk.1.ffn_up.weight", "missing", "[64, 96]"});
}

TEST(ModelSynthetic, WrongShapeNamesExpectedAndActual) {
  Spec s;
  Tensors t = make_tensors(s);
  t["blk.0.attn_k.weight"] = {{64, 48}, test::random_floats(64 * 48)};
  expect_error(load_status(write_model(s, t, "shape")), ErrorCode::kInvalidArgument,
               {"blk.0.attn_k.weight", "[64, 48]", "[64, 32]"});
}

TEST(ModelSynthetic, WrongTypeIsNamed) {
  Spec s;
  Tensors t = make_tensors(s);
  // A norm stored quantized: the elementwise ops need f32.
  expect_error(load_status(write_model(s, t, "type", {}, {{"blk.0.ffn_norm.weight", quant::Type::kQ8_0}})),
               ErrorCode::kUnsupported, {"blk.0.ffn_norm.weight", "q8_0", "f32"});
  // An activation-only format as a weight matrix has no dot product.
  expect_error(load_status(write_model(s, t, "type2", {}, {{"blk.1.attn_q.weight", quant::Type::kQ8_1}})),
               ErrorCode::kUnsupported, {"blk.1.attn_q.weight", "q8_1"});
}

TEST(ModelSynthetic, QuantizedModelLoadsAndRuns) {
  Spec s;
  s.n_embd = 256;  // K-quants need rows of 256
  s.n_ff = 256;
  Tensors t = make_tensors(s);
  std::map<std::string, quant::Type> types;
  for (const auto& [name, tv] : t)
    if (tv.first.size() == 2) types[name] = name.find("ffn") != std::string::npos ? quant::Type::kQ4_K : quant::Type::kQ8_0;
  const std::string path = write_model(s, t, "quant", {}, types);
  auto m = Model::load(path, {});
  std::filesystem::remove(path);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  std::vector<float> logits(size_t(s.n_vocab));
  const int32_t toks[] = {1, 2, 3};
  ASSERT_TRUE((*m)->eval(toks, logits).is_ok());
  // The reference sees the weights as stored (quantized, then dequantized), so what remains is
  // the 8-bit activation quantization of every product, which random weights amplify through the
  // layers (measured 1e-2..0.105 over 40 seeds). 0.2 still catches wiring errors, which give ~1.
  const Tensors deq = dequantized(t, types);
  const auto ref = reference_forward(s, deq, {1, 2, 3});
  EXPECT_LT(test::normalized_error(logits.data(), ref.data() + 2 * s.n_vocab, size_t(s.n_vocab)), 0.2);
}

TEST(ModelSynthetic, ExpertErrorsAreNamed) {
  Spec mix;
  mix.n_expert = 4, mix.n_used = 2, mix.norm_w = true;
  Tensors t = make_tensors(mix);
  // Top-k larger than the expert count.
  expect_error(load_status(write_model(mix, t, "moe_k", {{"llama.expert_used_count", gguf::Value::u32(5)}})),
               ErrorCode::kInvalidArgument, {"llama.expert_used_count", "5", "expert_count"});
  // Experts on an architecture without them.
  Spec mistral = mix;
  mistral.arch = "mistral";
  expect_error(load_status(write_model(mistral, t, "moe_arch")), ErrorCode::kUnsupported,
               {"mistral.expert_count", "not supported"});
  // A stacked expert tensor of the wrong expert count names both shapes.
  Tensors bad = t;
  bad["blk.1.ffn_up_exps.weight"] = {{64, 96, 3}, test::random_floats(64 * 96 * 3)};
  expect_error(load_status(write_model(mix, bad, "moe_shape")), ErrorCode::kInvalidArgument,
               {"blk.1.ffn_up_exps.weight", "[64, 96, 3]", "[64, 96, 4]"});
  // A router missing.
  bad = t;
  bad.erase("blk.0.ffn_gate_inp.weight");
  expect_error(load_status(write_model(mix, bad, "moe_router")), ErrorCode::kInvalidArgument,
               {"blk.0.ffn_gate_inp.weight", "missing"});
  // qwen3moe without an expert count.
  Spec q;
  q.arch = "qwen3moe", q.qk_norm = true, q.neox = true;
  expect_error(load_status(write_model(q, make_tensors(q), "moe_none")), ErrorCode::kInvalidArgument,
               {"qwen3moe.expert_count"});
}

// Stacked experts quantized (the CPU backend cuts each expert out of its packed layout where the
// format has one): the whole model against the scalar reference on the dequantized weights.
TEST(ModelSynthetic, QuantizedExpertsMatchReference) {
  for (const quant::Type type : {quant::Type::kQ4_K, quant::Type::kQ8_0, quant::Type::kQ6_K}) {
    SCOPED_TRACE(quant::type_name(type));
    Spec s;
    s.arch = "qwen3moe", s.qk_norm = true, s.neox = true;
    s.n_embd = 256, s.n_ff = 32, s.n_expert = 8, s.n_used = 2, s.norm_w = true;
    const std::vector<int32_t> toks = {1, 5, 9, 2, 7, 3};
    // The reference sees the dequantized weights; 8-bit activations move router logits by ~1e-2,
    // so weights are drawn until every routing decision has a margin of 0.1.
    Tensors t, deq;
    std::map<std::string, quant::Type> types;
    std::vector<float> ref;
    for (uint64_t salt = 100;; salt += 1000) {
      t = make_tensors(s, salt);
      types.clear();
      for (const auto& [name, tv] : t)
        if (name.find("_exps") != std::string::npos && tv.first[0] % 256 == 0) types[name] = type;
      deq = dequantized(t, types);
      double margin = 0;
      ref = reference_forward(s, deq, toks, &margin);
      if (margin > 0.1) break;
      ASSERT_LT(salt, 100u + 50 * 1000) << "no tie-free routing in 50 draws";
    }
    const std::string path = write_model(s, t, "moe_quant", {}, types);
    auto m = Model::load(path, {});
    std::filesystem::remove(path);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    std::vector<float> logits(toks.size() * size_t(s.n_vocab));
    ASSERT_TRUE((*m)->eval(toks, logits).is_ok());
    // 0.1 as for the dense quantized model above (8-bit activations; wiring errors give ~1).
    EXPECT_LT(test::normalized_error(logits.data(), ref.data(), ref.size()), 0.1);
  }
}

// Gemma 3 one token at a time after a prompt: the decode path's sliding window (positions past the
// window in the local layers) and per-layer RoPE bases, against the same scalar reference.
TEST(ModelSynthetic, Gemma3DecodeMatchesScalarReference) {
  const Spec s = gemma3_spec();
  std::vector<int32_t> toks;
  for (int i = 0; i < 12; ++i) toks.push_back((i * 5 + 1) % s.n_vocab);
  const Tensors t = make_tensors(s, 300);
  const auto ref = reference_forward(s, t, toks);
  const std::string path = write_model(s, t, "gemma3_decode");
  LoadOptions opts;
  opts.n_threads = 2;
  auto m = Model::load(path, opts);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const size_t nv = size_t(s.n_vocab);
  std::vector<float> logits(nv);
  ASSERT_TRUE((*m)->eval(std::span<const int32_t>(toks.data(), 4), logits).is_ok());
  EXPECT_LT(test::normalized_error(logits.data(), &ref[3 * nv], nv), 5e-3) << "prefill, last row";
  for (size_t i = 4; i < toks.size(); ++i) {
    ASSERT_TRUE((*m)->eval(std::span<const int32_t>(&toks[i], 1), logits).is_ok());
    EXPECT_LT(test::normalized_error(logits.data(), &ref[i * nv], nv), 5e-3) << "decode position " << i;
  }
  std::filesystem::remove(path);
}

// A gemma3 file without the tensors or keys its forward pass needs is refused, naming what is wrong.
TEST(ModelSynthetic, Gemma3ErrorsAreNamed) {
  const Spec s = gemma3_spec();
  Tensors t = make_tensors(s);
  t.erase("blk.1.post_ffw_norm.weight");
  expect_error(load_status(write_model(s, t, "gemma3_missing")), ErrorCode::kInvalidArgument,
               {"blk.1.post_ffw_norm.weight"});
  // A per-layer pattern of the wrong length.
  Spec n = s;
  n.n_swa = 0;  // write the window keys by hand
  std::vector<gguf::Value> pat{gguf::Value::boolean(true), gguf::Value::boolean(false)};
  expect_error(load_status(write_model(n, make_tensors(n), "gemma3_pattern",
                                       {{"gemma3.attention.sliding_window", gguf::Value::u32(4)},
                                        {"gemma3.attention.sliding_window_pattern",
                                         gguf::Value::array(gguf::ValueType::kBool, pat)}})),
               ErrorCode::kInvalidArgument, {"gemma3.attention.sliding_window_pattern", "one entry per layer"});
  // Soft-capped logits (Gemma 2's) are not implemented.
  expect_error(load_status(write_model(n, make_tensors(n), "gemma3_softcap",
                                       {{"gemma3.final_logit_softcapping", gguf::Value::f32(30.0f)}})),
               ErrorCode::kUnsupported, {"gemma3.final_logit_softcapping"});
}

TEST(ModelSynthetic, DeviceBytesCountWeightsKvPoolAndActivations) {
  // What --backend auto/cuda compares with the GPU's free memory before a whole-model load.
  Spec s;
  const std::string path = write_model(s, make_tensors(s), "devbytes");
  LoadOptions o;
  o.n_ctx = 64;
  auto at64 = Model::device_bytes(path, o);
  o.n_ctx = 128;
  auto at128 = Model::device_bytes(path, o);
  ASSERT_TRUE(at64.is_ok() && at128.is_ok()) << at64.status().message();
  // Every layer weight (f32 here) is in it; the embedding table (host lookups) is not needed
  // beyond the untied output head.
  const uint64_t e = uint64_t(s.n_embd), ff = uint64_t(s.n_ff), kv = uint64_t(s.n_head_kv * s.hd());
  const uint64_t layer = (e * e * 2 + e * kv * 2 + e * ff * 3 + 2 * e) * 4;
  EXPECT_GT(*at64, uint64_t(s.n_layer) * layer);
  // 64 more positions: the K and V rows of every layer in f16 and the attention's scratch grow.
  EXPECT_GE(*at128 - *at64, 64ull * uint64_t(s.n_layer) * 2 * kv * 2);
  o.n_ctx = s.n_ctx + 1;  // beyond the file's context length: load's error
  expect_error(Model::device_bytes(path, o).status(), ErrorCode::kInvalidArgument, {"n_ctx", "context_length"});
  std::filesystem::remove(path);
  expect_error(Model::device_bytes(path, LoadOptions{}).status(), ErrorCode::kIo, {"devbytes"});
}

TEST(ModelSynthetic, UnknownArchitecture) {
  Spec s;
  s.arch = "gpt5";
  expect_error(load_status(write_model(s, make_tensors(s), "arch")), ErrorCode::kUnsupported,
               {"gpt5", "llama"});
}

TEST(ModelSynthetic, InconsistentHyperParametersNameTheKey) {
  Spec s;
  Tensors t = make_tensors(s);
  expect_error(load_status(write_model(s, t, "kv", {{"llama.attention.head_count_kv", gguf::Value::u32(3)}})),
               ErrorCode::kInvalidArgument, {"llama.attention.head_count_kv", "3"});
  expect_error(load_status(write_model(s, t, "heads", {{"llama.attention.head_count", gguf::Value::u32(6)},
                                                       {"llama.attention.head_count_kv", gguf::Value::u32(6)}})),
               ErrorCode::kInvalidArgument, {"llama.attention.head_count", "embedding_length"});
  expect_error(load_status(write_model(s, t, "zero", {{"llama.block_count", gguf::Value::u32(0)}})),
               ErrorCode::kInvalidArgument, {"llama.block_count"});
  expect_error(load_status(write_model(s, t, "rot", {{"llama.rope.dimension_count", gguf::Value::u32(17)}})),
               ErrorCode::kInvalidArgument, {"llama.rope.dimension_count"});
  expect_error(load_status(write_model(s, t, "yarn", {{"llama.rope.scaling.type", gguf::Value::str("yarn")}})),
               ErrorCode::kUnsupported, {"llama.rope.scaling.type", "yarn"});
}

}  // namespace
}  // namespace sluice::model
