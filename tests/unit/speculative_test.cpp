// Speculative decoding (decode/speculative.h): exactness against generate() with scripted fake
// models (greedy: token for token, KV cache invariant; temperature 1: a chi-square goodness-of-fit
// test of the emitted tokens' joint distribution against the target's exact one), vocabulary
// checks, and the layer-mask hook on the real models (greedy identity with both draft kinds on
// SmolLM2 and Gemma 3, the KV rows of a self-draft repaired by the verification pass).
#include "decode/speculative.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "model/config.h"
#include "test_util.h"

namespace sluice::decode {
namespace {

constexpr int kVocab = 6;
constexpr int32_t kEos = 5;

class FakeTokenizer final : public model::Tokenizer {
 public:
  explicit FakeTokenizer(std::string last = "</s>") : last_(std::move(last)) {}
  std::vector<int32_t> encode(std::string_view, bool, bool) const override { return {}; }
  std::string token_bytes(int32_t id) const override {
    static constexpr const char* kText[kVocab] = {"a", "b", "c", "d", "e", ""};
    if (id == kEos) return last_;
    return id >= 0 && id < kVocab ? kText[id] : "";
  }
  int n_vocab() const override { return kVocab; }
  int32_t bos() const override { return -1; }
  int32_t eos() const override { return kEos; }
  bool is_end_of_generation(int32_t id) const override { return id == kEos; }
  bool add_bos_default() const override { return false; }
  int32_t find_token(std::string_view) const override { return -1; }
  bool is_control(int32_t id) const override { return id == kEos; }
  bool strips_leading_space() const override { return false; }

 private:
  std::string last_;
};

// Logits are a fixed pseudo-random function of the whole prefix (the cache up to and including
// each token), so a model's output depends on exactly what its cache holds: a wrong rollback
// changes every later token. `seed` tells target and draft apart; `mix` in [0, 1] makes the
// draft agree with the target partly (its logits: mix * target's + (1 - mix) * its own).
class HashModel final : public model::Model {
 public:
  HashModel(uint64_t seed, int n_ctx, float eos_bias = -3.0f, const HashModel* follow = nullptr, float mix = 0)
      : seed_(seed), n_ctx_(n_ctx), eos_bias_(eos_bias), follow_(follow), mix_(mix) {}
  const model::Config& config() const override { return config_; }
  const char* backend_name() const override { return "fake"; }
  int n_vocab() const override { return kVocab; }
  int n_ctx() const override { return n_ctx_; }
  int n_past() const override { return int(cache_.size()); }
  Status eval(std::span<const int32_t> tokens, std::span<float> logits) override {
    if (cache_.size() + tokens.size() > size_t(n_ctx_)) return invalid_argument("KV cache overflow");
    const bool all = logits.size() == tokens.size() * kVocab && tokens.size() > 1;
    if (!all && logits.size() != kVocab) return invalid_argument("bad logits size");
    ++calls_;
    for (size_t i = 0; i < tokens.size(); ++i) {
      cache_.push_back(tokens[i]);
      if (all || i + 1 == tokens.size()) logits_of(cache_, logits.subspan(all ? i * kVocab : 0, kVocab));
    }
    return Status::ok();
  }
  void truncate(int n) override { cache_.resize(size_t(std::clamp(n, 0, int(cache_.size())))); }
  uint64_t weight_bytes_per_token() const override { return 1; }

  // The logits after `prefix` (the model's whole cache).
  void logits_of(const std::vector<int32_t>& prefix, std::span<float> out) const {
    uint64_t h = seed_;
    for (int32_t t : prefix) h = (h ^ uint64_t(t + 1)) * 0x100000001B3ull;
    for (int v = 0; v < kVocab; ++v) {
      uint64_t x = h ^ (uint64_t(v) * 0x9E3779B97F4A7C15ull);
      x ^= x >> 33;
      x *= 0xff51afd7ed558ccdull;
      x ^= x >> 33;
      out[size_t(v)] = float(double(x >> 11) * 0x1.0p-53 * 3.0);
    }
    out[kEos] += eos_bias_;
    if (follow_) {
      std::vector<float> t(kVocab);
      follow_->logits_of(prefix, t);
      for (int v = 0; v < kVocab; ++v) out[size_t(v)] = mix_ * t[size_t(v)] + (1 - mix_) * out[size_t(v)];
    }
  }

  std::vector<int32_t> cache_;
  int calls_ = 0;

 private:
  uint64_t seed_;
  int n_ctx_;
  float eos_bias_;
  const HashModel* follow_;
  float mix_;
  model::Config config_{};
};

SamplerParams greedy() {
  SamplerParams p;
  p.temperature = 0;
  return p;
}

TEST(Speculative, GreedyMatchesGenerateForEveryK) {
  const FakeTokenizer tok;
  const std::vector<int32_t> prompt = {0, 1, 2};
  for (float mix : {0.0f, 0.6f, 1.0f}) {
    for (int k : {1, 2, 3, 5, 8}) {
      for (int n_predict : {1, 2, 7, 40}) {
        HashModel ref(1, 64, -9.0f);  // no end of generation: the full n_predict
        Sampler s_ref(greedy(), kVocab);
        auto a = generate(ref, tok, s_ref, prompt, {n_predict}, nullptr);
        ASSERT_TRUE(a.is_ok()) << a.status().message();

        HashModel target(1, 64, -9.0f);
        HashModel draft(2, 64, -9.0f, &target, mix);
        ModelDrafter drafter(draft);
        Sampler s(greedy(), kVocab);
        SpecStats st;
        auto b = generate_speculative(target, drafter, tok, s, prompt, {n_predict}, {k, false}, nullptr, &st);
        ASSERT_TRUE(b.is_ok()) << b.status().message();
        SCOPED_TRACE("mix " + std::to_string(mix) + " K " + std::to_string(k) + " n " + std::to_string(n_predict));
        EXPECT_EQ(a->tokens, b->tokens);
        EXPECT_EQ(a->text, b->text);
        EXPECT_EQ(a->stop, b->stop);
        EXPECT_EQ(a->pending, b->pending);
        // The KV cache invariant: the same positions, holding the same tokens.
        EXPECT_EQ(ref.cache_, target.cache_);
        if (mix == 1.0f && n_predict > k + 1) {
          // A draft that is the target: every drafted token is kept.
          EXPECT_EQ(st.accepted, st.drafted);
          EXPECT_LT(target.calls_, ref.calls_);
        }
      }
    }
  }
}

TEST(Speculative, GreedyStopsAtContextFullLikeGenerate) {
  const FakeTokenizer tok;
  const std::vector<int32_t> prompt = {3, 1};
  for (int k : {1, 4, 16}) {
    HashModel ref(7, 12, -9.0f);
    Sampler s_ref(greedy(), kVocab);
    auto a = generate(ref, tok, s_ref, prompt, {-1}, nullptr);
    ASSERT_TRUE(a.is_ok());
    ASSERT_EQ(a->stop, StopReason::kContextFull);
    HashModel target(7, 12, -9.0f);
    HashModel draft(8, 12, -9.0f, &target, 0.5f);
    ModelDrafter drafter(draft);
    Sampler s(greedy(), kVocab);
    auto b = generate_speculative(target, drafter, tok, s, prompt, {-1}, {k, false}, nullptr);
    ASSERT_TRUE(b.is_ok()) << b.status().message();
    EXPECT_EQ(a->tokens, b->tokens);
    EXPECT_EQ(b->stop, StopReason::kContextFull);
    EXPECT_EQ(ref.cache_, target.cache_);
  }
}

TEST(Speculative, GreedyStopsAtEndOfGenerationAndCallerStop) {
  const FakeTokenizer tok;
  const std::vector<int32_t> prompt = {4};
  for (uint64_t seed = 1; seed < 30; ++seed) {
    HashModel ref(seed, 200, 0.5f);
    Sampler s_ref(greedy(), kVocab);
    int pieces = 0;
    auto stop_after_5 = [&](std::string_view) { return ++pieces < 5; };
    auto a = generate(ref, tok, s_ref, prompt, {100}, stop_after_5);
    ASSERT_TRUE(a.is_ok());
    HashModel target(seed, 200, 0.5f);
    HashModel draft(seed + 100, 200, 0.5f, &target, 0.7f);
    ModelDrafter drafter(draft);
    Sampler s(greedy(), kVocab);
    pieces = 0;
    auto b = generate_speculative(target, drafter, tok, s, prompt, {100}, {4, true}, stop_after_5);
    ASSERT_TRUE(b.is_ok());
    EXPECT_EQ(a->tokens, b->tokens) << "seed " << seed;
    EXPECT_EQ(a->stop, b->stop) << "seed " << seed;
    EXPECT_EQ(a->text, b->text);
    EXPECT_EQ(ref.cache_, target.cache_) << "seed " << seed;
  }
}

TEST(Speculative, RepetitionPenaltyAppliesAsInGenerate) {
  const FakeTokenizer tok;
  SamplerParams p = greedy();
  p.repeat_penalty = 1.8f;
  p.repeat_last_n = 4;
  HashModel ref(3, 128, 0.0f);
  Sampler s_ref(p, kVocab);
  auto a = generate(ref, tok, s_ref, std::vector<int32_t>{1, 1}, {50}, nullptr);
  HashModel target(3, 128, 0.0f);
  HashModel draft(4, 128, 0.0f, &target, 0.5f);
  ModelDrafter drafter(draft);
  Sampler s(p, kVocab);
  auto b = generate_speculative(target, drafter, tok, s, std::vector<int32_t>{1, 1}, {50}, {6, false}, nullptr);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->tokens, b->tokens);
}

// Temperature 1: the emitted tokens must follow the target's distribution exactly. The test
// draws the first three tokens (over the 6-token vocabulary, EOS ending a sequence early) N times
// with speculation (K = 2: the first token comes from the prefill, the next two from one draft +
// verify round, exercising acceptance, rejection with the residual draw, and the bonus draw) and
// runs a chi-square goodness-of-fit test against the exact joint distribution computed from the
// target's logits with the same sampler filters.
//   Test: Pearson chi-square, df = outcomes - 1, alpha = 1e-3 (critical value from the
//   Wilson-Hilferty approximation).
//   Power: stated against the most likely bug, keeping draft tokens without the acceptance test
//   (tokens 2 and 3 would follow the draft): the noncentrality lambda = N * sum (q - p)^2 / p is
//   printed and required to exceed 200; with df <= 155 the noncentral chi-square then has mean
//   >= df + 200 and sd <= sqrt(2 (df + 400)), putting the critical value more than 4 sd below
//   the mean: power > 0.9999 (normal approximation).
double chi2_critical(int df, double z) {  // Wilson-Hilferty: upper quantile for standard normal z
  const double k = df;
  const double t = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * t * t * t;
}

// The joint distribution of the first `depth` emitted tokens when the first comes from `first`
// and the others from `rest`.
std::map<std::vector<int32_t>, double> exact_joint(const HashModel& first, const HashModel& rest,
                                                   const std::vector<int32_t>& prompt, const SamplerParams& params,
                                                   int depth) {
  std::map<std::vector<int32_t>, double> out;
  Sampler s(params, kVocab);
  std::function<void(std::vector<int32_t>&, std::vector<int32_t>&, double)> rec = [&](std::vector<int32_t>& prefix,
                                                                                       std::vector<int32_t>& emitted,
                                                                                       double pr) {
    if (int(emitted.size()) == depth || (!emitted.empty() && emitted.back() == kEos)) {
      out[emitted] += pr;
      return;
    }
    std::vector<float> logits(kVocab);
    (emitted.empty() ? first : rest).logits_of(prefix, logits);
    for (const Candidate& c : s.distribution(logits)) {
      prefix.push_back(c.id);
      emitted.push_back(c.id);
      rec(prefix, emitted, pr * c.p);
      prefix.pop_back();
      emitted.pop_back();
    }
  };
  std::vector<int32_t> prefix = prompt, emitted;
  rec(prefix, emitted, 1.0);
  return out;
}

TEST(Speculative, TemperatureOneMatchesTargetDistribution) {
  const FakeTokenizer tok;
  const std::vector<int32_t> prompt = {2, 0};
  constexpr int kDepth = 3, kRuns = 30000;
  for (const bool filters : {false, true}) {
    SamplerParams p;
    p.temperature = 1.0f;
    p.top_k = filters ? 4 : 0;
    p.top_p = filters ? 0.97f : 1.0f;
    p.min_p = filters ? 0.02f : 0.0f;
    const HashModel shape(11, 64, -1.0f);
    const HashModel draft_shape(12, 64, -1.0f, &shape, 0.4f);
    const auto exact = exact_joint(shape, shape, prompt, p, kDepth);
    // The alternative: every draft kept (the first token still comes from the target's prefill).
    const auto draft_dist = exact_joint(shape, draft_shape, prompt, p, kDepth);
    std::map<std::vector<int32_t>, int> seen;
    int64_t drafted = 0, accepted = 0;
    for (int r = 0; r < kRuns; ++r) {
      HashModel target(11, 64, -1.0f);
      HashModel draft(12, 64, -1.0f, &target, 0.4f);
      ModelDrafter drafter(draft);
      p.seed = uint64_t(r) * 7919 + 1;
      Sampler s(p, kVocab);
      SpecStats st;
      auto g = generate_speculative(target, drafter, tok, s, prompt, {kDepth}, {2, false}, nullptr, &st);
      ASSERT_TRUE(g.is_ok()) << g.status().message();
      seen[g->tokens]++;
      drafted += st.drafted;
      accepted += st.accepted;
    }
    double chi2 = 0, lambda = 0;
    for (const auto& [outcome, pr] : exact) {
      const double e = pr * kRuns;
      const auto it = seen.find(outcome);
      const double o = it == seen.end() ? 0 : it->second;
      chi2 += (o - e) * (o - e) / e;
      const auto q = draft_dist.find(outcome);
      const double qd = q == draft_dist.end() ? 0 : q->second;
      lambda += kRuns * (qd - pr) * (qd - pr) / pr;
    }
    for (const auto& [outcome, n] : seen) {
      EXPECT_TRUE(exact.count(outcome)) << "an outcome the target cannot produce was emitted";
    }
    const int df = int(exact.size()) - 1;
    const double crit = chi2_critical(df, 3.0902);  // alpha = 1e-3
    std::printf("filters %d: %zu outcomes, chi2 %.1f (critical %.1f at alpha 1e-3, df %d); acceptance %.3f; "
                "noncentrality against 'keep every draft' %.0f\n",
                int(filters), exact.size(), chi2, crit, df, double(accepted) / double(std::max<int64_t>(drafted, 1)),
                lambda);
    EXPECT_LT(chi2, crit);
    EXPECT_GT(lambda, 200.0) << "the test would have too little power against accepting every draft";
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, drafted) << "rejections must occur for the test to exercise the residual draw";
  }
}

TEST(Speculative, VocabularyMismatchIsAClearError) {
  const FakeTokenizer a, b("<eos>");
  EXPECT_TRUE(check_same_vocabulary("t.gguf", a, kVocab, "d.gguf", a, kVocab).is_ok());
  Status st = check_same_vocabulary("t.gguf", a, kVocab, "d.gguf", b, kVocab);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("t.gguf"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("d.gguf"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("token 5"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("<eos>"), std::string::npos) << st.message();
  st = check_same_vocabulary("t.gguf", a, kVocab, "d.gguf", a, kVocab + 1);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("vocabulary of 7"), std::string::npos) << st.message();
}

TEST(Speculative, RejectsBadK) {
  const FakeTokenizer tok;
  HashModel t(1, 16), d(2, 16);
  ModelDrafter drafter(d);
  Sampler s(greedy(), kVocab);
  auto g = generate_speculative(t, drafter, tok, s, std::vector<int32_t>{1}, {4}, {0, false}, nullptr);
  EXPECT_FALSE(g.is_ok());
}

}  // namespace
}  // namespace sluice::decode

namespace sluice::decode {
namespace {

SpecStats stats_with(double acceptance, std::vector<std::pair<int, double>> pass_ms) {
  SpecStats s;
  s.drafted = 100;
  s.accepted = int64_t(acceptance * 100);
  for (auto [k, ms] : pass_ms) {
    if (s.by_k.size() <= size_t(k)) s.by_k.resize(size_t(k) + 1);
    s.by_k[size_t(k)].passes = 10;
    s.by_k[size_t(k)].seconds = 10 * ms * 1e-3;
  }
  return s;
}

TEST(Speculative, AdaptiveKFollowsTheMeasuredCosts) {
  // Too little seen: the most.
  SpecStats fresh;
  EXPECT_EQ(choose_k(fresh, 8, 0.001), 8);
  // Weight-bound target (passes of K + 1 cost about one), cheap draft, high acceptance: a long K.
  EXPECT_GE(choose_k(stats_with(0.8, {{1, 10.0}, {8, 10.5}}), 16, 0.0005), 6);
  // The same at low acceptance: a short one.
  EXPECT_LE(choose_k(stats_with(0.2, {{1, 10.0}, {8, 10.5}}), 16, 0.0005), 2);
  // Compute-bound target (this 2-core CPU: a 4-token pass 2.6x a 1-token one) and a draft nearly
  // as costly as the target: plain decoding.
  EXPECT_EQ(choose_k(stats_with(0.55, {{0, 10.0}, {3, 26.0}}), 8, 0.009), 0);
}

}  // namespace
}  // namespace sluice::decode

namespace sluice::decode {
namespace {

// A draft model keeps its own cache: continuing a target cache (chat's later turns) needs that
// cache's tokens (`cached`), else a clear error with nothing changed. Given them, two turns in a
// row give plain decoding's tokens.
TEST(Speculative, DraftModelContinuesACacheGivenItsTokens) {
  const FakeTokenizer tok;
  const std::vector<int32_t> history{1, 2};
  HashModel t(1, 64, -9.0f), ref(1, 64, -9.0f), d(2, 64, -9.0f);
  std::vector<float> logits(kVocab);
  ASSERT_TRUE(t.eval(history, logits).is_ok());
  ASSERT_TRUE(ref.eval(history, logits).is_ok());
  ModelDrafter drafter(d);
  Sampler s(greedy(), kVocab), a(greedy(), kVocab);
  auto g = generate_speculative(t, drafter, tok, s, std::vector<int32_t>{3}, {4}, {2, false}, nullptr);
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("already in the KV cache"), std::string::npos) << g.status().message();
  auto bad = generate_speculative(t, drafter, tok, s, std::vector<int32_t>{3}, {4}, {2, false}, nullptr, nullptr,
                                  std::vector<int32_t>{1});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(t.n_past(), 2);

  std::vector<int32_t> cached = history, prompt{3};
  for (int turn = 0; turn < 2; ++turn) {
    SCOPED_TRACE(turn);
    auto want = generate(ref, tok, a, prompt, {6}, nullptr);
    auto got = generate_speculative(t, drafter, tok, s, prompt, {6}, {2, false}, nullptr, nullptr, cached);
    ASSERT_TRUE(want.is_ok() && got.is_ok()) << got.status().message();
    EXPECT_EQ(got->tokens, want->tokens);
    ASSERT_TRUE(got->pending.has_value());
    // The cache now holds the prompt and every token but the pending one.
    cached.insert(cached.end(), prompt.begin(), prompt.end());
    cached.insert(cached.end(), got->tokens.begin(), got->tokens.end() - 1);
    ASSERT_EQ(int64_t(cached.size()), t.n_past());
    prompt = {*got->pending, 4};
  }
}

}  // namespace
}  // namespace sluice::decode
