// Start-up CPU probe for hybrid execution: how fast this machine's CPU computes one-token matrix
// products on weights in DRAM (the executor's decode work), alone and while the GPU's copy engine
// reads pinned host memory at the same time (both draw on the same DRAM). The planner's CPU and
// DRAM terms come from it, so placement follows this machine, not defaults.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "quant/quant.h"

namespace sluice::stream {

struct CpuProbeOptions {
  quant::Type type = quant::Type::kQ4_K;  // the format that holds most of the model's bytes
  int64_t ne0 = 4096;                     // row length (the model's n_embd)
  uint64_t bytes = 512ull << 20;          // weights per product: far beyond the last-level cache
  int reps = 5;                           // median of this many products
  // The batched rate (Bandwidths::cpu_flops): products of batch_tokens tokens over the first
  // batch_bytes of the same matrix, which are compute-bound (each weight serves every token).
  // batch_tokens = 0: not measured.
  int batch_tokens = 32;
  uint64_t batch_bytes = 64ull << 20;
};

struct CpuProbe {
  double alone = 0;       // bytes/s of weights, the CPU computing with nothing else reading DRAM
  double shared = 0;      // bytes/s while the copy engine streams pinned memory (0: not measured)
  double h2d_shared = 0;  // the copy engine's bytes/s meanwhile (0: not measured)
  double flops = 0;       // ops/s (2 per multiply-add) at batch_tokens tokens (0: not measured)
  int batch_tokens = 0;
  int threads = 0;
  quant::Type type = quant::Type::kQ4_K;
  bool packed = false;    // timed on the backend's packed layout (what hybrid layers use)
  // "Q4_K on 16 threads: 61.2 GB/s alone, 50.3 GB/s + H2D 47.9 GB/s together; 32 tokens 2.1 Tops/s"
  std::string describe() const;
};

// Times `cpu` (a CPU backend) computing y = W x for one token over a synthetic matrix of
// opts.type (a few really quantized rows repeated, so the kernel sees valid blocks). With
// `copy_during` (which runs copies of about `copy_bytes` and returns the H2D bytes/s it saw, or an
// error; it runs `during` on the calling thread while its copies are in flight), the same
// products are timed again while the copy engine reads pinned memory.
Result<CpuProbe> probe_cpu(backend::Backend& cpu, int threads, const CpuProbeOptions& opts,
                           const std::function<Result<double>(uint64_t copy_bytes, const std::function<void()>& during)>&
                               copy_during = {});

}  // namespace sluice::stream
