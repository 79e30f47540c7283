// Several sequences in one forward pass (Model::eval_batch) over the paged KV cache: the block
// bookkeeping (KvBlocks), and on the real SmolLM2 every row of interleaved prompt chunks and
// decode steps of three sequences, whose blocks are scattered through the pool, compared with
// each sequence evaluated alone; plus the API's error cases.
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/kv_cache.h"
#include "model/model.h"
#include "test_util.h"

namespace sluice::model {
namespace {

constexpr int B = KvBlocks::kBlockSize;

TEST(KvBlocks, TakesLowestBlocksAndFreesFromTheEnd) {
  KvBlocks kb;
  kb.init(10 * B, 3, 8 * B);
  EXPECT_EQ(kb.n_blocks(), 10);
  EXPECT_TRUE(kb.valid(0));
  EXPECT_FALSE(kb.valid(1));
  ASSERT_TRUE(kb.reserve(0, 2 * B + 1).is_ok());  // blocks 0, 1, 2
  kb.set_n_past(0, 2 * B + 1);
  std::vector<int32_t> rows;
  EXPECT_TRUE(kb.rows(0, 2 * B + 1, rows));  // the identity: nothing to map
  EXPECT_TRUE(rows.empty());
  auto s1 = kb.open();
  ASSERT_TRUE(s1.is_ok());
  EXPECT_EQ(*s1, 1);
  ASSERT_TRUE(kb.reserve(1, B).is_ok());  // block 3
  kb.truncate(0, B);                      // frees block 2, then 1 stays (positions 0..B-1 need one block)
  EXPECT_EQ(kb.n_past(0), B);
  EXPECT_EQ(kb.n_free(), 10 - 2);
  auto s2 = kb.open();
  ASSERT_TRUE(s2.is_ok());
  ASSERT_TRUE(kb.reserve(*s2, 2 * B).is_ok());  // the lowest free: blocks 1, 2
  rows.clear();
  EXPECT_FALSE(kb.rows(*s2, 2 * B, rows));
  ASSERT_EQ(rows.size(), size_t(2 * B));
  EXPECT_EQ(rows[0], B);
  EXPECT_EQ(rows[size_t(B)], 2 * B);
  EXPECT_FALSE(kb.open().is_ok());  // 3 sequences open
  // Too few free blocks: an error, nothing taken.
  const int free_before = kb.n_free();
  const Status st = kb.reserve(1, 8 * B);
  EXPECT_EQ(st.code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(st.message().find("blocks"), std::string::npos) << st.message();
  EXPECT_EQ(kb.n_free(), free_before);
  kb.close(*s2);
  EXPECT_FALSE(kb.valid(*s2));
  EXPECT_EQ(kb.n_free(), free_before + 2);
  kb.close(0);  // sequence 0 cannot be closed
  EXPECT_TRUE(kb.valid(0));
}

TEST(KvBlocks, SharedBlocksGoBackWithTheirLastHolderAndAreNeverWritten) {
  KvBlocks kb;
  kb.init(10 * B, 3, 8 * B);
  ASSERT_TRUE(kb.reserve(0, 3 * B).is_ok());  // blocks 0, 1, 2
  kb.set_n_past(0, 3 * B - 4);
  auto s1 = kb.open();
  ASSERT_TRUE(s1.is_ok());
  kb.share(0, *s1, 2 * B);  // blocks 0, 1 by reference
  EXPECT_EQ(kb.n_past(*s1), 2 * B);
  EXPECT_EQ(kb.holders(0), 2);
  EXPECT_EQ(kb.holders(1), 2);
  EXPECT_EQ(kb.holders(2), 1);
  EXPECT_EQ(kb.n_free(), 10 - 3);
  std::vector<int32_t> rows;
  EXPECT_TRUE(kb.rows(*s1, 2 * B, rows));  // blocks 0, 1: still the identity
  ASSERT_TRUE(kb.reserve(*s1, 2 * B + 5).is_ok());  // its own next block: 3
  kb.set_n_past(*s1, 2 * B + 5);
  rows.clear();
  EXPECT_FALSE(kb.rows(*s1, 2 * B + 5, rows));
  EXPECT_EQ(rows[size_t(2 * B)], 3 * B);
  // Sequence 0 goes back into block 1, which s1 holds: the block's positions go too.
  kb.truncate(0, B + 3);
  EXPECT_EQ(kb.n_past(0), B);
  EXPECT_EQ(kb.holders(1), 1);
  EXPECT_EQ(kb.holders(2), 0);
  EXPECT_EQ(kb.n_free(), 10 - 3);  // block 2 back; 0, 1 (s1) and 3 held
  // Truncating inside a block only one sequence holds keeps the positions asked for.
  kb.truncate(*s1, 2 * B + 2);
  EXPECT_EQ(kb.n_past(*s1), 2 * B + 2);
  // Freeing s1 returns block 1 (no other holder) and 3, not block 0 (sequence 0 holds it).
  kb.close(*s1);
  EXPECT_EQ(kb.holders(0), 1);
  EXPECT_EQ(kb.holders(1), 0);
  EXPECT_EQ(kb.n_free(), 10 - 1);
  kb.truncate(0, 0);
  EXPECT_EQ(kb.n_free(), 10);
}

std::unique_ptr<Model> load(int max_seqs, int kv_positions) {
  LoadOptions opts;
  opts.n_ctx = 256;
  opts.max_sequences = max_seqs;
  opts.kv_positions = kv_positions;
  auto m = Model::load(test::model_path(test::kSmolLM2), opts);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

// Three texts (SmolLM2 token ids) of different lengths, each prompt + continuation.
const std::vector<std::vector<int32_t>> kTexts = {
    {504, 3575, 282, 4649, 314, 7042, 30, 198, 198, 504, 1797, 1918, 282, 2914, 314, 5611, 30, 198, 198},
    {1068, 2030, 253, 1488, 288, 1343, 28, 260, 1228, 314, 216, 33, 34, 35, 36, 37},
    {9038, 2356, 281, 253, 1345, 429, 314, 2077, 30, 378, 1121, 6941, 288, 260, 2745, 28, 20, 9038,
     2356, 281, 253, 1345, 429}};

// Batched rows take the batched matmul path where the lone run may take the GEMV path, so rows
// agree to rounding (measured by ModelSmolLM2.BatchEqualsTokenByToken: up to 0.052), not bits.
// Reading another sequence's keys, or the wrong positions, moves logits by whole units.
void expect_close(const float* got, const float* want, size_t nv, const std::string& where) {
  EXPECT_LT(test::normalized_error(got, want, nv), 0.1) << where;
  const size_t top = size_t(std::max_element(want, want + nv) - want);
  float second = -INFINITY;
  for (size_t v = 0; v < nv; ++v)
    if (v != top) second = std::max(second, want[v]);
  if (want[top] - second > 0.5f) { EXPECT_EQ(size_t(std::max_element(got, got + nv) - got), top) << where; }
}

TEST(ModelBatch, InterleavedSequencesMatchEachAlone) {
  SLUICE_REQUIRE_MODEL(test::model_path(test::kSmolLM2));
  // Each text alone, every position's logits.
  auto solo = load(1, 0);
  ASSERT_TRUE(solo);
  const size_t nv = size_t(solo->n_vocab());
  std::vector<std::vector<float>> ref;
  for (const auto& t : kTexts) {
    solo->truncate(0);
    ref.emplace_back(t.size() * nv);
    ASSERT_TRUE(solo->eval(t, ref.back()).is_ok());
  }

  auto m = load(5, 12 * B);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->max_sequences(), 5);
  EXPECT_EQ(m->kv_block_size(), B);
  EXPECT_EQ(m->kv_blocks_total(), 12);
  // Scatter the pool: a filler takes blocks 0-1, sequence A takes 2, the filler is freed, so the
  // others get 0-1 and A's later blocks come after them.
  auto filler = m->seq_new();
  ASSERT_TRUE(filler.is_ok());
  std::vector<int32_t> fill(size_t(2 * B), 17);
  std::vector<float> one(nv);
  ASSERT_TRUE(m->eval_batch(std::vector<Model::SeqTokens>{{*filler, fill, false}}, one).is_ok());
  std::vector<int> seq;
  for (size_t i = 0; i < kTexts.size(); ++i) {
    auto s = m->seq_new();
    ASSERT_TRUE(s.is_ok());
    seq.push_back(*s);
  }
  const std::vector<int32_t>& a = kTexts[0];
  ASSERT_TRUE(m->eval_batch(std::vector<Model::SeqTokens>{{seq[0], std::span(a).first(3), false}}, one).is_ok());
  m->seq_free(*filler);
  EXPECT_EQ(m->kv_blocks_free(), 12 - 1);

  // Steps: prompt chunks of different sequences together, then chunks mixed with decode tokens,
  // then one token of each per pass. Every returned row is checked against the lone run.
  std::vector<size_t> done = {3, 0, 0};
  auto step = [&](const std::vector<std::pair<size_t, size_t>>& what, bool all) {
    std::vector<Model::SeqTokens> items;
    size_t rows = 0;
    for (auto [i, n] : what) {
      items.push_back({seq[i], std::span(kTexts[i]).subspan(done[i], n), all});
      rows += all ? n : 1;
    }
    std::vector<float> out(rows * nv);
    const Status st = m->eval_batch(items, out);
    ASSERT_TRUE(st.is_ok()) << st.message();
    size_t r = 0;
    for (auto [i, n] : what) {
      for (size_t t = all ? 0 : n - 1; t < n; ++t, ++r) {
        const size_t pos = done[i] + t;
        expect_close(out.data() + r * nv, ref[i].data() + pos * nv, nv,
                     "text " + std::to_string(i) + " position " + std::to_string(pos));
      }
      done[i] += n;
      EXPECT_EQ(m->seq_n_past(seq[i]), int(done[i]));
    }
  };
  step({{0, 4}, {1, 9}}, true);
  step({{2, 11}, {0, 1}, {1, 1}}, false);
  step({{1, 2}, {2, 5}, {0, 3}}, true);
  while (done[0] < kTexts[0].size() || done[1] < kTexts[1].size() || done[2] < kTexts[2].size()) {
    std::vector<std::pair<size_t, size_t>> what;
    for (size_t i = 0; i < 3; ++i)
      if (done[i] < kTexts[i].size()) what.push_back({i, 1});
    step(what, false);
  }
  // Freed sequences return their blocks; a truncated one re-evaluates to the same logits.
  const int before = m->kv_blocks_free();
  m->seq_truncate(seq[2], 5);
  EXPECT_EQ(m->seq_n_past(seq[2]), 5);
  EXPECT_EQ(m->kv_blocks_free(), before + KvBlocks::blocks_for(int(kTexts[2].size())) - 1);
  done[2] = 5;
  step({{2, 6}}, true);
  for (int s : seq) m->seq_free(s);
  EXPECT_EQ(m->kv_blocks_free(), 12);
}

// A sequence sharing another's first blocks (Model::seq_share) computes what it would have with
// those positions of its own: on the CPU the same bits, the shared rows having come from the same
// prefill (the matrix products give each row the bits of a one-row product). The source then
// goes back into a shared block (the block is dropped from it and recomputed, so the other
// sequence's rows stay) and both go on.
TEST(ModelBatch, SharedPrefixBlocksGiveTheSameLogits) {
  SLUICE_REQUIRE_MODEL(test::model_path(test::kSmolLM2));
  auto m = load(5, 16 * B);
  ASSERT_TRUE(m);
  const size_t nv = size_t(m->n_vocab());
  std::vector<int32_t> text;
  for (int i = 0; i < 3; ++i) text.insert(text.end(), kTexts[2].begin(), kTexts[2].end());  // 69 tokens
  const int shared = 2 * B;
  auto last = [&](int seq, std::span<const int32_t> tokens) {
    std::vector<float> out(nv);
    const Status st = m->eval_batch(std::vector<Model::SeqTokens>{{seq, tokens, false}}, out);
    EXPECT_TRUE(st.is_ok()) << st.message();
    return out;
  };
  auto a = m->seq_new(), b = m->seq_new(), c = m->seq_new();
  ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok());
  last(*a, std::span(text).first(40));  // A's prefill
  last(*c, std::span(text).first(shared));  // C: the same first positions, its own blocks
  const int free_before_share = m->kv_blocks_free();
  ASSERT_TRUE(m->seq_share(*a, *b, shared).is_ok());
  EXPECT_EQ(m->seq_n_past(*b), shared);
  EXPECT_EQ(m->kv_blocks_free(), free_before_share);  // nothing taken from the pool
  const std::vector<float> want = last(*c, std::span(text).subspan(size_t(shared), 20));
  const int free_before_b = m->kv_blocks_free();
  EXPECT_EQ(last(*b, std::span(text).subspan(size_t(shared), 20)), want);
  EXPECT_EQ(m->kv_blocks_free(), free_before_b - 2);  // B's own blocks for positions 32..51
  // A goes back to position 20 (inside shared block 1): it keeps 16, and other tokens from there
  // go into a block of its own.
  m->seq_truncate(*a, 20);
  EXPECT_EQ(m->seq_n_past(*a), B);
  const std::vector<int32_t> other(text.rbegin(), text.rbegin() + 30);  // other tokens at those positions
  last(*a, other);
  // B's shared rows were not touched: its next token equals C's.
  const auto next = std::span(text).subspan(size_t(shared) + 20, 1);
  EXPECT_EQ(last(*b, next), last(*c, next));
  // Errors.
  EXPECT_EQ(m->seq_share(*a, *b, B).code(), ErrorCode::kInvalidArgument);       // B holds positions
  auto d = m->seq_new();
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(m->seq_share(*a, *d, B + 1).code(), ErrorCode::kInvalidArgument);   // not whole blocks
  EXPECT_EQ(m->seq_share(*a, *d, 4 * B).code(), ErrorCode::kInvalidArgument);   // past A's positions
  EXPECT_EQ(m->seq_share(*a, 99, B).code(), ErrorCode::kInvalidArgument);       // no such sequence
  for (int s : {*a, *b, *c, *d}) m->seq_free(s);
  m->truncate(0);
  EXPECT_EQ(m->kv_blocks_free(), 16);
}

// logits_buffer: the first buffer large enough is handed out again (a loop that asks at every
// generation does not grow the model's memory), a larger request gets new memory and leaves the
// old span valid, and a pass writes the same logits there as into any other memory.
TEST(ModelBatch, LogitsBufferIsReusedAndHoldsThePassLogits) {
  SLUICE_REQUIRE_MODEL(test::model_path(test::kSmolLM2));
  auto m = load(2, 4 * B);
  ASSERT_TRUE(m);
  const size_t nv = size_t(m->n_vocab());
  auto a = m->logits_buffer(2 * nv);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  ASSERT_EQ(a->size(), 2 * nv);
  auto b = m->logits_buffer(nv);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->data(), a->data());
  EXPECT_EQ(b->size(), nv);
  auto c = m->logits_buffer(3 * nv);
  ASSERT_TRUE(c.is_ok());
  EXPECT_NE(c->data(), a->data());
  EXPECT_EQ(c->size(), 3 * nv);
  const std::vector<int32_t> t = {504, 3575, 282};
  std::vector<float> want(nv);
  ASSERT_TRUE(m->eval(t, want).is_ok());
  m->truncate(0);
  std::fill(a->begin(), a->end(), NAN);
  ASSERT_TRUE(m->eval(t, a->first(nv)).is_ok());
  for (size_t v = 0; v < nv; ++v) ASSERT_EQ((*a)[v], want[v]) << "logit " << v;
}

TEST(ModelBatch, ErrorsLeaveStateUnchanged) {
  SLUICE_REQUIRE_MODEL(test::model_path(test::kSmolLM2));
  auto m = load(3, 4 * B);
  ASSERT_TRUE(m);
  const size_t nv = size_t(m->n_vocab());
  auto s1 = m->seq_new();
  auto s2 = m->seq_new();
  ASSERT_TRUE(s1.is_ok() && s2.is_ok());
  EXPECT_EQ(m->seq_new().status().code(), ErrorCode::kOutOfMemory);  // 3 open, sequence 0 included
  const std::vector<int32_t> t = {1, 2, 3};
  std::vector<float> two(2 * nv), one(nv);
  auto code = [&](std::vector<Model::SeqTokens> items, std::span<float> out) {
    return m->eval_batch(items, out).code();
  };
  EXPECT_EQ(code({}, one), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({{*s1, t}, {*s1, t}}, two), ErrorCode::kInvalidArgument);  // twice
  EXPECT_EQ(code({{7, t}}, one), ErrorCode::kInvalidArgument);             // unknown
  EXPECT_EQ(code({{*s1, {}}}, one), ErrorCode::kInvalidArgument);          // empty
  EXPECT_EQ(code({{*s1, t}, {*s2, t}}, one), ErrorCode::kInvalidArgument); // logits size
  const std::vector<int32_t> bad = {1, -1};
  EXPECT_EQ(code({{*s1, bad}}, one), ErrorCode::kInvalidArgument);
  // 4 blocks in the pool: 3 for one sequence, then 2 more for the other do not fit.
  std::vector<int32_t> big(size_t(3 * B), 5), more(size_t(B + 1), 5);
  ASSERT_TRUE(m->eval_batch(std::vector<Model::SeqTokens>{{*s1, big}}, one).is_ok());
  EXPECT_EQ(m->kv_blocks_free(), 1);
  const Status st = m->eval_batch(std::vector<Model::SeqTokens>{{*s2, more}}, one);
  EXPECT_EQ(st.code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(st.message().find("KV blocks"), std::string::npos) << st.message();
  EXPECT_EQ(m->kv_blocks_free(), 1);
  EXPECT_EQ(m->seq_n_past(*s2), 0);
  EXPECT_EQ(m->seq_n_past(*s1), 3 * B);
  // Sequence 0 (eval) shares the pool.
  EXPECT_EQ(m->eval(std::vector<int32_t>(size_t(B + 1), 5), one).code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(m->n_past(), 0);
  EXPECT_EQ(m->kv_blocks_free(), 1);
}

TEST(ModelBatch, LoadRejectsBadSequenceOptions) {
  SLUICE_REQUIRE_MODEL(test::model_path(test::kSmolLM2));
  LoadOptions o;
  o.max_sequences = 0;
  EXPECT_EQ(Model::load(test::model_path(test::kSmolLM2), o).status().code(), ErrorCode::kInvalidArgument);
  o.max_sequences = 2;
  o.kv_positions = -1;
  EXPECT_EQ(Model::load(test::model_path(test::kSmolLM2), o).status().code(), ErrorCode::kInvalidArgument);
}

// Tokens per pass (LoadOptions::max_batch, --ubatch): one 700-token prompt evaluated in passes of
// 96, 512 (the default) and 1024 tokens gives the same bits on the CPU (a row's products, norms
// and attention do not depend on which pass it is in), every row's logits and the next token's
// alike; eval_batch refuses a pass longer than the model's cap, and load refuses a cap out of range.
TEST(ModelBatch, PassSizeDoesNotChangeTheBits) {
  SLUICE_REQUIRE_MODEL(test::model_path(test::kSmolLM2));
  constexpr int kPrompt = 700;
  std::vector<int32_t> prompt(kPrompt);
  for (int i = 0; i < kPrompt; ++i) prompt[size_t(i)] = kTexts[size_t(i % 3)][size_t(i % kTexts[size_t(i % 3)].size())];
  std::vector<std::vector<float>> all, next;
  for (int max_batch : {512, 96, 1024}) {
    LoadOptions opts;
    opts.n_ctx = 2048;  // room for the refused pass below, so the cap is what refuses it
    opts.max_batch = max_batch;
    auto m = Model::load(test::model_path(test::kSmolLM2), opts);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    EXPECT_EQ((*m)->max_batch(), max_batch);
    const size_t nv = size_t((*m)->n_vocab());
    std::vector<float> rows(size_t(kPrompt) * nv), one(nv);
    ASSERT_TRUE((*m)->eval(prompt, rows).is_ok());  // every row: rows holds prompt x n_vocab
    const std::vector<int32_t> step = {kTexts[0][3]};
    ASSERT_TRUE((*m)->eval(step, one).is_ok());
    all.push_back(std::move(rows));
    next.push_back(std::move(one));
    // A pass longer than the cap is refused, naming both counts; nothing is evaluated.
    std::vector<float> out(nv);
    const std::vector<int32_t> long_pass(size_t(max_batch + 1), 5);
    const Model::SeqTokens item{0, long_pass, false};
    const Status st = (*m)->eval_batch({&item, 1}, out);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find(std::to_string(max_batch + 1) + " tokens, at most " + std::to_string(max_batch)),
              std::string::npos)
        << st.message();
    EXPECT_EQ((*m)->n_past(), kPrompt + 1);
  }
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_TRUE(all[i] == all[0]) << "every row's logits, cap #" << i;
    EXPECT_TRUE(next[i] == next[0]) << "the next token's logits, cap #" << i;
  }
  LoadOptions o;
  for (int bad : {0, -1, kMaxMaxBatch + 1}) {
    o.max_batch = bad;
    const auto r = Model::load(test::model_path(test::kSmolLM2), o);
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("max_batch"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace sluice::model
