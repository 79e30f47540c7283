// The planner is a pure function: these tests pin its decisions on hand-checkable inputs.
#include "stream/plan.h"

#include <gtest/gtest.h>

namespace sluice::stream {
namespace {

constexpr uint64_t kMiB = 1024ull * 1024;
constexpr uint64_t kGiB = 1024ull * kMiB;

PlanInput dense(int layers, uint64_t layer_bytes) {
  PlanInput in;
  for (int i = 0; i < layers; ++i) in.units.push_back({"blk." + std::to_string(i), layer_bytes});
  in.bw = {.vram = 2000e9, .h2d = 50e9, .disk = 2e9, .cpu = 50e9, .dram = 100e9};
  return in;
}

int count(const Plan& p, Home h) {
  int c = 0;
  for (const auto& u : p.units) c += u.home == h;
  return c;
}

TEST(StreamPlan, ParsesByteSizes) {
  EXPECT_EQ(*parse_byte_size("16G"), 16 * kGiB);
  EXPECT_EQ(*parse_byte_size("512M"), 512 * kMiB);
  EXPECT_EQ(*parse_byte_size("1.5G"), 3 * kGiB / 2);
  EXPECT_EQ(*parse_byte_size("4096"), 4096u);
  EXPECT_EQ(*parse_byte_size("2GiB"), 2 * kGiB);
  for (const char* bad : {"", "G", "12X", "-1G", "1.2.3G", "16GG", "1e400"}) {
    auto r = parse_byte_size(bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_NE(r.status().message().find("bad byte size"), std::string::npos);
  }
}

TEST(StreamPlan, EverythingResidentWhenItFits) {
  PlanInput in = dense(10, 100 * kMiB);
  in.vram_budget = 2 * kGiB;
  in.ram_budget = 0;
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(count(*p, Home::kVram), 10);
  EXPECT_EQ(p->n_slots, 0);
  EXPECT_EQ(p->bound, "compute");
  EXPECT_NEAR(p->token_seconds, 1000.0 * kMiB / 2000e9, 1e-9);
}

TEST(StreamPlan, StreamsTheRestThroughTwoSlots) {
  // 80 layers of 500 MiB in a 16 GiB budget with 1 GiB reserved: 15 GiB - 2 slots (1000 MiB)
  // leaves room for 28 resident layers (14000 MiB); 52 layers stream from pinned RAM.
  PlanInput in = dense(80, 500 * kMiB);
  in.vram_budget = 16 * kGiB;
  in.vram_reserved = 1 * kGiB;
  in.ram_budget = 64 * kGiB;
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(count(*p, Home::kVram), 28);
  EXPECT_EQ(count(*p, Home::kRam), 52);
  EXPECT_EQ(count(*p, Home::kDisk), 0);
  EXPECT_EQ(p->n_slots, 2);
  EXPECT_EQ(p->slot_bytes, 500 * kMiB);
  EXPECT_EQ(p->bound, "h2d");
  EXPECT_NEAR(p->token_seconds, 52.0 * 500 * kMiB / 50e9, 1e-9);
  EXPECT_LE(p->resident_bytes + 2 * p->slot_bytes, in.vram_budget - in.vram_reserved);
}

TEST(StreamPlan, RamBudgetSendsLayersToDiskWithStaging) {
  PlanInput in = dense(20, 1 * kGiB);
  in.vram_budget = 6 * kGiB;  // 4 resident + 2 slots
  in.ram_budget = 10 * kGiB;  // 8 layers + 2 staging slots
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(count(*p, Home::kVram), 4);
  EXPECT_EQ(count(*p, Home::kRam), 8);
  EXPECT_EQ(count(*p, Home::kDisk), 8);
  EXPECT_EQ(p->staging_bytes, 2 * kGiB);
  EXPECT_EQ(p->bound, "disk");
  EXPECT_NEAR(p->t_disk, 8.0 * kGiB / 2e9, 1e-9);
}

TEST(StreamPlan, KeepsTheLargestUnitsResident) {
  // One big output head and small layers: resident head shrinks the slot for everything else.
  PlanInput in = dense(8, 100 * kMiB);
  in.units.push_back({"output", 800 * kMiB});
  in.vram_budget = 1200 * kMiB;
  in.ram_budget = 8 * kGiB;
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->units.back().home, Home::kVram);
  EXPECT_EQ(p->slot_bytes, 100 * kMiB);
}

TEST(StreamPlan, TooSmallBudgetStatesTheMinimum) {
  PlanInput in = dense(4, 1 * kGiB);
  in.vram_budget = 1 * kGiB;
  in.ram_budget = 8 * kGiB;
  auto p = make_plan(in);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("at least 2.00 GiB"), std::string::npos) << p.status().message();

  in.vram_budget = 4 * kGiB;
  in.vram_reserved = 5 * kGiB;
  EXPECT_FALSE(make_plan(in).is_ok());

  in.vram_reserved = 0;
  in.vram_budget = 2 * kGiB;
  in.ram_budget = 1 * kGiB;  // cannot even stage one disk read pair
  auto q = make_plan(in);
  ASSERT_FALSE(q.is_ok());
  EXPECT_NE(q.status().message().find("staging"), std::string::npos) << q.status().message();
}

TEST(StreamPlan, CpuExecutorBalancesAgainstPcie) {
  // 60 streamed GiB at 50 GB/s H2D vs a 50 GB/s CPU sharing 100 GB/s of DRAM: handing part of
  // the pinned layers to the CPU must beat pure streaming.
  PlanInput in = dense(60, 1 * kGiB);
  in.vram_budget = 2 * kGiB;
  in.ram_budget = 128 * kGiB;
  auto pure = make_plan(in);
  in.allow_cpu_executor = true;
  auto mixed = make_plan(in);
  ASSERT_TRUE(pure.is_ok() && mixed.is_ok());
  EXPECT_GT(mixed->cpu_exec_bytes, 0u);
  EXPECT_LT(mixed->token_seconds, pure->token_seconds * 0.9);
  int cpu_units = 0;
  for (const auto& u : mixed->units) {
    if (u.exec == Executor::kCpu) {
      ++cpu_units;
      EXPECT_EQ(u.home, Home::kRam);
    }
  }
  EXPECT_GT(cpu_units, 0);
}

TEST(StreamPlan, CpuOnlyStreamsFromDiskThroughRamSlots) {
  PlanInput in = dense(12, 1 * kGiB);
  in.has_gpu = false;
  in.ram_budget = 3 * kGiB;  // a quarter of the model
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(count(*p, Home::kRam), 1);
  EXPECT_EQ(count(*p, Home::kDisk), 11);
  EXPECT_EQ(p->n_slots, 2);
  EXPECT_LE(p->resident_bytes + uint64_t(p->n_slots) * p->slot_bytes, in.ram_budget);
  for (const auto& u : p->units) EXPECT_EQ(u.exec, Executor::kCpu);
  EXPECT_FALSE(p->describe(in).empty());
}

TEST(StreamPlan, RejectsNonsense) {
  PlanInput in;
  EXPECT_FALSE(make_plan(in).is_ok());
  in = dense(2, kMiB);
  in.bw.h2d = 0;
  EXPECT_FALSE(make_plan(in).is_ok());
}

}  // namespace
}  // namespace sluice::stream
