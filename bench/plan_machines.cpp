// Consumer machines, on paper: the cost model (src/stream/plan.*) run for a 70B Q4_K_M model on
// several GPU hosts, next to the same model's prediction for llama.cpp's best partial offload.
// Nothing is measured here; every input is written below with where it comes from.
//
//   bench_plan_machines              markdown table (docs/STREAMING.md, "Consumer machines")
//   bench_plan_machines --describe   also each hybrid plan, layer by layer
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "stream/plan.h"

namespace {

using sluice::stream::Bandwidths;
using sluice::stream::Executor;
using sluice::stream::Home;
using sluice::stream::PlanInput;
using sluice::stream::Unit;

// Llama-3-70B Q4_K_M. Bytes: 80 layers of 0.544 GB (the 519 MiB of the largest layer in the
// synthetic 70B file measured on the H100 host; Q4_K_M mixes Q6_K into some layers, so the real
// average is a little lower: S2 streamed 27.96 GB for 56 layers = 0.499 GB) and the Q6_K output
// head 0.82 GB. Params (multiply-adds per token): 70e9 / 80 = 0.87e9 per layer, head 8192 x
// 128256 = 1.05e9. token_embd stays in host memory and costs a row lookup: left out.
constexpr int kLayers = 80;
constexpr double kLayerBytes = 0.544e9;
constexpr double kLayerParams = 0.87e9;
constexpr double kHeadBytes = 0.82e9;
constexpr double kHeadParams = 1.05e9;
// VRAM that is not weights: KV cache (8k context f16 of 70B GQA = 2.7 GB at full length; ~1 GB at
// 4k) + workspace + activations, rounded to 2.0 GB as for both engines.
constexpr double kReserved = 2.0e9;
constexpr double kGiB = 1024.0 * 1024 * 1024;

struct Machine {
  const char* name;
  double vram_bytes;   // card memory
  double h2d;          // pinned H2D, B/s
  double cpu;          // CPU computing on DRAM weights alone, B/s
  double dram;         // DRAM total with DMA and CPU reading at once, B/s
  double vram_bw;      // VRAM read, B/s
};

std::vector<Unit> layers() {
  std::vector<Unit> u;
  for (int i = 0; i < kLayers; ++i) u.push_back({"blk." + std::to_string(i), uint64_t(kLayerBytes), uint64_t(kLayerParams)});
  return u;
}

}  // namespace

int main(int argc, char** argv) {
  const bool describe = argc > 1 && std::strcmp(argv[1], "--describe") == 0;
  // Sources: PCIe Gen4 x16 ~25 GB/s pinned, Gen4 x8 half; dual-channel DDR4-3200 51 GB/s peak,
  // CPU reads ~40 alone and ~45 total with DMA; DDR5-6000 96 GB/s peak, ~70 / ~75; the 16 GB
  // class with DDR5 ~60 / ~65 (assumed: +5 GB/s with DMA, as for the others); the seeds'
  // reference RTX 3090 at PCIe Gen3 x8 (6.5 GB/s measured there) with DDR4 ~35 / ~40 (assumed).
  // H100 host (measured): pinned H2D 54.8 GB/s, VRAM copy 2988 GB/s, DMA + CPU together 48.1 + 51.4
  // ~ 100 GB/s; CPU alone 75 GB/s = what llama.cpp achieves there (-ngl 26: 54 layers + head =
  // 30.2 GB on 16 threads at 2.45 tok/s, the GPU's 26 layers taking ~5 ms), inside the 62-80 GB/s
  // that 16 threads read alone.
  const std::vector<Machine> machines = {
      {"RTX 3090 24 GB, Gen4 x16, DDR4-3200", 24 * kGiB, 25e9, 40e9, 45e9, 936e9},
      {"RTX 4090 24 GB, Gen4 x16, DDR5-6000", 24 * kGiB, 25e9, 70e9, 75e9, 1008e9},
      {"16 GB card (RTX 4080 class), Gen4 x16, DDR5", 16 * kGiB, 25e9, 60e9, 65e9, 717e9},
      {"16 GB card, Gen4 x8, DDR5", 16 * kGiB, 12.5e9, 60e9, 65e9, 717e9},
      {"seeds' RTX 3090, Gen3 x8, DDR4", 24 * kGiB, 6.5e9, 35e9, 40e9, 936e9},
      {"H100 host, 16 GiB of VRAM used (measured rates)", 16 * kGiB, 54.8e9, 75e9, 100e9, 2988e9},
  };
  const std::vector<Unit> L = layers();
  const Unit head{"output", uint64_t(kHeadBytes), uint64_t(kHeadParams)};

  std::printf("| machine | VRAM | H2D GB/s | CPU GB/s (alone / DRAM total) | sluice streaming tok/s | sluice hybrid tok/s "
              "| CPU units | llama.cpp best -ngl (tok/s) | hybrid / llama.cpp | hybrid bound |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  std::string details;
  for (const Machine& m : machines) {
    PlanInput in;
    in.units = L;
    in.units.push_back(head);  // the head is a unit: the planner keeps it resident (largest first)
    in.has_gpu = true;
    in.vram_budget = uint64_t(m.vram_bytes);
    in.vram_reserved = uint64_t(kReserved);
    in.ram_budget = uint64_t(64 * kGiB);  // every streamed layer fits in pinned RAM (64 GB host)
    in.min_slots = 2;
    in.bw.vram = m.vram_bw;
    in.bw.h2d = m.h2d;
    in.bw.cpu = m.cpu;
    in.bw.dram = m.dram;
    auto pure = sluice::stream::make_plan(in);
    in.allow_cpu_executor = true;
    auto hybrid = sluice::stream::make_plan(in);
    auto llama = sluice::stream::best_llama_offload(L, uint64_t(m.vram_bytes - kReserved), in.bw, head);
    if (!pure.is_ok() || !hybrid.is_ok() || !llama.is_ok()) {
      std::fprintf(stderr, "%s: planning failed\n", m.name);
      return 1;
    }
    int cpu_units = 0, b_units = 0;
    for (const auto& u : hybrid->units) {
      cpu_units += u.exec == Executor::kCpu;
      b_units += u.home == Home::kRam;
    }
    // Hybrid bound: every non-resident byte is read from DRAM once, by the copy engine or the CPU,
    // so no placement beats non-resident / min(cpu + h2d, dram) (GPU compute and switches on top).
    const double nonres = double(hybrid->ram_bytes + hybrid->disk_bytes);
    const double rate = std::min(m.cpu + m.h2d, m.dram);
    const double t_h = hybrid->token_seconds, t_p = pure->token_seconds;
    char bound[160];
    std::snprintf(bound, sizeof bound, "%.1f GB / min(%.0f + %.1f, %.0f) = %.0f ms; plan %.0f ms, bound by %s", nonres / 1e9,
                  m.cpu / 1e9, m.h2d / 1e9, m.dram / 1e9, nonres / rate * 1e3, t_h * 1e3, hybrid->bound.c_str());
    std::printf("| %s | %.0f GiB | %.1f | %.0f / %.0f | %.2f | %.2f | %d of %d | %d (%.2f) | %.2fx | %s |\n", m.name,
                m.vram_bytes / kGiB, m.h2d / 1e9, m.cpu / 1e9, m.dram / 1e9, 1 / t_p, 1 / t_h, cpu_units, b_units,
                llama->n_gpu_layers, 1 / llama->token_seconds, llama->token_seconds / t_h, bound);
    if (describe) details += std::string("\n### ") + m.name + "\n" + hybrid->describe(in);
  }
  // The llama.cpp model against the two runs measured on the H100 host (same layer sizes).
  Bandwidths h100;
  h100.vram = 2988e9;
  h100.h2d = 54.8e9;
  h100.cpu = 75e9;
  h100.dram = 100e9;
  for (int ngl : {26, 30}) {
    auto r = sluice::stream::predict_llama_offload(L, ngl, h100, head);
    if (!r.is_ok()) return 1;
    std::printf("\nllama.cpp model on the H100 host, -ngl %d: %.2f tok/s (measured %s)", ngl, 1 / r->token_seconds,
                ngl == 26 ? "2.45" : "2.57");
  }
  std::printf("\n%s", details.c_str());
  return 0;
}
