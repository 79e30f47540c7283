// sluice synth: files of small custom shapes, for every type mix, parse with our reader and have
// the expected tensors, shapes, types, metadata, tokenizer and weight statistics.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
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
  EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->type, Type::kQ8_0);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type, Type::kQ8_0);
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
  // llama.cpp's Q4_K_M of Mixtral-8x7B is 26.4 GB; it promotes fewer expert tensors than we do.
  EXPECT_GT(gbmx, 25.0);
  EXPECT_LT(gbmx, 29.0);
  std::printf("plan sizes: llama-3-8b q4_k_m %.2f GB, mixtral-8x7b q4_k_m %.2f GB\n", gb8, gbmx);
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
