// The placement planner: a pure function from sizes, budgets and measured bandwidths to the home
// and executor of every weight unit, and the token time that placement should achieve.
//
// A "unit" is what moves as one piece: a transformer layer's weights, or the output head. Homes:
//   A = VRAM resident (GPU) / RAM resident (CPU-only), read where it lies every token;
//   B = pinned host RAM, copied to a VRAM slot each token (H2D);
//   C = disk, read with O_DIRECT into pinned staging each token (and then H2D when a GPU runs it).
// Executor: the GPU computes on units in VRAM or in slots; the CPU can compute a B unit where it
// lies, moving only activations. Streamed bytes and CPU reads share DRAM bandwidth.
//
// Cost model of one decoded token (every stage overlapped by the pipeline, layers in order):
//   t = max( t_exec,  t_h2d,  t_disk,  t_dram )
//   t_exec = sum over units of (bytes / vram_bw if GPU-executed, bytes / cpu_bw if CPU-executed)
//   t_h2d  = bytes of GPU-executed B and C units / h2d_bw
//   t_disk = bytes of C units / disk_bw
//   t_dram = (bytes crossing DRAM: B+C units sent to the GPU, plus CPU-executed bytes) / dram_bw
// The GPU's compute on streamed units hides under the copies; CPU compute does not overlap GPU
// compute of the same token (layers are sequential), hence the sum in t_exec.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sluice::stream {

enum class Home { kVram, kRam, kDisk };
enum class Executor { kGpu, kCpu };
const char* home_name(Home h);          // "A:vram", "B:ram", "C:disk"
const char* executor_name(Executor e);  // "gpu", "cpu"

struct Unit {
  std::string name;   // "blk.12", "output"
  uint64_t bytes = 0; // weight bytes read per token
};

struct Bandwidths {        // bytes per second, measured at start-up (or defaults for --plan)
  double vram = 2.0e12;    // GPU reading its own memory
  double h2d = 25.0e9;     // pinned host -> device
  double disk = 2.0e9;     // O_DIRECT sequential read
  double cpu = 50.0e9;     // CPU computing on weights in DRAM (all threads)
  double dram = 90.0e9;    // DRAM total when DMA and CPU read at once
};

struct PlanInput {
  std::vector<Unit> units;
  bool has_gpu = true;
  // Memory for weights. On a GPU machine vram_budget covers resident units + slots; the KV cache
  // and workspace are subtracted first. ram_budget covers pinned host copies of B units plus the
  // pinned staging slots of C units. In CPU-only mode vram_* is ignored and RAM-resident units
  // plus the disk read pool come from ram_budget.
  uint64_t vram_budget = 0;
  uint64_t vram_reserved = 0;  // KV cache + workspace + activations
  uint64_t ram_budget = 0;
  int min_slots = 2;           // ring slots for streamed units (>= 2 for overlap)
  bool allow_cpu_executor = false;  // let the CPU compute some B units where they lie
  Bandwidths bw;
};

struct UnitPlan {
  Home home = Home::kVram;
  Executor exec = Executor::kGpu;
};

struct Plan {
  std::vector<UnitPlan> units;  // parallel to PlanInput::units
  int n_slots = 0;              // VRAM (GPU) or RAM (CPU-only) ring slots for streamed units
  uint64_t slot_bytes = 0;      // size of one slot: the largest streamed unit
  uint64_t resident_bytes = 0;  // A bytes
  uint64_t ram_bytes = 0;       // B bytes (host copies)
  uint64_t disk_bytes = 0;      // C bytes
  uint64_t staging_bytes = 0;   // pinned staging for C reads
  uint64_t cpu_exec_bytes = 0;  // bytes the CPU computes on
  double t_exec = 0, t_h2d = 0, t_disk = 0, t_dram = 0;
  double token_seconds = 0;     // max of the above
  std::string bound;            // which term bounds the token time

  std::string describe(const PlanInput& in) const;  // human-readable table
};

// Errors (kInvalidArgument) when even the minimum does not fit, stating the minimum.
Result<Plan> make_plan(const PlanInput& in);

// Scores a placement chosen elsewhere (tests forcing tiers, an explicit per-unit override): the
// units' homes and executors, n_slots, slot_bytes and staging_bytes are the caller's; fills the
// byte totals, the cost terms and the bound exactly as make_plan does for its own placements.
void score_plan(const PlanInput& in, Plan& p);

// "16G", "512M", "1.5G", "1024" (bytes), K/M/G/T are powers of 1024. Error names the text.
Result<uint64_t> parse_byte_size(std::string_view text);
std::string format_bytes(uint64_t bytes);

}  // namespace sluice::stream
