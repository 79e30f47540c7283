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
  EXPECT_EQ(*parse_vram_budget("16G"), 16 * kGiB);
  EXPECT_EQ(*parse_vram_budget("auto"), 0u);  // the GPU's free memory at load
  EXPECT_FALSE(parse_vram_budget("0").is_ok());
  EXPECT_NE(parse_vram_budget("Auto").status().message().find("or auto"), std::string::npos);
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

TEST(StreamPlan, TiesKeepEverythingResident) {
  // Slow compute (10 x 100 MiB at 100 GB/s = 10.5 ms) hides the copy of up to 5 streamed layers
  // (2.1 ms each at 50 GB/s): those plans tie with the all-resident one, which must win.
  PlanInput in = dense(10, 100 * kMiB);
  in.bw.vram = 100e9;
  in.vram_budget = 1000 * kMiB;
  in.ram_budget = 4 * kGiB;
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(count(*p, Home::kVram), 10);
  EXPECT_EQ(p->n_slots, 0);
  EXPECT_EQ(p->bound, "compute");
  // Less VRAM: the most resident layers that fit with the slots (7 + 2 slots of 100 MiB; 8 + 2
  // slots is 1000 MiB).
  in.vram_budget = 999 * kMiB;
  p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(count(*p, Home::kVram), 7);
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
  // Alternating whole layers here (the row split's balance is SplitBalancesCpuAgainstCopies...).
  PlanInput in = dense(60, 1 * kGiB);
  in.vram_budget = 2 * kGiB;
  in.ram_budget = 128 * kGiB;
  auto pure = make_plan(in);
  in.allow_cpu_executor = true;
  in.hybrid_mode = HybridMode::kAlternate;
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

// Four equal units that must all stream (the VRAM holds the 2 slots and nothing else), on round
// numbers: bytes 1e9 and params 1e9 per unit; copy 1e9 / 1e9 = 1 s; GPU exec max(1e9 / 1e12,
// 2e9 / 1e14) = 1 ms; CPU exec max(1e9 / 1e9, 2e9 / 4e10) = 1 s; switch 10 ms; DRAM 1e12 (4 ms).
PlanInput four_streamed() {
  PlanInput in;
  for (int i = 0; i < 4; ++i) in.units.push_back({"blk." + std::to_string(i), 1'000'000'000ull, 1'000'000'000ull});
  in.vram_budget = 2'500'000'000ull;  // 2 slots (2e9) fit, one more resident unit (3e9) does not
  in.ram_budget = 8'000'000'000ull;
  in.allow_cpu_executor = true;
  in.bw = {.vram = 1e12, .h2d = 1e9, .disk = 1e9, .cpu = 1e9, .dram = 1e12, .cpu_flops = 4e10, .gpu_flops = 1e14,
           .switch_seconds = 0.01, .split_seconds = 0.05};
  return in;
}

std::vector<int> cpu_positions(const Plan& p) {
  std::vector<int> v;
  for (size_t i = 0; i < p.units.size(); ++i) {
    if (p.units[i].exec == Executor::kCpu) v.push_back(int(i));
  }
  return v;
}

TEST(StreamPlan, TheCpusCopiesOfItsUnitsCountAgainstTheRamBudget) {
  // 60 pinned GiB, and each unit the CPU computes holds its packed copy (1 GiB) on top.
  PlanInput in = dense(60, 1 * kGiB);
  for (Unit& u : in.units) u.cpu_copy_bytes = kGiB;
  in.vram_budget = 2 * kGiB;
  in.allow_cpu_executor = true;
  auto on_cpu = [](const Plan& p) {
    int c = 0;
    for (const auto& u : p.units) c += u.exec != Executor::kGpu;
    return c;
  };
  auto host_bytes = [](const Plan& p) { return p.ram_bytes + p.staging_bytes + p.cpu_copy_bytes; };
  for (HybridMode mode : {HybridMode::kAuto, HybridMode::kAlternate}) {
    in.hybrid_mode = mode;
    in.ram_budget = 128 * kGiB;
    auto roomy = make_plan(in);
    ASSERT_TRUE(roomy.is_ok()) << roomy.status().message();
    const int n_roomy = on_cpu(*roomy);
    EXPECT_GT(n_roomy, 10);
    EXPECT_EQ(roomy->cpu_copy_bytes, uint64_t(n_roomy) * kGiB);
    EXPECT_LE(host_bytes(*roomy), in.ram_budget);
    // Room for the 60 pinned units and 10 copies: at most 10 on the CPU, all 60 still pinned.
    in.ram_budget = 70 * kGiB;
    auto tight = make_plan(in);
    ASSERT_TRUE(tight.is_ok()) << tight.status().message();
    EXPECT_GT(on_cpu(*tight), 0);
    EXPECT_LE(on_cpu(*tight), 10);
    EXPECT_EQ(count(*tight, Home::kRam), 60);
    EXPECT_LE(host_bytes(*tight), in.ram_budget);
    EXPECT_GT(tight->token_seconds, roomy->token_seconds);
    // No room for a copy: the CPU computes nothing, the plan streams every unit.
    in.ram_budget = 60 * kGiB;
    auto none = make_plan(in);
    ASSERT_TRUE(none.is_ok()) << none.status().message();
    EXPECT_EQ(on_cpu(*none), 0);
    EXPECT_EQ(none->cpu_copy_bytes, 0u);
  }
}

TEST(StreamPlan, HybridChoosesTwoOfFourSpreadEvenly) {
  // Count c of CPU units (positions floor((k + 0.5) * 4 / c)); a pass starts and ends on the GPU
  // (embedding rows, output head), so a CPU unit first or last costs a switch too:
  //   c=0: exec 4 x 1 ms = 0.004, h2d 4 x 1 s = 4                     -> 4 s
  //   c=1: [G G C G]: exec 1 + 0.003 + 2 switches = 1.023, h2d 3        -> 3 s
  //   c=2: [G C G C] (positions 1, 3): exec 2 + 0.002 + 4 switches 0.04 = 2.042; its two GPU
  //        units are no more than the 2 slots, so each stays in its own (kept: no copies per
  //        pass, DRAM only the CPU's 2e9 = 2 ms) -> 2.042 s
  //   c=3: [C G C C] (positions 0, 2, 3): exec >= 3 -> > 3 s;  c=4: exec 4 -> 4 s
  PlanInput in = four_streamed();
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(cpu_positions(*p), (std::vector<int>{1, 3}));
  EXPECT_EQ(count(*p, Home::kRam), 4);
  EXPECT_EQ(p->n_switches, 4);
  EXPECT_NEAR(p->t_cpu, 2.0, 1e-12);
  EXPECT_NEAR(p->t_gpu, 0.002, 1e-12);
  EXPECT_NEAR(p->t_exec, 2.042, 1e-12);
  EXPECT_EQ(p->kept_units, 2);
  EXPECT_NEAR(p->t_h2d, 0.0, 1e-15);
  EXPECT_NEAR(p->t_dram, 0.002, 1e-12);
  EXPECT_NEAR(p->t_pipeline, 2.042, 1e-9);
  EXPECT_NEAR(p->token_seconds, 2.042, 1e-9);
  EXPECT_EQ(p->bound, "compute");
  ASSERT_EQ(p->unit_seconds.size(), 4u);
  EXPECT_NEAR(p->unit_seconds[0], 0.001, 1e-15);
  EXPECT_NEAR(p->unit_seconds[1], 1.0, 1e-15);
  EXPECT_EQ(p->cpu_exec_bytes, 2'000'000'000ull);
  // One line per unit once the plan has CPU units, with its predicted time; then the totals.
  const std::string d = p->describe(in);
  EXPECT_NE(d.find("blk.1                        B:ram   cpu"), std::string::npos) << d;
  EXPECT_NE(d.find("1000.000 ms"), std::string::npos) << d;
  EXPECT_NE(d.find("predicted token time 2042.00 ms (0.49 tok/s), bound by compute"), std::string::npos) << d;
  EXPECT_NE(d.find("exec 2042.00 ms (cpu 2000.00 + gpu 2.00 + 4 switches 40.00)"), std::string::npos) << d;

  // Without the CPU executor: all four copied, 4 s, bound by the copies.
  in.allow_cpu_executor = false;
  auto pure = make_plan(in);
  ASSERT_TRUE(pure.is_ok());
  EXPECT_TRUE(cpu_positions(*pure).empty());
  EXPECT_NEAR(pure->token_seconds, 4.0, 1e-9);
  EXPECT_EQ(pure->n_switches, 0);
  EXPECT_EQ(pure->bound, "h2d");
}

TEST(StreamPlan, SwitchesCountExecutorChangesOnly) {
  // score_plan on a forced placement: executors G C C G (A, B, B, B): 2 switches; exec =
  // 1 ms + 1 s + 1 s + 1 ms + 2 x 10 ms = 2.022 s. One slot: blk.3, the one unit the GPU
  // computes from a slot, has it to itself and is kept there (no copies per pass).
  PlanInput in = four_streamed();
  Plan p;
  p.units = {{Home::kVram, Executor::kGpu}, {Home::kRam, Executor::kCpu}, {Home::kRam, Executor::kCpu},
             {Home::kRam, Executor::kGpu}};
  p.n_slots = 1;
  p.slot_bytes = 1'000'000'000ull;
  score_plan(in, p);
  EXPECT_EQ(p.n_switches, 2);
  EXPECT_NEAR(p.t_exec, 2.022, 1e-12);
  EXPECT_EQ(p.kept_units, 1);
  EXPECT_NEAR(p.t_h2d, 0.0, 1e-15);
  EXPECT_NEAR(p.t_dram, 0.002, 1e-12);  // the CPU's two units only
  EXPECT_EQ(p.resident_bytes, 1'000'000'000ull);
  EXPECT_EQ(p.cpu_exec_bytes, 2'000'000'000ull);

  // G C G G: two GPU units through one slot take turns in it, so both are copied every pass
  // (1 switch back after blk.1; exec 1 s + 3 ms + 2 x 10 ms).
  p.units[2] = {Home::kRam, Executor::kGpu};
  score_plan(in, p);
  EXPECT_EQ(p.kept_units, 0);
  EXPECT_EQ(p.n_switches, 2);
  EXPECT_NEAR(p.t_exec, 1.023, 1e-12);
  EXPECT_NEAR(p.t_h2d, 2.0, 1e-12);
  EXPECT_NEAR(p.t_dram, 0.003, 1e-12);
}

TEST(StreamPlan, CpuRunsAtItsAloneRateOnceTheCopiesAreDone) {
  // four_streamed with the CPU at 1e9 B/s while copies run and 2e9 alone.
  PlanInput in = four_streamed();
  in.bw.cpu_alone = 2e9;
  Plan p;
  p.units.assign(4, {Home::kRam, Executor::kCpu});
  p.units[0].exec = p.units[1].exec = Executor::kGpu;  // G G C C, one slot: both copied
  p.n_slots = 1;
  p.slot_bytes = 1'000'000'000ull;
  in.bw.h2d = 2e9;  // copies 2e9 / 2e9 = 1 s: the CPU's first 1e9 at 1e9 (1 s), the other 1e9
                    // alone at 2e9 (0.5 s): 1.5 s for its two units
  score_plan(in, p);
  EXPECT_NEAR(p.t_h2d, 1.0, 1e-12);
  EXPECT_NEAR(p.t_cpu, 1.5, 1e-12);
  EXPECT_NEAR(p.unit_seconds[2], 0.75, 1e-12);
  in.bw.h2d = 1e9;  // copies 2 s outlast the CPU's 2 s at the shared rate: no gain
  score_plan(in, p);
  EXPECT_NEAR(p.t_cpu, 2.0, 1e-12);
  // Nothing copied (the GPU's units kept in two slots, or every B unit on the CPU): alone rate.
  p.n_slots = 2;
  score_plan(in, p);
  EXPECT_EQ(p.kept_units, 2);
  EXPECT_NEAR(p.t_cpu, 1.0, 1e-12);
  in.bw.cpu_alone = 0;  // not measured: the CPU's one rate
  score_plan(in, p);
  EXPECT_NEAR(p.t_cpu, 2.0, 1e-12);
}

TEST(StreamPlan, LargeBatchKeepsTheCpuOut) {
  // The same four units at batch 64: CPU exec max(1 s, 64 x 2e9 / 4e10 = 3.2 s) = 3.2 s, GPU
  // max(1 ms, 64 x 2e9 / 1e14 = 1.28 ms) = 1.28 ms. c=0: 4 copies = 4 s.
  // c=1 [G G C G]: the resource bounds alone say max(3.2 + 3 x 0.00128 + 0.02, 3) = 3.224 s, but
  // the ring cannot absorb 3.2 s of CPU: with 2 slots, G1's copy waits for the previous pass's G3
  // to release its slot, and G3's copy for G0's, so per pass: copy G1 (1 s) + G1 (1.28 ms) + switch
  // + C2 (3.2 s) + switch + G3 (1.28 ms) = 4.22256 s > 4 s. c >= 2: >= 6.4 s. So c = 0.
  // (Alternating only: a row split at a small share still pays here, SplitPaysAtLargeBatch.)
  PlanInput in = four_streamed();
  in.batch = 64;
  in.hybrid_mode = HybridMode::kAlternate;
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_TRUE(cpu_positions(*p).empty());
  EXPECT_NEAR(p->token_seconds, 4.0, 1e-9);
  EXPECT_NEAR(p->unit_seconds[0], 0.00128, 1e-15);

  Plan one = *p;
  one.units[2].exec = Executor::kCpu;
  score_plan(in, one);
  EXPECT_NEAR(one.t_exec, 3.2 + 3 * 0.00128 + 0.02, 1e-12);
  EXPECT_NEAR(one.t_pipeline, 4.22256, 1e-9);
  EXPECT_EQ(one.bound, "prefetch");
  // Describe gives the pass time and tokens per second of the batch.
  EXPECT_NE(p->describe(in).find("predicted pass time 4000.00 ms for 64 tokens (16.00 tok/s)"), std::string::npos)
      << p->describe(in);
}

TEST(StreamPlan, BatchPlacementKeepsHomesAndTakesASubsetOfTheCpuUnits) {
  // four_streamed's decode plan: [G C G C], its GPU units kept in the 2 slots, 2.042 s. For a pass
  // of n tokens a CPU unit takes max(1 s, n x 2e9 / 4e10) = max(1, 0.05 n) s, a GPU unit
  // max(1 ms, n x 2e9 / 1e14). Candidates c of its CPU units {1, 3} (the k-th at floor((k + 0.5) x
  // 2 / c)):
  //   n = 30 (CPU unit 1.5 s): c=2 [G C G C]: 2 x 1.5 + 2 x 1 ms + 4 switches = 3.042 s;
  //     c=1 [G G G C] (unit 3): exec 3 ms + 1.5 s + 2 switches = 1.523 s under 3 copies of 1 s; the
  //     copies of the next pass's first two GPU units run during the CPU unit (their slots are
  //     free by then), so the copy engine never waits: 3.0 s, bound by h2d; c=0: 4 copies, 4 s.
  //   n = 64 (CPU unit 3.2 s): c=1: the third copy waits for the first unit's slot, which the
  //     next pass frees after the CPU's 3.2 s: per pass unit 0 (1.28 ms), then the copy (1 s),
  //     unit 2 (1.28 ms), 2 switches and the CPU unit: 4.22256 s > 4 s of c=0.
  //   n = 1: the decode placement itself.
  PlanInput in = four_streamed();
  auto decode = make_plan(in);
  ASSERT_TRUE(decode.is_ok()) << decode.status().message();
  ASSERT_EQ(cpu_positions(*decode), (std::vector<int>{1, 3}));

  Plan one = batch_placement(in, *decode);
  EXPECT_EQ(cpu_positions(one), (std::vector<int>{1, 3}));
  EXPECT_NEAR(one.token_seconds, 2.042, 1e-9);

  in.batch = 30;
  Plan b30 = batch_placement(in, *decode);
  EXPECT_EQ(cpu_positions(b30), (std::vector<int>{3}));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b30.units[i].home, decode->units[i].home) << i;
  EXPECT_EQ(b30.n_slots, decode->n_slots);
  EXPECT_EQ(b30.cpu_exec_bytes, 1'000'000'000ull);
  EXPECT_EQ(b30.kept_units, 0);
  EXPECT_NEAR(b30.t_exec, 1.523, 1e-9);
  EXPECT_NEAR(b30.t_h2d, 3.0, 1e-9);
  EXPECT_NEAR(b30.token_seconds, 3.0, 1e-9);
  EXPECT_EQ(b30.bound, "h2d");
  Plan d30 = *decode;
  score_plan(in, d30);
  EXPECT_NEAR(d30.token_seconds, 3.042, 1e-9);

  in.batch = 64;
  Plan b64 = batch_placement(in, *decode);
  EXPECT_TRUE(cpu_positions(b64).empty());
  EXPECT_EQ(b64.cpu_exec_bytes, 0u);
  EXPECT_NEAR(b64.token_seconds, 4.0, 1e-9);
  Plan c1 = b30;
  score_plan(in, c1);
  EXPECT_NEAR(c1.t_pipeline, 4.22256, 1e-9);
}

TEST(StreamPlan, BatchPlacementCountPlacesExactlyThatManyCpuUnits) {
  // The same decode plan as above; batch_placement_count(c) is the spread batch_placement scores
  // for c (so at n = 30 its choice, c = 1, is the same plan), scored at in.batch.
  PlanInput in = four_streamed();
  auto decode = make_plan(in);
  ASSERT_TRUE(decode.is_ok()) << decode.status().message();
  EXPECT_EQ(cpu_unit_count(*decode), 2);
  in.batch = 30;
  const Plan best = batch_placement(in, *decode);
  const Plan c1 = batch_placement_count(in, *decode, 1);
  EXPECT_EQ(cpu_positions(c1), cpu_positions(best));
  EXPECT_NEAR(c1.token_seconds, best.token_seconds, 1e-12);
  EXPECT_EQ(c1.cpu_exec_bytes, best.cpu_exec_bytes);
  const Plan c2 = batch_placement_count(in, *decode, 2);
  EXPECT_EQ(cpu_positions(c2), (std::vector<int>{1, 3}));
  EXPECT_NEAR(c2.token_seconds, 3.042, 1e-9);
  EXPECT_EQ(c2.cpu_exec_bytes, 2'000'000'000ull);
  const Plan c0 = batch_placement_count(in, *decode, 0);
  EXPECT_TRUE(cpu_positions(c0).empty());
  EXPECT_NEAR(c0.token_seconds, 4.0, 1e-9);
  for (const Plan* p : {&c0, &c1, &c2}) {
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(p->units[i].home, decode->units[i].home) << i;
  }
  EXPECT_DEATH(batch_placement_count(in, *decode, 3), "outside 0");
}

TEST(StreamPlan, SeventyBOnTheH100HostDecodeVsPrefill) {
  // 70B Q4_K_M shape (80 x 0.544 GB / 0.87e9 params + head 0.82 GB / 1.05e9) on the measured
  // H100 host with 16 GiB: 24 layers + head resident, 56 in pinned RAM.
  // Decode: CPU units 0.544 / 75 = 7.3 ms against copies of 9.9 ms: the plan uses the CPU and is
  // DRAM-bound, 56 x 0.544 GB / 100 GB/s = 304.6 ms; fewest CPU units at that bound: 26 (30 copies
  // x 9.93 ms = 297.8 ms <= 304.6, 29 would need 31 x 9.93 = 307.7).
  // Prefill of 64: a CPU unit computes 64 x 1.74e9 / 2e12 = 55.7 ms while the 2 slots absorb 2
  // copies (19.9 ms), so every CPU unit leaves the copy engine idle for longer than the copy it
  // saves: no CPU units. The same at 512 (445 ms per CPU unit).
  PlanInput in;
  for (int i = 0; i < 80; ++i) in.units.push_back({"blk." + std::to_string(i), 544'000'000ull, 870'000'000ull});
  in.units.push_back({"output", 820'000'000ull, 1'050'000'000ull});
  in.vram_budget = 16 * kGiB;
  in.vram_reserved = 2'000'000'000ull;
  in.ram_budget = 64 * kGiB;
  in.allow_cpu_executor = true;
  in.bw = {.vram = 2988e9, .h2d = 54.8e9, .disk = 2e9, .cpu = 75e9, .dram = 100e9};
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(count(*p, Home::kVram), 25);
  EXPECT_EQ(cpu_positions(*p).size(), 26u);
  EXPECT_EQ(p->bound, "dram");
  EXPECT_NEAR(p->token_seconds, 56 * 0.544 / 100, 1e-9);
  for (int batch : {64, 512}) {
    in.batch = batch;
    auto q = make_plan(in);
    ASSERT_TRUE(q.is_ok()) << q.status().message();
    EXPECT_TRUE(cpu_positions(*q).empty()) << "batch " << batch;
  }
}

TEST(StreamPlan, DiskUnitsNeverRunOnTheCpu) {
  // 20 units of 1 GiB, VRAM for 4 + 2 slots, RAM for 8 B units + 2 staging buffers: 8 C units.
  // The CPU may take B units only; C units are read from disk for the GPU.
  PlanInput in = dense(20, 1 * kGiB);
  in.vram_budget = 6 * kGiB;
  in.ram_budget = 10 * kGiB;
  in.allow_cpu_executor = true;
  in.bw.disk = 20e9;  // a fast disk, so the CPU's share matters against the copies
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(count(*p, Home::kDisk), 8);
  int cpu = 0;
  for (const auto& u : p->units) {
    if (u.home == Home::kDisk || u.home == Home::kVram) {
      EXPECT_EQ(u.exec, Executor::kGpu);
    }
    cpu += u.exec == Executor::kCpu;
  }
  EXPECT_GT(cpu, 0);
}

TEST(StreamPlan, LlamaCppOffloadModel) {
  // 4 layers of 1e9 bytes and a 2e9-byte head, no params; VRAM 1e12 (1 ms per GB), CPU 1e10
  // (100 ms per layer), switch 10 ms.
  std::vector<Unit> layers;
  for (int i = 0; i < 4; ++i) layers.push_back({"blk." + std::to_string(i), 1'000'000'000ull});
  const Unit head{"output", 2'000'000'000ull};
  Bandwidths bw{.vram = 1e12, .h2d = 1e9, .disk = 1e9, .cpu = 1e10, .dram = 1e12, .switch_seconds = 0.01};
  // -ngl 2: blk.2, blk.3 on the GPU (the LAST layers), blk.0, blk.1 and the head on the CPU:
  // C C G G C = 0.1 + 0.1 + 0.001 + 0.001 + 0.2 + 2 switches x 0.01 = 0.422 s.
  auto r = predict_llama_offload(layers, 2, bw, head);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->gpu_bytes, 2'000'000'000ull);
  EXPECT_EQ(r->n_switches, 2);
  EXPECT_NEAR(r->t_cpu, 0.4, 1e-12);
  EXPECT_NEAR(r->token_seconds, 0.422, 1e-12);
  // -ngl 0: everything on the CPU, 0.6 s. -ngl 5 (= layers + 1): head too, 6e9 / 1e12 = 6 ms.
  EXPECT_NEAR(predict_llama_offload(layers, 0, bw, head)->token_seconds, 0.6, 1e-12);
  EXPECT_NEAR(predict_llama_offload(layers, 5, bw, head)->token_seconds, 0.006, 1e-12);
  EXPECT_FALSE(predict_llama_offload(layers, 6, bw, head).is_ok());
  EXPECT_FALSE(predict_llama_offload(layers, 5, bw).is_ok());  // no head passed: at most 4
  // Budget 3.5e9: -ngl 3 fits (3e9) and costs 0.1 + 0.003 + 0.2 + 0.02 = 0.323 s; 4 does not fit.
  auto best = best_llama_offload(layers, 3'500'000'000ull, bw, head);
  ASSERT_TRUE(best.is_ok());
  EXPECT_EQ(best->n_gpu_layers, 3);
  EXPECT_NEAR(best->token_seconds, 0.323, 1e-12);
  EXPECT_EQ(best_llama_offload(layers, 0, bw, head)->n_gpu_layers, 0);
}

TEST(StreamPlan, RejectsNonsense) {
  PlanInput in;
  EXPECT_FALSE(make_plan(in).is_ok());
  in = dense(2, kMiB);
  in.bw.h2d = 0;
  EXPECT_FALSE(make_plan(in).is_ok());
  in = dense(2, kMiB);
  in.bw.cpu_flops = 0;
  EXPECT_FALSE(make_plan(in).is_ok());
  in = dense(2, kMiB);
  in.batch = 0;
  EXPECT_FALSE(make_plan(in).is_ok());
}

// ---- row split: a B unit's matrices split by rows between CPU and GPU ---------------------------

TEST(StreamPlan, SplitUnitCostHandComputed) {
  // score_plan on G, split 0.25, split 0.5, G (A, B, B, B) with four_streamed's rates:
  //   blk.0 (A, GPU): max(1e9 / 1e12, 2e9 / 1e14) = 1 ms;  blk.3 (B, GPU): 1 ms
  //   blk.1: max(CPU max(0.25 s, 0.25 x 2e9 / 4e10), GPU max(0.75 ms, ...)) + 50 ms of hand-offs = 0.30 s
  //   blk.2: 0.5 s + 50 ms = 0.55 s
  // The residual stream stays on the GPU: no switches. Copies: 0.75e9 + 0.5e9 + 1e9 at 1 GB/s =
  // 2.25 s; DRAM: every B byte once (3e9 at 1e12). The CPU computes 0.25e9 + 0.5e9 bytes.
  PlanInput in = four_streamed();
  Plan p;
  p.units = {{Home::kVram, Executor::kGpu}, {Home::kRam, Executor::kSplit, 0.25}, {Home::kRam, Executor::kSplit, 0.5},
             {Home::kRam, Executor::kGpu}};
  p.n_slots = 2;
  p.slot_bytes = 1'000'000'000ull;
  score_plan(in, p);
  ASSERT_EQ(p.unit_seconds.size(), 4u);
  EXPECT_NEAR(p.unit_seconds[1], 0.30, 1e-12);
  EXPECT_NEAR(p.unit_seconds[2], 0.55, 1e-12);
  EXPECT_EQ(p.n_switches, 0);
  EXPECT_NEAR(p.t_split, 0.85, 1e-12);
  EXPECT_NEAR(p.t_gpu, 0.002, 1e-12);
  EXPECT_NEAR(p.t_cpu, 0.0, 1e-15);
  EXPECT_NEAR(p.t_exec, 0.852, 1e-12);
  EXPECT_NEAR(p.t_h2d, 2.25, 1e-12);
  EXPECT_NEAR(p.t_dram, 0.003, 1e-12);
  EXPECT_NEAR(p.token_seconds, 2.25, 1e-9);
  EXPECT_EQ(p.bound, "h2d");
  EXPECT_EQ(p.cpu_exec_bytes, 750'000'000ull);
  EXPECT_EQ(p.ram_bytes, 3'000'000'000ull);
  const std::string d = p.describe(in);
  EXPECT_NE(d.find("blk.1                        B:ram   split 0.25"), std::string::npos) << d;
  EXPECT_NE(d.find("exec 852.00 ms (cpu 0.00 + gpu 2.00 + split 850.00 + 0 switches 0.00)"), std::string::npos) << d;
}

// Three streamed units (2.5e9 of VRAM: two slots, nothing resident). Alternating, c CPU units:
//   c=0: 3 copies = 3 s;  c=1 [G C G]: its two GPU units are no more than the slots, so they stay
//   in them (kept, no copies): exec 1 + 0.002 + 2 switches = 1.022 s;  c=2 [C G C]: 2.041;
//   c=3: 3.02. Split at share s (every unit: three streamed units, not kept): exec 3 (s + 0.05)
//   (+ 3 x (1-s) ms of GPU, under the CPU's), copies 3 (1 - s): they balance at s = 0.475; of the
//   k / 64 shares, k = 30 (0.46875): exec 1.556, copies 1.59375 -> 1.59375 s (k = 31: exec
//   1.603). The copies bound the schedule.
PlanInput three_streamed() {
  PlanInput in = four_streamed();
  in.units.pop_back();
  return in;
}

TEST(StreamPlan, SplitBalancesCpuAgainstCopies) {
  PlanInput in = three_streamed();
  // The faster placement: alternating, its GPU units kept in the two slots.
  auto a = make_plan(in);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  EXPECT_EQ(cpu_positions(*a), (std::vector<int>{1}));
  EXPECT_EQ(a->kept_units, 2);
  EXPECT_NEAR(a->token_seconds, 1.022, 1e-9);
  EXPECT_NEAR(a->t_h2d, 0.0, 1e-15);
  EXPECT_NEAR(a->split_seconds, 1.59375, 1e-9);
  EXPECT_NEAR(a->alternating_seconds, 1.022, 1e-9);
  const std::string da = a->describe(in);
  EXPECT_NE(da.find("hybrid (auto): alternating whole layers 1022.00 ms, row split 1593.75 ms"), std::string::npos) << da;
  EXPECT_NE(da.find("2 streamed units kept in their slots"), std::string::npos) << da;

  // The split itself (forced): balanced at k = 30.
  in.hybrid_mode = HybridMode::kSplit;
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  for (const UnitPlan& u : p->units) {
    EXPECT_EQ(u.home, Home::kRam);
    EXPECT_EQ(u.exec, Executor::kSplit);
    EXPECT_DOUBLE_EQ(u.cpu_share, 30.0 / 64);
  }
  EXPECT_EQ(p->kept_units, 0);
  EXPECT_NEAR(p->t_exec, 3 * (30.0 / 64 + 0.05), 1e-9);
  EXPECT_NEAR(p->t_h2d, 3 * (34.0 / 64), 1e-9);
  EXPECT_NEAR(p->token_seconds, 1.59375, 1e-9);
  EXPECT_EQ(p->bound, "h2d");
  EXPECT_NEAR(p->split_seconds, 1.59375, 1e-9);
  EXPECT_EQ(p->alternating_seconds, 0.0);

  // Forced alternating: c = 1, the middle unit on the CPU; split at a fixed share.
  in.hybrid_mode = HybridMode::kAlternate;
  auto alt = make_plan(in);
  ASSERT_TRUE(alt.is_ok());
  EXPECT_EQ(cpu_positions(*alt), (std::vector<int>{1}));
  EXPECT_NEAR(alt->token_seconds, 1.022, 1e-9);
  EXPECT_EQ(alt->split_seconds, 0.0);
  in.hybrid_mode = HybridMode::kSplit;
  in.split_share = 0.25;  // exec 0.9, copies 2.25
  auto fixed = make_plan(in);
  ASSERT_TRUE(fixed.is_ok());
  for (const UnitPlan& u : fixed->units) EXPECT_EQ(u.cpu_share, 0.25);
  EXPECT_NEAR(fixed->token_seconds, 2.25, 1e-9);
  EXPECT_EQ(fixed->alternating_seconds, 0.0);
}

TEST(StreamPlan, AlternatingWinsWhenTheSplitsHandOffsCostMore) {
  // four_streamed: alternating 2.042 s (HybridChoosesTwoOfFourSpreadEvenly); split at k = 30:
  // exec 4 (0.46875 + 0.05) = 2.075, copies 2.125 -> 2.125 s. Ties and losses keep alternating.
  PlanInput in = four_streamed();
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(cpu_positions(*p), (std::vector<int>{1, 3}));
  EXPECT_NEAR(p->alternating_seconds, 2.042, 1e-9);
  EXPECT_NEAR(p->split_seconds, 2.125, 1e-9);
}

TEST(StreamPlan, SplitPaysAtLargeBatch) {
  // Batch 64 (LargeBatchKeepsTheCpuOut's units): a split unit at share s costs max(64 x 2 x s x
  // 1e9 / 4e10 = 3.2 s, ...) + 50 ms on the CPU's side, the copies 4 (1 - s): at k = 14 (s =
  // 0.21875) exec 4 x 0.75 = 3.0 s, copies 3.125 s -> 3.125 s (k = 15: exec 3.2 s), under the
  // 4 s of streaming everything.
  PlanInput in = four_streamed();
  in.batch = 64;
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok());
  for (const UnitPlan& u : p->units) EXPECT_EQ(u.cpu_share, 14.0 / 64);
  EXPECT_NEAR(p->t_exec, 3.0, 1e-9);
  EXPECT_NEAR(p->token_seconds, 3.125, 1e-9);
  EXPECT_NEAR(p->alternating_seconds, 4.0, 1e-9);
}

TEST(StreamPlan, UnsplittableUnitsAreNeverSplit) {
  PlanInput in = three_streamed();
  for (Unit& u : in.units) u.splittable = false;  // a mixture of experts
  in.hybrid_mode = HybridMode::kSplit;
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok());
  for (const UnitPlan& u : p->units) EXPECT_EQ(u.exec, Executor::kGpu);
  EXPECT_EQ(p->split_seconds, 0.0);
  in.units[1].splittable = true;
  p = make_plan(in);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->units[0].exec, Executor::kGpu);
  EXPECT_EQ(p->units[1].exec, Executor::kSplit);
  EXPECT_EQ(p->units[2].exec, Executor::kGpu);
}

TEST(StreamPlan, ForcedSplitEvenWhereStreamingIsFaster) {
  // Copies at 1e12 (as fast as VRAM): streaming all three units costs 3 ms, a split adds 50 ms of
  // hand-offs per unit. Auto keeps streaming; --hybrid split splits anyway (at the fastest share).
  PlanInput in = three_streamed();
  in.bw.h2d = 1e12;
  auto p = make_plan(in);
  ASSERT_TRUE(p.is_ok());
  for (const UnitPlan& u : p->units) EXPECT_EQ(u.exec, Executor::kGpu);
  in.hybrid_mode = HybridMode::kSplit;
  p = make_plan(in);
  ASSERT_TRUE(p.is_ok());
  for (const UnitPlan& u : p->units) EXPECT_EQ(u.exec, Executor::kSplit);
  EXPECT_NEAR(p->token_seconds, p->split_seconds, 1e-15);
  EXPECT_GT(p->token_seconds, 0.15);
}

TEST(StreamPlan, HybridModesParseAndBadSharesAreErrors) {
  HybridMode m = HybridMode::kAuto;
  double share = -1;
  ASSERT_TRUE(parse_hybrid_mode("split", &m, &share).is_ok());
  EXPECT_EQ(m, HybridMode::kSplit);
  EXPECT_EQ(share, 0.0);
  ASSERT_TRUE(parse_hybrid_mode("split=0.4", &m, &share).is_ok());
  EXPECT_EQ(share, 0.4);
  ASSERT_TRUE(parse_hybrid_mode("alternate", &m, &share).is_ok());
  EXPECT_EQ(m, HybridMode::kAlternate);
  ASSERT_TRUE(parse_hybrid_mode("auto", &m, &share).is_ok());
  EXPECT_EQ(m, HybridMode::kAuto);
  for (const char* bad : {"", "splt", "split=", "split=0", "split=1", "split=1.5", "split=0.4x", "split=-0.1"}) {
    const Status st = parse_hybrid_mode(bad, &m, &share);
    ASSERT_FALSE(st.is_ok()) << bad;
    EXPECT_NE(st.message().find("bad hybrid mode"), std::string::npos) << st.message();
  }
  PlanInput in = three_streamed();
  for (double s : {-0.5, 1.0, 2.0}) {
    in.split_share = s;
    auto p = make_plan(in);
    ASSERT_FALSE(p.is_ok()) << s;
    EXPECT_NE(p.status().message().find("share must be in (0, 1)"), std::string::npos) << p.status().message();
  }
}

}  // namespace
}  // namespace sluice::stream
