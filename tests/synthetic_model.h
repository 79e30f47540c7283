// A small synthetic llama GGUF for the streaming tests: 6 layers, n_embd 256, each matrix in a
// chosen format (real quantized blocks of random values), so every tensor has the format and
// alignment of a real file.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test_util.h"

namespace sluice::test {

// A synthetic llama of 6 layers with the matrix formats given. Every matrix shape divides into
// the packed layout's 16-row groups; ne0 = 256 or 512 fits every block size.
struct SynthTypes {
  quant::Type q, k, v, o, gate, up, down, embd;
  bool output;  // false: tied (the output is token_embd)
  quant::Type out;
};
// Written to the temp folder as sluice_<prefix>_<tag>_<pid>.gguf; `salt` seeds the values.
inline std::string write_synthetic_llama(const std::string& prefix, const std::string& tag, const SynthTypes& ty,
                                        uint64_t salt = 11) {
  const int E = 256, H = 4, KVH = 2, F = 512, L = 6, V = 96;
  const int D = E / H;
  gguf::Writer w;
  w.add("general.architecture", gguf::Value::str("llama"));
  w.add("llama.block_count", gguf::Value::u32(L));
  w.add("llama.context_length", gguf::Value::u32(256));
  w.add("llama.embedding_length", gguf::Value::u32(E));
  w.add("llama.feed_forward_length", gguf::Value::u32(F));
  w.add("llama.attention.head_count", gguf::Value::u32(H));
  w.add("llama.attention.head_count_kv", gguf::Value::u32(KVH));
  w.add("llama.attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-5f));
  w.add("llama.rope.freq_base", gguf::Value::f32(10000.0f));
  std::vector<std::vector<uint8_t>> data;
  auto add = [&](const std::string& name, quant::Type t, uint64_t ne0, uint64_t ne1, float scale, float offset) {
    std::vector<uint64_t> shape = {ne0};
    if (ne1 > 1) shape.push_back(ne1);
    ASSERT_TRUE(w.add_tensor(name, t, shape).is_ok()) << name;
    std::vector<float> v = test::random_floats(ne0 * ne1, scale, ++salt);
    for (float& x : v) x += offset;
    const int64_t rb = quant::row_bytes(t, int64_t(ne0));
    std::vector<uint8_t> bytes(size_t(rb) * ne1);
    for (uint64_t r = 0; r < ne1; ++r) quant::kernels(t).quantize_row(v.data() + r * ne0, bytes.data() + r * rb, int64_t(ne0));
    data.push_back(std::move(bytes));
  };
  using T = quant::Type;
  add("token_embd.weight", ty.embd, E, V, 1.0f, 0);
  for (int l = 0; l < L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", T::kF32, E, 1, 0.1f, 1.0f);
    add(p + "attn_q.weight", ty.q, E, uint64_t(H * D), 0.2f, 0);
    add(p + "attn_k.weight", ty.k, E, uint64_t(KVH * D), 0.2f, 0);
    add(p + "attn_v.weight", ty.v, E, uint64_t(KVH * D), 0.2f, 0);
    add(p + "attn_output.weight", ty.o, uint64_t(H * D), E, 0.2f, 0);
    add(p + "ffn_norm.weight", T::kF32, E, 1, 0.1f, 1.0f);
    add(p + "ffn_gate.weight", ty.gate, E, F, 0.2f, 0);
    add(p + "ffn_up.weight", ty.up, E, F, 0.2f, 0);
    add(p + "ffn_down.weight", ty.down, F, E, 0.2f, 0);
  }
  add("output_norm.weight", T::kF32, E, 1, 0.1f, 1.0f);
  if (ty.output) add("output.weight", ty.out, E, V, 0.2f, 0);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sluice_" + prefix + "_" + tag + "_" + std::to_string(::getpid()) + ".gguf")).string();
  const Status st = w.write(path, data);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return path;
}

// A Mixtral-style llama for the MoE streaming tests: 3 layers, 8 experts (top-2) of 256 x 256, the
// experts in `type`, the other matrices Q8_0, norms and the router F32.
inline constexpr int kMoeE = 256, kMoeF = 256, kMoeX = 8, kMoeK = 2, kMoeL = 3, kMoeV = 64;

// n_expert: experts per layer (the RAM expert cache tests use more, so a quarter of the file holds
// more than one layer's active experts next to the attention weights).
inline std::string write_synthetic_moe(quant::Type type, const std::string& tag, int n_expert = kMoeX) {
  constexpr int kE = kMoeE, kF = kMoeF, kK = kMoeK, kL = kMoeL, kV = kMoeV;
  const int kX = n_expert;
  EXPECT_GE(kX, kK);
  gguf::Writer w;
  w.add("general.architecture", gguf::Value::str("llama"));
  w.add("llama.block_count", gguf::Value::u32(kL));
  w.add("llama.context_length", gguf::Value::u32(256));
  w.add("llama.embedding_length", gguf::Value::u32(kE));
  w.add("llama.feed_forward_length", gguf::Value::u32(kF));
  w.add("llama.attention.head_count", gguf::Value::u32(4));
  w.add("llama.attention.head_count_kv", gguf::Value::u32(2));
  w.add("llama.attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-5f));
  w.add("llama.expert_count", gguf::Value::u32(uint32_t(kX)));
  w.add("llama.expert_used_count", gguf::Value::u32(kK));
  std::vector<std::vector<uint8_t>> data;
  uint64_t salt = 500;
  auto add = [&](const std::string& name, quant::Type t, std::vector<uint64_t> shape, float scale, float offset) {
    ASSERT_TRUE(w.add_tensor(name, t, shape).is_ok()) << name;
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    std::vector<float> v = test::random_floats(n, scale, ++salt);
    for (float& x : v) x += offset;
    const int64_t ne0 = int64_t(shape[0]), rb = quant::row_bytes(t, ne0);
    std::vector<uint8_t> bytes(size_t(rb) * (n / shape[0]));
    for (uint64_t r = 0; r < n / shape[0]; ++r)
      quant::kernels(t).quantize_row(v.data() + r * uint64_t(ne0), bytes.data() + r * uint64_t(rb), ne0);
    data.push_back(std::move(bytes));
  };
  using T = quant::Type;
  add("token_embd.weight", T::kQ8_0, {kE, kV}, 1.0f, 0);
  add("output_norm.weight", T::kF32, {kE}, 0.1f, 1.0f);
  add("output.weight", T::kQ8_0, {kE, kV}, 0.2f, 0);
  for (int l = 0; l < kL; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", T::kF32, {kE}, 0.1f, 1.0f);
    add(p + "attn_q.weight", T::kQ8_0, {kE, kE}, 0.2f, 0);
    add(p + "attn_k.weight", T::kQ8_0, {kE, kE / 2}, 0.2f, 0);
    add(p + "attn_v.weight", T::kQ8_0, {kE, kE / 2}, 0.2f, 0);
    add(p + "attn_output.weight", T::kQ8_0, {kE, kE}, 0.2f, 0);
    add(p + "ffn_norm.weight", T::kF32, {kE}, 0.1f, 1.0f);
    const uint64_t x = uint64_t(kX);
    add(p + "ffn_gate_inp.weight", T::kF32, {kE, x}, 0.5f, 0);
    add(p + "ffn_gate_exps.weight", type, {kE, kF, x}, 0.2f, 0);
    add(p + "ffn_up_exps.weight", type, {kE, kF, x}, 0.2f, 0);
    add(p + "ffn_down_exps.weight", type, {kF, kE, x}, 0.2f, 0);
  }
  const std::string path = std::filesystem::temp_directory_path().string() + "/sluice_" + tag + "_" +
                           std::to_string(::getpid()) + ".gguf";
  EXPECT_TRUE(w.write(path, data).is_ok());
  return path;
}

}  // namespace sluice::test
