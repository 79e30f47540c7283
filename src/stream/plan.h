// The placement planner: a pure function from sizes, budgets and measured bandwidths to the home
// and executor of every weight unit, and the token time that placement should achieve.
//
// A "unit" is what moves as one piece: a transformer layer's weights, or the output head. Homes:
//   A = VRAM resident (GPU) / RAM resident (CPU-only), read where it lies every token;
//   B = pinned host RAM, copied to a VRAM slot each token (H2D);
//   C = disk, read with O_DIRECT into pinned staging each token (and then H2D when a GPU runs it).
// Executor: the GPU computes on units in VRAM or in slots; the CPU can compute a B unit where it
// lies, moving only activations; or a B unit is split by matrix rows: the GPU computes the first
// rows of each matrix from a slot holding only those (copied each token), the CPU the rest where
// they lie, both at once. Streamed bytes and CPU reads share DRAM bandwidth.
//
// Units kept in slots: when the GPU-computed streamed units of a placement are no more than the
// ring's slots (and none is on disk), each stays in its slot from pass to pass and costs what a
// resident unit costs (Plan::kept_units).
//
// Cost model of one forward pass of `batch` tokens (every stage overlapped by the pipeline,
// layers in order):
//   exec(u) = max(bytes / vram, batch * 2 * params / gpu_flops)   GPU-executed
//           = max(bytes / cpu,  batch * 2 * params / cpu_flops)   CPU-executed
//           = max(exec_cpu(s * u), exec_gpu((1 - s) * u))            split, CPU share s of the rows
//             + split_seconds                                        (its activation hand-offs)
//   t = max( t_exec,  t_h2d,  t_disk,  t_dram,  t_pipeline )
//   t_exec = sum of exec(u) + n_switches * switch_seconds   (layers are sequential: CPU and GPU
//            compute add up; a switch is a pair of consecutive units on different executors, and
//            with a GPU a pass starts and ends there: embedding rows and the output head)
//   t_h2d  = bytes of GPU-executed B and C units (of a split unit its GPU share) / h2d
//   t_disk = bytes of C units / disk
//   t_dram = (bytes crossing DRAM: B+C units sent to the GPU, plus CPU-executed bytes) / dram
//   t_pipeline = period of the schedule the pipeline really runs (see below).
// The first four terms are resource bounds: they assume the copy engine and the disk never wait
// for a free slot. That holds while the compute between two streamed units is short, but the
// ring of n_slots slots lets copies run at most n_slots streamed units ahead of compute: a CPU
// unit that computes for longer than the copies the free slots can absorb leaves the copy engine
// idle (e.g. a 512-token prefill of a 70B layer on the CPU: ~0.45 s against ~10 ms per copy), and
// the max of the bounds would then promise overlap that cannot happen. t_pipeline is the
// steady-state period of an in-order schedule of the same units: compute in layer order (plus
// switches), copies in order on one engine, copy of streamed unit s not before unit s - n_slots
// released its slot, disk reads in order into 2 staging buffers (with a GPU) or straight into the
// slots (CPU only). It equals max(t_exec, t_h2d, t_disk) when the ring never runs dry, and is
// larger otherwise. DRAM sharing is not in the schedule; t_dram stays a separate bound.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sluice::stream {

enum class Home { kVram, kRam, kDisk };
enum class Executor { kGpu, kCpu, kSplit };
const char* home_name(Home h);          // "A:vram", "B:ram", "C:disk"
const char* executor_name(Executor e);  // "gpu", "cpu", "split"

struct Unit {
  std::string name;    // "blk.12", "output"
  uint64_t bytes = 0;  // weight bytes read per token
  // Multiply-adds per token = weight matrix elements (a dense layer of d x k weights does d * k
  // per token, whatever its quantization). 0 = unknown: the unit's compute term is then ignored
  // and only its bytes count.
  uint64_t params = 0;
  // Whether the unit may be split by rows between CPU and GPU (dense layers; not mixtures of
  // experts, whose experts are placed one by one).
  bool splittable = true;
  // Host memory of the CPU's own copy of the unit (the CPU backend's packed layout), held on top
  // of the pinned copy when the CPU computes the unit (whole or split); counted with the pinned
  // bytes against ram_budget. 0: the CPU computes on the pinned bytes as they lie.
  uint64_t cpu_copy_bytes = 0;
};

// Rates of the machine. Bandwidths are bytes per second, compute rates operations per second
// (one multiply-add = 2 operations). Where each number should come from is noted per field.
struct Bandwidths {
  double vram = 2.0e12;    // GPU reading its own memory: cuda_copy_bandwidth() at load
  double h2d = 25.0e9;     // pinned host -> device: cuda_h2d_bandwidth() at load; with hybrid
                           // execution the rate while the CPU reads DRAM (probe_cpu)
  double disk = 2.0e9;     // O_DIRECT sequential read: probe_disk() on the model file
  double cpu = 50.0e9;     // CPU computing quantized GEMV on weights in DRAM, all threads:
                           // probe_cpu at load (device pipeline: its rate while the copy engine
                           // runs, as in a hybrid token); CPU-only plans: default
  // The CPU's rate with no copies running (probe_cpu alone; 0: cpu). A placement whose copies
  // take t_h2d a pass has the CPU at `cpu` for that long and at cpu_alone for the rest of its
  // work: a plan that copies nothing (every non-resident unit on the CPU, or kept in slots) gets
  // the CPU's whole rate.
  double cpu_alone = 0;
  double dram = 90.0e9;    // DRAM total when DMA and CPU read at once (probe_cpu: the two rates
                           // measured together, summed; default where not measured)
  double cpu_flops = 2.0e12;   // CPU ops/s on quantized weights with many tokens (prefill GEMM
                               // of the CPU backend; 16 AVX-512 cores ~ 1-3e12)
  double gpu_flops = 2.0e14;   // GPU ops/s of the dequantizing GEMM (well under the tensor-core
                               // peak; a prefill benchmark's rate)
  double switch_seconds = 50e-6;  // one hand-over of activations between CPU and GPU (a small
                                  // copy plus a synchronization), per executor change
  // A row-split unit's hand-offs per pass: ten small copies, each after a synchronization (the
  // normed input to the CPU, its Q, K and V rows back, the attention output to the CPU, its Wo
  // rows back, the FFN's normed input to the CPU, the hidden rows both ways, its W_down rows
  // back). First estimated at 0.25 ms (half a switch each); measured on the GPU machine (H200
  // host, 2026-11-27, 70B Q4_K_M with 16 GiB free, 56 split layers, `--hybrid split`): 348 ms per
  // token against 258 predicted, of which ~44 ms is the CPU's own shortfall on its rows (57 GB/s,
  // as the alternating run of the same call measured, against 67 planned) and ~46 ms more
  // hand-off time than estimated: ~1 ms per split layer (each hand-off waits for the GPU's queue
  // and wakes the CPU's threads).
  double split_seconds = 1.0e-3;
};

// Which hybrid placements the planner scores (allow_cpu_executor): whole B units alternating
// between the executors, B units split by rows, or both (the faster prediction wins).
enum class HybridMode { kAuto, kAlternate, kSplit };
const char* hybrid_mode_name(HybridMode m);  // "auto", "alternate", "split"
// "auto", "alternate", "split" or "split=SHARE" (the CPU's share of rows, in (0, 1); *share 0
// otherwise): --hybrid. Error names the text.
Status parse_hybrid_mode(std::string_view text, HybridMode* mode, double* share);

struct PlanInput {
  std::vector<Unit> units;
  bool has_gpu = true;
  // Memory for weights. On a GPU machine vram_budget covers resident units + slots; the KV cache
  // and workspace are subtracted first. ram_budget covers pinned host copies of B units, the
  // pinned staging slots of C units and the CPU's own copies of the units it computes
  // (Unit::cpu_copy_bytes; hybrid placements that would exceed it are not considered). In CPU-only mode vram_* is ignored and RAM-resident units
  // plus the disk read pool come from ram_budget.
  uint64_t vram_budget = 0;
  uint64_t vram_reserved = 0;  // KV cache + workspace + activations
  uint64_t ram_budget = 0;
  int min_slots = 2;           // ring slots for streamed units (>= 2 for overlap)
  bool allow_cpu_executor = false;  // let the CPU compute some B units where they lie
  HybridMode hybrid_mode = HybridMode::kAuto;
  // The CPU's row share of split units, in (0, 1); 0: the planner scans shares (k / 64).
  double split_share = 0;
  int batch = 1;               // tokens per forward pass (1 = decode; prefill chunks are larger)
  Bandwidths bw;
};

struct UnitPlan {
  Home home = Home::kVram;
  Executor exec = Executor::kGpu;
  double cpu_share = 0;  // kSplit: the CPU's share of each matrix's rows, in (0, 1)
};

struct Plan {
  std::vector<UnitPlan> units;  // parallel to PlanInput::units
  int n_slots = 0;              // VRAM (GPU) or RAM (CPU-only) ring slots for streamed units
  // With a GPU: the units it computes from slots (not resident, not on the CPU) when they are at
  // most n_slots and none comes from disk, else 0. Each then keeps a slot of its own: copied in
  // the first pass, read in place after that (no H2D, no DRAM), like a resident unit. A pass that
  // streams more units through the ring (a prefill streaming every unit) overwrites them, and the
  // next pass of this placement copies them once again. So a hybrid plan that computes all but
  // n_slots of its pinned-RAM units on the CPU uses the slots prefill needs as resident memory.
  int kept_units = 0;
  uint64_t slot_bytes = 0;      // size of one slot: the largest streamed unit
  uint64_t resident_bytes = 0;  // A bytes
  uint64_t ram_bytes = 0;       // B bytes (host copies)
  uint64_t disk_bytes = 0;      // C bytes
  uint64_t staging_bytes = 0;   // pinned staging for C reads
  uint64_t cpu_exec_bytes = 0;  // bytes the CPU computes on (of split units, its share)
  uint64_t cpu_copy_bytes = 0;  // host memory of the CPU's own copies of its units (Unit::cpu_copy_bytes)
  std::vector<double> unit_seconds;  // parallel to units: predicted exec seconds per pass
  double t_cpu = 0, t_gpu = 0;  // CPU and GPU shares of t_exec (sums of unit_seconds)
  double t_split = 0;           // split units' share of t_exec (CPU and GPU at once, hand-offs)
  int n_switches = 0;           // executor changes along GPU (embedding), units..., GPU (head)
  double t_exec = 0, t_h2d = 0, t_disk = 0, t_dram = 0;
  double t_pipeline = 0;        // steady-state period of the in-order schedule (plan.h top)
  double token_seconds = 0;     // max of the above: seconds per forward pass of `batch` tokens
  // Which term bounds the token time: "compute", "h2d", "disk", "dram", or "prefetch" when the
  // schedule is slower than every resource bound (the slot ring runs dry behind long CPU units).
  std::string bound;
  // make_plan with allow_cpu_executor: the best alternating and the best row-split placement's
  // predictions at the chosen resident count (0: not scored).
  double alternating_seconds = 0, split_seconds = 0;

  std::string describe(const PlanInput& in) const;  // human-readable table
};

// Placement: for each count r of resident units (largest first), the streamed rest goes to pinned
// RAM (B) as far as ram_budget allows, the remainder to disk (C); with allow_cpu_executor every
// count c = 0 .. |B| of CPU-computed B units is scored, the k-th at position
// floor((k + 0.5) * |B| / c) among the B units in layer order (spread evenly, so the copy
// engine streams the GPU's B units while the CPU computes its own); the lowest predicted time
// wins, ties going to fewer CPU units, then fewer resident units. Row split (hybrid_mode kSplit or
// kAuto): every splittable B unit split at one CPU share (split_share, or the best of k / 64,
// k = 1..63); kAuto keeps the split placement only when strictly faster than the alternating one,
// kSplit keeps it even when streaming every B unit is predicted faster (a forced A/B).
// A units and C units always run on the GPU (with a GPU).
// Errors (kInvalidArgument) when even the minimum does not fit, stating the minimum.
Result<Plan> make_plan(const PlanInput& in);

// Scores a placement chosen elsewhere (tests forcing tiers, an explicit per-unit override): the
// units' homes and executors, n_slots, slot_bytes and staging_bytes are the caller's; fills the
// byte totals, the cost terms and the bound exactly as make_plan does for its own placements.
void score_plan(const PlanInput& in, Plan& p);

// A placement for passes of in.batch tokens (several sequences' decode tokens, a verification)
// that keeps `decode`'s homes and computes on the CPU a subset of the units `decode` computes
// there (only those have the CPU's copies of their weights and KV cache): every count c = 0 .. |K|
// of them, the k-th at floor((k + 0.5) * |K| / c) among them in layer order; every other unit,
// split ones included, on the GPU. The fastest prediction wins, ties going to fewer CPU units
// (c = 0: every streamed unit copied to the GPU). Returned scored at in.batch.
Plan batch_placement(const PlanInput& in, const Plan& decode);
// The units a placement computes on the CPU (Executor::kCpu; of a decode placement, the units
// batch_placement chooses among).
int cpu_unit_count(const Plan& p);
// batch_placement's spread with exactly `count` of those units on the CPU (0 .. their number;
// the pass tuner's trials, stream/pass_tuner.h), scored at in.batch. With a GPU only.
Plan batch_placement_count(const PlanInput& in, const Plan& decode, int count);

// llama.cpp's partial offload (`-ngl N`), as a baseline to compare plans with: the LAST N of
// `layers` are resident in VRAM and run on the GPU, the others run on the CPU from RAM, strictly
// in sequence, nothing streamed. The output head (optional) goes to the GPU only when
// N == layers.size() + 1 (llama.cpp offloads it when N exceeds the layer count), else the CPU.
// Time per pass: sum over GPU units of max(bytes / vram, flops term) + sum over CPU units of
// max(bytes / cpu, flops term) + switches * switch_seconds. bw.cpu is the CPU's rate alone: no
// DMA competes for DRAM. Not modelled: llama.cpp copying CPU weights to the GPU for large
// batches (its prefill "op offload"), so use it for decode (batch 1).
struct OffloadPrediction {
  int n_gpu_layers = 0;        // N as passed to -ngl (layers.size() + 1 = everything + head)
  uint64_t gpu_bytes = 0;      // weight bytes resident in VRAM
  double t_cpu = 0, t_gpu = 0; // compute shares
  int n_switches = 0;
  double token_seconds = 0;
};
// Errors when n_gpu_layers is outside 0 .. layers.size() + (output ? 1 : 0) or bw is not positive.
Result<OffloadPrediction> predict_llama_offload(const std::vector<Unit>& layers, int n_gpu_layers, const Bandwidths& bw,
                                                const std::optional<Unit>& output = std::nullopt, int batch = 1);
// The fastest N whose GPU bytes fit vram_budget_for_layers (VRAM left after KV cache and compute
// buffers); ties go to the smaller N. N = 0 always fits.
Result<OffloadPrediction> best_llama_offload(const std::vector<Unit>& layers, uint64_t vram_budget_for_layers,
                                             const Bandwidths& bw, const std::optional<Unit>& output = std::nullopt,
                                             int batch = 1);

// "16G", "512M", "1.5G", "1024" (bytes), K/M/G/T are powers of 1024. Error names the text.
Result<uint64_t> parse_byte_size(std::string_view text);
std::string format_bytes(uint64_t bytes);
// --vram-budget: a byte size, or "auto" (returned as 0): the GPU's free memory at load less
// kAutoVramMargin.
Result<uint64_t> parse_vram_budget(std::string_view text);

}  // namespace sluice::stream
