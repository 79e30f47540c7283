// Speculative decoding and the layer-mask hook on the real models (labelled slow: the sanitizer
// build skips it): greedy output with both draft kinds against non-speculative decoding on
// SmolLM2 and Gemma 3, the self-draft's KV rows repaired by the verification pass (bit for bit),
// layer-mask and early-exit checks, self-draft over the resident layers of a streamed model.
//
// Greedy identity: the verification pass is a batched pass, and the CPU backend's batched
// kernels sum in another order than its one-token kernels (as llama.cpp's do:
// backend/cpu/attention.cpp, the multi-column matmul kernels), by up to ~0.15 on Gemma 3's logits
// of ~26. Verification therefore runs in row-invariant mode (Model::set_row_invariant), where
// every row has the bits of a one-token pass, and speculative greedy output must equal plain
// greedy decoding token for token, at near-ties too. Plain decoding itself is checked against
// one-token greedy re-evaluated from the prompt (expect_same_greedy), where a prompt re-evaluated
// as one batch may break a near-tie the other way (kTieMargin).
#include <gtest/gtest.h>

#include <algorithm>

#include "decode/calibrate.h"
#include "decode/speculative.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "stream/cpu_streamer.h"
#include "stream/device_streamer.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace sluice::decode {
namespace {

constexpr float kTieMargin = 0.5f;

SamplerParams greedy() {
  SamplerParams p;
  p.temperature = 0;
  return p;
}

std::unique_ptr<model::Model> load(const std::string& path, int n_ctx = 256) {
  model::LoadOptions o;
  o.n_ctx = n_ctx;
  o.n_threads = 2;
  auto m = model::Model::load(path, o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<model::Tokenizer> tokenizer(const std::string& path) {
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.is_ok());
  auto t = model::Tokenizer::from_gguf(*f);
  EXPECT_TRUE(t.is_ok());
  return t.is_ok() ? std::move(t).value() : nullptr;
}

// Every other layer but the first and last left out.
std::vector<bool> every_other(int n_layer) {
  std::vector<bool> run(size_t(n_layer), true);
  for (int l = 1; l + 1 < n_layer; l += 2) run[size_t(l)] = false;
  return run;
}

// Greedy decoding on the one-token path from prompt + prefix, n tokens: the tokens (argmax, ties
// to the lowest id, as Sampler) and the top-1 minus top-2 logit before each.
void one_token_greedy(model::Model& m, std::vector<int32_t> context, int n, std::vector<int32_t>& tokens,
                      std::vector<float>& margin) {
  tokens.clear();
  margin.clear();
  std::vector<float> logits(size_t(m.n_vocab()));
  m.truncate(0);
  ASSERT_TRUE(m.eval(context, logits).is_ok());
  for (int i = 0; i < n; ++i) {
    int32_t best = 0;
    for (int32_t v = 1; v < m.n_vocab(); ++v) best = logits[size_t(v)] > logits[size_t(best)] ? v : best;
    float second = -1e30f;
    for (int32_t v = 0; v < m.n_vocab(); ++v) {
      if (v != best) second = std::max(second, logits[size_t(v)]);
    }
    tokens.push_back(best);
    margin.push_back(logits[size_t(best)] - second);
    if (i + 1 == n) break;
    const int32_t one[1] = {best};
    ASSERT_TRUE(m.eval(one, logits).is_ok());
  }
  m.truncate(0);
}

// Every token of `got` (speculative greedy output) is the one-token path's greedy token given the
// tokens before it, except at near-ties of that path (see the top of the file): after a near-tie
// broke the other way, the check re-synchronises on got's prefix and continues, so the whole
// output is checked, not only the part before the first divergence.
void expect_same_greedy(model::Model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& got,
                        const std::string& what) {
  std::vector<int32_t> context = prompt, ref;
  std::vector<float> margin;
  size_t pos = 0;
  int ties = 0;
  while (pos < got.size()) {
    one_token_greedy(m, context, int(got.size() - pos), ref, margin);
    size_t j = 0;
    while (j < ref.size() && ref[j] == got[pos + j]) ++j;
    if (j == ref.size()) break;
    EXPECT_LT(margin[j], kTieMargin) << what << ": token " << pos + j << " is " << got[pos + j] << ", the one-token "
                                     << "path's is " << ref[j] << " with a top-2 margin of " << margin[j]
                                     << " (not a near-tie)";
    std::printf("%s: token %zu breaks a near-tie (margin %.3f) the other way\n", what.c_str(), pos + j,
                double(margin[j]));
    ++ties;
    context.insert(context.end(), got.begin() + ptrdiff_t(pos), got.begin() + ptrdiff_t(pos + j + 1));
    pos += j + 1;
  }
  std::printf("%s: %zu tokens, every one the one-token path's greedy choice%s\n", what.c_str(), got.size(),
              ties ? " except at the near-ties above" : "");
}

void greedy_identity(const std::string& file) {
  const std::string path = test::model_path(file);
  SLUICE_REQUIRE_MODEL(path);
  auto tok = tokenizer(path);
  const std::vector<int32_t> prompt =
      tok->encode("The capital of France is Paris. The capital of Italy is", tok->add_bos_default(), false);
  constexpr int kN = 24;
  auto m = load(path);
  auto d = load(path);
  Sampler s0(greedy(), m->n_vocab());
  auto a = generate(*m, *tok, s0, prompt, {kN}, nullptr);
  ASSERT_TRUE(a.is_ok());
  const int n_past = m->n_past();
  expect_same_greedy(*m, prompt, a->tokens, file + " without speculation");
  const int n_layer = m->config().n_layer;

  // Self-draft leaving out two layers of the second half (skippable ones by sluice calibrate on
  // both models: cosine >= 0.97), so that drafts are often, but not always, accepted.
  {
    m->truncate(0);
    std::vector<bool> run(size_t(n_layer), true);
    run[size_t(n_layer / 2)] = run[size_t(5 * n_layer / 6)] = false;
    SelfDrafter drafter(*m, run);
    Sampler s(greedy(), m->n_vocab());
    SpecStats st;
    auto b = generate_speculative(*m, drafter, *tok, s, prompt, {kN}, {4, false}, nullptr, &st);
    ASSERT_TRUE(b.is_ok()) << b.status().message();
    EXPECT_EQ(m->n_past(), n_past);
    EXPECT_EQ(b->tokens, a->tokens) << file << " self-draft: speculative greedy output differs from plain decoding";
    EXPECT_TRUE(m->layer_mask().empty()) << "the draft's mask must not outlive the draft";
    std::printf("%s self-draft: acceptance %.2f, %.2f tokens per pass\n", file.c_str(), st.acceptance_rate(),
                st.tokens_per_pass());
  }
  // A draft model: the same file, a second Model with three layers left out (a different model
  // of the same vocabulary), then the identical model (every draft kept).
  for (const bool identical : {false, true}) {
    m->truncate(0);
    d->truncate(0);
    std::vector<bool> run(size_t(n_layer), true);
    if (!identical) {
      run[size_t(n_layer / 2 - 1)] = run[size_t(n_layer / 2 + 1)] = run[size_t(5 * n_layer / 6)] = false;
    }
    ASSERT_TRUE(d->set_layer_mask(identical ? std::vector<bool>{} : run).is_ok());
    ModelDrafter drafter(*d);
    Sampler s(greedy(), m->n_vocab());
    SpecStats st;
    auto b = generate_speculative(*m, drafter, *tok, s, prompt, {kN}, {5, false}, nullptr, &st);
    ASSERT_TRUE(b.is_ok()) << b.status().message();
    EXPECT_EQ(m->n_past(), n_past);
    EXPECT_EQ(b->tokens, a->tokens) << file << " draft model" << (identical ? " (identical)" : "")
                                    << ": speculative greedy output differs from plain decoding";
    if (identical) {
      EXPECT_EQ(st.accepted, st.drafted);
    }
    std::printf("%s draft model (identical %d): acceptance %.2f, %.2f tokens per pass\n", file.c_str(), int(identical),
                st.acceptance_rate(), st.tokens_per_pass());
  }
}

TEST(SpeculativeModel, GreedyIdenticalSmolLM2) { greedy_identity(test::kSmolLM2); }
TEST(SpeculativeModel, GreedyIdenticalGemma3) { greedy_identity(test::kGemma3); }

// The self-draft KV invariant, bit for bit: a draft pass writes rows only for the layers it runs;
// after truncating back, the verification pass's logits equal those of a pass that never saw the
// draft, because it overwrites every layer's rows at those positions before reading them.
TEST(SpeculativeModel, VerificationOverwritesSelfDraftRows) {
  const std::string path = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(path);
  auto m = load(path, 64);
  const int nv = m->n_vocab();
  const std::vector<int32_t> prompt = {1, 504, 3458, 282, 4649, 314};
  const std::vector<int32_t> verify = {253, 1345, 30, 88};
  std::vector<float> last(static_cast<size_t>(nv)), clean(verify.size() * static_cast<size_t>(nv)),
      after(verify.size() * static_cast<size_t>(nv));
  ASSERT_TRUE(m->eval(prompt, last).is_ok());
  const int n0 = m->n_past();
  ASSERT_TRUE(m->eval(verify, clean).is_ok());
  m->truncate(n0);
  // A draft over every other layer, at the same positions (and beyond).
  ASSERT_TRUE(m->set_layer_mask(every_other(m->config().n_layer)).is_ok());
  for (int32_t t : {verify[0], int32_t(77), int32_t(99), int32_t(5), int32_t(6)}) {
    const int32_t one[1] = {t};
    ASSERT_TRUE(m->eval(one, last).is_ok());
  }
  ASSERT_TRUE(m->set_layer_mask({}).is_ok());
  m->truncate(n0);
  ASSERT_TRUE(m->eval(verify, after).is_ok());
  EXPECT_EQ(clean, after);
  // And the draft's own logits differ from the full model's (the mask did something).
  m->truncate(n0);
  ASSERT_TRUE(m->set_layer_mask(every_other(m->config().n_layer)).is_ok());
  const int32_t one[1] = {verify[0]};
  ASSERT_TRUE(m->eval(one, last).is_ok());
  EXPECT_NE(std::vector<float>(clean.begin(), clean.begin() + nv), last);
}

TEST(SpeculativeModel, LayerMaskAndEarlyExitChecks) {
  const std::string path = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(path);
  auto m = load(path, 64);
  const int n_layer = m->config().n_layer;
  EXPECT_FALSE(m->set_layer_mask(std::vector<bool>(3, true)).is_ok());
  EXPECT_FALSE(m->set_early_exit(1.5f, 0).is_ok());
  EXPECT_FALSE(m->set_early_exit(0.9f, n_layer).is_ok());
  EXPECT_TRUE(m->set_layer_mask(std::vector<bool>(size_t(n_layer), true)).is_ok());
  EXPECT_TRUE(m->layer_mask().empty()) << "an all-true mask is the full model";
  const std::vector<bool> res = m->resident_layers();
  EXPECT_EQ(int(res.size()), n_layer);
  EXPECT_TRUE(std::all_of(res.begin(), res.end(), [](bool r) { return r; }));
  // Early exit with a threshold every layer meets: each one-token pass stops at min_layer.
  ASSERT_TRUE(m->set_early_exit(-0.5f, 0).is_ok());  // <= 0: off
  ASSERT_TRUE(m->set_early_exit(1e-6f, 4).is_ok());
  std::vector<float> logits(size_t(m->n_vocab()));
  const model::Model::LayerCounts c0 = m->layer_counts();
  for (int32_t t : {1, 504, 3458}) {
    const int32_t one[1] = {t};
    ASSERT_TRUE(m->eval(one, logits).is_ok());
  }
  const model::Model::LayerCounts c1 = m->layer_counts();
  EXPECT_EQ(c1.passes - c0.passes, 3);
  EXPECT_EQ(c1.early_exits - c0.early_exits, 3);
  EXPECT_EQ(c1.layers_run - c0.layers_run, 3 * 5);  // layers 0..4
  // A skipped layer's contribution is gone: perplexity changes, and is back with the full model.
  ASSERT_TRUE(m->set_early_exit(0, 0).is_ok());
  const std::vector<int32_t> text = {1, 504, 3458, 282, 4649, 314, 253, 1345, 30, 88, 17, 29};
  auto full = perplexity_of(*m, text, false);
  ASSERT_TRUE(m->set_layer_mask(every_other(n_layer)).is_ok());
  auto skipped = perplexity_of(*m, text, false);
  ASSERT_TRUE(m->set_layer_mask({}).is_ok());
  auto again = perplexity_of(*m, text, false);
  ASSERT_TRUE(full.is_ok() && skipped.is_ok() && again.is_ok());
  EXPECT_NE(*full, *skipped);
  EXPECT_EQ(*full, *again);
}

// Self-draft over the resident layers of a CPU-streamed model: the draft passes leave every
// streamed layer out (LayerSource::can_skip: the ring of reads waits for the next full pass), so
// no layer is read for a draft; the output is still the non-speculative one.
TEST(SpeculativeModel, SelfDraftOverResidentLayersOfAStreamedModel) {
  const std::string path = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(path);
  auto tok = tokenizer(path);
  const std::vector<int32_t> prompt = tok->encode("Once upon a time", tok->add_bos_default(), false);
  auto ref = load(path, 128);
  Sampler s0(greedy(), ref->n_vocab());
  auto a = generate(*ref, *tok, s0, prompt, {16}, nullptr);
  ASSERT_TRUE(a.is_ok());

  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.is_ok());
  uint64_t bytes = 0;
  for (const auto& t : f->tensors()) bytes += t.nbytes;
  model::LoadOptions o;
  o.n_ctx = 128;
  o.n_threads = 2;
  stream::CpuStreamOptions so;
  so.ram_budget = bytes * 9 / 10;
  so.n_slots = 2;
  stream::CpuLayerStreamer* streamer = nullptr;
  o.layer_source = stream::cpu_streaming_source(path, so, &streamer);
  auto m = model::Model::load(path, o);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const std::vector<bool> res = (*m)->resident_layers();
  const int n_res = int(std::count(res.begin(), res.end(), true));
  ASSERT_GT(n_res, 0);
  ASSERT_LT(n_res, int(res.size())) << "the budget should stream some layers";
  SelfDrafter drafter(**m, res);
  Sampler s(greedy(), (*m)->n_vocab());
  SpecStats st;
  const uint64_t read0 = streamer->stats().bytes_read;
  auto b = generate_speculative(**m, drafter, *tok, s, prompt, {16}, {3, false}, nullptr, &st);
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  EXPECT_EQ(b->tokens, a->tokens) << "CPU-streamed self-draft: differs from the resident model's plain decoding";
  // Streamed bytes: one full read of the streamed layers per target pass (prefill + verification
  // passes), none for the drafts.
  uint64_t streamed_bytes = 0;
  for (size_t l = 0; l < res.size(); ++l) {
    if (!res[l]) streamed_bytes += streamer->plan().input.units[l].bytes;
  }
  EXPECT_EQ(streamer->stats().bytes_read - read0, streamed_bytes * uint64_t(1 + st.rounds));
}

// The device pipeline (on the CPU backend, as its unit tests run it): a self-draft over the
// VRAM-resident (A) layers leaves the pinned-RAM (B) and disk (C) layers out of the draft passes
// without disturbing the copy ring: output identical to the same pipeline without speculation,
// and the bytes copied are one copy of the streamed layers per target pass, none per draft.
class NullTokenizer final : public model::Tokenizer {
 public:
  explicit NullTokenizer(int n) : n_(n) {}
  std::vector<int32_t> encode(std::string_view, bool, bool) const override { return {}; }
  std::string token_bytes(int32_t) const override { return "x"; }
  int n_vocab() const override { return n_; }
  int32_t bos() const override { return -1; }
  int32_t eos() const override { return -1; }
  bool is_end_of_generation(int32_t) const override { return false; }
  bool add_bos_default() const override { return false; }
  int32_t find_token(std::string_view) const override { return -1; }
  bool is_control(int32_t) const override { return false; }
  bool strips_leading_space() const override { return false; }

 private:
  int n_;
};

TEST(SpeculativeModel, SelfDraftOverVramResidentLayersOfTheDevicePipeline) {
  using quant::Type;
  using stream::Home;
  const test::SynthTypes ty{Type::kQ4_K, Type::kQ4_K, Type::kQ6_K, Type::kQ4_K, Type::kQ4_K,
                            Type::kQ4_K, Type::kQ6_K, Type::kQ4_K, true,        Type::kQ6_K};
  const std::string path = test::write_synthetic_llama("specdev", "a", ty, /*salt=*/7);
  const std::vector<Home> homes = {Home::kVram, Home::kRam, Home::kVram, Home::kDisk, Home::kVram, Home::kRam};
  auto load_dev = [&](stream::DeviceStreamer** s) {
    stream::DeviceStreamOptions so;
    so.allow_host_backend = true;
    so.force_homes = homes;
    so.n_slots = 2;
    so.n_ctx = 128;
    model::LoadOptions o;
    o.backend = model::BackendKind::kCpu;
    o.cpu_pack_weights = false;
    o.n_ctx = 128;
    o.layer_source = stream::device_streaming_source(path, so, s);
    auto m = model::Model::load(path, o);
    EXPECT_TRUE(m.is_ok()) << m.status().message();
    return m.is_ok() ? std::move(m).value() : nullptr;
  };
  stream::DeviceStreamer* s0 = nullptr;
  stream::DeviceStreamer* s1 = nullptr;
  auto ref = load_dev(&s0);
  auto m = load_dev(&s1);
  ASSERT_TRUE(ref && m);
  const NullTokenizer tok(m->n_vocab());
  const std::vector<int32_t> prompt = {1, 5, 9, 2};
  Sampler a0(greedy(), m->n_vocab());
  auto a = generate(*ref, tok, a0, prompt, {20}, nullptr);
  ASSERT_TRUE(a.is_ok()) << a.status().message();

  const std::vector<bool> res = m->resident_layers();
  EXPECT_EQ(res, (std::vector<bool>{true, false, true, false, true, false}));
  SelfDrafter drafter(*m, res);
  Sampler b0(greedy(), m->n_vocab());
  SpecStats st;
  const stream::DeviceStreamStats before = s1->stats();
  auto b = generate_speculative(*m, drafter, tok, b0, prompt, {20}, {3, false}, nullptr, &st);
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  EXPECT_EQ(b->tokens, a->tokens) << "device pipeline self-draft: differs from plain decoding";
  const stream::DeviceStreamStats& after = s1->stats();
  uint64_t streamed = 0;
  for (size_t l = 0; l < homes.size(); ++l) {
    if (homes[l] != Home::kVram) streamed += s1->plan().input.units[l].bytes;
  }
  const uint64_t moved = (after.ram_bytes + after.disk_bytes + after.cpu_bytes) -
                         (before.ram_bytes + before.disk_bytes + before.cpu_bytes);
  EXPECT_EQ(moved, streamed * uint64_t(1 + st.rounds)) << "drafts must not fetch streamed layers";
  std::printf("device pipeline self-draft: acceptance %.2f, %.2f tokens per pass\n", st.acceptance_rate(),
              st.tokens_per_pass());
}

}  // namespace
}  // namespace sluice::decode
