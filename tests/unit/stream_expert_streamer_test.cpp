// Expert placement (stream/expert_streamer.h) on the CPU backend, whose streaming calls run
// synchronously: a mixture-of-experts model with a small expert cache, misses on the host
// executor, copied into the cache, or both, must compute what the resident model computes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"
#include "quant/quant.h"
#include "stream/expert_streamer.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace sluice::stream {
namespace {

constexpr int kE = test::kMoeE, kF = test::kMoeF, kX = test::kMoeX, kK = test::kMoeK, kL = test::kMoeL,
              kV = test::kMoeV;

std::string write_moe(quant::Type type, const std::string& tag) { return test::write_synthetic_moe(type, "moe_" + tag); }

// Prefill of 40 tokens (a "prefill" pass: >= prefill_batch) then 12 decode steps fed `tokens`
// (empty: the model's own greedy choices, recorded there); the logits of every step.
std::vector<std::vector<float>> run(model::Model& m, std::vector<int32_t>& tokens) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 11 + 5) % kV);
  std::vector<std::vector<float>> out;
  std::vector<float> logits(kV);
  EXPECT_TRUE(m.eval(prompt, logits).is_ok());
  out.push_back(logits);
  const bool record = tokens.empty();
  for (int s = 0; s < 12; ++s) {
    if (record) tokens.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    EXPECT_TRUE(m.eval(std::span<const int32_t>(&tokens[size_t(s)], 1), logits).is_ok());
    out.push_back(logits);
  }
  return out;
}

model::LoadOptions cpu_opts() {
  model::LoadOptions o;
  o.backend = model::BackendKind::kCpu;
  o.n_threads = 2;
  o.n_ctx = 128;
  return o;
}

struct Placed {
  std::unique_ptr<model::Model> model;
  ExpertStreamer* streamer = nullptr;
};

Placed load_placed(const std::string& path, MissPolicy policy, int cache_experts, bool prefetch = true,
                   bool layer_quotas = false) {
  ExpertStreamOptions eo;
  eo.layer_quotas = layer_quotas;
  eo.quota_period = 1;
  eo.prefetch = prefetch;
  eo.allow_host_backend = true;
  eo.policy = policy;
  eo.host_cpu.n_threads = 2;
  eo.n_ctx = 128;
  // One slot's bytes: three matrices of one expert, at 256-byte offsets.
  eo.cache_bytes = uint64_t(cache_experts) * 3 * ((uint64_t(quant::row_bytes(quant::Type::kQ8_0, kE)) * kF + 255) / 256 * 256);
  model::LoadOptions o = cpu_opts();
  Placed p;
  o.layer_source = expert_streaming_source(eo, &p.streamer);
  auto m = model::Model::load(path, o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (m.is_ok()) p.model = std::move(m).value();
  return p;
}

// Every policy against the resident model, both fed the resident run's greedy tokens: logits within
// 5e-2. The host's experts are summed apart and then added, so float sums associate differently,
// usually to ~1e-6; where a router has a near-tie that last bit switches an expert, and the
// switched position's K/V rows carry it to later steps (measured up to 1.8e-2 on random weights).
// A wrong slot, expert or weight gives errors of order 1.
TEST(StreamExperts, PlacementsComputeWhatTheResidentModelComputes) {
  const std::string path = write_moe(quant::Type::kQ8_0, "policies");
  auto resident = model::Model::load(path, cpu_opts());
  ASSERT_TRUE(resident.is_ok()) << resident.status().message();
  std::vector<int32_t> tokens;
  const auto want = run(**resident, tokens);
  for (const MissPolicy policy : {MissPolicy::kCostModel, MissPolicy::kCpu, MissPolicy::kCopy}) {
    SCOPED_TRACE(int(policy));
    Placed p = load_placed(path, policy, 5);  // 5 of 24 experts cached
    ASSERT_TRUE(p.model && p.streamer);
    const auto got = run(*p.model, tokens);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      EXPECT_LT(test::normalized_error(got[s].data(), want[s].data(), want[s].size()), 5e-2) << "step " << s;
    }
    const ExpertStats& st = p.streamer->stats();
    EXPECT_EQ(p.streamer->cache_slots(), 5);
    EXPECT_EQ(st.uses, st.hits + st.cpu_misses + st.copy_misses);
    EXPECT_EQ(st.decode_uses, uint64_t(12 * kL * kK));
    EXPECT_GT(st.hits, 0u);
    if (policy == MissPolicy::kCpu) {
      EXPECT_EQ(st.copy_misses, 0u);
      EXPECT_GT(st.cpu_misses, 0u);
    }
    if (policy == MissPolicy::kCopy) {
      // Decode needs at most 2 experts per layer, fewer than the slots; a 40-token prefill may
      // route to more distinct experts than there are slots, and those run on the CPU.
      EXPECT_EQ(st.decode_cpu, 0u);
      EXPECT_GT(st.copy_misses, 0u);
    }
    if (policy == MissPolicy::kCostModel) {
      // Prefill copies its misses; decode sends some to the CPU.
      EXPECT_GT(st.copy_misses, 0u);
      EXPECT_GT(st.decode_cpu, 0u);
    }
  }
  std::filesystem::remove(path);
}

// Prefetch (the next layer's router on this layer's state; predicted misses copied into the cache
// ahead) changes where experts are, never what is computed: with every miss copied (no host sums),
// the logits of every step are those of the run without prefetch, bit for bit. Every decode pass
// predicts layers 1 .. L-1; the copies ahead that were used show up as hits.
TEST(StreamExperts, PrefetchChangesOnlyPlacement) {
  const std::string path = write_moe(quant::Type::kQ8_0, "prefetch");
  std::vector<int32_t> tokens;
  Placed off = load_placed(path, MissPolicy::kCopy, 5, false);
  ASSERT_TRUE(off.model);
  const auto want = run(*off.model, tokens);
  Placed on = load_placed(path, MissPolicy::kCopy, 5, true);
  ASSERT_TRUE(on.model);
  const auto got = run(*on.model, tokens);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s) EXPECT_EQ(got[s], want[s]) << "step " << s;
  const ExpertStats& a = off.streamer->stats();
  const ExpertStats& b = on.streamer->stats();
  EXPECT_EQ(a.prefetch_copies, 0u);
  EXPECT_EQ(a.decode_predicted_actual, 0u);
  EXPECT_EQ(b.decode_predicted_actual, uint64_t(12 * (kL - 1) * kK));
  EXPECT_LE(b.decode_predicted_used, b.decode_predicted_actual);
  EXPECT_GT(b.prefetch_copies, 0u);
  EXPECT_LE(b.prefetch_used, b.prefetch_copies);
  // A copy ahead that was used replaced a miss: hits + prefetch-used misses add up the same way.
  EXPECT_EQ(b.uses, b.hits + b.cpu_misses + b.copy_misses);
  // On this model (random routers, 5 of 24 experts cached) the copies ahead raise decode hits
  // (measured: 21 of 72 with prefetch, 3 without).
  EXPECT_GT(b.decode_hits, a.decode_hits);
  std::printf("[ info ] prefetch: accuracy %.1f%% (%llu of %llu), %llu of %llu copies ahead used; decode hits %llu "
              "(without prefetch %llu) of %llu\n",
              100.0 * double(b.decode_predicted_used) / double(b.decode_predicted_actual),
              (unsigned long long)b.decode_predicted_used, (unsigned long long)b.decode_predicted_actual,
              (unsigned long long)b.prefetch_used, (unsigned long long)b.prefetch_copies,
              (unsigned long long)b.decode_hits, (unsigned long long)a.decode_hits, (unsigned long long)b.decode_uses);
  // The cpu policy never copies, so it never prefetches.
  Placed cpu = load_placed(path, MissPolicy::kCpu, 5, true);
  ASSERT_TRUE(cpu.model);
  run(*cpu.model, tokens);
  EXPECT_EQ(cpu.streamer->stats().prefetch_copies, 0u);
  std::filesystem::remove(path);
}

// Per-layer quotas, hand-computed: each slot to one of the most-used experts (more uses first,
// then the lower key); slots left over dealt round-robin to the layers with room, layer 0 first.
TEST(StreamExperts, QuotasFollowUses) {
  const std::vector<double> none(12, 0.0);
  EXPECT_EQ(plan_expert_quotas(none, 3, 4, 7), (std::vector<int>{3, 2, 2}));  // uniform, as the cache starts
  // Layer 0 uses {5, 4}, layer 1 {1}, layer 2 {3, 3, 3}.
  const std::vector<double> uses = {5, 4, 0, 0, 1, 0, 0, 0, 3, 3, 3, 0};
  EXPECT_EQ(plan_expert_quotas(uses, 3, 4, 5), (std::vector<int>{2, 0, 3}));
  EXPECT_EQ(plan_expert_quotas(uses, 3, 4, 4), (std::vector<int>{2, 0, 2}));  // a tie: the lower keys
  EXPECT_EQ(plan_expert_quotas(uses, 3, 4, 8), (std::vector<int>{3, 2, 3}));  // 6 used + 2 round-robin
  EXPECT_EQ(plan_expert_quotas(uses, 3, 4, 100), (std::vector<int>{4, 4, 4}));  // capped at the experts
  EXPECT_EQ(plan_expert_quotas(uses, 3, 4, 0), (std::vector<int>{0, 0, 0}));
}

// Eviction under quotas, driven through the placement interface with hand-made routing (6 slots
// of 3 x 8 experts, every miss copied, quotas re-planned every decode pass). The cache starts
// with experts 0 and 1 of every layer; four passes use experts {0, 1} of layer 0 and {0} of
// layers 1 and 2, so the quotas become [3, 2, 1] (the four used experts, then two slots
// round-robin). A miss of layer 2 (at its quota) then evicts layer 2's unused expert 1, where
// global eviction takes the first least-used slot, layer 1's expert 1. That use re-plans the
// quotas to [3, 1, 2]; a miss of layer 0 (below its quota) then evicts from layer 1 (above it),
// which brings every layer to its quota.
TEST(StreamExperts, LayerQuotasDecideWhoIsEvicted) {
  const std::string path = write_moe(quant::Type::kQ8_0, "quotas");
  auto pass = [](ExpertStreamer& s, const std::vector<std::vector<int>>& experts) {
    ASSERT_TRUE(s.begin_pass(1).is_ok());
    for (int l = 0; l < kL; ++l) {
      std::vector<model::ExpertBatch> batches;
      for (int e : experts[size_t(l)]) batches.push_back({e, {0}, {1.0f / float(experts[size_t(l)].size())}});
      std::vector<model::ExpertPlacement::Site> sites(batches.size());
      ASSERT_TRUE(s.place(l, 1, batches, sites).is_ok());
      s.done(l, 0.0);
    }
  };
  for (const bool quotas : {true, false}) {
    SCOPED_TRACE(quotas ? "layer quotas" : "global");
    Placed p = load_placed(path, MissPolicy::kCopy, 6, false, quotas);
    ASSERT_TRUE(p.model && p.streamer);
    ExpertStreamer& s = *p.streamer;
    EXPECT_EQ(s.layer_cached(), (std::vector<int>{2, 2, 2}));
    if (quotas) {
      EXPECT_EQ(s.quotas(), (std::vector<int>{2, 2, 2}));
    }
    for (int i = 0; i < 4; ++i) pass(s, {{0, 1}, {0}, {0}});
    EXPECT_EQ(s.stats().copy_misses, 0u);
    pass(s, {{0, 1}, {0}, {0, 2}});  // the quotas are re-planned at this pass's start
    if (quotas) {
      EXPECT_EQ(s.quotas(), (std::vector<int>{3, 2, 1}));
      EXPECT_EQ(s.layer_cached(), (std::vector<int>{2, 2, 2}));
      pass(s, {{0, 1, 2}, {0}, {0}});
      EXPECT_EQ(s.quotas(), (std::vector<int>{3, 1, 2}));
      EXPECT_EQ(s.layer_cached(), (std::vector<int>{3, 1, 2}));
    } else {
      EXPECT_TRUE(s.quotas().empty());
      EXPECT_EQ(s.layer_cached(), (std::vector<int>{2, 1, 3}));
    }
    EXPECT_EQ(s.stats().uses, s.stats().hits + s.stats().copy_misses);
  }
  std::filesystem::remove(path);
}

// Quotas change where experts are, never what is computed: with every miss copied, the logits of
// a run with per-layer quotas are those of a run without, bit for bit.
TEST(StreamExperts, LayerQuotasChangeOnlyPlacement) {
  const std::string path = write_moe(quant::Type::kQ8_0, "quota_run");
  std::vector<int32_t> tokens;
  Placed global = load_placed(path, MissPolicy::kCopy, 5, false, false);
  ASSERT_TRUE(global.model);
  const auto want = run(*global.model, tokens);
  Placed layer = load_placed(path, MissPolicy::kCopy, 5, false, true);
  ASSERT_TRUE(layer.model);
  const auto got = run(*layer.model, tokens);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s) EXPECT_EQ(got[s], want[s]) << "step " << s;
  int cached = 0, quota = 0;
  for (int l = 0; l < kL; ++l) cached += layer.streamer->layer_cached()[size_t(l)], quota += layer.streamer->quotas()[size_t(l)];
  EXPECT_EQ(cached, 5);
  EXPECT_EQ(quota, 5);
  std::filesystem::remove(path);
}

// With the whole model's experts cached, every decode use is a hit and nothing is copied again.
TEST(StreamExperts, FullCacheOnlyHits) {
  const std::string path = write_moe(quant::Type::kQ8_0, "full");
  Placed p = load_placed(path, MissPolicy::kCostModel, kL * kX);
  ASSERT_TRUE(p.model);
  std::vector<int32_t> tokens;
  run(*p.model, tokens);
  const ExpertStats& st = p.streamer->stats();
  EXPECT_EQ(st.hits, st.uses);
  EXPECT_EQ(st.cpu_misses + st.copy_misses, 0u);
  std::filesystem::remove(path);
}

// The sizes behind the placement: resident = everything but token_embd and the routed experts;
// slots hold one expert's three matrices at 256-byte offsets; the budget left after the resident
// part and the reserved memory, in whole slots.
TEST(StreamExperts, PlanSizes) {
  const std::string path = write_moe(quant::Type::kQ8_0, "plan");
  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.is_ok());
  uint64_t resident = 0, experts = 0;
  for (const auto& t : f->tensors()) {
    if (t.name == "token_embd.weight") continue;
    (t.name.find("_exps") != std::string::npos ? experts : resident) += t.nbytes;
  }
  const model::ArchSpec* arch = model::find_arch("llama");
  auto cfg = model::read_config(*f, *arch);
  ASSERT_TRUE(cfg.is_ok());
  auto w = model::load_weights(*f, *arch, *cfg);
  ASSERT_TRUE(w.is_ok());
  const uint64_t matrix = uint64_t(quant::row_bytes(quant::Type::kQ8_0, kE)) * kF;  // 69632: 256-aligned
  const ExpertPlan none = plan_experts(*w, 128, 1 << 20, 0);
  EXPECT_EQ(none.resident_bytes, resident);
  EXPECT_EQ(none.expert_bytes, experts);
  EXPECT_EQ(none.slot_bytes, 3 * matrix);
  EXPECT_EQ(none.off_up, matrix);
  EXPECT_EQ(none.n_slots, 0u);
  const uint64_t budget = resident + none.reserved_bytes + 5 * none.slot_bytes + 100;
  EXPECT_EQ(plan_experts(*w, 128, 1 << 20, budget).n_slots, 5u);
  EXPECT_EQ(plan_experts(*w, 128, 1 << 20, uint64_t(1) << 40).n_slots, uint64_t(kL * kX));  // capped
  EXPECT_NE(none.describe(1e12, 50e9, 50e9).find("routed experts: 3 layers x 8 (top-2)"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(StreamExperts, ErrorsAreClear) {
  const std::string path = write_moe(quant::Type::kQ8_0, "errors");
  // No room for one expert slot, and misses that would need copies.
  ExpertStreamOptions eo;
  eo.allow_host_backend = true;
  eo.cache_bytes = 1000;
  model::LoadOptions o = cpu_opts();
  o.layer_source = expert_streaming_source(eo, nullptr);
  auto m = model::Model::load(path, o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("expert slot"), std::string::npos) << m.status().message();
  // A RAM budget below the experts' size names both.
  eo.cache_bytes = 0;
  eo.ram_budget = 1 << 20;
  o.layer_source = expert_streaming_source(eo, nullptr);
  m = model::Model::load(path, o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("--ram-budget"), std::string::npos) << m.status().message();
  // The CPU backend without the test switch: not a backend with its own memory.
  eo.ram_budget = 0;
  eo.allow_host_backend = false;
  o.layer_source = expert_streaming_source(eo, nullptr);
  m = model::Model::load(path, o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kUnsupported);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sluice::stream
