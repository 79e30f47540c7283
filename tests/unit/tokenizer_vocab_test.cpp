// Malformed tokenizer metadata: every case must come back as an error Status that names the key
// and the offending value, never a crash. Covers both the GGUF reader (read_vocab, through an
// in-memory GGUF) and the checks in Tokenizer::from_vocab.
#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "model/tokenizer.h"

namespace sluice::model {
namespace {

using gguf::Value;
using gguf::ValueType;

// A tiny valid byte-level BPE vocabulary: single letters a b c, merges "a b" and "ab c".
VocabSpec tiny_bpe() {
  VocabSpec v;
  v.model = "gpt2";
  v.pre = "gpt2";
  v.tokens = {"<|endoftext|>", "a", "b", "c", "ab", "abc", "\xC4\xA0"};  // last: "Ġ" = space
  v.types = {TokenType::kControl, TokenType::kNormal, TokenType::kNormal, TokenType::kNormal,
             TokenType::kNormal,  TokenType::kNormal, TokenType::kNormal};
  v.merges = {"a b", "ab c"};
  v.eos = 0;
  return v;
}

void expect_error(const VocabSpec& v, ErrorCode code, const std::string& must_mention) {
  auto t = Tokenizer::from_vocab(v);
  ASSERT_FALSE(t.is_ok()) << "accepted; expected error mentioning " << must_mention;
  EXPECT_EQ(t.status().code(), code) << t.status().message();
  EXPECT_NE(t.status().message().find(must_mention), std::string::npos)
      << "message \"" << t.status().message() << "\" does not mention \"" << must_mention << "\"";
}

TEST(TokenizerVocab, TinyBpeMergesByRank) {
  auto t = Tokenizer::from_vocab(tiny_bpe());
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  // "abc": a b c -> (a b) rank 0 -> ab c -> (ab c) rank 1 -> abc.
  EXPECT_EQ((*t)->encode("abc", false, false), std::vector<int32_t>{5});
  // "cab": c a b -> c ab (no merge "c ab").
  EXPECT_EQ((*t)->encode("cab", false, false), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ((*t)->encode("abc<|endoftext|>", false, true), (std::vector<int32_t>{5, 0}));
  EXPECT_EQ((*t)->decode({5, 6, 1}), "abc a");
}

TEST(TokenizerVocab, FromVocabRejectsBadSpecs) {
  VocabSpec v = tiny_bpe();
  v.model = "bert";
  expect_error(v, ErrorCode::kUnsupported, "\"bert\"");

  v = tiny_bpe();
  v.pre = "no-such-family";
  expect_error(v, ErrorCode::kUnsupported, "\"no-such-family\"");

  v = tiny_bpe();
  v.merges.push_back("a zz");
  expect_error(v, ErrorCode::kCorruptFile, "merges[2] = \"a zz\"");

  v = tiny_bpe();
  v.merges.push_back("c a");  // "ca" is not a token
  expect_error(v, ErrorCode::kCorruptFile, "\"ca\" is not a token");

  v = tiny_bpe();
  v.merges.push_back("abc");
  expect_error(v, ErrorCode::kCorruptFile, "merges[2] = \"abc\"");

  v = tiny_bpe();
  v.merges.clear();
  expect_error(v, ErrorCode::kCorruptFile, "tokenizer.ggml.merges");

  v = tiny_bpe();
  v.bos = 7;
  expect_error(v, ErrorCode::kCorruptFile, "bos_token_id = 7");

  v = tiny_bpe();
  v.eos = -3;
  expect_error(v, ErrorCode::kCorruptFile, "eos_token_id = -3");

  v = tiny_bpe();
  v.types.pop_back();
  expect_error(v, ErrorCode::kCorruptFile, "token_type has 6");

  v = tiny_bpe();
  v.scores = {1.0f};
  expect_error(v, ErrorCode::kCorruptFile, "scores has 1");

  v = tiny_bpe();
  v.tokens.clear();
  v.types.clear();
  expect_error(v, ErrorCode::kCorruptFile, "tokenizer.ggml.tokens is empty");
}

// Serialises metadata into an in-memory GGUF and reads it back; `bytes` must outlive the File.
Result<std::unique_ptr<Tokenizer>> from_metadata(const std::vector<std::pair<std::string, Value>>& kv,
                                                 std::vector<uint8_t>& bytes) {
  gguf::Writer w;
  for (const auto& [k, v] : kv) w.add(k, v);
  SLUICE_ASSIGN_OR_RETURN(bytes, w.header_bytes());
  SLUICE_ASSIGN_OR_RETURN(gguf::File f, gguf::File::parse(bytes.data(), bytes.size(), "mem.gguf"));
  return Tokenizer::from_gguf(f);
}

std::vector<std::pair<std::string, Value>> tiny_metadata() {
  const VocabSpec v = tiny_bpe();
  std::vector<int32_t> types;
  for (TokenType t : v.types) types.push_back(static_cast<int32_t>(t));
  return {{"tokenizer.ggml.model", Value::str("gpt2")},
          {"tokenizer.ggml.pre", Value::str("gpt2")},
          {"tokenizer.ggml.tokens", Value::string_array(v.tokens)},
          {"tokenizer.ggml.token_type", Value::i32_array(types)},
          {"tokenizer.ggml.merges", Value::string_array(v.merges)},
          {"tokenizer.ggml.eos_token_id", Value::u32(0)},
          {"tokenizer.ggml.add_bos_token", Value::boolean(false)}};
}

// Replaces (or with `value` absent, removes) one key of the tiny metadata.
std::vector<std::pair<std::string, Value>> with(const std::string& key, std::optional<Value> value) {
  auto kv = tiny_metadata();
  std::erase_if(kv, [&](const auto& p) { return p.first == key; });
  if (value) kv.emplace_back(key, *value);
  return kv;
}

void expect_gguf_error(const std::vector<std::pair<std::string, Value>>& kv, const std::string& must_mention) {
  std::vector<uint8_t> bytes;
  auto t = from_metadata(kv, bytes);
  ASSERT_FALSE(t.is_ok()) << "accepted; expected error mentioning " << must_mention;
  EXPECT_NE(t.status().message().find(must_mention), std::string::npos)
      << "message \"" << t.status().message() << "\" does not mention \"" << must_mention << "\"";
}

TEST(TokenizerVocab, ReadsValidGguf) {
  std::vector<uint8_t> bytes;
  auto t = from_metadata(tiny_metadata(), bytes);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ((*t)->encode("abc", false, false), std::vector<int32_t>{5});
  EXPECT_EQ((*t)->eos(), 0);
  EXPECT_EQ((*t)->bos(), -1);
  EXPECT_FALSE((*t)->add_bos_default());
}

TEST(TokenizerVocab, GgufMetadataErrorsNameKeyAndValue) {
  expect_gguf_error(with("tokenizer.ggml.model", std::nullopt), "tokenizer.ggml.model is missing");
  expect_gguf_error(with("tokenizer.ggml.model", Value::u32(2)), "tokenizer.ggml.model has type u32");
  expect_gguf_error(with("tokenizer.ggml.tokens", std::nullopt), "tokenizer.ggml.tokens is missing");
  expect_gguf_error(with("tokenizer.ggml.tokens", Value::i32_array({1, 2})),
                    "tokenizer.ggml.tokens has type array of i32");
  expect_gguf_error(with("tokenizer.ggml.token_type", Value::i32_array({3, 1, 1, 1, 1, 9, 1})),
                    "tokenizer.ggml.token_type[5] = 9");
  expect_gguf_error(with("tokenizer.ggml.token_type", Value::i32_array({3, 1})), "token_type has 2 entries");
  expect_gguf_error(with("tokenizer.ggml.token_type", Value::str("x")), "token_type has type string");
  expect_gguf_error(with("tokenizer.ggml.merges", Value::string_array({"a b", "b q"})), "merges[1] = \"b q\"");
  expect_gguf_error(with("tokenizer.ggml.merges", std::nullopt), "tokenizer.ggml.merges is missing");
  expect_gguf_error(with("tokenizer.ggml.bos_token_id", Value::u32(4000000000u)), "bos_token_id = 4000000000");
  expect_gguf_error(with("tokenizer.ggml.bos_token_id", Value::u32(7)), "bos_token_id = 7");
  expect_gguf_error(with("tokenizer.ggml.eos_token_id", Value::str("0")), "eos_token_id has type string");
  expect_gguf_error(with("tokenizer.ggml.add_bos_token", Value::u8(1)), "add_bos_token has type u8");
  expect_gguf_error(with("tokenizer.ggml.scores", Value::f32_array({1.0f})), "scores has 1 entries");
  expect_gguf_error(with("tokenizer.ggml.scores", Value::string_array({"a"})), "scores has type array of string");
  expect_gguf_error(with("tokenizer.ggml.pre", Value::str("mystery")), "\"mystery\"");
}

TEST(TokenizerVocab, NoTokenSentinelIsNone) {
  // Some converters write 0xFFFFFFFF / -1 for "no such token".
  std::vector<uint8_t> bytes;
  auto t = from_metadata(with("tokenizer.ggml.bos_token_id", Value::i32(-1)), bytes);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ((*t)->bos(), -1);
  auto u = from_metadata(with("tokenizer.ggml.bos_token_id", Value::u32(0xFFFFFFFFu)), bytes);
  ASSERT_TRUE(u.is_ok()) << u.status().message();
  EXPECT_EQ((*u)->bos(), -1);
}

TEST(TokenizerVocab, EveryPreTokenizerCompiles) {
  for (const char* pre : {"default", "gpt2", "gpt-2", "llama-bpe", "llama3", "smollm", "starcoder", "qwen2",
                          "deepseek-r1-qwen", "tekken"}) {
    VocabSpec v = tiny_bpe();
    v.pre = pre;
    auto t = Tokenizer::from_vocab(v);
    ASSERT_TRUE(t.is_ok()) << pre << ": " << t.status().message();
    EXPECT_EQ((*t)->decode((*t)->encode("abc cab  ba c <|endoftext|>", false, true)), "abc cab  ba c <|endoftext|>")
        << pre;
  }
}

}  // namespace
}  // namespace sluice::model
