// serve::Scheduler: continuous batching (requests join and leave at token boundaries), chunked
// prefill mixed with decode, admission by KV blocks, stop strings, logprobs, cancellation, queue
// limit and shutdown, against a fake multi-sequence model (a paged pool with eval_batch) and a
// fake one-sequence model (the Model base-class defaults); then greedy output against
// decode::generate on the real SmolLM2 model.
#include "serve/scheduler.h"

#include <map>
#include <random>
#include <set>
#include <thread>

#include "app/common.h"
#include "decode/generate.h"
#include "model/config.h"
#include "test_util.h"

namespace sluice::serve {
namespace {

using namespace std::chrono_literals;

constexpr int kVocab = 16;
constexpr int32_t kEog = 15;

// Token i is the letter 'a' + i; 15 ends generation; 14 is a control token.
class FakeTokenizer final : public model::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view, bool, bool) const override { return {}; }
  std::string token_bytes(int32_t id) const override { return id >= 0 && id < kVocab ? std::string(1, char('a' + id)) : ""; }
  int n_vocab() const override { return kVocab; }
  int32_t bos() const override { return -1; }
  int32_t eos() const override { return kEog; }
  bool is_end_of_generation(int32_t id) const override { return id == kEog; }
  bool add_bos_default() const override { return false; }
  int32_t find_token(std::string_view) const override { return -1; }
  bool is_control(int32_t id) const override { return id == 14 || id == kEog; }
  bool strips_leading_space() const override { return false; }
};

// Slow text: every token's bytes take `delay`, so the scheduler thread is still inside a pass's
// token handling while a client reads what it was sent.
class SlowTokenizer final : public model::Tokenizer {
 public:
  explicit SlowTokenizer(std::chrono::milliseconds delay) : delay_(delay) {}
  std::vector<int32_t> encode(std::string_view s, bool a, bool b) const override { return fast_.encode(s, a, b); }
  std::string token_bytes(int32_t id) const override {
    std::this_thread::sleep_for(delay_);
    return fast_.token_bytes(id);
  }
  int n_vocab() const override { return fast_.n_vocab(); }
  int32_t bos() const override { return fast_.bos(); }
  int32_t eos() const override { return fast_.eos(); }
  bool is_end_of_generation(int32_t id) const override { return fast_.is_end_of_generation(id); }
  bool add_bos_default() const override { return fast_.add_bos_default(); }
  int32_t find_token(std::string_view s) const override { return fast_.find_token(s); }
  bool is_control(int32_t id) const override { return fast_.is_control(id); }
  bool strips_leading_space() const override { return fast_.strips_leading_space(); }

 private:
  FakeTokenizer fast_;
  std::chrono::milliseconds delay_;
};

// The most likely next token is (last token + 1) % 16 in every sequence, so each request's greedy
// output is determined by its own last prompt token whatever else shares the batch. A pool of
// blocks of 4 positions, shared between sequences as the real pool shares them (seq_share: counted
// once, held until the last holder lets go, a truncation into a shared block drops it); every
// pass is recorded and checked against eval_batch's contract.
class FakeModel : public model::Model {
 public:
  FakeModel(int n_ctx, int max_seq, int blocks)
      : n_ctx_(n_ctx), max_seq_(max_seq), blocks_(blocks), refs_(size_t(blocks), 0) {
    seqs_[0] = {};
  }

  const model::Config& config() const override { return config_; }
  const char* backend_name() const override { return "fake"; }
  int n_vocab() const override { return kVocab; }
  int n_ctx() const override { return n_ctx_; }
  int n_past() const override { return int(seqs_.at(0).size()); }
  Status eval(std::span<const int32_t> tokens, std::span<float> logits) override {
    SeqTokens item{0, tokens, false};
    return eval_batch(std::span(&item, 1), logits);
  }
  void truncate(int n) override { seq_truncate(0, n); }
  uint64_t weight_bytes_per_token() const override { return 1; }

  Result<int> seq_new() override {
    if (int(seqs_.size()) >= max_seq_) return out_of_memory("all sequences in use");
    const int id = next_id_++;
    seqs_[id] = {};
    return id;
  }
  void seq_free(int seq) override {
    if (seq == 0 || !seqs_.count(seq)) return;
    seq_truncate(seq, 0);
    seqs_.erase(seq);
    blk_.erase(seq);
  }
  int seq_n_past(int seq) const override {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? 0 : int(it->second.size());
  }
  void seq_truncate(int seq, int n) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end() || n >= int(it->second.size())) return;
    std::vector<int>& b = blk_[seq];
    const int bs = kv_block_size();
    if (n % bs != 0 && refs_[size_t(b[size_t(n / bs)])] > 1) n -= n % bs;
    it->second.resize(size_t(n));
    while (int(b.size()) > kv_blocks_for(n)) {
      refs_[size_t(b.back())]--;
      b.pop_back();
    }
  }
  Status seq_share(int src, int dst, int n) override {
    auto s = seqs_.find(src), d = seqs_.find(dst);
    if (s == seqs_.end() || d == seqs_.end() || src == dst || !d->second.empty() || n % kv_block_size() != 0 ||
        n > int(s->second.size())) {
      return contract("bad seq_share");
    }
    d->second.assign(s->second.begin(), s->second.begin() + n);
    for (int i = 0; i < n / kv_block_size(); ++i) {
      const int b = blk_[src][size_t(i)];
      refs_[size_t(b)]++;
      blk_[dst].push_back(b);
    }
    shares++;
    return Status::ok();
  }
  int shares = 0;
  int max_sequences() const override { return max_seq_; }
  int cap = model::kDefaultMaxBatch;  // tokens per pass (max_batch)
  int max_batch() const override { return cap; }
  int kv_block_size() const override { return 4; }
  int kv_blocks_total() const override { return blocks_; }
  int kv_blocks_free() const override { return int(std::count(refs_.begin(), refs_.end(), 0)); }

  Status eval_batch(std::span<const SeqTokens> items, std::span<float> logits) override {
    int total = 0, rows = 0, need = 0;
    std::set<int> seen;
    for (const auto& it : items) {
      auto s = seqs_.find(it.seq);
      if (s == seqs_.end()) return contract("unknown sequence " + std::to_string(it.seq));
      if (!seen.insert(it.seq).second) return contract("sequence twice in one pass");
      if (it.tokens.empty()) return contract("empty item");
      if (int(s->second.size() + it.tokens.size()) > n_ctx_) return contract("sequence past n_ctx");
      total += int(it.tokens.size());
      rows += it.all_logits ? int(it.tokens.size()) : 1;
      need += kv_blocks_for(int(s->second.size() + it.tokens.size())) - kv_blocks_for(int(s->second.size()));
    }
    if (total > cap) return contract("more than max_batch() tokens");
    if (logits.size() != size_t(rows) * kVocab) return contract("wrong logits size");
    if (need > kv_blocks_free()) return out_of_memory("pool full");
    passes.push_back({int(items.size()), total});
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    size_t row = 0;
    for (const auto& it : items) {
      auto& s = seqs_[it.seq];
      s.insert(s.end(), it.tokens.begin(), it.tokens.end());
      std::vector<int>& b = blk_[it.seq];
      for (int i = 0; int(b.size()) < kv_blocks_for(int(s.size())); ++i) {
        if (refs_[size_t(i)] == 0) {
          refs_[size_t(i)] = 1;
          b.push_back(i);
        }
      }
      const int32_t next = (s.back() + 1) % wrap;
      for (int i = 0; i < kVocab; ++i) logits[row * kVocab + size_t(i)] = i == next ? 5.0f : float(i) * 0.1f;
      row++;
    }
    return Status::ok();
  }

  struct Pass {
    int sequences, tokens;
  };
  std::vector<Pass> passes;   // read after the scheduler is idle
  std::atomic<int> violations{0};
  std::chrono::microseconds delay{0};  // per pass, so requests overlap in time
  int wrap = kVocab;  // next token (last + 1) % wrap: 14 never ends generation

 private:
  Status contract(const std::string& what) {
    violations++;
    return invalid_argument("contract: " + what);
  }
  model::Config config_{};
  int n_ctx_, max_seq_, blocks_;
  int next_id_ = 1;
  std::map<int, std::vector<int32_t>> seqs_;
  std::map<int, std::vector<int>> blk_;  // each sequence's blocks
  std::vector<int> refs_;                // each block's holders
};

// The Model base-class defaults: sequence 0 only.
class OneSeqModel : public FakeModel {
 public:
  OneSeqModel(int n_ctx) : FakeModel(n_ctx, 1, n_ctx) {}
  Result<int> seq_new() override { return model::Model::seq_new(); }
  int max_sequences() const override { return 1; }
  int kv_block_size() const override { return 1; }
  int kv_blocks_total() const override { return n_ctx(); }
  int kv_blocks_free() const override { return n_ctx() - n_past(); }
  Status eval_batch(std::span<const SeqTokens> items, std::span<float> logits) override {
    if (items.size() != 1 || items[0].seq != 0) violations++;
    return FakeModel::eval_batch(items, logits);
  }
};

RequestParams greedy(std::vector<int32_t> prompt, int max_tokens) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0;
  return p;
}

struct Outcome {
  std::string text;
  Event done;
  int events = 0;
  std::vector<TokenLogprob> logprobs;
};

Outcome drain(Request& r) {
  Outcome o;
  for (;;) {
    auto e = r.next(10s);
    if (!e) {
      ADD_FAILURE() << "no event within 10 s";
      return o;
    }
    o.events++;
    o.text += e->text;
    for (auto& lp : e->logprobs) o.logprobs.push_back(lp);
    if (e->kind == Event::Kind::kDone) {
      o.done = std::move(*e);
      return o;
    }
  }
}

TEST(ServeScheduler, OneRequestGreedyUntilMaxTokens) {
  FakeModel m(64, 4, 64);
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  auto r = s.submit(greedy({1, 2, 3}, 5));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  Outcome o = drain(**r);
  EXPECT_EQ(o.text, "efghi");
  EXPECT_EQ(o.done.finish, FinishReason::kLength);
  EXPECT_EQ(o.done.n_prompt, 3);
  EXPECT_EQ(o.done.n_generated, 5);
  s.shutdown(1s);
  EXPECT_EQ(m.violations, 0);
  EXPECT_EQ(m.kv_blocks_free(), 64);  // everything returned
}

TEST(ServeScheduler, EndOfGenerationStopsAndAddsNoText) {
  FakeModel m(64, 4, 64);
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  auto r = s.submit(greedy({11}, 10));  // 12 13 14(control) 15(EOG)
  ASSERT_TRUE(r.is_ok());
  Outcome o = drain(**r);
  EXPECT_EQ(o.text, "mn");
  EXPECT_EQ(o.done.finish, FinishReason::kStop);
  EXPECT_EQ(o.done.n_generated, 4);
}

TEST(ServeScheduler, ConcurrentRequestsSharePassesAndGetTheirOwnText) {
  FakeModel m(256, 8, 512);
  m.delay = 1ms;
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 6; ++i) {
    auto r = s.submit(greedy({int32_t(i), int32_t(i)}, 12 + i));
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    reqs.push_back(*r);
  }
  for (int i = 0; i < 6; ++i) {
    Outcome o = drain(*reqs[size_t(i)]);
    // Tokens after i: i+1, i+2, ... skipping the control token 14 and stopping at EOG 15.
    std::string want;
    for (int t = i + 1, n = 0; n < 12 + i && t != kEog; ++t, ++n) {
      if (t != 14) want += char('a' + t);
    }
    EXPECT_EQ(o.text, want) << "request " << i;
  }
  s.shutdown(1s);
  EXPECT_EQ(m.violations, 0);
  int most = 0;
  for (const auto& p : m.passes) most = std::max(most, p.sequences);
  EXPECT_GE(most, 2) << "requests never shared a pass";
  EXPECT_EQ(m.kv_blocks_free(), 512);
}

// A burst: requests that arrive a little apart while the scheduler is idle share its first pass
// (SchedulerOptions::admit_window); with no window the first request starts alone. The gaps are
// generous (20 ms apart, 200 ms of quiet ends the wait) so that a loaded machine's late sleeps do
// not matter.
TEST(ServeScheduler, ABurstOfRequestsSharesTheFirstPass) {
  for (int window : {0, 2000}) {
    SCOPED_TRACE(window);
    FakeModel m(256, 8, 512);
    m.delay = 20ms;
    FakeTokenizer tok;
    SchedulerOptions o;
    o.admit_window = std::chrono::milliseconds(window);
    o.admit_gap = 200ms;
    Scheduler s(m, tok, o);
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 6; ++i) {
      if (i > 0) std::this_thread::sleep_for(20ms);
      auto r = s.submit(greedy({int32_t(i), int32_t(i)}, 4));
      ASSERT_TRUE(r.is_ok()) << r.status().message();
      reqs.push_back(*r);
    }
    for (auto& r : reqs) EXPECT_EQ(drain(*r).done.finish, FinishReason::kLength);
    s.shutdown(1s);
    EXPECT_EQ(m.violations, 0);
    ASSERT_FALSE(m.passes.empty());
    if (window > 0) {
      EXPECT_EQ(m.passes.front().sequences, 6) << "the burst did not share the first pass";
    } else {
      EXPECT_LT(m.passes.front().sequences, 6);
    }
  }
}

TEST(ServeScheduler, LongPromptIsPrefilledInChunksMixedWithDecode) {
  FakeModel m(2048, 4, 1024);
  m.delay = 2ms;
  FakeTokenizer tok;
  SchedulerOptions o;
  o.step_tokens = 128;
  Scheduler s(m, tok, o);
  auto short_req = s.submit(greedy({0}, 40));
  ASSERT_TRUE(short_req.is_ok());
  std::vector<int32_t> long_prompt(1000, 3);
  long_prompt.back() = 2;
  auto long_req = s.submit(greedy(long_prompt, 3));
  ASSERT_TRUE(long_req.is_ok());
  Outcome lo = drain(**long_req);
  EXPECT_EQ(lo.text, "def");
  Outcome so = drain(**short_req);
  EXPECT_EQ(so.done.finish, FinishReason::kStop);  // reached EOG
  s.shutdown(1s);
  EXPECT_EQ(m.violations, 0);
  bool mixed = false;
  for (const auto& p : m.passes) {
    EXPECT_LE(p.tokens, 128);
    mixed = mixed || (p.sequences == 2 && p.tokens > 2);
  }
  EXPECT_TRUE(mixed) << "no pass mixed a prompt chunk with a decode token";
}

// The step's token budget defaults to the model's pass cap (--ubatch), and a larger --batch-tokens
// is held to it: a 1000-token prompt goes through in passes of the cap, never more.
TEST(ServeScheduler, PassesFollowTheModelsPassCap) {
  for (int step : {0, 400}) {
    FakeModel m(2048, 4, 1024);
    m.cap = 200;
    FakeTokenizer tok;
    SchedulerOptions o;
    o.step_tokens = step;
    Scheduler s(m, tok, o);
    std::vector<int32_t> long_prompt(1000, 3);
    long_prompt.back() = 2;
    auto req = s.submit(greedy(long_prompt, 3));
    ASSERT_TRUE(req.is_ok());
    EXPECT_EQ(drain(**req).text, "def");
    s.shutdown(1s);
    EXPECT_EQ(m.violations, 0);
    int most = 0;
    for (const auto& p : m.passes) most = std::max(most, p.tokens);
    EXPECT_EQ(most, 200) << "step_tokens " << step;
  }
}

TEST(ServeScheduler, StopStringEndsTheTextBeforeIt) {
  FakeModel m(64, 4, 64);
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  auto p = greedy({0}, 10);
  p.stop = {"xyz", "de"};
  auto r = s.submit(p);
  ASSERT_TRUE(r.is_ok());
  Outcome o = drain(**r);
  EXPECT_EQ(o.text, "bc");
  EXPECT_EQ(o.done.finish, FinishReason::kStop);
}

// A pass's sequences are sampled on several threads (SchedulerOptions::sample_threads): each has
// its own generator, so the tokens and logprobs are those of one thread. Temperature 2 over the
// fake model's logits leaves the chosen next token ~40% likely, so the draws differ from greedy.
TEST(ServeScheduler, SamplingThreadsDoNotChangeTheTokens) {
  std::vector<std::vector<Outcome>> runs;
  for (int threads : {1, 4}) {
    FakeModel m(256, 8, 512);
    FakeTokenizer tok;
    SchedulerOptions o;
    o.sample_threads = threads;
    Scheduler s(m, tok, o);
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 8; ++i) {
      RequestParams p = greedy({int32_t(i)}, 10);
      p.sampling.temperature = 2.0f;
      p.sampling.top_k = 0;
      p.sampling.top_p = 1.0f;
      p.sampling.min_p = 0.0f;
      p.sampling.seed = uint64_t(100 + i);
      p.top_logprobs = 2;
      auto r = s.submit(p);
      ASSERT_TRUE(r.is_ok()) << r.status().message();
      reqs.push_back(*r);
    }
    runs.emplace_back();
    for (auto& r : reqs) runs.back().push_back(drain(*r));
    s.shutdown(1s);
    EXPECT_EQ(m.violations, 0);
  }
  int differ_from_greedy = 0;
  for (size_t i = 0; i < 8; ++i) {
    const Outcome &a = runs[0][i], &b = runs[1][i];
    EXPECT_EQ(a.text, b.text) << "request " << i;
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << "request " << i;
    for (size_t k = 0; k < a.logprobs.size(); ++k) {
      EXPECT_EQ(a.logprobs[k].id, b.logprobs[k].id);
      EXPECT_EQ(a.logprobs[k].logprob, b.logprobs[k].logprob);
      ASSERT_EQ(a.logprobs[k].top.size(), b.logprobs[k].top.size());
      for (size_t t = 0; t < a.logprobs[k].top.size(); ++t) EXPECT_EQ(a.logprobs[k].top[t].id, b.logprobs[k].top[t].id);
    }
    std::string greedy_text;
    for (int t = int(i) + 1, n = 0; n < 10 && t != kEog; ++t, ++n) {
      if (t != 14) greedy_text += char('a' + t);
    }
    differ_from_greedy += a.text != greedy_text;
  }
  EXPECT_GE(differ_from_greedy, 4) << "the draws look greedy: the test would not see a thread mix-up";
}

TEST(ServeScheduler, LogprobsOfTheChosenTokenAndTheTopAlternatives) {
  FakeModel m(64, 4, 64);
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  auto p = greedy({0}, 3);
  p.top_logprobs = 2;
  auto r = s.submit(p);
  ASSERT_TRUE(r.is_ok());
  Outcome o = drain(**r);
  ASSERT_EQ(o.logprobs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(o.logprobs[i].id, int32_t(i + 1));
    ASSERT_EQ(o.logprobs[i].top.size(), 2u);
    EXPECT_EQ(o.logprobs[i].top[0].id, o.logprobs[i].id);
    EXPECT_FLOAT_EQ(o.logprobs[i].top[0].logprob, o.logprobs[i].logprob);
    EXPECT_LT(o.logprobs[i].logprob, 0.0f);
    EXPECT_GT(o.logprobs[i].top[0].logprob, o.logprobs[i].top[1].logprob);
  }
}

TEST(ServeScheduler, AdmissionWaitsForKvBlocksAndRefusesWhatCanNeverFit) {
  // Pool of 8 blocks (32 positions); a request of 10 + 20 tokens reserves 29 positions = 8 blocks.
  FakeModel m(64, 4, 8);
  m.wrap = 14;
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  auto a = s.submit(greedy(std::vector<int32_t>(10, 1), 20));
  auto b = s.submit(greedy(std::vector<int32_t>(10, 2), 20));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(drain(**a).done.n_generated, 20);
  EXPECT_EQ(drain(**b).done.n_generated, 20);
  for (const auto& p : m.passes) EXPECT_EQ(p.sequences, 1);  // never both at once
  auto big = s.submit(greedy(std::vector<int32_t>(10, 1), 40));
  ASSERT_FALSE(big.is_ok());
  EXPECT_EQ(big.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("KV"), std::string::npos) << big.status().message();
  EXPECT_EQ(m.violations, 0);
}

TEST(ServeScheduler, PromptLongerThanTheContextIsRefused) {
  FakeModel m(16, 4, 64);
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  auto r = s.submit(greedy(std::vector<int32_t>(17, 1), 1));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("longer than the context"), std::string::npos) << r.status().message();
  EXPECT_FALSE(s.submit(greedy({}, 1)).is_ok());
  EXPECT_FALSE(s.submit(greedy({99}, 1)).is_ok());
}

TEST(ServeScheduler, ContextFullEndsWithLength) {
  FakeModel m(8, 4, 64);
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  auto r = s.submit(greedy({0, 0, 0, 0, 0}, -1));
  ASSERT_TRUE(r.is_ok());
  Outcome o = drain(**r);
  EXPECT_EQ(o.done.finish, FinishReason::kLength);
  EXPECT_EQ(o.done.n_generated, 4);  // the 4th is sampled from position 7's logits, never evaluated
  EXPECT_EQ(m.violations, 0);
}

TEST(ServeScheduler, CancelFreesTheSequenceAndItsBlocks) {
  FakeModel m(4096, 4, 2048);
  m.wrap = 14;
  m.delay = 1ms;
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  auto r = s.submit(greedy({0}, 4000));
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE((*r)->next(10s).has_value());
  (*r)->cancel();
  Outcome o = drain(**r);
  EXPECT_EQ(o.done.finish, FinishReason::kCancelled);
  EXPECT_LT(o.done.n_generated, 4000);
  // The scheduler is idle now; the pool is whole again.
  for (int i = 0; i < 100 && s.metrics().active > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.metrics().kv_blocks_reserved, 0);
  EXPECT_EQ(s.metrics().requests_cancelled, 1u);
  s.shutdown(1s);
  EXPECT_EQ(m.kv_blocks_free(), 2048);
}

TEST(ServeScheduler, MetricsCountARequestBeforeItsClientSeesTheEnd) {
  // A finishes in a pass that B shares, and B's token handling comes after A's end in that pass
  // (slow text): a client that reads the metrics as soon as A's last event arrives must already
  // see A counted and its blocks released, not the numbers of the pass before.
  FakeModel m(64, 4, 64);
  m.delay = 20ms;
  SlowTokenizer tok(50ms);
  Scheduler s(m, tok, {});
  auto a = s.submit(greedy({1}, 4));
  ASSERT_TRUE(a.is_ok());
  auto b = s.submit(greedy({5}, 8));
  ASSERT_TRUE(b.is_ok());
  Outcome oa = drain(**a);
  const Metrics mid = s.metrics();
  EXPECT_EQ(oa.done.finish, FinishReason::kLength);
  EXPECT_EQ(mid.requests_finished, 1u);
  EXPECT_LE(mid.kv_blocks_reserved, 1);  // B's still to take: 8 positions at its longest, 1+ held
  EXPECT_LE(mid.kv_blocks_used, 2);      // B's positions only
  Outcome ob = drain(**b);
  EXPECT_EQ(ob.text, "ghijklmn");
  const Metrics end = s.metrics();
  EXPECT_EQ(end.requests_finished, 2u);
  EXPECT_EQ(end.kv_blocks_reserved, 0);
  EXPECT_EQ(end.kv_blocks_used, 0);
  s.shutdown(1s);
  EXPECT_EQ(m.violations, 0);
}

TEST(ServeScheduler, QueueFullIsRefusedAndShutdownCancelsWhatIsLeft) {
  FakeModel m(100000, 1, 100000);
  m.wrap = 14;
  m.delay = 1ms;
  FakeTokenizer tok;
  SchedulerOptions o;
  o.max_queue = 1;
  Scheduler s(m, tok, o);
  auto a = s.submit(greedy({0}, 90000));
  ASSERT_TRUE(a.is_ok());
  ASSERT_TRUE((*a)->next(10s).has_value());  // running
  auto b = s.submit(greedy({0}, 5));
  ASSERT_TRUE(b.is_ok());  // waits
  auto c = s.submit(greedy({0}, 5));
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(c.status().message().find("queue full"), std::string::npos);
  s.shutdown(50ms);
  EXPECT_EQ(drain(**a).done.finish, FinishReason::kCancelled);
  EXPECT_EQ(drain(**b).done.finish, FinishReason::kCancelled);
  auto d = s.submit(greedy({0}, 5));
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("shutting down"), std::string::npos);
}

TEST(ServeScheduler, OneSequenceModelServesRequestsOneAfterAnother) {
  OneSeqModel m(64);
  FakeTokenizer tok;
  SchedulerOptions o;
  o.parallel = 8;
  Scheduler s(m, tok, o);
  EXPECT_EQ(s.parallel(), 1);
  auto a = s.submit(greedy({0}, 4));
  auto b = s.submit(greedy({5}, 4));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(drain(**a).text, "bcde");
  EXPECT_EQ(drain(**b).text, "ghij");
  s.shutdown(1s);
  EXPECT_EQ(m.violations, 0);
  EXPECT_EQ(m.n_past(), 0);
}

// Prompts of n tokens 0..13 repeating from `start` (never 14 or 15: no control or EOG token).
std::vector<int32_t> tokens_from(int start, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = int32_t((start + i) % 14);
  return t;
}

// Submits and waits for the whole answer.
Outcome run(Scheduler& s, RequestParams p) {
  auto r = s.submit(std::move(p));
  if (!r.is_ok()) {
    ADD_FAILURE() << r.status().message();
    return {};
  }
  return drain(**r);
}

TEST(ServeScheduler, PromptCacheReusesAFinishedPromptsPrefix) {
  FakeModel m(256, 4, 256);
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  const std::vector<int32_t> first = tokens_from(0, 40);
  const Outcome oa = run(s, greedy(first, 3));
  EXPECT_EQ(oa.done.n_cached, 0);
  Metrics mid = s.metrics();
  EXPECT_EQ(mid.cached_prefixes, 1);
  EXPECT_EQ(mid.kv_blocks_cached, 10);  // 40 prompt positions in blocks of 4; generated rows dropped
  EXPECT_EQ(mid.kv_blocks_used, 10);
  EXPECT_EQ(mid.kv_blocks_reserved, 0);

  // The next turn: the same 40 tokens and 10 more. Only the 10 are evaluated.
  std::vector<int32_t> second = first;
  for (int32_t t : tokens_from(3, 10)) second.push_back(t);
  const size_t passes_before = m.passes.size();
  const Outcome ob = run(s, greedy(second, 3));
  EXPECT_EQ(ob.done.n_cached, 40);
  EXPECT_EQ(ob.done.n_prompt, 50);
  EXPECT_EQ(ob.text, "n");  // after 12: 13, then 14 (control, no text), then 15 (end of generation)
  ASSERT_GT(m.passes.size(), passes_before);
  EXPECT_EQ(m.passes[passes_before].tokens, 10);
  const Metrics end = s.metrics();
  EXPECT_EQ(end.prompt_tokens, 40u + 10u);
  EXPECT_EQ(end.prompt_tokens_cached, 40u);
  EXPECT_EQ(end.cached_prefixes, 1);  // the longer prefix replaced the one it holds
  EXPECT_EQ(end.kv_blocks_cached, 13);

  // The same prompt again: all but its last two tokens come from the cache.
  const Outcome oc = run(s, greedy(second, 3));
  EXPECT_EQ(oc.done.n_cached, 48);
  EXPECT_EQ(oc.text, ob.text);
  s.shutdown(1s);
  EXPECT_EQ(m.violations, 0);
}

TEST(ServeScheduler, PromptCacheOffOrRefusedPrefillsEverything) {
  const std::vector<int32_t> prompt = tokens_from(0, 40);
  {
    FakeModel m(256, 4, 256);
    FakeTokenizer tok;
    SchedulerOptions o;
    o.prompt_cache = false;
    Scheduler s(m, tok, o);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(run(s, greedy(prompt, 2)).done.n_cached, 0);
    EXPECT_EQ(s.metrics().cached_prefixes, 0);
    EXPECT_EQ(s.metrics().kv_blocks_used, 0);
    EXPECT_EQ(s.metrics().prompt_tokens, 80u);
  }
  {
    FakeModel m(256, 4, 256);
    FakeTokenizer tok;
    Scheduler s(m, tok, {});
    RequestParams p = greedy(prompt, 2);
    run(s, p);
    p.cache_prompt = false;  // the request's own opt-out (llama-server's cache_prompt)
    EXPECT_EQ(run(s, p).done.n_cached, 0);
    EXPECT_EQ(s.metrics().prompt_tokens, 80u);
  }
}

TEST(ServeScheduler, PromptCacheGivesWayToBlocksAndSequences) {
  // 20 blocks of 4 positions: a cached 40-token prefix (10 blocks) must go for a request that
  // reserves 18.
  {
    FakeModel m(256, 4, 20);
    m.wrap = 14;  // never end of generation
    FakeTokenizer tok;
    Scheduler s(m, tok, {});
    run(s, greedy(tokens_from(0, 40), 2));
    EXPECT_EQ(s.metrics().kv_blocks_cached, 10);
    const Outcome ob = run(s, greedy(tokens_from(5, 40), 30));  // 69 positions: 18 blocks
    EXPECT_EQ(ob.done.finish, FinishReason::kLength);
    EXPECT_EQ(ob.done.n_cached, 0);
    EXPECT_EQ(ob.done.n_generated, 30);
    s.shutdown(1s);
    EXPECT_EQ(m.violations, 0);
  }
  // Two sequences: cached prefixes hold both, so a third prompt evicts the least recently used.
  {
    FakeModel m(256, 2, 256);
    FakeTokenizer tok;
    Scheduler s(m, tok, {});
    for (int start : {0, 3, 7}) EXPECT_EQ(run(s, greedy(tokens_from(start, 30), 2)).done.finish, FinishReason::kLength);
    EXPECT_EQ(s.metrics().cached_prefixes, 2);
    // The first prompt was evicted, the second is still there.
    EXPECT_EQ(run(s, greedy(tokens_from(3, 30), 2)).done.n_cached, 28);
    EXPECT_EQ(run(s, greedy(tokens_from(0, 30), 2)).done.n_cached, 0);
    s.shutdown(1s);
    EXPECT_EQ(m.violations, 0);
  }
}

TEST(ServeScheduler, PromptCacheSharesAShortMatchAndKeepsTheLongPrefix) {
  // A new prompt sharing 20 tokens with a cached 60-token one does not take it over (that would
  // drop 40 tokens to save 20): a sequence of its own shares the 20 positions' blocks.
  FakeModel m(256, 4, 256);
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  const std::vector<int32_t> long_prompt = tokens_from(0, 60);
  run(s, greedy(long_prompt, 2));
  std::vector<int32_t> other(long_prompt.begin(), long_prompt.begin() + 20);
  for (int32_t t : tokens_from(9, 20)) other.push_back(t);
  EXPECT_EQ(run(s, greedy(other, 2)).done.n_cached, 20);
  EXPECT_EQ(m.shares, 1);
  EXPECT_EQ(s.metrics().cached_prefixes, 2);
  EXPECT_EQ(run(s, greedy(long_prompt, 2)).done.n_cached, 58);
  // Shared positions are whole blocks: 22 common tokens give 20.
  std::vector<int32_t> third(long_prompt.begin(), long_prompt.begin() + 22);
  for (int32_t t : tokens_from(5, 30)) third.push_back(t);
  EXPECT_EQ(run(s, greedy(third, 2)).done.n_cached, 20);
  s.shutdown(1s);
  EXPECT_EQ(m.violations, 0);
}

TEST(ServeScheduler, PromptCacheSharesARunningRequestsPromptRows) {
  // B arrives while A generates: B's first 40 tokens are A's prompt, whose rows A's prefill
  // computed, so B's sequence starts with A's blocks.
  FakeModel m(256, 4, 256);
  m.wrap = 14;  // never end of generation
  m.delay = 2ms;
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  const std::vector<int32_t> shared = tokens_from(0, 40);
  auto a = s.submit(greedy(shared, 60));
  ASSERT_TRUE(a.is_ok());
  ASSERT_TRUE((*a)->next(10s).has_value());  // A's prefill is done
  std::vector<int32_t> second = shared;
  for (int32_t t : tokens_from(2, 8)) second.push_back(t);
  const Outcome ob = run(s, greedy(second, 5));
  EXPECT_EQ(ob.done.n_cached, 40);
  EXPECT_EQ(ob.text, "klmna");  // after 9: 10 .. 13, then 0 (wrap 14)
  EXPECT_EQ(m.shares, 1);
  EXPECT_EQ(drain(**a).done.n_generated, 60);
  s.shutdown(1s);
  EXPECT_EQ(m.violations, 0);
}

TEST(ServeScheduler, SharedPrefixBlocksCountOnceForAdmission) {
  // 24 blocks of 4 positions; three requests of a common 40-token prefix (10 blocks) and 4 tokens
  // of their own, 13 generated: 14 blocks each at their longest. Counted apart, one runs at a
  // time (28 > 24); sharing the prefix, all three fit (10 + 3 x 4 = 22).
  for (const bool cache : {true, false}) {
    FakeModel m(256, 4, 24);
    m.wrap = 14;  // never end of generation
    m.delay = 2ms;
    FakeTokenizer tok;
    Scheduler s(m, tok, {});
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> prompt = tokens_from(0, 40);
      for (int32_t t : tokens_from(i + 1, 4)) prompt.push_back(t);
      RequestParams p = greedy(prompt, 13);
      p.cache_prompt = cache;
      auto r = s.submit(p);
      ASSERT_TRUE(r.is_ok());
      reqs.push_back(*r);
      if (i == 0) {
        ASSERT_TRUE((*r)->next(10s).has_value());  // its prefill is done
      }
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Outcome o = drain(*reqs[i]);
      EXPECT_EQ(o.done.finish, FinishReason::kLength);
      EXPECT_EQ(o.done.n_cached, cache && i > 0 ? 40 : 0);
    }
    s.shutdown(1s);
    EXPECT_EQ(m.violations, 0);
    int most = 0;
    for (const auto& p : m.passes) most = std::max(most, p.sequences);
    EXPECT_EQ(most, cache ? 3 : 1) << (cache ? "sharing" : "no sharing");
  }
}

// Random traffic over a small pool: prompts sharing prefixes of random lengths with three bases
// (so the cache takes sequences over, shares blocks from cached and running ones, and evicts),
// random lengths and cancellations, rounds of concurrent requests, chunked prefill. Every request
// must end as it would alone and never with an error (admission leaves every admitted request
// the blocks it will take), and the pass contract must hold throughout.
// Run with spare sequences for the cache (6 for 4 running requests) and with none (3 for 3: a
// request that would share from a cached prefix takes it over instead).
class RandomTraffic : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(RandomTraffic, WithThePromptCacheNeverRunsOutOfBlocks) {
  const auto [sequences, parallel] = GetParam();
  std::mt19937_64 rng(test::test_seed() ^ 0x5eedULL);
  FakeModel m(128, sequences, 48);  // 192 positions
  m.wrap = 14;                      // tokens 0..13: never a control or end-of-generation token
  FakeTokenizer tok;
  SchedulerOptions o;
  o.parallel = parallel;
  o.step_tokens = 24;
  Scheduler s(m, tok, o);
  const std::vector<std::vector<int32_t>> bases = {tokens_from(0, 60), tokens_from(5, 60), tokens_from(9, 60)};
  int cached_requests = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<std::pair<std::shared_ptr<Request>, RequestParams>> reqs;
    for (int i = 0, n = 1 + int(rng() % 5); i < n; ++i) {
      const auto& base = bases[rng() % bases.size()];
      std::vector<int32_t> prompt(base.begin(), base.begin() + ptrdiff_t(10 + rng() % 50));
      for (int32_t t : tokens_from(int(rng() % 14), int(1 + rng() % 12))) prompt.push_back(t);
      RequestParams p = greedy(prompt, int(1 + rng() % 30));
      auto r = s.submit(p);
      ASSERT_TRUE(r.is_ok()) << r.status().message();
      if (rng() % 6 == 0) (*r)->cancel();
      reqs.push_back({*r, std::move(p)});
    }
    for (auto& [r, p] : reqs) {
      const Outcome out = drain(*r);
      ASSERT_NE(out.done.finish, FinishReason::kError) << "round " << round << ": " << out.done.error;
      cached_requests += out.done.n_cached > 0;
      if (out.done.finish != FinishReason::kLength) continue;  // cancelled
      std::string want;
      for (int t = 1; t <= p.max_tokens; ++t) want += char('a' + (p.prompt.back() + t) % 14);
      EXPECT_EQ(out.text, want) << "round " << round;
    }
  }
  EXPECT_GT(cached_requests, 0);
  const Metrics end = s.metrics();
  EXPECT_EQ(end.kv_blocks_reserved, 0);
  EXPECT_LE(end.kv_blocks_used, end.kv_blocks_cached);
  s.shutdown(1s);
  EXPECT_EQ(m.violations, 0);
}
INSTANTIATE_TEST_SUITE_P(ServeScheduler, RandomTraffic, ::testing::Values(std::pair{6, 4}, std::pair{3, 3}));

TEST(ServeScheduler, PromptCacheOnAOneSequenceModel) {
  OneSeqModel m(128);
  FakeTokenizer tok;
  Scheduler s(m, tok, {});
  std::vector<int32_t> prompt = tokens_from(0, 24);
  run(s, greedy(prompt, 2));
  EXPECT_EQ(m.n_past(), 24);  // the prompt's rows stay
  for (int32_t t : tokens_from(1, 6)) prompt.push_back(t);
  EXPECT_EQ(run(s, greedy(prompt, 2)).done.n_cached, 24);
  EXPECT_EQ(run(s, greedy(tokens_from(4, 24), 2)).done.n_cached, 0);  // unrelated: the cache is dropped
  s.shutdown(1s);
  EXPECT_EQ(m.violations, 0);
}

// The real model as a server loads it (4 sequences over a 1024-position pool), and its tokenizer.
class ServeSmolLM2 : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test::model_path(test::kSmolLM2);
    SLUICE_REQUIRE_MODEL(path);
    auto meta = app::open_model_meta(path);
    ASSERT_TRUE(meta.is_ok()) << meta.status().message();
    meta_ = std::move(*meta);
    model::LoadOptions lo;
    lo.n_ctx = 256;
    lo.max_sequences = 4;
    lo.kv_positions = 1024;
    auto m = model::Model::load(path, lo);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    model_ = std::move(*m);
  }
  std::vector<int32_t> encode(const std::string& text) const {
    return meta_.tokenizer->encode(text, meta_.tokenizer->add_bos_default(), true);
  }
  app::ModelMeta meta_;
  std::unique_ptr<model::Model> model_;
};

// decode::generate's greedy text (what `sluice run` prints) for `prompt` on an emptied sequence 0,
// which it leaves empty.
std::string generate_greedy(model::Model& m, const model::Tokenizer& tok, const std::vector<int32_t>& prompt, int n) {
  m.truncate(0);
  decode::SamplerParams sp;
  sp.temperature = 0;
  decode::Sampler sampler(sp, m.n_vocab());
  decode::GenerateOptions go;
  go.n_predict = n;
  auto g = decode::generate(m, tok, sampler, prompt, go, nullptr);
  m.truncate(0);
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  return g.is_ok() ? g->text : std::string();
}

// The real model: the scheduler's greedy text equals decode::generate's (what `sluice run` prints).
TEST_F(ServeSmolLM2, GreedyMatchesGenerate) {
  const auto& tok = *meta_.tokenizer;
  const std::vector<std::string> prompts = {"The capital of France is", "Once upon a time", "1, 2, 3, 4,"};
  std::vector<std::string> want;
  for (const auto& p : prompts) want.push_back(generate_greedy(*model_, tok, encode(p), 12));
  Scheduler s(*model_, tok, {});
  std::vector<std::shared_ptr<Request>> reqs;
  for (const auto& p : prompts) {
    auto r = s.submit(greedy(encode(p), 12));
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    reqs.push_back(*r);
  }
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(drain(*reqs[i]).text, want[i]) << prompts[i];
}

// A prefix from the prompt cache gives the same bits as prefilling it (CPU: the cached rows come
// from a prefill, and the rest of the prompt is again prefilled in a pass of several tokens), so the
// next turn's greedy text equals decode::generate's on the whole prompt.
TEST_F(ServeSmolLM2, PromptCacheGivesTheBitsOfAFreshPrefill) {
  const auto& tok = *meta_.tokenizer;
  const std::string first =
      "The old lighthouse keeper climbed the winding stone stairs every single night to light the great lamp, and";
  const std::string second = first + " one stormy evening he saw a ship far out at sea. He";
  const std::vector<int32_t> p1 = encode(first);
  const std::vector<int32_t> p2 = encode(second);
  ASSERT_GE(p1.size(), 18u);
  ASSERT_TRUE(std::equal(p1.begin(), p1.end(), p2.begin())) << "the longer prompt must start with the shorter's tokens";
  const std::string want = generate_greedy(*model_, tok, p2, 16);

  // Logprobs too: the same bits, not only the same argmax.
  RequestParams rp = greedy(p2, 16);
  rp.top_logprobs = 0;
  std::vector<float> fresh;
  {
    SchedulerOptions o;
    o.prompt_cache = false;
    Scheduler s(*model_, tok, o);
    auto r = s.submit(rp);
    ASSERT_TRUE(r.is_ok());
    for (const auto& lp : drain(**r).logprobs) fresh.push_back(lp.logprob);
  }
  model_->truncate(0);
  Scheduler s(*model_, tok, {});
  auto a = s.submit(greedy(p1, 8));
  ASSERT_TRUE(a.is_ok());
  drain(**a);
  auto b = s.submit(rp);
  ASSERT_TRUE(b.is_ok());
  const Outcome ob = drain(**b);
  EXPECT_EQ(ob.done.n_cached, int(p1.size()));
  EXPECT_EQ(ob.text, want);
  std::vector<float> cached;
  for (const auto& lp : ob.logprobs) cached.push_back(lp.logprob);
  EXPECT_EQ(cached, fresh);
}

}  // namespace
}  // namespace sluice::serve
