// SentencePiece (llama-2 style) on a small hand-built vocabulary. Expected ids are derived by
// hand from SentencePiece's BPE rule, step by step in the comments: repeatedly merge the
// adjacent pair whose concatenation is a vocabulary piece with the highest score (leftmost on
// ties); pieces left outside the vocabulary fall back to <0xXX> byte tokens.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "gguf/gguf.h"
#include "model/tokenizer.h"
#include "test_util.h"

namespace sluice::model {
namespace {

constexpr int32_t kUnk = 0, kBos = 1, kEos = 2, kFirstByte = 3;
int32_t byte_id(uint8_t b) { return kFirstByte + b; }

struct Piece {
  const char* text;
  float score;
};
// Ids from 259 on, in this order.
constexpr Piece kPieces[] = {
    {"\xE2\x96\x81", -10}, {"h", -10},  {"e", -10},   {"l", -10},   {"o", -10},  {"w", -10},
    {"r", -10},            {"d", -10},  {"he", -3},   {"ll", -2},   {"\xE2\x96\x81he", -4},
    {"llo", -5},           {"\xE2\x96\x81hello", -6}, {"or", -1},   {"\xE2\x96\x81w", -7},
    {"\xE2\x96\x81wor", -8}, {"ld", -9}, {"a", -10},  {"aa", -1},
};

VocabSpec spm_vocab(bool byte_tokens = true) {
  VocabSpec v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  v.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    v.tokens.push_back(byte_tokens ? name : std::string("unused") + std::to_string(b));
    v.types.push_back(byte_tokens ? TokenType::kByte : TokenType::kUnused);
    v.scores.push_back(0);
  }
  for (const Piece& p : kPieces) {
    v.tokens.push_back(p.text);
    v.types.push_back(TokenType::kNormal);
    v.scores.push_back(p.score);
  }
  v.bos = kBos;
  v.eos = kEos;
  v.unk = kUnk;
  return v;
}

std::unique_ptr<Tokenizer> make(const VocabSpec& v) {
  auto t = Tokenizer::from_vocab(v);
  EXPECT_TRUE(t.is_ok()) << t.status().message();
  return t.is_ok() ? std::move(t).value() : nullptr;
}

int32_t id_of(const Tokenizer& t, const char* text) {
  const int32_t id = t.find_token(text);
  EXPECT_GE(id, 0) << text;
  return id;
}

TEST(TokenizerSpm, MergesByScoreHighestFirst) {
  auto tok = make(spm_vocab());
  ASSERT_TRUE(tok);
  // "▁hello▁world": symbols ▁ h e l l o ▁ w o r l d. Merges in score order:
  //   or(-1), ll(-2), he(-3), ▁he(-4), llo(-5), ▁hello(-6), ▁w(-7), ▁wor(-8), ld(-9)
  // "▁world" is not a piece, so ▁wor + ld stay apart.
  const std::vector<int32_t> want = {id_of(*tok, "\xE2\x96\x81hello"), id_of(*tok, "\xE2\x96\x81wor"),
                                     id_of(*tok, "ld")};
  EXPECT_EQ(tok->encode("hello world", false, false), want);
  // With BOS (SPM default: add_bos on).
  EXPECT_TRUE(tok->add_bos_default());
  std::vector<int32_t> with_bos = {kBos};
  with_bos.insert(with_bos.end(), want.begin(), want.end());
  EXPECT_EQ(tok->encode("hello world", true, false), with_bos);
}

TEST(TokenizerSpm, EqualScoresMergeLeftmostFirst) {
  auto tok = make(spm_vocab());
  ASSERT_TRUE(tok);
  // "▁aaa": ▁ a a a; both (a,a) pairs score -1, the left one wins: ▁ [aa] a.
  EXPECT_EQ(tok->encode("aaa", false, false),
            (std::vector<int32_t>{id_of(*tok, "\xE2\x96\x81"), id_of(*tok, "aa"), id_of(*tok, "a")}));
}

TEST(TokenizerSpm, ByteFallbackForUnknownCharacters) {
  auto tok = make(spm_vocab());
  ASSERT_TRUE(tok);
  // "▁hi!": "i" and "!" are not pieces -> <0x69> <0x21>; "▁h" is not a piece either.
  EXPECT_EQ(tok->encode("hi!", false, false),
            (std::vector<int32_t>{id_of(*tok, "\xE2\x96\x81"), id_of(*tok, "h"), byte_id('i'), byte_id('!')}));
  // A 4-byte character falls back to four byte tokens.
  EXPECT_EQ(tok->encode("\xF0\x9F\x98\x80", false, false),
            (std::vector<int32_t>{id_of(*tok, "\xE2\x96\x81"), byte_id(0xF0), byte_id(0x9F), byte_id(0x98),
                                  byte_id(0x80)}));
  EXPECT_EQ(tok->token_bytes(byte_id(0xF0)), "\xF0");
}

TEST(TokenizerSpm, UnknownTokenWithoutByteFallback) {
  auto tok = make(spm_vocab(/*byte_tokens=*/false));
  ASSERT_TRUE(tok);
  // One <unk> per character missing from the vocabulary.
  EXPECT_EQ(tok->encode("hi!", false, false),
            (std::vector<int32_t>{id_of(*tok, "\xE2\x96\x81"), id_of(*tok, "h"), kUnk, kUnk}));
}

TEST(TokenizerSpm, AddSpacePrefixOff) {
  VocabSpec v = spm_vocab();
  v.add_space_prefix = 0;
  auto tok = make(v);
  ASSERT_TRUE(tok);
  // "hello" (no "▁"): h e l l o -> ll(-2), he(-3), then (ll,o) -> llo(-5); "hello" is not a
  // piece -> [he][llo].
  EXPECT_EQ(tok->encode("hello", false, false), (std::vector<int32_t>{id_of(*tok, "he"), id_of(*tok, "llo")}));
  EXPECT_FALSE(tok->strips_leading_space());
  EXPECT_EQ(tok->decode(tok->encode(" hello", false, false)), " hello");
}

TEST(TokenizerSpm, SpecialTokensAndSpacePrefixAfterThem) {
  auto tok = make(spm_vocab());
  ASSERT_TRUE(tok);
  const int32_t hello = id_of(*tok, "\xE2\x96\x81hello");
  // Text after a special token gets the "▁" prefix again (llama.cpp's behaviour).
  EXPECT_EQ(tok->encode("<s>hello</s>", false, true), (std::vector<int32_t>{kBos, hello, kEos}));
  // Without parse_special the markup is text: "▁<s>hello</s>" -> ▁ < s > he llo < / s >.
  const auto plain = tok->encode("<s>hello</s>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), kBos), 0);
  EXPECT_EQ(tok->decode(plain), "<s>hello</s>");
  EXPECT_TRUE(tok->is_end_of_generation(kEos));
  EXPECT_FALSE(tok->is_end_of_generation(kBos));
}

TEST(TokenizerSpm, DecodeStripsOnlyThePrefixSpace) {
  auto tok = make(spm_vocab());
  ASSERT_TRUE(tok);
  for (const std::string text : {"hello world", "  two leading spaces", "trailing ", "a\xF0\x9F\x98\x80z", ""}) {
    EXPECT_EQ(tok->decode(tok->encode(text, false, false)), text);
    // BOS (a control token) does not count as the first token.
    EXPECT_EQ(tok->decode(tok->encode(text, true, false)), "<s>" + text);
  }
  EXPECT_EQ(tok->token_bytes(id_of(*tok, "\xE2\x96\x81hello")), " hello");
}

TEST(TokenizerSpm, StreamingMatchesDecode) {
  auto tok = make(spm_vocab());
  ASSERT_TRUE(tok);
  const std::string text = "hello \xF0\x9F\x98\x80 world";
  const auto ids = tok->encode(text, true, false);
  Detokenizer detok(*tok);
  std::string out;
  for (int32_t id : ids) {
    const std::string chunk = detok.push(id);
    // The emoji arrives as four byte tokens; nothing of it may be released early.
    EXPECT_TRUE(chunk.find('\xF0') == std::string::npos || chunk.find("\xF0\x9F\x98\x80") != std::string::npos);
    out += chunk;
  }
  out += detok.flush();
  EXPECT_EQ(out, tok->decode(ids));
  EXPECT_EQ(out, "<s>" + text);
}

// Gemma 3's SentencePiece vocabulary (262144 tokens, no space prefix, byte fallback) against
// llama.cpp's llama-tokenize on the SmolLM2 tokenizer corpus (52 texts: scripts, whitespace runs,
// code, emoji, special-token text), special-token parsing on and off, no BOS; and decode(encode(x))
// == x. tests/fixtures/tokenizer/README.md says how the fixture was made.
TEST(TokenizerSpm, Gemma3MatchesLlamaCppOnCorpus) {
  const std::string path = test::model_path(test::kGemma3);
  SLUICE_REQUIRE_MODEL(path);
  auto file = gguf::File::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  auto tok = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  std::ifstream in(test::fixture_path("tokenizer/gemma3_llama_cpp.json"));
  ASSERT_TRUE(in.good()) << "missing fixture tokenizer/gemma3_llama_cpp.json";
  const nlohmann::json doc = nlohmann::json::parse(in);
  ASSERT_GE(doc["cases"].size(), 40u);
  for (const auto& c : doc["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ((*tok)->encode(text, false, true), c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    EXPECT_EQ((*tok)->encode(text, false, false), c["ids_no_special"].get<std::vector<int32_t>>()) << "text: " << text;
    EXPECT_EQ((*tok)->decode((*tok)->encode(text, false, false)), text) << "round trip: " << text;
  }
}

}  // namespace
}  // namespace sluice::model
