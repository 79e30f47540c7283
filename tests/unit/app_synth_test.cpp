// sluice synth: files of small custom shapes, for every type mix, parse with our reader and have
// the expected tensors, shapes, types, metadata, tokenizer and weight statistics.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <unordered_set>

#include "app/inspect.h"
#include "app/synth.h"
#include "gguf/gguf.h"
#include "test_util.h"

namespace sluice::app {
namespace {

using quant::Type;

struct TempFile {
  explicit TempFile(const std::string& tag)
      : path((std::filesystem::temp_directory_path() /
              ("sluice_synth_" + tag + "_" + std::to_string(::getpid()) + ".gguf")).string()) {}
  ~TempFile() { std::filesystem::remove(path); }
  std::string path;
};

SynthShape small_shape() {
  SynthShape s = named_shape("custom").value();
  s.layers = 2, s.dim = 256, s.ffn = 512, s.heads = 4, s.kv_heads = 2, s.vocab = 600;
  return s;
}

gguf::File synth_and_open(const SynthShape& s, const std::string& type, const std::string& path, uint64_t seed = 7,
                          unsigned threads = 2) {
  auto mix = parse_type_mix(type);
  EXPECT_TRUE(mix.is_ok()) << mix.status().message();
  auto plan = make_plan(s, *mix, seed);
  EXPECT_TRUE(plan.is_ok()) << plan.status().message();
  SynthStats stats;
  Status st = write_synth(*plan, path, seed, threads, &stats);
  EXPECT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(stats.bytes, std::filesystem::file_size(path));
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  return std::move(f).value();
}

// Dequantized statistics of a tensor's first rows.
void expect_scale(const gguf::File& f, const std::string& name, double want_std) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  ASSERT_NE(t, nullptr) << name;
  const uint64_t rows = std::min<uint64_t>(t->n_rows(), 64), ne0 = t->shape[0];
  std::vector<float> v(rows * ne0);
  const auto deq = quant::kernels(t->type).dequantize_row;
  for (uint64_t r = 0; r < rows; ++r) deq(f.tensor_data(*t) + r * t->row_bytes(), v.data() + r * ne0, int64_t(ne0));
  double sum = 0, sq = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x)) << name;
    sum += x;
    sq += double(x) * x;
  }
  const double mean = sum / double(v.size()), sd = std::sqrt(sq / double(v.size()) - mean * mean);
  EXPECT_NEAR(sd, want_std, want_std * 0.15) << name << " " << quant::type_name(t->type);
  EXPECT_LT(std::abs(mean), want_std * 0.1) << name;
}

class SynthEveryType : public ::testing::TestWithParam<std::string> {};

TEST_P(SynthEveryType, ParsesWithExpectedTensors) {
  const std::string type = GetParam();
  TempFile tmp(type);
  const SynthShape s = small_shape();
  gguf::File f = synth_and_open(s, type, tmp.path);
  ASSERT_EQ(f.tensors().size(), 3u + 9u * s.layers);
  EXPECT_EQ(f.get_string("general.architecture").value(), "llama");
  EXPECT_EQ(f.get_uint("llama.block_count").value(), s.layers);
  EXPECT_EQ(f.get_uint("llama.embedding_length").value(), s.dim);
  EXPECT_EQ(f.get_uint("llama.feed_forward_length").value(), s.ffn);
  EXPECT_EQ(f.get_uint("llama.attention.head_count").value(), s.heads);
  EXPECT_EQ(f.get_uint("llama.attention.head_count_kv").value(), s.kv_heads);
  EXPECT_EQ(f.get_uint("llama.rope.dimension_count").value(), 64u);
  EXPECT_EQ(f.get_uint("llama.context_length").value(), s.ctx);
  EXPECT_GT(f.get_float("llama.attention.layer_norm_rms_epsilon").value(), 0);
  EXPECT_TRUE(f.get_uint("general.file_type").is_ok());

  const bool km = type == "q4_k_m";
  const Type base = km ? Type::kQ4_K : quant::type_from_name(type).value();
  auto expect_tensor = [&](const std::string& name, std::vector<uint64_t> shape, Type t) {
    const gguf::TensorInfo* info = f.find_tensor(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->shape, shape) << name;
    EXPECT_EQ(info->type, t) << name << " is " << quant::type_name(info->type);
  };
  expect_tensor("token_embd.weight", {256, 600}, base);
  expect_tensor("output.weight", {256, 600}, km ? Type::kQ6_K : base);
  expect_tensor("output_norm.weight", {256}, Type::kF32);
  for (uint32_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    expect_tensor(p + "attn_norm.weight", {256}, Type::kF32);
    expect_tensor(p + "ffn_norm.weight", {256}, Type::kF32);
    expect_tensor(p + "attn_q.weight", {256, 256}, base);
    expect_tensor(p + "attn_k.weight", {256, 128}, base);
    // q4_k_m promotes attn_v/ffn_down in the last eighth of the layers (here: layer 1 of 2).
    const bool promoted = km && l == 1;
    expect_tensor(p + "attn_v.weight", {256, 128}, promoted ? Type::kQ6_K : base);
    expect_tensor(p + "attn_output.weight", {256, 256}, base);
    expect_tensor(p + "ffn_gate.weight", {256, 512}, base);
    expect_tensor(p + "ffn_up.weight", {256, 512}, base);
    expect_tensor(p + "ffn_down.weight", {512, 256}, promoted ? Type::kQ6_K : base);
  }
  expect_scale(f, "blk.1.attn_q.weight", 1.0 / 16);
  expect_scale(f, "blk.0.ffn_down.weight", 1.0 / std::sqrt(512.0));
  const auto* norm = reinterpret_cast<const float*>(f.tensor_data(*f.find_tensor("blk.0.attn_norm.weight")));
  for (int i = 0; i < 256; ++i) {
    EXPECT_GT(norm[i], 0.9f);
    EXPECT_LT(norm[i], 1.1f);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, SynthEveryType,
                         ::testing::Values("q4_k_m", "q6_k", "q8_0", "f16", "f32", "bf16", "q4_0", "q4_1", "q5_0",
                                           "q5_1", "q2_k", "q3_k", "q4_k", "q5_k"));

TEST(Synth, TokenizerSectionIsConsistent) {
  TempFile tmp("tok");
  SynthShape s = small_shape();
  s.vocab = 5000;
  gguf::File f = synth_and_open(s, "q8_0", tmp.path);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model").value(), "gpt2");
  const auto& tokens = f.find("tokenizer.ggml.tokens")->items;
  const auto& types = f.find("tokenizer.ggml.token_type")->items;
  const auto& merges = f.find("tokenizer.ggml.merges")->items;
  ASSERT_EQ(tokens.size(), 5000u);
  ASSERT_EQ(types.size(), 5000u);
  std::unordered_set<std::string> set;
  for (const auto& t : tokens) EXPECT_TRUE(set.insert(t.s).second) << "duplicate token " << t.s;
  // GPT-2 byte-level alphabet: 'A' is itself, space is U+0120, newline U+010A, byte 0 U+0100.
  EXPECT_EQ(tokens['A'].s, "A");
  EXPECT_EQ(tokens[' '].s, "\xC4\xA0");
  EXPECT_EQ(tokens['\n'].s, "\xC4\x8A");
  EXPECT_EQ(tokens[0].s, "\xC4\x80");
  EXPECT_EQ(tokens[255].s, "\xC3\xBF");
  EXPECT_GT(merges.size(), 4000u);
  for (const auto& m : merges) {
    const size_t sp = m.s.find(' ');
    ASSERT_NE(sp, std::string::npos) << m.s;
    const std::string a = m.s.substr(0, sp), b = m.s.substr(sp + 1);
    EXPECT_TRUE(set.count(a) && set.count(b) && set.count(a + b)) << m.s;
  }
  const uint64_t bos = f.get_uint("tokenizer.ggml.bos_token_id").value();
  const uint64_t eos = f.get_uint("tokenizer.ggml.eos_token_id").value();
  ASSERT_LT(bos, 5000u);
  ASSERT_LT(eos, 5000u);
  EXPECT_NE(bos, eos);
  EXPECT_EQ(types[bos].i, 3);
  EXPECT_EQ(types[eos].i, 3);
  EXPECT_EQ(types['a'].i, 1);
}

TEST(Synth, MixtureOfExperts) {
  TempFile tmp("moe");
  SynthShape s = small_shape();
  s.experts = 4, s.experts_used = 2;
  gguf::File f = synth_and_open(s, "q4_k_m", tmp.path);
  EXPECT_EQ(f.get_uint("llama.expert_count").value(), 4u);
  EXPECT_EQ(f.get_uint("llama.expert_used_count").value(), 2u);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_gate.weight"), nullptr);
  const auto* inp = f.find_tensor("blk.1.ffn_gate_inp.weight");
  ASSERT_NE(inp, nullptr);
  EXPECT_EQ(inp->type, Type::kF32);
  EXPECT_EQ(inp->shape, (std::vector<uint64_t>{256, 4}));
  EXPECT_EQ(f.find_tensor("blk.1.ffn_gate_exps.weight")->shape, (std::vector<uint64_t>{256, 512, 4}));
  EXPECT_EQ(f.find_tensor("blk.1.ffn_up_exps.weight")->shape, (std::vector<uint64_t>{256, 512, 4}));
  EXPECT_EQ(f.find_tensor("blk.1.ffn_down_exps.weight")->shape, (std::vector<uint64_t>{512, 256, 4}));
  EXPECT_EQ(f.find_tensor("blk.1.ffn_down_exps.weight")->type, Type::kQ6_K);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down_exps.weight")->type, Type::kQ4_K);
  expect_scale(f, "blk.1.ffn_gate_inp.weight", 1.0 / 16);
  expect_scale(f, "blk.0.ffn_up_exps.weight", 1.0 / 16);
}

TEST(Synth, Qwen2MoeSharedExpert) {
  TempFile tmp("qwen2moe");
  SynthShape s = small_shape();
  s.arch = "qwen2", s.experts = 6, s.experts_used = 2, s.ffn = 128, s.shared_ffn = 384;
  gguf::File f = synth_and_open(s, "q4_k_m", tmp.path);
  EXPECT_EQ(f.get_string("general.architecture").value(), "qwen2moe");
  EXPECT_EQ(f.get_uint("qwen2moe.expert_count").value(), 6u);
  EXPECT_EQ(f.get_uint("qwen2moe.expert_used_count").value(), 2u);
  EXPECT_EQ(f.get_uint("qwen2moe.expert_feed_forward_length").value(), 128u);
  EXPECT_EQ(f.get_uint("qwen2moe.expert_shared_feed_forward_length").value(), 384u);
  EXPECT_EQ(f.get_uint("qwen2moe.feed_forward_length").value(), 384u);  // Qwen1.5-MoE: = shared size
  EXPECT_EQ(f.find("sluice.synth.route_skew"), nullptr);
  // Per layer: norms 2, attention 4 + 3 biases, router, 3 expert tensors, shared gate + 3.
  ASSERT_EQ(f.tensors().size(), 3u + 17u * s.layers);
  auto expect_tensor = [&](const std::string& name, std::vector<uint64_t> shape, Type t) {
    const gguf::TensorInfo* info = f.find_tensor(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->shape, shape) << name;
    EXPECT_EQ(info->type, t) << name << " is " << quant::type_name(info->type);
  };
  for (uint32_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    expect_tensor(p + "attn_q.bias", {256}, Type::kF32);
    expect_tensor(p + "attn_v.bias", {128}, Type::kF32);
    expect_tensor(p + "ffn_gate_inp.weight", {256, 6}, Type::kF32);
    // Expert rows of 128: Q4_K falls back to Q5_0 and Q6_K to Q8_0, as llama.cpp's quantizer.
    expect_tensor(p + "ffn_gate_exps.weight", {256, 128, 6}, Type::kQ4_K);
    expect_tensor(p + "ffn_up_exps.weight", {256, 128, 6}, Type::kQ4_K);
    expect_tensor(p + "ffn_down_exps.weight", {128, 256, 6}, l == 1 ? Type::kQ8_0 : Type::kQ5_0);
    expect_tensor(p + "ffn_gate_inp_shexp.weight", {256}, Type::kF32);
    expect_tensor(p + "ffn_gate_shexp.weight", {256, 384}, Type::kQ4_K);
    expect_tensor(p + "ffn_up_shexp.weight", {256, 384}, Type::kQ4_K);
    expect_tensor(p + "ffn_down_shexp.weight", {384, 256}, l == 1 ? Type::kQ8_0 : Type::kQ5_0);  // 384 % 256
    EXPECT_EQ(f.find_tensor(p + "ffn_gate.weight"), nullptr);
  }
  expect_scale(f, "blk.0.ffn_up_shexp.weight", 1.0 / 16);
  expect_scale(f, "blk.1.ffn_down_shexp.weight", 1.0 / std::sqrt(384.0));

  // With 256-multiple rows the promotions show: ffn_down_exps and ffn_down_shexp in layer 1.
  s.ffn = 256, s.shared_ffn = 512;
  auto plan = make_plan(s, parse_type_mix("q4_k_m").value(), 1);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->fallbacks, 0u);
  for (const auto& t : plan->tensors) {
    if (t.name.find("ffn_down") != std::string::npos || t.name.find("attn_v.weight") != std::string::npos) {
      EXPECT_EQ(t.type, t.name.rfind("blk.1.", 0) == 0 ? Type::kQ6_K : Type::kQ4_K) << t.name;
    }
  }
}

TEST(Synth, Qwen3MoeKeys) {
  SynthShape s = small_shape();
  s.arch = "qwen3", s.experts = 4, s.experts_used = 2, s.ffn = 256;
  auto plan = make_plan(s, parse_type_mix("q8_0").value(), 1);
  ASSERT_TRUE(plan.is_ok());
  std::map<std::string, uint64_t> keys;
  for (const auto& kv : plan->metadata) {
    if (kv.key.rfind("qwen3moe.", 0) == 0) keys[kv.key] = kv.value.u;
  }
  EXPECT_EQ(keys.at("qwen3moe.expert_feed_forward_length"), 256u);
  EXPECT_EQ(keys.at("qwen3moe.feed_forward_length"), 512u);  // Qwen3-MoE: expert size x experts used
  EXPECT_EQ(keys.at("qwen3moe.expert_count"), 4u);
  EXPECT_EQ(keys.at("qwen3moe.expert_used_count"), 2u);
  EXPECT_EQ(keys.count("qwen3moe.expert_shared_feed_forward_length"), 0u);
  std::set<std::string> names;
  for (const auto& t : plan->tensors) names.insert(t.name);
  EXPECT_TRUE(names.count("blk.1.attn_q_norm.weight") && names.count("blk.1.attn_k_norm.weight"));
  EXPECT_TRUE(names.count("blk.1.ffn_down_exps.weight"));
  EXPECT_FALSE(names.count("blk.1.ffn_gate_inp_shexp.weight"));
  EXPECT_FALSE(names.count("blk.1.attn_q.bias"));
}

TEST(Synth, MixtralQ4KMFollowsLlamaCpp) {
  // llama.cpp's Q4_K_M with exactly 8 experts: attn_v and attn_k Q8_0, attn_output Q5_K.
  SynthShape s = small_shape();
  s.layers = 8, s.experts = 8, s.experts_used = 2;
  auto plan = make_plan(s, parse_type_mix("q4_k_m").value(), 1);
  ASSERT_TRUE(plan.is_ok());
  for (const auto& t : plan->tensors) {
    if (t.name.find("attn_v.weight") != std::string::npos || t.name.find("attn_k.weight") != std::string::npos) {
      EXPECT_EQ(t.type, Type::kQ8_0) << t.name;
    }
    if (t.name.find("attn_output") != std::string::npos) { EXPECT_EQ(t.type, Type::kQ5_K) << t.name; }
    if (t.name.find("ffn_down_exps") != std::string::npos) {
      const int l = std::stoi(t.name.substr(4));
      const bool more = l < 1 || l >= 7 || (l - 1) % 3 == 2;  // layers 0, 3, 6, 7
      EXPECT_EQ(t.type, more ? Type::kQ6_K : Type::kQ4_K) << t.name;
    }
  }
  s.experts = 4;  // not 8: attn_v follows the layer rule, attn_k/attn_output stay Q4_K
  plan = make_plan(s, parse_type_mix("q4_k_m").value(), 1);
  for (const auto& t : plan->tensors) {
    if (t.name == "blk.1.attn_v.weight" || t.name == "blk.1.attn_k.weight" || t.name == "blk.1.attn_output.weight") {
      EXPECT_EQ(t.type, Type::kQ4_K) << t.name;
    }
    if (t.name == "blk.0.attn_v.weight") { EXPECT_EQ(t.type, Type::kQ6_K); }
  }
}

TEST(Synth, Qwen2BiasesQwen3NormsRopeScaling) {
  {
    TempFile tmp("qwen2");
    SynthShape s = small_shape();
    s.arch = "qwen2";
    gguf::File f = synth_and_open(s, "q8_0", tmp.path);
    EXPECT_EQ(f.get_string("general.architecture").value(), "qwen2");
    EXPECT_EQ(f.get_uint("qwen2.block_count").value(), 2u);
    EXPECT_EQ(f.find_tensor("blk.0.attn_q.bias")->shape, (std::vector<uint64_t>{256}));
    EXPECT_EQ(f.find_tensor("blk.1.attn_k.bias")->shape, (std::vector<uint64_t>{128}));
    EXPECT_EQ(f.find_tensor("blk.1.attn_v.bias")->type, Type::kF32);
  }
  {
    TempFile tmp("qwen3");
    SynthShape s = small_shape();
    s.arch = "qwen3";
    s.head_dim = 128;  // qwen3 decouples head_dim from dim / heads
    s.rope_scaling = true;
    gguf::File f = synth_and_open(s, "q8_0", tmp.path);
    EXPECT_EQ(f.get_uint("qwen3.attention.key_length").value(), 128u);
    EXPECT_EQ(f.find_tensor("blk.0.attn_q_norm.weight")->shape, (std::vector<uint64_t>{128}));
    EXPECT_EQ(f.find_tensor("blk.0.attn_k_norm.weight")->shape, (std::vector<uint64_t>{128}));
    EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->shape, (std::vector<uint64_t>{256, 512}));
    EXPECT_EQ(f.find_tensor("blk.0.attn_output.weight")->shape, (std::vector<uint64_t>{512, 256}));
    const auto* rf = f.find_tensor("rope_freqs.weight");
    ASSERT_NE(rf, nullptr);
    ASSERT_EQ(rf->shape, (std::vector<uint64_t>{64}));
    const auto* v = reinterpret_cast<const float*>(f.tensor_data(*rf));
    EXPECT_FLOAT_EQ(v[0], 1.0f);    // high frequencies unscaled
    EXPECT_FLOAT_EQ(v[63], 8.0f);   // low frequencies scaled by the factor
    for (int i = 1; i < 64; ++i) EXPECT_GE(v[i], v[i - 1]);
  }
}

TEST(Synth, BlockFallbackForOddRows) {
  TempFile tmp("fallback");
  SynthShape s = small_shape();
  s.dim = 96, s.heads = 3, s.kv_heads = 1, s.ffn = 160;  // 96 and 160: not multiples of 256
  auto plan = make_plan(s, parse_type_mix("q4_k").value(), 1);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_GT(plan->fallbacks, 0u);
  gguf::File f = synth_and_open(s, "q4_k", tmp.path);
  // llama.cpp's tensor_type_fallback: Q4_K -> Q5_0, Q6_K -> Q8_0, Q5_K -> Q5_1, Q3_K -> Q4_0.
  EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->type, Type::kQ5_0);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type, Type::kQ5_0);
  auto type_of = [](const SynthPlan& p, const std::string& name) {
    for (const auto& t : p.tensors) {
      if (t.name == name) return t.type;
    }
    return Type::kF32;
  };
  EXPECT_EQ(type_of(make_plan(s, parse_type_mix("q6_k").value(), 1).value(), "output.weight"), Type::kQ8_0);
  EXPECT_EQ(type_of(make_plan(s, parse_type_mix("q5_k").value(), 1).value(), "output.weight"), Type::kQ5_1);
  EXPECT_EQ(type_of(make_plan(s, parse_type_mix("q3_k").value(), 1).value(), "output.weight"), Type::kQ4_0);
  s.dim = 80, s.heads = 2, s.kv_heads = 1;  // 80: not a multiple of 32 either
  EXPECT_EQ(type_of(make_plan(s, parse_type_mix("q4_k").value(), 1).value(), "blk.0.attn_q.weight"), Type::kF16);
  EXPECT_EQ(type_of(make_plan(s, parse_type_mix("q8_0").value(), 1).value(), "blk.0.attn_q.weight"), Type::kF16);
}

// --embd-type: token_embd alone takes the given format (the real SmolLM2 Q4_1 file's Q8_0
// embeddings, which its tied output reads too); every other tensor keeps the mix's choice.
TEST(Synth, EmbeddingTypeOverride) {
  TempFile tmp("embd_type");
  SynthShape s = small_shape();
  s.tied_output = true;
  TypeMix mix = parse_type_mix("q4_1").value();
  const SynthPlan base = make_plan(s, mix, 1).value();
  mix.embd = parse_weight_format("Q8_0", "--embd-type").value();
  const SynthPlan plan = make_plan(s, mix, 1).value();
  ASSERT_EQ(plan.tensors.size(), base.tensors.size());
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const bool embd = plan.tensors[i].name == "token_embd.weight";
    EXPECT_EQ(plan.tensors[i].type, embd ? Type::kQ8_0 : base.tensors[i].type) << plan.tensors[i].name;
    if (embd) {
      EXPECT_EQ(base.tensors[i].type, Type::kQ4_1);
    }
  }
  // Rows that do not fit the format fall back as the other matrices do.
  SynthShape odd = s;
  odd.dim = 96, odd.heads = 3, odd.kv_heads = 1, odd.ffn = 160;
  mix.embd = Type::kQ4_K;
  const SynthPlan odd_plan = make_plan(odd, mix, 1).value();
  for (const auto& t : odd_plan.tensors) {
    if (t.name == "token_embd.weight") {
      EXPECT_EQ(t.type, Type::kQ5_0);
    }
  }
  EXPECT_NE(parse_weight_format("q9", "--embd-type").status().message().find("--embd-type 'q9': unknown"),
            std::string::npos);
  EXPECT_NE(parse_weight_format("q8_k", "--embd-type").status().message().find("not a weight format"),
            std::string::npos);
}

TEST(Synth, SameSeedSameBytesAnyThreadCount) {
  TempFile a("seed_a"), b("seed_b"), c("seed_c");
  const SynthShape s = small_shape();
  synth_and_open(s, "q4_k_m", a.path, 42, 1);
  synth_and_open(s, "q4_k_m", b.path, 42, 3);
  synth_and_open(s, "q4_k_m", c.path, 43, 2);
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(read(a.path), read(b.path));
  EXPECT_NE(read(a.path), read(c.path));
}

TEST(Synth, RejectsBadShapesAndTypes) {
  SynthShape s = small_shape();
  s.heads = 3, s.kv_heads = 1;  // 256 % 3
  EXPECT_NE(validate(s).message().find("--dim 256"), std::string::npos) << validate(s).message();
  s = small_shape();
  s.kv_heads = 3;
  EXPECT_NE(validate(s).message().find("--kv-heads 3"), std::string::npos);
  s = small_shape();
  s.vocab = 100;
  EXPECT_NE(validate(s).message().find("--vocab 100"), std::string::npos);
  s = small_shape();
  s.experts = 4, s.experts_used = 5;
  EXPECT_NE(validate(s).message().find("--experts-used 5"), std::string::npos);
  s = small_shape();
  s.arch = "gpt9";
  EXPECT_FALSE(validate(s).is_ok());
  // qwen2moe needs a shared expert; nothing else has one.
  s = small_shape();
  s.arch = "qwen2", s.experts = 4, s.experts_used = 2;
  EXPECT_NE(validate(s).message().find("--shared-ffn"), std::string::npos) << validate(s).message();
  s.shared_ffn = 256;
  EXPECT_TRUE(validate(s).is_ok()) << validate(s).message();
  s.arch = "qwen3";
  EXPECT_NE(validate(s).message().find("--shared-ffn 256: only qwen2moe"), std::string::npos) << validate(s).message();
  s = small_shape();
  s.shared_ffn = 256;
  EXPECT_NE(validate(s).message().find("--shared-ffn 256"), std::string::npos);
  // llama.cpp's qwen2 attention is --dim wide.
  s = small_shape();
  s.arch = "qwen2", s.head_dim = 128;
  EXPECT_NE(validate(s).message().find("--head-dim 128"), std::string::npos) << validate(s).message();
  // Route skew: a non-negative exponent, experts, room for the reserved dims.
  s = small_shape();
  s.route_skew = 1;
  EXPECT_NE(validate(s).message().find("--route-skew: needs --experts"), std::string::npos) << validate(s).message();
  s.experts = 4, s.experts_used = 2;
  EXPECT_TRUE(validate(s).is_ok());
  s.route_skew = -1;
  EXPECT_NE(validate(s).message().find("--route-skew -1"), std::string::npos) << validate(s).message();
  s.route_skew = 1, s.dim = 64, s.heads = 2, s.kv_heads = 1;
  EXPECT_NE(validate(s).message().find("--dim 64"), std::string::npos) << validate(s).message();
  EXPECT_FALSE(parse_type_mix("q9_z").is_ok());
  EXPECT_NE(parse_type_mix("q8_k").status().message().find("not a weight format"), std::string::npos);
  EXPECT_TRUE(parse_type_mix("Q4_K_M").is_ok());
  EXPECT_FALSE(named_shape("llama-5").is_ok());
  auto big = named_shape("llama-3-70b");
  ASSERT_TRUE(big.is_ok());
  EXPECT_EQ(big->layers, 80u);
  EXPECT_EQ(big->dim, 8192u);
  EXPECT_TRUE(validate(*big).is_ok());
}

TEST(Synth, NamedShapePlansHaveExpectedSizes) {
  // Plans only (no bytes written): tensor counts and total bytes of the real shapes.
  auto bytes_of = [](const SynthPlan& p) {
    uint64_t n = 0;
    for (const auto& t : p.tensors) {
      uint64_t rows = 1;
      for (size_t d = 1; d < t.shape.size(); ++d) rows *= t.shape[d];
      n += uint64_t(quant::row_bytes(t.type, int64_t(t.shape[0]))) * rows;
    }
    return n;
  };
  auto p8 = make_plan(named_shape("llama-3-8b").value(), parse_type_mix("q4_k_m").value(), 1);
  ASSERT_TRUE(p8.is_ok());
  EXPECT_EQ(p8->tensors.size(), 3u + 9u * 32);
  EXPECT_EQ(p8->fallbacks, 0u);
  int q6_attn_v = 0;
  for (const auto& t : p8->tensors) q6_attn_v += t.name.find("attn_v") != std::string::npos && t.type == Type::kQ6_K;
  EXPECT_EQ(q6_attn_v, 16);  // layers 0-3, 28-31 and every third between (6, 9, ..., 27)
  const double gb8 = double(bytes_of(*p8)) / 1e9;
  EXPECT_GT(gb8, 4.7);  // llama.cpp's Q4_K_M of Llama-3-8B is 4.92 GB
  EXPECT_LT(gb8, 5.1);
  auto mx = make_plan(named_shape("mixtral-8x7b").value(), parse_type_mix("q4_k_m").value(), 1);
  ASSERT_TRUE(mx.is_ok());
  const double gbmx = double(bytes_of(*mx)) / 1e9;
  // Published Q4_K_M files of Mixtral-8x7B are 26.4 GB (TheBloke, an older llama.cpp) to 28.4 GB;
  // today's rule gives ffn_down_exps Q6_K in 16 of the 32 layers, +1.9 GB over Q4_K.
  EXPECT_GT(gbmx, 25.0);
  EXPECT_LT(gbmx, 29.0);
  std::printf("plan sizes: llama-3-8b q4_k_m %.2f GB, mixtral-8x7b q4_k_m %.2f GB\n", gb8, gbmx);

  // The Qwen MoE shapes: architecture, tensor count and shapes, and size against llama.cpp's
  // Q4_K_M files of the real models.
  struct Want {
    const char* name;
    const char* arch;
    size_t tensors;
    double gb_lo, gb_hi;
  };
  // Qwen's own Q4_K_M files of Qwen3-30B-A3B and Qwen3-235B-A22B are 18.6 and ~142 GB (these
  // plans: 18.55, 142.2). Qwen1.5-MoE-A2.7B's was not at hand; llama.cpp's rules on its shape
  // (14.3B parameters, expert rows of 1408 falling back to Q5_0/Q8_0) give 9.5 GB.
  for (const Want& want : {Want{"qwen3-30b-a3b", "qwen3moe", 3u + 48u * 12, 17.5, 19.5},
                           Want{"qwen3-235b-a22b", "qwen3moe", 3u + 94u * 12, 135.0, 150.0},
                           Want{"qwen2moe-a2.7b", "qwen2moe", 3u + 24u * 17, 8.5, 10.0}}) {
    auto shape = named_shape(want.name);
    ASSERT_TRUE(shape.is_ok()) << want.name;
    auto p = make_plan(*shape, parse_type_mix("q4_k_m").value(), 1);
    ASSERT_TRUE(p.is_ok()) << want.name << ": " << p.status().message();
    EXPECT_EQ(p->metadata[0].value.s, want.arch) << want.name;
    EXPECT_EQ(p->tensors.size(), want.tensors) << want.name;
    const double gb = double(bytes_of(*p)) / 1e9;
    std::printf("plan size: %s q4_k_m %.2f GB (%u fallbacks)\n", want.name, gb, p->fallbacks);
    EXPECT_GT(gb, want.gb_lo) << want.name;
    EXPECT_LT(gb, want.gb_hi) << want.name;
  }
  auto q30 = make_plan(named_shape("qwen3-30b-a3b").value(), parse_type_mix("q4_k_m").value(), 1).value();
  auto find = [](const SynthPlan& p, const std::string& name) -> const SynthTensor* {
    for (const auto& t : p.tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  };
  EXPECT_EQ(find(q30, "blk.47.attn_q.weight")->shape, (std::vector<uint64_t>{2048, 4096}));  // 32 heads x 128
  EXPECT_EQ(find(q30, "blk.47.attn_k.weight")->shape, (std::vector<uint64_t>{2048, 512}));
  EXPECT_EQ(find(q30, "blk.47.attn_output.weight")->shape, (std::vector<uint64_t>{4096, 2048}));
  EXPECT_EQ(find(q30, "blk.47.attn_k_norm.weight")->shape, (std::vector<uint64_t>{128}));
  EXPECT_EQ(find(q30, "blk.0.ffn_gate_inp.weight")->shape, (std::vector<uint64_t>{2048, 128}));
  EXPECT_EQ(find(q30, "blk.0.ffn_up_exps.weight")->shape, (std::vector<uint64_t>{2048, 768, 128}));
  EXPECT_EQ(find(q30, "blk.0.ffn_down_exps.weight")->shape, (std::vector<uint64_t>{768, 2048, 128}));
  EXPECT_EQ(find(q30, "blk.0.ffn_down_exps.weight")->type, Type::kQ6_K);  // first eighth
  EXPECT_EQ(find(q30, "blk.6.ffn_down_exps.weight")->type, Type::kQ4_K);
  EXPECT_EQ(find(q30, "token_embd.weight")->shape, (std::vector<uint64_t>{2048, 151936}));
  auto q2 = make_plan(named_shape("qwen2moe-a2.7b").value(), parse_type_mix("q4_k_m").value(), 1).value();
  EXPECT_EQ(find(q2, "blk.23.attn_q.bias")->shape, (std::vector<uint64_t>{2048}));
  EXPECT_EQ(find(q2, "blk.23.ffn_gate_inp.weight")->shape, (std::vector<uint64_t>{2048, 60}));
  EXPECT_EQ(find(q2, "blk.23.ffn_gate_exps.weight")->shape, (std::vector<uint64_t>{2048, 1408, 60}));
  EXPECT_EQ(find(q2, "blk.23.ffn_down_exps.weight")->type, Type::kQ8_0);  // last eighth: Q6_K -> Q8_0
  EXPECT_EQ(find(q2, "blk.4.ffn_down_exps.weight")->type, Type::kQ5_0);   // Q4_K -> Q5_0 (1408 % 256)
  EXPECT_EQ(find(q2, "blk.23.ffn_gate_inp_shexp.weight")->shape, (std::vector<uint64_t>{2048}));
  EXPECT_EQ(find(q2, "blk.23.ffn_down_shexp.weight")->shape, (std::vector<uint64_t>{5632, 2048}));
  EXPECT_EQ(find(q2, "blk.23.ffn_down_shexp.weight")->type, Type::kQ6_K);
  std::map<std::string, uint64_t> keys;
  for (const auto& kv : q2.metadata) keys[kv.key] = kv.value.u;
  EXPECT_EQ(keys.at("qwen2moe.expert_feed_forward_length"), 1408u);
  EXPECT_EQ(keys.at("qwen2moe.expert_shared_feed_forward_length"), 5632u);
  EXPECT_EQ(keys.at("qwen2moe.expert_count"), 60u);
  EXPECT_EQ(keys.at("qwen2moe.expert_used_count"), 4u);
  EXPECT_EQ(keys.at("qwen2moe.attention.head_count_kv"), 16u);
}

// Routes every token_embd row through layer `layer`'s router as the model does (RMS norm,
// ffn_norm gain, F32 router, top-k of the logits = top-k after softmax) and counts each expert's
// selections. Exact in every layer for a route-skew file (RouteSkew); for S = 0 it leaves out
// attention's contribution.
std::vector<uint64_t> route_counts(const gguf::File& f, int layer, uint32_t k) {
  const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
  const std::string p = "blk." + std::to_string(layer) + ".";
  const gguf::TensorInfo* norm = f.find_tensor(p + "ffn_norm.weight");
  const gguf::TensorInfo* router = f.find_tensor(p + "ffn_gate_inp.weight");
  const uint64_t dim = embd->shape[0], vocab = embd->shape[1], E = router->shape[1];
  const auto* g = reinterpret_cast<const float*>(f.tensor_data(*norm));
  const auto* w = reinterpret_cast<const float*>(f.tensor_data(*router));
  std::vector<float> x(dim);
  std::vector<std::pair<double, uint32_t>> logit(E);
  std::vector<uint64_t> counts(E, 0);
  for (uint64_t t = 0; t < vocab; ++t) {
    quant::kernels(embd->type).dequantize_row(f.tensor_data(*embd) + t * embd->row_bytes(), x.data(), int64_t(dim));
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double inv = 1.0 / std::sqrt(ss / double(dim) + 1e-5);
    for (uint64_t e = 0; e < E; ++e) {
      double acc = 0;
      for (uint64_t j = 0; j < dim; ++j) acc += double(w[e * dim + j]) * x[j] * inv * g[j];
      logit[e] = {acc, uint32_t(e)};
    }
    std::partial_sort(logit.begin(), logit.begin() + k, logit.end(), std::greater<>());
    for (uint32_t i = 0; i < k; ++i) ++counts[logit[i].second];
  }
  return counts;
}

TEST(Synth, RouteTargetsAreCappedZipf) {
  const auto flat = route_targets(16, 2, 0.0);
  for (double v : flat) EXPECT_NEAR(v, 1.0 / 16, 1e-12);
  const auto z = route_targets(16, 2, 1.0);
  double sum = 0;
  for (size_t r = 0; r < z.size(); ++r) {
    sum += z[r];
    if (r) { EXPECT_NEAR(z[r] / z[0], 1.0 / double(r + 1), 1e-9); }  // nothing capped: pure Zipf
  }
  EXPECT_NEAR(sum, 1.0, 1e-9);
  // 128 experts, top-8, S = 1.5: pure Zipf would give rank 1 43% of the selections, but an expert
  // can take at most one of a token's 8 (12.5%).
  const auto c = route_targets(128, 8, 1.5);
  sum = 0;
  for (double v : c) {
    sum += v;
    EXPECT_LE(v, 0.125 + 1e-12);
  }
  EXPECT_NEAR(sum, 1.0, 1e-9);
  EXPECT_NEAR(c[0], 0.125, 1e-12);
  EXPECT_LT(c[10], 0.125);
  for (size_t r = 1; r < c.size(); ++r) EXPECT_LE(c[r], c[r - 1] + 1e-15);
  EXPECT_NEAR(c[127] / c[63], std::pow(2.0, -1.5), 1e-9);  // the uncapped tail keeps its shape
}

TEST(Synth, RouteSkewFollowsZipfInEveryLayer) {
  SynthShape s = small_shape();
  s.layers = 2, s.ffn = 64, s.vocab = 1024, s.experts = 16, s.experts_used = 2;
  auto median = [](std::vector<uint64_t> v) {
    std::sort(v.begin(), v.end());
    return double(v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  {
    // S = 0: the original random router, roughly flat.
    TempFile tmp("skew0");
    gguf::File f = synth_and_open(s, "q8_0", tmp.path);
    EXPECT_EQ(f.find("sluice.synth.route_skew"), nullptr);
    for (int l = 0; l < 2; ++l) {
      const auto c = route_counts(f, l, 2);
      const double top = double(*std::max_element(c.begin(), c.end()));
      EXPECT_LT(top / median(c), 1.6) << "layer " << l;
      EXPECT_GT(double(*std::min_element(c.begin(), c.end())) / median(c), 0.5) << "layer " << l;
    }
  }
  s.route_skew = 1.0f;
  TempFile tmp("skew1");
  gguf::File f = synth_and_open(s, "q4_k_m", tmp.path);
  EXPECT_FLOAT_EQ(float(f.get_float("sluice.synth.route_skew").value()), 1.0f);
  const auto target = route_targets(16, 2, 1.0);
  std::vector<uint64_t> top_expert;
  for (int l = 0; l < 2; ++l) {
    const auto c = route_counts(f, l, 2);
    std::vector<uint32_t> order(16);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return c[a] > c[b]; });
    top_expert.push_back(order[0]);
    EXPECT_GT(double(c[order[0]]) / median(c), 3.0) << "layer " << l;
    // Measured share per rank against r^-1 (normalized): within 25% down to rank 8.
    for (uint32_t r = 0; r < 8; ++r) {
      const double share = double(c[order[r]]) / (1024.0 * 2);
      EXPECT_NEAR(share / target[r], 1.0, 0.25) << "layer " << l << " rank " << r + 1;
    }
  }
  EXPECT_NE(top_expert[0], top_expert[1]);  // a different popularity order per layer (seeded)
  // How: the reserved residual dims are never written, ffn_norm's gain there is 1, and the
  // router reads nothing else.
  const gguf::TensorInfo* wo = f.find_tensor("blk.1.attn_output.weight");
  std::vector<float> row(wo->shape[0]);
  for (uint64_t r = 0; r < 48; ++r) {
    quant::kernels(wo->type).dequantize_row(f.tensor_data(*wo) + r * wo->row_bytes(), row.data(), int64_t(row.size()));
    const bool zero = std::all_of(row.begin(), row.end(), [](float v) { return v == 0.0f; });
    EXPECT_EQ(zero, r < kRouteDims) << "row " << r;
  }
  const gguf::TensorInfo* down = f.find_tensor("blk.0.ffn_down_exps.weight");
  row.resize(down->shape[0]);
  for (uint64_t e = 0; e < 16; ++e) {
    for (uint64_t r : {uint64_t{0}, uint64_t{kRouteDims - 1}, uint64_t{kRouteDims}}) {
      const uint64_t idx = e * down->shape[1] + r;
      quant::kernels(down->type).dequantize_row(f.tensor_data(*down) + idx * down->row_bytes(), row.data(),
                                                int64_t(row.size()));
      EXPECT_EQ(std::all_of(row.begin(), row.end(), [](float v) { return v == 0.0f; }), r < kRouteDims);
    }
  }
  const auto* g = reinterpret_cast<const float*>(f.tensor_data(*f.find_tensor("blk.0.ffn_norm.weight")));
  for (uint32_t j = 0; j < kRouteDims; ++j) EXPECT_EQ(g[j], 1.0f);
  EXPECT_NE(g[kRouteDims], 1.0f);
  const auto* w = reinterpret_cast<const float*>(f.tensor_data(*f.find_tensor("blk.0.ffn_gate_inp.weight")));
  for (uint32_t j = kRouteDims; j < 256; ++j) EXPECT_EQ(w[3 * 256 + j], 0.0f);
}

TEST(Inspect, RolesAndPerLayerSummary) {
  EXPECT_EQ(tensor_role("blk.12.attn_q.weight").layer, 12);
  EXPECT_EQ(tensor_role("blk.12.attn_q.weight").role, "attn_q");
  EXPECT_EQ(tensor_role("blk.0.attn_q.bias").role, "attn_q");
  EXPECT_EQ(tensor_role("blk.3.ffn_down_exps.weight").role, "experts");
  EXPECT_EQ(tensor_role("blk.3.ffn_gate_inp.weight").role, "experts");
  EXPECT_EQ(tensor_role("blk.3.attn_k_norm.weight").role, "norms");
  EXPECT_EQ(tensor_role("blk.3.ffn_norm.weight").role, "norms");
  EXPECT_EQ(tensor_role("token_embd.weight").layer, -1);
  EXPECT_EQ(tensor_role("token_embd.weight").role, "token_embd");
  EXPECT_EQ(tensor_role("output.weight").role, "output");
  EXPECT_EQ(tensor_role("blk.x.attn_q.weight").role, "other");

  TempFile tmp("inspect");
  SynthShape s = small_shape();
  s.experts = 2, s.experts_used = 1;
  gguf::File f = synth_and_open(s, "q4_k_m", tmp.path);
  const InspectReport rep = make_report(f);
  EXPECT_EQ(rep.architecture, "llama");
  EXPECT_EQ(rep.vocab_size, 600u);
  EXPECT_EQ(rep.tokenizer_model, "gpt2");
  ASSERT_EQ(rep.layers.size(), 2u);
  uint64_t sum = 0;
  for (const auto& l : rep.layers) {
    uint64_t roles = 0;
    for (const auto& [r, b] : l.by_role) roles += b;
    EXPECT_EQ(roles, l.total);
    EXPECT_GT(l.by_role.at("experts"), 0u);
    sum += l.total;
  }
  for (const auto& [r, b] : rep.non_layer) sum += b;
  EXPECT_EQ(sum, rep.tensor_bytes);
  EXPECT_EQ(rep.non_layer.at("token_embd"), f.find_tensor("token_embd.weight")->nbytes);
  const auto j = render_json(rep);
  EXPECT_EQ(j["tensors"].size(), f.tensors().size());
  EXPECT_EQ(j["hparams"]["block_count"], "2");
  EXPECT_NE(render_text(rep).find("blk.1.ffn_down_exps.weight"), std::string::npos);
}

}  // namespace
}  // namespace sluice::app
