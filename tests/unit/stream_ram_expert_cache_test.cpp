// The RAM expert cache (stream/ram_expert_cache.h): a mixture of experts on the CPU with a quarter
// of its weights in RAM, routed experts read from disk when the router picks them, must compute
// what the resident model computes, bit for bit (experts repacked as the resident load packs the
// stacked tensors; CTest's isa_ref.* variant runs it where the reference kernels pack). Prefetch
// changes only what is read when; its accuracy and the cache's counters are checked exactly on
// hand-made routings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"
#include "stream/ram_expert_cache.h"
#include "model_test_util.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace sluice::stream {
namespace {

constexpr int kExperts = 16;  // per layer: the attention part is then a small share of the file
const std::vector<int32_t> kPrompt = {1, 5, 9, 17, 33, 2, 40, 11};

uint64_t weight_bytes(const std::string& path) {
  auto f = gguf::File::open(path);
  uint64_t b = 0;
  for (const auto& t : f->tensors()) b += t.nbytes;
  return b;
}

test::GreedyRun resident_run(const std::string& path, int n) {
  model::LoadOptions o;
  o.backend = model::BackendKind::kCpu;
  o.n_threads = 2;
  o.n_ctx = 128;
  auto m = model::Model::load(path, o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (!m.is_ok()) return {};
  return test::greedy_run(**m, kPrompt, n);
}

Result<std::unique_ptr<model::Model>> load_cached(const std::string& path, const RamExpertOptions& ro,
                                                  RamExpertCache** out) {
  model::LoadOptions o;
  o.backend = model::BackendKind::kCpu;
  o.n_threads = 2;
  o.n_ctx = 128;
  o.layer_source = ram_expert_source(ro, out);
  return model::Model::load(path, o);
}

// A quarter of the file in RAM (a fraction of the experts cached), with and without prefetch, and a
// cache of only one layer's active experts (a prefill's experts placed in groups): the resident
// run's tokens and logits bit for bit; every expert use counted once as a hit or a miss, misses
// read from disk.
TEST(StreamRamExperts, QuarterBudgetMatchesResident) {
  const std::string path = test::write_synthetic_moe(quant::Type::kQ8_0, "ram_experts", kExperts);
  const test::GreedyRun ref = resident_run(path, 10);
  ASSERT_EQ(ref.tokens.size(), 10u);
  const uint64_t quarter = weight_bytes(path) / 4;
  struct Case {
    const char* name;
    bool prefetch;
    uint64_t cache_slots;  // 0: what the budget holds
  };
  for (const Case c : {Case{"prefetch", true, 0}, Case{"no prefetch", false, 0}, Case{"two slots", true, 2}}) {
    SCOPED_TRACE(c.name);
    RamExpertOptions ro;
    ro.ram_budget = quarter;
    ro.prefetch = c.prefetch;
    const std::string trace_path = path + ".trace.csv";
    auto trace = TraceWriter::open(trace_path);
    ASSERT_TRUE(trace.is_ok());
    ro.trace = trace->get();
    RamExpertCache* rc = nullptr;
    if (c.cache_slots) {
      // One slot's size from the plan the budget gives.
      auto f = gguf::File::open(path);
      ASSERT_TRUE(f.is_ok());
      const model::ArchSpec* arch = model::find_arch("llama");
      auto cfg = model::read_config(*f, *arch);
      ASSERT_TRUE(cfg.is_ok());
      auto w = model::load_weights(*f, *arch, *cfg);
      ASSERT_TRUE(w.is_ok());
      backend::CpuOptions co;
      co.n_threads = 1;
      auto plan = plan_ram_experts(*w, *backend::make_cpu_backend(co), ro);
      ASSERT_TRUE(plan.is_ok()) << plan.status().message();
      ro.cache_bytes = c.cache_slots * plan->slot_bytes;
    }
    auto m = load_cached(path, ro, &rc);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    ASSERT_NE(rc, nullptr);
    EXPECT_LE(rc->owned_bytes(), quarter);
    // Where this CPU packs Q8_0, every expert is read into a staging buffer and repacked.
    backend::CpuOptions co;
    co.n_threads = 1;
    const bool packs = backend::make_cpu_backend(co)->repacked_bytes({quant::Type::kQ8_0, 256, 256}) > 0;
    EXPECT_EQ(rc->plan().staging_bytes > 0, packs);
    EXPECT_LT(uint64_t(rc->cache_slots()), uint64_t(test::kMoeL * kExperts)) << "the budget must not hold every expert";
    if (c.cache_slots) {
      EXPECT_EQ(uint64_t(rc->cache_slots()), c.cache_slots);
    }
    const test::GreedyRun got = test::greedy_run(**m, kPrompt, 10);
    EXPECT_EQ(got.tokens, ref.tokens);
    EXPECT_EQ(got.first_logits, ref.first_logits);
    const RamExpertStats& s = rc->stats();
    EXPECT_EQ(s.decode_passes, 9u);
    EXPECT_EQ(s.decode_uses, uint64_t(9 * test::kMoeL * test::kMoeK));
    EXPECT_EQ(s.uses, s.hits + s.misses);
    EXPECT_GT(s.misses, 0u);
    const uint64_t expert_bytes = 3ull * 256 * 272;  // Q8_0: 256 rows of 272 bytes, three matrices
    EXPECT_EQ(s.disk_bytes, (s.misses + s.prefetch_reads) * expert_bytes);
    EXPECT_EQ(s.hit_bytes, s.hits * expert_bytes);
    if (c.prefetch) {
      // Layers 1 and 2 are predicted in every decode pass (and in none of the 8-token prefill).
      EXPECT_EQ(s.decode_predicted_actual, uint64_t(9 * (test::kMoeL - 1) * test::kMoeK));
      EXPECT_LE(s.decode_predicted_used, s.decode_predicted_actual);
      EXPECT_LE(s.prefetch_used, s.prefetch_reads);
      std::printf("[ info ] %s: %d of %d experts cached, decode hit rate %.1f%%, prefetch accuracy %.1f%%, "
                  "%llu of %llu reads ahead used\n",
                  c.name, rc->cache_slots(), test::kMoeL * kExperts,
                  100.0 * double(s.decode_hits) / double(s.decode_uses),
                  100.0 * double(s.decode_predicted_used) / double(s.decode_predicted_actual),
                  (unsigned long long)s.prefetch_used, (unsigned long long)s.prefetch_reads);
    } else {
      EXPECT_EQ(s.prefetch_reads, 0u);
      EXPECT_EQ(s.predicted_actual, 0u);
    }
    // The trace: one "expert" row per use, tiers as counted.
    const uint64_t uses = s.uses, misses = s.misses;
    ASSERT_TRUE((*trace)->flush().is_ok());
    std::ifstream in(trace_path);
    std::string line;
    uint64_t rows = 0, disk = 0;
    while (std::getline(in, line)) {
      if (line.find(",expert,") == std::string::npos) continue;
      ++rows;
      disk += line.find(",disk,") != std::string::npos ? 1 : 0;
    }
    EXPECT_EQ(rows, uses);
    EXPECT_EQ(disk, misses);
    std::filesystem::remove(trace_path);
  }
  std::filesystem::remove(path);
}

// Hand-made passes: a prediction is scored against what the layer then uses, predicted experts
// missing from the cache are read ahead and count as hits when used, and eviction keeps the most
// used experts.
TEST(StreamRamExperts, PrefetchAndEvictionAreCountedExactly) {
  const std::string path = test::write_synthetic_moe(quant::Type::kQ8_0, "ram_experts_count", 8);
  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.is_ok());
  const model::ArchSpec* arch = model::find_arch("llama");
  auto cfg = model::read_config(*f, *arch);
  ASSERT_TRUE(cfg.is_ok());
  auto w = model::load_weights(*f, *arch, *cfg);
  ASSERT_TRUE(w.is_ok());
  backend::CpuOptions co;
  co.n_threads = 1;
  auto be = backend::make_cpu_backend(co);
  RamExpertOptions ro;
  ro.ram_budget = uint64_t(1) << 30;
  ro.prefetch = true;
  auto plan = plan_ram_experts(*w, *be, ro);
  ASSERT_TRUE(plan.is_ok());
  ro.cache_bytes = 4 * plan->slot_bytes;  // 4 slots
  auto rc = RamExpertCache::create(*f, *w, *be, ro);
  ASSERT_TRUE(rc.is_ok()) << rc.status().message();
  RamExpertCache& c = **rc;
  ASSERT_EQ(c.cache_slots(), 4);
  auto batches = [](std::vector<int32_t> experts) {
    std::vector<model::ExpertBatch> b;
    for (int32_t e : experts) b.push_back({e, {0}, {1.0f}});
    return b;
  };
  auto place = [&](int layer, std::vector<int32_t> experts) {
    const auto b = batches(experts);
    std::vector<model::ExpertPlacement::Site> sites(b.size());
    ASSERT_TRUE(c.place(layer, 1, b, sites).is_ok());
    for (size_t i = 0; i < b.size(); ++i) {
      // The site is the expert's bytes (unpacked Q8_0 here, or its packed copy).
      const model::TensorRef& t = w->layers[size_t(layer)].gate_exps;
      if (!sites[i].gate.packed) {
        EXPECT_EQ(0, std::memcmp(sites[i].gate.data, t.expert(b[i].expert).data, t.expert_bytes()));
      }
      EXPECT_EQ(sites[i].gate.ne1, t.ne1);
      EXPECT_FALSE(sites[i].host);
    }
  };
  model::MoeRouting predicted;
  predicted.n_tokens = 1;
  predicted.n_used = 2;
  predicted.weights = {0.5f, 0.5f};

  ASSERT_TRUE(c.begin_pass(1).is_ok());
  ASSERT_NE(c.predictor(0), nullptr);
  EXPECT_EQ(c.predictor(2), nullptr);  // the last layer has no next one
  place(0, {1, 2});                    // 2 misses
  predicted.experts = {3, 5};
  c.predicted(1, predicted);           // both read ahead (2 free slots)
  place(1, {3, 4});                    // 3 predicted and read ahead: a hit; 4 a miss
  const RamExpertStats& s = c.stats();
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.prefetch_reads, 2u);
  EXPECT_EQ(s.prefetch_used, 1u);
  EXPECT_EQ(s.decode_predicted_used, 1u);
  EXPECT_EQ(s.decode_predicted_actual, 2u);
  EXPECT_EQ(s.layer_hits[1], 1u);
  EXPECT_EQ(s.layer_uses[1], 2u);
  // Layer 0's experts 1 and 2 used again (twice now each); expert 5 of layer 1, read ahead and never
  // used, went first (for expert 4); layer 2's misses then evict layer 1's (used once).
  ASSERT_TRUE(c.begin_pass(1).is_ok());
  place(0, {1, 2});
  EXPECT_EQ(s.hits, 3u);
  place(2, {0, 7});
  EXPECT_EQ(s.misses, 5u);
  ASSERT_TRUE(c.begin_pass(1).is_ok());
  place(0, {1, 2});  // still cached: the least used (layer 1's 3 and 4, used once) were evicted
  EXPECT_EQ(s.hits, 5u);
  EXPECT_EQ(s.decode_predicted_actual, 2u);

  // prefetch_top 1: only each token's first-ranked prediction is read ahead; the accuracy still
  // scores every predicted expert.
  ro.prefetch_top = 1;
  auto rc1 = RamExpertCache::create(*f, *w, *be, ro);
  ASSERT_TRUE(rc1.is_ok()) << rc1.status().message();
  RamExpertCache& c1 = **rc1;
  ASSERT_TRUE(c1.begin_pass(1).is_ok());
  std::vector<model::ExpertPlacement::Site> sites(1);
  const auto b0 = batches({6});
  ASSERT_TRUE(c1.place(0, 1, b0, sites).is_ok());
  predicted.experts = {5, 3};  // expert 5 ranked first
  c1.predicted(1, predicted);
  EXPECT_EQ(c1.stats().prefetch_reads, 1u);
  const auto b1 = batches({3, 5});
  sites.resize(2);
  ASSERT_TRUE(c1.place(1, 1, b1, sites).is_ok());
  EXPECT_EQ(c1.stats().prefetch_used, 1u);
  EXPECT_EQ(c1.stats().hits, 1u);  // 5, read ahead
  EXPECT_EQ(c1.stats().decode_predicted_used, 2u);
  std::filesystem::remove(path);
}

TEST(StreamRamExperts, ErrorsAreClear) {
  const std::string path = test::write_synthetic_moe(quant::Type::kQ8_0, "ram_experts_err", 8);
  RamExpertOptions ro;
  ro.ram_budget = 100000;  // below the attention weights
  auto m = load_cached(path, ro, nullptr);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("too small for the expert cache"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("one layer's active experts"), std::string::npos) << m.status().message();
  // A cap below one layer's active experts.
  ro.ram_budget = uint64_t(1) << 30;
  ro.cache_bytes = 1000;
  m = load_cached(path, ro, nullptr);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("active experts need 2"), std::string::npos) << m.status().message();
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sluice::stream
