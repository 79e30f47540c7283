// The reader against a real file (SmolLM2-135M-Instruct Q4_1, as published) and its typed
// accessors. The expected facts were read independently with python's gguf package.
#include <unistd.h>

#include <fstream>
#include <map>

#include "gguf/gguf.h"
#include "test_util.h"

namespace sluice::gguf {
namespace {

using quant::Type;

class SmolLM2 : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = test::model_path(test::kSmolLM2);
    SLUICE_REQUIRE_MODEL(path_);
    auto r = File::open(path_);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    file_ = std::make_unique<File>(std::move(r).value());
  }
  std::string path_;
  std::unique_ptr<File> file_;
};

TEST_F(SmolLM2, HeaderAndHyperParameters) {
  const File& f = *file_;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.data_offset(), 1785664u);
  EXPECT_EQ(f.get_string("general.architecture").value(), "llama");
  EXPECT_EQ(f.get_uint("llama.block_count").value(), 30u);
  EXPECT_EQ(f.get_uint("llama.embedding_length").value(), 576u);
  EXPECT_EQ(f.get_uint("llama.feed_forward_length").value(), 1536u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count").value(), 9u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count_kv").value(), 3u);
  EXPECT_EQ(f.get_uint("llama.context_length").value(), 8192u);
  EXPECT_EQ(f.get_uint("llama.vocab_size").value(), 49152u);
  EXPECT_EQ(f.get_int("llama.rope.dimension_count").value(), 64);
  EXPECT_DOUBLE_EQ(f.get_float("llama.rope.freq_base").value(), 100000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon").value()), 1e-5f);
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token").value());
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_space_prefix").value());
  EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id").value(), 1u);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre").value(), "smollm");
}

TEST_F(SmolLM2, TokenizerArrays) {
  const Value* tokens = file_->find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->type, ValueType::kArray);
  EXPECT_EQ(tokens->elem_type, ValueType::kString);
  EXPECT_EQ(tokens->items.size(), 49152u);
  const Value* types = file_->find("tokenizer.ggml.token_type");
  ASSERT_NE(types, nullptr);
  EXPECT_EQ(types->elem_type, ValueType::kI32);
  EXPECT_EQ(types->items.size(), 49152u);
  const Value* merges = file_->find("tokenizer.ggml.merges");
  ASSERT_NE(merges, nullptr);
  EXPECT_EQ(merges->items.size(), 48900u);
  const Value* langs = file_->find("general.languages");
  ASSERT_NE(langs, nullptr);
  ASSERT_EQ(langs->items.size(), 1u);
  EXPECT_EQ(langs->items[0].s, "en");
}

TEST_F(SmolLM2, TensorInfos) {
  const File& f = *file_;
  std::map<Type, int> counts;
  for (const auto& t : f.tensors()) counts[t.type]++;
  EXPECT_EQ(counts[Type::kQ4_1], 210);
  EXPECT_EQ(counts[Type::kF32], 61);
  EXPECT_EQ(counts[Type::kQ8_0], 1);

  const TensorInfo* embd = f.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, Type::kQ8_0);
  EXPECT_EQ(embd->shape, (std::vector<uint64_t>{576, 49152}));
  EXPECT_EQ(embd->nbytes, 30081024u);
  EXPECT_EQ(embd->offset, 0u);
  EXPECT_EQ(embd->row_bytes(), 576u / 32 * 34);
  EXPECT_EQ(embd->n_rows(), 49152u);

  const TensorInfo* down = f.find_tensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, Type::kQ4_1);
  EXPECT_EQ(down->shape, (std::vector<uint64_t>{1536, 576}));
  EXPECT_EQ(down->nbytes, 552960u);
  EXPECT_EQ(f.data_offset() + down->offset, 31868992u);

  const TensorInfo* norm = f.find_tensor("blk.29.attn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, Type::kF32);
  EXPECT_EQ(norm->shape, (std::vector<uint64_t>{576}));
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied to token_embd in this model
  EXPECT_EQ(f.find_tensor("blk.30.attn_norm.weight"), nullptr);

  // Norm weights of a trained model are finite and mostly near 1; reading them proves
  // tensor_data points at the right bytes.
  const auto* w = reinterpret_cast<const float*>(f.tensor_data(*norm));
  double sum = 0;
  for (int i = 0; i < 576; ++i) {
    ASSERT_TRUE(std::isfinite(w[i]));
    sum += w[i];
  }
  EXPECT_GT(sum / 576, 0.05);
  EXPECT_LT(sum / 576, 20.0);
  for (int l = 0; l < 30; ++l) {
    for (const char* role : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      EXPECT_NE(f.find_tensor("blk." + std::to_string(l) + "." + role + ".weight"), nullptr) << l << role;
    }
  }
}

TEST_F(SmolLM2, TypedGettersNameTheKey) {
  auto s = file_->get_string("llama.block_count");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("llama.block_count"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("u32"), std::string::npos) << s.status().message();
  auto u = file_->get_uint("general.architecture");
  ASSERT_FALSE(u.is_ok());
  EXPECT_NE(u.status().message().find("general.architecture"), std::string::npos);
  auto m = file_->get_uint("llama.no_such_key");
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("llama.no_such_key"), std::string::npos);
  EXPECT_NE(m.status().message().find("missing"), std::string::npos);
  EXPECT_NE(m.status().message().find(path_), std::string::npos);
  EXPECT_FALSE(file_->get_bool("llama.block_count").is_ok());
  EXPECT_FALSE(file_->get_float("general.name").is_ok());
}

TEST_F(SmolLM2, MoveKeepsMappingValid) {
  File moved = std::move(*file_);
  const TensorInfo* norm = moved.find_tensor("blk.0.attn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_TRUE(std::isfinite(reinterpret_cast<const float*>(moved.tensor_data(*norm))[0]));
  EXPECT_EQ(moved.get_uint("llama.block_count").value(), 30u);
}

TEST(GgufOpen, MissingFileIsIoErrorNamingThePath) {
  auto r = File::open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIo);
  EXPECT_NE(r.status().message().find("/nonexistent/dir/model.gguf"), std::string::npos);
}

TEST(GgufOpen, DirectoryIsRejected) {
  auto r = File::open(test::source_dir());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos) << r.status().message();
}

TEST(GgufOpen, EmptyFileIsTruncated) {
  auto path = std::filesystem::temp_directory_path() / ("sluice_empty_" + std::to_string(::getpid()) + ".gguf");
  { std::ofstream(path.string()).flush(); }
  auto r = File::open(path.string());
  std::filesystem::remove(path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruptFile);
  EXPECT_NE(r.status().message().find("magic"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace sluice::gguf
