// generate(): batched prefill, decode loop, stop conditions, streaming and the KV-cache
// invariant, against a scripted fake model and a fake tokenizer (no real weights needed).
#include "decode/generate.h"

#include <map>

#include "test_util.h"

#if __has_include("model/config.h")
#include "model/config.h"
#define SLUICE_TEST_HAS_CONFIG 1
#endif

namespace sluice::decode {
namespace {

constexpr int kVocab = 8;
constexpr int32_t kEos = 7;

// Tokens: 0..6 spell text, 7 is EOS. 4 and 5 are the two bytes of "é" (C3 A9), 6 is control.
class FakeTokenizer final : public model::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view, bool, bool) const override { return {}; }
  std::string token_bytes(int32_t id) const override {
    static constexpr const char* kText[kVocab] = {"a", "b", " c", "d", "\xC3", "\xA9", "<ctl>", "</s>"};
    return id >= 0 && id < kVocab ? kText[id] : "";
  }
  int n_vocab() const override { return kVocab; }
  int32_t bos() const override { return -1; }
  int32_t eos() const override { return kEos; }
  bool is_end_of_generation(int32_t id) const override { return id == kEos; }
  bool add_bos_default() const override { return false; }
  int32_t find_token(std::string_view) const override { return -1; }
  bool is_control(int32_t id) const override { return id == 6 || id == kEos; }
  bool strips_leading_space() const override { return false; }
};

// Greedy-friendly fake: after evaluating a batch, the logits of its last token are 5 at
// script[n_past - 1] (or at 0 past the script's end) and 1 elsewhere. Records every eval call.
class FakeModel final : public model::Model {
 public:
  FakeModel(int n_ctx, std::vector<int32_t> script) : n_ctx_(n_ctx), script_(std::move(script)) {}

  const char* backend_name() const override { return "fake"; }
  const model::Config& config() const override {
#ifdef SLUICE_TEST_HAS_CONFIG
    return config_;
#else
    SLUICE_CHECK(false, "the fake model has no config");
    return *reinterpret_cast<const model::Config*>(this);
#endif
  }
  int n_vocab() const override { return kVocab; }
  int n_ctx() const override { return n_ctx_; }
  int n_past() const override { return int(cache_.size()); }
  Status eval(std::span<const int32_t> tokens, std::span<float> logits) override {
    if (fail_at_call_ >= 0 && int(calls_.size()) == fail_at_call_) return io_error("injected failure");
    if (cache_.size() + tokens.size() > size_t(n_ctx_)) return invalid_argument("KV cache overflow");
    calls_.emplace_back(tokens.begin(), tokens.end());
    cache_.insert(cache_.end(), tokens.begin(), tokens.end());
    const size_t pos = cache_.size() - 1;
    const int32_t next = pos < script_.size() ? script_[pos] : 0;
    for (int i = 0; i < kVocab; ++i) logits[size_t(i)] = i == next ? 5.0f : 1.0f;
    return Status::ok();
  }
  void truncate(int n) override { cache_.resize(size_t(std::min<int>(n, int(cache_.size())))); }
  uint64_t weight_bytes_per_token() const override { return 1000; }

  std::vector<std::vector<int32_t>> calls_;
  std::vector<int32_t> cache_;
  int fail_at_call_ = -1;

 private:
  int n_ctx_;
  std::vector<int32_t> script_;
#ifdef SLUICE_TEST_HAS_CONFIG
  model::Config config_{};
#endif
};

SamplerParams greedy() {
  SamplerParams p;
  p.temperature = 0;
  return p;
}

// Script indexed by position: the prompt occupies 0..2, so script[2] is the first sample.
TEST(Generate, PrefillIsOneBatchThenOneTokenPerStepUntilEos) {
  FakeModel m(64, {9, 9, 0, 1, 2, 3, kEos});
  FakeTokenizer tok;
  Sampler s(greedy(), kVocab);
  std::vector<std::string> pieces;
  const std::vector<int32_t> prompt{3, 3, 3};
  auto r = generate(m, tok, s, prompt, {}, [&](std::string_view p) {
    pieces.emplace_back(p);
    return true;
  });
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->stop, StopReason::kEndOfGeneration);
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{0, 1, 2, 3, kEos}));
  EXPECT_EQ(r->text, "ab cd");  // EOS adds no text
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "b", " c", "d"}));
  ASSERT_EQ(m.calls_.size(), 5u);
  EXPECT_EQ(m.calls_[0], prompt);  // batched prefill
  for (size_t i = 1; i < m.calls_.size(); ++i) EXPECT_EQ(m.calls_[i].size(), 1u);
  // Every sampled token but the last is in the cache; the last is pending.
  EXPECT_EQ(m.cache_, (std::vector<int32_t>{3, 3, 3, 0, 1, 2, 3}));
  ASSERT_TRUE(r->pending.has_value());
  EXPECT_EQ(*r->pending, kEos);
  EXPECT_EQ(r->timings.n_prompt, 3);
  EXPECT_EQ(r->timings.n_decode, 4);
  EXPECT_GE(r->timings.decode_s, 0.0);
}

TEST(Generate, StopsAtNPredictWithoutEvaluatingTheLastToken) {
  FakeModel m(64, {0, 1, 2, 1, 2, 1, 2});
  FakeTokenizer tok;
  Sampler s(greedy(), kVocab);
  GenerateOptions o;
  o.n_predict = 3;
  auto r = generate(m, tok, s, std::vector<int32_t>{5}, o, nullptr);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->stop, StopReason::kMaxTokens);
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(m.cache_, (std::vector<int32_t>{5, 0, 1}));
  EXPECT_EQ(r->pending, std::optional<int32_t>(2));
  EXPECT_EQ(r->timings.n_decode, 2);

  FakeModel m0(64, {0});
  Sampler s0(greedy(), kVocab);
  o.n_predict = 0;
  auto r0 = generate(m0, tok, s0, std::vector<int32_t>{5}, o, nullptr);
  ASSERT_TRUE(r0.is_ok());
  EXPECT_TRUE(r0->tokens.empty());
  EXPECT_FALSE(r0->pending.has_value());
}

TEST(Generate, StopsWhenTheContextIsFull) {
  FakeModel m(6, {});  // always token 0, never EOS
  FakeTokenizer tok;
  Sampler s(greedy(), kVocab);
  auto r = generate(m, tok, s, std::vector<int32_t>{1, 1, 1, 1}, {}, nullptr);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->stop, StopReason::kContextFull);
  EXPECT_EQ(m.n_past(), 6);
  EXPECT_EQ(r->tokens.size(), 3u);  // two evaluated (positions 4, 5), the third pending
  EXPECT_TRUE(r->pending.has_value());
  EXPECT_STREQ(stop_reason_name(r->stop), "context full");
}

TEST(Generate, RejectsAPromptThatDoesNotFitWithoutEvaluating) {
  FakeModel m(4, {});
  FakeTokenizer tok;
  Sampler s(greedy(), kVocab);
  auto r = generate(m, tok, s, std::vector<int32_t>{1, 1, 1, 1, 1}, {}, nullptr);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("does not fit"), std::string::npos) << r.status().message();
  EXPECT_TRUE(m.calls_.empty());

  auto empty = generate(m, tok, s, std::vector<int32_t>{}, {}, nullptr);
  ASSERT_FALSE(empty.is_ok());
  EXPECT_EQ(empty.status().code(), ErrorCode::kInvalidArgument);

  // A continuation must fit in what is left after earlier turns.
  std::vector<float> logits(kVocab);
  ASSERT_TRUE(m.eval(std::vector<int32_t>{1, 1, 1}, logits).is_ok());
  auto more = generate(m, tok, s, std::vector<int32_t>{1, 1}, {}, nullptr);
  ASSERT_FALSE(more.is_ok());
  EXPECT_EQ(m.n_past(), 3);
}

TEST(Generate, StreamsOnlyCompleteUtf8AndHidesControlTokens) {
  FakeModel m(64, {4, 6, 5, 0, kEos});  // "\xC3" <ctl> "\xA9" "a"
  FakeTokenizer tok;
  Sampler s(greedy(), kVocab);
  std::vector<std::string> pieces;
  auto r = generate(m, tok, s, std::vector<int32_t>{1}, {}, [&](std::string_view p) {
    pieces.emplace_back(p);
    return true;
  });
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->text, "\xC3\xA9"
                     "a");
  ASSERT_FALSE(pieces.empty());
  EXPECT_EQ(pieces[0], "\xC3\xA9");  // never a lone lead byte
}

TEST(Generate, CallbackCanStopGeneration) {
  FakeModel m(64, {0, 1, 2, 3, 0, 1});
  FakeTokenizer tok;
  Sampler s(greedy(), kVocab);
  int calls = 0;
  auto r = generate(m, tok, s, std::vector<int32_t>{1}, {}, [&](std::string_view) { return ++calls < 2; });
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->stop, StopReason::kStoppedByCaller);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(r->tokens.size(), 2u);
}

TEST(Generate, PromptTokensFeedTheRepetitionPenalty) {
  // The fake's logits are 5 for the scripted token (0 here) and 1 elsewhere. A penalty of 10
  // on token 0 makes it 0.5 < 1, so greedy picks token 1 -- only if generate() fed the prompt
  // to the sampler's history.
  FakeTokenizer tok;
  SamplerParams p = greedy();
  p.repeat_penalty = 10.0f;
  p.repeat_last_n = 8;
  GenerateOptions o;
  o.n_predict = 1;
  FakeModel with_zero(64, {});
  Sampler s(p, kVocab);
  auto r = generate(with_zero, tok, s, std::vector<int32_t>{0}, o, nullptr);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{1}));

  FakeModel without_zero(64, {});
  Sampler s2(p, kVocab);
  auto r2 = generate(without_zero, tok, s2, std::vector<int32_t>{2}, o, nullptr);
  ASSERT_TRUE(r2.is_ok());
  EXPECT_EQ(r2->tokens, (std::vector<int32_t>{0}));
}

TEST(Generate, EvalErrorsPropagateWithContext) {
  FakeModel m(64, {0, 1, 2, 3});
  m.fail_at_call_ = 2;  // prefill, one decode step, then failure
  FakeTokenizer tok;
  Sampler s(greedy(), kVocab);
  auto r = generate(m, tok, s, std::vector<int32_t>{1}, {}, nullptr);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIo);
  EXPECT_NE(r.status().message().find("injected failure"), std::string::npos);
  EXPECT_NE(r.status().message().find("decode at position"), std::string::npos);

  FakeModel m2(64, {});
  m2.fail_at_call_ = 0;
  auto r2 = generate(m2, tok, s, std::vector<int32_t>{1}, {}, nullptr);
  ASSERT_FALSE(r2.is_ok());
  EXPECT_NE(r2.status().message().find("prefill"), std::string::npos);
}

}  // namespace
}  // namespace sluice::decode
