#include "stream/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>

namespace sluice::stream {

const char* home_name(Home h) {
  switch (h) {
    case Home::kVram: return "A:vram";
    case Home::kRam: return "B:ram";
    case Home::kDisk: return "C:disk";
  }
  return "?";
}

const char* executor_name(Executor e) {
  switch (e) {
    case Executor::kGpu: return "gpu";
    case Executor::kCpu: return "cpu";
    case Executor::kSplit: return "split";
  }
  return "?";
}

const char* hybrid_mode_name(HybridMode m) {
  switch (m) {
    case HybridMode::kAuto: return "auto";
    case HybridMode::kAlternate: return "alternate";
    case HybridMode::kSplit: return "split";
  }
  return "?";
}

std::string format_bytes(uint64_t bytes) {
  char buf[32];
  const double b = double(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else if (b >= 1024.0 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

Result<uint64_t> parse_vram_budget(std::string_view text) {
  if (text == "auto") return uint64_t(0);
  auto b = parse_byte_size(text);
  if (!b.is_ok()) return invalid_argument(b.status().message() + ", or auto");
  if (*b == 0) return invalid_argument("a VRAM budget of 0 bytes holds nothing (auto uses the GPU's free memory)");
  return b;
}

Result<uint64_t> parse_byte_size(std::string_view text) {
  const std::string s(text);
  auto bad = [&] {
    return invalid_argument("bad byte size '" + s + "': expected a number with an optional K/M/G/T suffix (powers of 1024)");
  };
  if (s.empty()) return bad();
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return bad();
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(s.substr(0, i), &used);
    if (used != i) return bad();
  } catch (...) {
    return bad();
  }
  double mult = 1;
  std::string suffix = s.substr(i);
  if (!suffix.empty()) {
    char c = char(std::toupper(static_cast<unsigned char>(suffix[0])));
    std::string rest = suffix.substr(1);
    if (!(rest.empty() || rest == "B" || rest == "b" || rest == "iB" || rest == "ib")) return bad();
    switch (c) {
      case 'K': mult = 1024.0; break;
      case 'M': mult = 1024.0 * 1024; break;
      case 'G': mult = 1024.0 * 1024 * 1024; break;
      case 'T': mult = 1024.0 * 1024 * 1024 * 1024; break;
      case 'B': if (!rest.empty()) return bad(); break;
      default: return bad();
    }
  }
  const double bytes = value * mult;
  if (!std::isfinite(bytes) || bytes < 0 || bytes >= 1.8e19) return bad();
  return static_cast<uint64_t>(bytes);
}

Status parse_hybrid_mode(std::string_view text, HybridMode* mode, double* share) {
  const std::string s(text);
  *share = 0;
  if (s == "auto" || s == "alternate" || s == "split") {
    *mode = s == "auto" ? HybridMode::kAuto : s == "alternate" ? HybridMode::kAlternate : HybridMode::kSplit;
    return Status::ok();
  }
  const std::string prefix = "split=";
  if (s.rfind(prefix, 0) == 0) {
    const std::string num = s.substr(prefix.size());
    char* end = nullptr;
    const double v = num.empty() ? 0 : std::strtod(num.c_str(), &end);
    if (end && *end == '\0' && v > 0 && v < 1) {
      *mode = HybridMode::kSplit;
      *share = v;
      return Status::ok();
    }
  }
  return invalid_argument("bad hybrid mode '" + s +
                          "': expected auto, alternate, split or split=SHARE with SHARE in (0, 1) (the CPU's share of rows)");
}

namespace {

bool rates_ok(const Bandwidths& bw) {
  return bw.vram > 0 && bw.h2d > 0 && bw.disk > 0 && bw.cpu > 0 && bw.dram > 0 && bw.cpu_flops > 0 && bw.gpu_flops > 0 &&
         bw.switch_seconds >= 0 && bw.split_seconds >= 0;
}

// Seconds one executor spends on a unit per pass: reading its bytes or doing its batch * 2 *
// params operations, whichever is slower (GEMV/GEMM of one layer is limited by one or the other).
// A split unit (cpu_share s): the CPU on its share and the GPU on the rest at the same time, plus
// the hand-offs between them (split_seconds).
double exec_seconds(const Unit& u, Executor e, int batch, const Bandwidths& bw, double cpu_share = 0) {
  const double ops = double(batch) * 2.0 * double(u.params);
  if (e == Executor::kGpu) return std::max(double(u.bytes) / bw.vram, ops / bw.gpu_flops);
  if (e == Executor::kCpu) return std::max(double(u.bytes) / bw.cpu, ops / bw.cpu_flops);
  const double s = cpu_share, g = 1 - cpu_share;
  const double cpu = std::max(s * double(u.bytes) / bw.cpu, s * ops / bw.cpu_flops);
  const double gpu = std::max(g * double(u.bytes) / bw.vram, g * ops / bw.gpu_flops);
  return std::max(cpu, gpu) + bw.split_seconds;
}

// Bytes of unit i copied to the GPU per pass when it is streamed: all of it, or a split unit's
// GPU share.
double copy_bytes(const PlanInput& in, const Plan& p, size_t i) {
  const double b = double(in.units[i].bytes);
  return p.units[i].exec == Executor::kSplit ? b * (1 - p.units[i].cpu_share) : b;
}

// The executor holding the residual stream around unit i: a split unit's stays on the GPU.
Executor stream_side(Executor e) { return e == Executor::kSplit ? Executor::kGpu : e; }

// A unit the GPU computes from a slot: not resident, not computed by the CPU.
bool gpu_streamed(const Plan& p, const std::vector<Executor>& exec, size_t i) {
  return p.units[i].home != Home::kVram && exec[i] != Executor::kCpu;
}

// Units kept in their slots (plan.h, Plan::kept_units): with a GPU, when the units it computes
// from slots are no more than the slots and none comes from disk, each keeps a slot of its own
// and is copied once, not every pass. Returns their count, or 0 when that does not hold.
int kept_in_slots(const PlanInput& in, const Plan& p, const std::vector<Executor>& exec) {
  if (!in.has_gpu) return 0;
  int m = 0;
  for (size_t i = 0; i < in.units.size(); ++i) {
    if (!gpu_streamed(p, exec, i)) continue;
    if (p.units[i].home == Home::kDisk) return 0;
    ++m;
  }
  return m <= p.n_slots ? m : 0;
}

// Steady-state seconds per pass of the in-order schedule (plan.h top): compute in layer order,
// copies in order on one engine, each streamed unit's copy waiting for the slot that the unit
// n_slots earlier in the stream releases, disk reads in order into 2 staging buffers (with a GPU:
// read k waits for the copy of read k-2 out of its buffer) or into the slot itself (CPU only).
// Times are evaluated when compute reaches a unit; that is exact because every engine runs in
// order and each dependency is on an earlier index. Several passes run so the ring wraps from the
// last streamed unit of one pass to the first of the next; the period is the average of the last
// two (the first pass starts with empty slots).
double pipeline_period(const PlanInput& in, const Plan& p, const std::vector<Executor>& exec) {
  constexpr int kPasses = 6;
  const size_t n = in.units.size();
  std::vector<char> streamed(n, 0);
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    // Units kept in their slots are read in place, like resident ones.
    streamed[i] = in.has_gpu ? (gpu_streamed(p, exec, i) && p.kept_units == 0) : p.units[i].home == Home::kDisk;
    m += streamed[i];
  }
  const size_t slots = size_t(std::max(1, p.n_slots));
  std::vector<double> release;   // per streamed index (pass * m + k): when its slot is free again
  std::vector<double> staged;    // per disk read (GPU only): when its staging buffer is free again
  release.reserve(kPasses * m);
  double compute_end = 0, copy_free = 0, disk_free = 0;
  double pass_end[kPasses] = {};
  for (int pass = 0; pass < kPasses; ++pass) {
    for (size_t i = 0; i < n; ++i) {
      double start = compute_end;
      if (stream_side(exec[i]) != (i > 0 ? stream_side(exec[i - 1]) : Executor::kGpu) && in.has_gpu) {
        start += in.bw.switch_seconds;
      }
      if (streamed[i]) {
        const size_t g = release.size();
        const double slot_free = g >= slots ? release[g - slots] : 0.0;
        const double b = in.has_gpu ? copy_bytes(in, p, i) : double(in.units[i].bytes);
        double ready = 0;
        if (in.has_gpu) {
          double source = 0;  // when the bytes are in pinned host memory
          if (p.units[i].home == Home::kDisk) {
            const size_t k = staged.size();
            const double buffer_free = k >= 2 ? staged[k - 2] : 0.0;
            disk_free = std::max(disk_free, buffer_free) + b / in.bw.disk;
            source = disk_free;
          }
          copy_free = std::max({copy_free, slot_free, source}) + b / in.bw.h2d;
          if (p.units[i].home == Home::kDisk) staged.push_back(copy_free);
          ready = copy_free;
        } else {
          disk_free = std::max(disk_free, slot_free) + b / in.bw.disk;
          ready = disk_free;
        }
        start = std::max(start, ready);
        compute_end = start + p.unit_seconds[i];
        release.push_back(compute_end);
      } else {
        compute_end = start + p.unit_seconds[i];
      }
    }
    if (in.has_gpu && n > 0 && exec[n - 1] == Executor::kCpu) compute_end += in.bw.switch_seconds;  // to the head
    pass_end[pass] = compute_end;
  }
  return (pass_end[kPasses - 1] - pass_end[kPasses - 3]) / 2;
}

// Fills in the cost terms of a plan whose homes and executors are set.
void score(const PlanInput& in, Plan& p) {
  const size_t n = in.units.size();
  // CPU-only plans run everything on the CPU whatever the executor field says.
  std::vector<Executor> exec(n);
  for (size_t i = 0; i < n; ++i) exec[i] = in.has_gpu ? p.units[i].exec : Executor::kCpu;
  double h2d = 0, disk = 0, dram = 0;
  p.kept_units = kept_in_slots(in, p, exec);
  // The copies first: how long they run decides the CPU's rate (Bandwidths::cpu_alone).
  double cpu_bytes = 0;
  for (size_t i = 0; i < n && in.has_gpu; ++i) {
    if (exec[i] == Executor::kCpu) cpu_bytes += double(in.units[i].bytes);
    if (exec[i] == Executor::kSplit) cpu_bytes += double(in.units[i].bytes) - copy_bytes(in, p, i);
    if (gpu_streamed(p, exec, i) && p.kept_units == 0) h2d += copy_bytes(in, p, i);
  }
  Bandwidths bw = in.bw;
  const double copy_s = h2d / in.bw.h2d;
  if (in.has_gpu && bw.cpu_alone > 0 && cpu_bytes > bw.cpu * copy_s) {
    bw.cpu = cpu_bytes / (copy_s + (cpu_bytes - bw.cpu * copy_s) / bw.cpu_alone);
  }
  p.unit_seconds.assign(n, 0.0);
  p.t_cpu = p.t_gpu = p.t_split = 0;
  p.n_switches = 0;
  for (size_t i = 0; i < n; ++i) {
    const double b = double(in.units[i].bytes);
    const UnitPlan& u = p.units[i];
    p.unit_seconds[i] = exec_seconds(in.units[i], exec[i], in.batch, bw, u.cpu_share);
    (exec[i] == Executor::kCpu ? p.t_cpu : exec[i] == Executor::kSplit ? p.t_split : p.t_gpu) += p.unit_seconds[i];
    // With a GPU a pass starts and ends there (embedding rows land in its activations, the output
    // head runs there): a CPU unit first or last costs a hand-off too. A split unit keeps the
    // residual stream on the GPU (its own hand-offs are in its exec time).
    const Executor side = stream_side(exec[i]);
    if (in.has_gpu && side != (i > 0 ? stream_side(exec[i - 1]) : Executor::kGpu)) ++p.n_switches;
    if (in.has_gpu && i + 1 == n && side == Executor::kCpu) ++p.n_switches;
    if (u.home == Home::kDisk) disk += b;
    if (!in.has_gpu) continue;
    if (exec[i] == Executor::kCpu) {
      dram += b;
    } else if (u.home != Home::kVram && p.kept_units > 0) {
      dram += b - copy_bytes(in, p, i);  // kept in its slot: a split unit's CPU share still reads DRAM
    } else if (u.home != Home::kVram) {
      dram += b;  // a split unit: its GPU share through the copy engine, the rest read by the CPU
    }
  }
  p.t_exec = p.t_cpu + p.t_gpu + p.t_split + double(p.n_switches) * in.bw.switch_seconds;
  p.t_h2d = in.has_gpu ? h2d / in.bw.h2d : 0;
  p.t_disk = disk / in.bw.disk;
  p.t_dram = in.has_gpu ? dram / in.bw.dram : 0;
  p.t_pipeline = pipeline_period(in, p, exec);
  p.token_seconds = std::max({p.t_exec, p.t_h2d, p.t_disk, p.t_dram, p.t_pipeline});
  // The schedule reproduces a resource bound up to rounding; name that resource, and "prefetch"
  // only when the schedule is really slower than all of them.
  const double t = p.token_seconds * (1 - 1e-9);
  p.bound = p.t_exec >= t ? "compute" : p.t_h2d >= t ? "h2d" : p.t_disk >= t ? "disk" : p.t_dram >= t ? "dram" : "prefetch";
}

// Streamed units `s` (indices, largest first) split into B (pinned RAM) and C (disk): as many
// bytes in RAM as the budget allows after reserving pinned staging for the disk reads.
// Returns false when not even the staging fits.
bool split_ram_disk(const PlanInput& in, const std::vector<size_t>& s, uint64_t ram_budget, int n_staging, Plan& p) {
  for (size_t b = s.size() + 1; b-- > 0;) {
    uint64_t ram = 0, disk_max = 0;
    for (size_t k = 0; k < s.size(); ++k) {
      if (k < b) ram += in.units[s[k]].bytes;
      else disk_max = std::max(disk_max, in.units[s[k]].bytes);
    }
    const uint64_t staging = b < s.size() ? uint64_t(n_staging) * disk_max : 0;
    if (ram + staging > ram_budget) continue;
    for (size_t k = 0; k < s.size(); ++k) p.units[s[k]].home = k < b ? Home::kRam : Home::kDisk;
    p.staging_bytes = staging;
    return true;
  }
  return false;
}

// B, C and CPU-computed bytes of a placed plan (of a split unit, the CPU computes its share).
void tally(const PlanInput& in, Plan& p) {
  p.ram_bytes = p.disk_bytes = p.cpu_exec_bytes = p.cpu_copy_bytes = 0;
  for (size_t i = 0; i < in.units.size(); ++i) {
    const uint64_t b = in.units[i].bytes;
    if (in.has_gpu && p.units[i].home == Home::kRam) p.ram_bytes += b;
    if (p.units[i].home == Home::kDisk) p.disk_bytes += b;
    if (p.units[i].exec == Executor::kCpu) p.cpu_exec_bytes += b;
    if (p.units[i].exec == Executor::kSplit) p.cpu_exec_bytes += uint64_t(std::llround(double(b) * p.units[i].cpu_share));
    if (in.has_gpu && p.units[i].exec != Executor::kGpu) p.cpu_copy_bytes += in.units[i].cpu_copy_bytes;
  }
}

// Whether a GPU placement's host memory (pinned B copies, disk staging, the CPU's own copies of
// its units, as tally counts them) fits ram_budget.
bool fits_ram(const PlanInput& in, Plan& p) {
  tally(in, p);
  return p.ram_bytes + p.staging_bytes + p.cpu_copy_bytes <= in.ram_budget;
}

// `base` with c of `candidates` on the CPU, the k-th at floor((k + 0.5) * |candidates| / c), unscored.
Plan spread(const Plan& base, const std::vector<size_t>& candidates, size_t c) {
  const size_t nb = candidates.size();
  Plan trial = base;
  for (size_t k = 0; k < c; ++k) trial.units[candidates[(2 * k + 1) * nb / (2 * c)]].exec = Executor::kCpu;
  return trial;
}

// Alternating: the fastest of `base` and, for c = 1 .. |candidates| (the B units, or a decode
// placement's CPU units), `base` with c of them on the CPU, the k-th at floor((k + 0.5) *
// |candidates| / c) in layer order (distinct because |candidates| / c >= 1), so CPU units
// alternate with streamed ones (the copy engine fills slots while the CPU computes); ties keep
// fewer CPU units.
Plan best_spread(const PlanInput& in, const Plan& base, const std::vector<size_t>& candidates) {
  const size_t nb = candidates.size();
  Plan chosen = base;
  for (size_t c = 1; c <= nb; ++c) {
    Plan trial = spread(base, candidates, c);
    if (!fits_ram(in, trial)) continue;  // units differ in size: a spread of more units may still fit
    score(in, trial);
    if (trial.token_seconds < chosen.token_seconds * (1 - 1e-12)) chosen = std::move(trial);
  }
  return chosen;
}

// Row split: every splittable B unit split at one CPU share, in.split_share or the fastest of
// k / 64 (k = 1 .. 63; ties to the smaller share). None without a splittable B unit.
std::optional<Plan> best_split(const PlanInput& in, const Plan& base, const std::vector<size_t>& ram_units) {
  constexpr int kSteps = 64;
  std::optional<Plan> best;
  if (std::none_of(ram_units.begin(), ram_units.end(), [&](size_t i) { return in.units[i].splittable; })) return best;
  for (int k = 1; k < kSteps; ++k) {
    const double share = in.split_share > 0 ? in.split_share : double(k) / kSteps;
    Plan trial = base;
    for (size_t i : ram_units) {
      if (in.units[i].splittable) trial.units[i] = {Home::kRam, Executor::kSplit, share};
    }
    if (!fits_ram(in, trial)) return best;  // the CPU's copies do not depend on the share
    score(in, trial);
    if (!best || trial.token_seconds < best->token_seconds * (1 - 1e-12)) best = std::move(trial);
    if (in.split_share > 0) break;
  }
  return best;
}

}  // namespace

Result<Plan> make_plan(const PlanInput& in) {
  if (in.units.empty()) return invalid_argument("plan: no weight units");
  if (in.min_slots < 1) return invalid_argument("plan: min_slots must be >= 1");
  if (!rates_ok(in.bw)) return invalid_argument("plan: bandwidths and compute rates must be positive");
  if (in.batch < 1) return invalid_argument("plan: batch must be >= 1");
  if (in.split_share != 0 && !(in.split_share > 0 && in.split_share < 1)) {
    return invalid_argument("plan: the split's CPU share must be in (0, 1), got " + std::to_string(in.split_share));
  }
  const size_t n = in.units.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Largest first: keeping the biggest units resident also shrinks the slot every streamed unit
  // must fit, so it saves the most streamed bytes per byte of fast memory.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return in.units[a].bytes > in.units[b].bytes; });

  // Fast memory that holds resident units and the ring slots.
  uint64_t fast_budget = 0;
  if (in.has_gpu) {
    if (in.vram_reserved > in.vram_budget) {
      return invalid_argument("VRAM budget " + format_bytes(in.vram_budget) + " is smaller than the KV cache and workspace (" +
                              format_bytes(in.vram_reserved) + ")");
    }
    fast_budget = in.vram_budget - in.vram_reserved;
  } else {
    fast_budget = in.ram_budget;
  }

  std::optional<Plan> best;
  uint64_t min_fast_needed = UINT64_MAX;
  bool staging_failed = false;
  uint64_t resident = 0;
  for (size_t r = 0; r <= n; ++r) {
    if (r > 0) resident += in.units[order[r - 1]].bytes;
    std::vector<size_t> streamed(order.begin() + std::ptrdiff_t(r), order.end());
    const uint64_t slot = streamed.empty() ? 0 : in.units[streamed.front()].bytes;
    const int slots = streamed.empty() ? 0 : int(std::min<size_t>(size_t(in.min_slots), streamed.size()));
    const uint64_t fast_needed = resident + uint64_t(slots) * slot;
    min_fast_needed = std::min(min_fast_needed, fast_needed);
    if (fast_needed > fast_budget) continue;

    Plan p;
    p.units.assign(n, UnitPlan{});
    p.n_slots = slots;
    p.slot_bytes = slot;
    p.resident_bytes = resident;
    for (size_t k = 0; k < r; ++k) p.units[order[k]] = {in.has_gpu ? Home::kVram : Home::kRam, in.has_gpu ? Executor::kGpu : Executor::kCpu};
    if (in.has_gpu) {
      if (!split_ram_disk(in, streamed, in.ram_budget, 2, p)) {
        staging_failed = true;
        continue;
      }
    } else {
      // CPU-only: streamed units come from disk through the RAM slots counted above.
      for (size_t idx : streamed) p.units[idx] = {Home::kDisk, Executor::kCpu};
    }
    score(in, p);
    if (in.has_gpu && in.allow_cpu_executor) {
      std::vector<size_t> ram_units;
      for (size_t i = 0; i < n; ++i) {
        if (p.units[i].home == Home::kRam) ram_units.push_back(i);
      }
      // Strictly better only, so ties keep fewer CPU units, and alternating over split.
      Plan chosen = p;
      if (in.hybrid_mode != HybridMode::kSplit && !ram_units.empty()) {
        chosen = best_spread(in, p, ram_units);
        p.alternating_seconds = chosen.token_seconds;
      }
      if (in.hybrid_mode != HybridMode::kAlternate) {
        std::optional<Plan> split = best_split(in, p, ram_units);
        if (split) {
          // Forced (kSplit): the split placement even where streaming everything is predicted
          // faster, so the two can be measured against each other.
          p.split_seconds = split->token_seconds;
          if (in.hybrid_mode == HybridMode::kSplit || split->token_seconds < chosen.token_seconds * (1 - 1e-12)) {
            chosen = std::move(*split);
          }
        }
      }
      chosen.alternating_seconds = p.alternating_seconds;
      chosen.split_seconds = p.split_seconds;
      p = std::move(chosen);
    }
    tally(in, p);
    // Plans are tried with ever more bytes resident, so on a tie (a compute-bound token, where a
    // few streamed layers would hide behind the compute) the later one wins: streaming costs what
    // the model does not count (copies competing for memory bandwidth, per-layer synchronization),
    // measured on an H200 with 48 GiB free for a 70B (same sweep script, two calls): one streamed
    // layer 26.3 ms/token, all resident 22.2.
    if (!best || p.token_seconds <= best->token_seconds * (1 + 1e-12)) best = std::move(p);
  }
  if (!best) {
    if (min_fast_needed > fast_budget) {
      return invalid_argument(std::string(in.has_gpu ? "VRAM" : "RAM") + " budget too small: weights need at least " +
                              format_bytes(min_fast_needed) + " (" + std::to_string(in.min_slots) +
                              " streaming slots of the largest unit) but " + format_bytes(fast_budget) + " is available" +
                              (in.has_gpu ? " after the KV cache and workspace" : ""));
    }
    (void)staging_failed;
    return invalid_argument("RAM budget " + format_bytes(in.ram_budget) +
                            " too small: reading from disk needs 2 pinned staging slots of the largest streamed unit");
  }
  return *best;
}

namespace {

// The decode placement's CPU units, and that placement with every unit on the GPU (unscored).
std::vector<size_t> batch_candidates(const Plan& decode, Plan* base) {
  std::vector<size_t> cpu_units;
  for (size_t i = 0; i < decode.units.size(); ++i) {
    if (decode.units[i].exec == Executor::kCpu) cpu_units.push_back(i);
  }
  *base = decode;
  for (UnitPlan& u : base->units) {
    if (u.exec != Executor::kGpu) u = {u.home, Executor::kGpu, 0.0};
  }
  return cpu_units;
}

}  // namespace

Plan batch_placement(const PlanInput& in, const Plan& decode) {
  SLUICE_CHECK(decode.units.size() == in.units.size(), "batch_placement: plan and input differ in unit count");
  Plan base = decode;
  if (!in.has_gpu) {  // CPU only: every unit is the CPU's already
    score_plan(in, base);
    return base;
  }
  const std::vector<size_t> cpu_units = batch_candidates(decode, &base);
  score_plan(in, base);
  // The alternating placements' spread, over the decode placement's CPU units.
  Plan chosen = best_spread(in, base, cpu_units);
  score_plan(in, chosen);  // the byte totals of the chosen units
  return chosen;
}

int cpu_unit_count(const Plan& p) {
  return int(std::count_if(p.units.begin(), p.units.end(),
                           [](const UnitPlan& u) { return u.exec == Executor::kCpu; }));
}

Plan batch_placement_count(const PlanInput& in, const Plan& decode, int count) {
  SLUICE_CHECK(decode.units.size() == in.units.size(), "batch_placement_count: plan and input differ in unit count");
  SLUICE_CHECK(in.has_gpu, "batch_placement_count: a CPU-only placement has no count to choose");
  Plan base;
  const std::vector<size_t> cpu_units = batch_candidates(decode, &base);
  SLUICE_CHECK(count >= 0 && size_t(count) <= cpu_units.size(),
               "batch_placement_count: the count is outside 0 .. the decode placement's CPU units");
  Plan chosen = spread(base, cpu_units, size_t(count));
  score_plan(in, chosen);
  return chosen;
}

void score_plan(const PlanInput& in, Plan& p) {
  SLUICE_CHECK(p.units.size() == in.units.size(), "score_plan: plan and input differ in unit count");
  p.resident_bytes = 0;
  for (size_t i = 0; i < in.units.size(); ++i) {
    if (p.units[i].home == Home::kVram || (!in.has_gpu && p.units[i].home == Home::kRam)) {
      p.resident_bytes += in.units[i].bytes;
    }
  }
  tally(in, p);
  score(in, p);
}

std::string Plan::describe(const PlanInput& in) const {
  std::string out;
  char line[320];
  const bool any_cpu_on_gpu_machine =
      in.has_gpu && std::any_of(units.begin(), units.end(), [](const UnitPlan& u) { return u.exec != Executor::kGpu; });
  auto secs = [&](size_t i) { return i < unit_seconds.size() ? unit_seconds[i] : 0.0; };
  if (any_cpu_on_gpu_machine) {
    // One line per unit: with CPU units interleaved, runs would be one or two units long anyway,
    // and the per-unit times show where the CPU and the GPU spend the token. A split unit shows
    // the CPU's share of its rows ("split 0.41").
    for (size_t i = 0; i < units.size(); ++i) {
      char exec[24];
      if (units[i].exec == Executor::kSplit) {
        std::snprintf(exec, sizeof exec, "split %.2f", units[i].cpu_share);
      } else {
        std::snprintf(exec, sizeof exec, "%s", executor_name(units[i].exec));
      }
      std::snprintf(line, sizeof line, "  %-28s %-7s %-10s %12s %9.3f ms\n", in.units[i].name.c_str(),
                    home_name(units[i].home), exec, format_bytes(in.units[i].bytes).c_str(), secs(i) * 1e3);
      out += line;
    }
  } else {
    // Runs of consecutive units with the same placement, e.g. "blk.0 .. blk.24  A:vram gpu".
    size_t i = 0;
    while (i < units.size()) {
      size_t j = i;
      uint64_t bytes = 0;
      double seconds = 0;
      while (j < units.size() && units[j].home == units[i].home && units[j].exec == units[i].exec) {
        seconds += secs(j);
        bytes += in.units[j++].bytes;
      }
      std::string names = in.units[i].name + (j - i > 1 ? " .. " + in.units[j - 1].name : "");
      std::snprintf(line, sizeof line, "  %-28s %-7s %-4s %3zu units %12s %9.3f ms\n", names.c_str(), home_name(units[i].home),
                    executor_name(units[i].exec), j - i, format_bytes(bytes).c_str(), seconds * 1e3);
      out += line;
      i = j;
    }
  }
  if (kept_units > 0) {
    std::snprintf(line, sizeof line,
                  "  %d streamed unit%s kept in %s slot%s: copied once, then read in place every pass (a pass that "
                  "streams more units through the slots copies them again once)\n",
                  kept_units, kept_units > 1 ? "s" : "", kept_units > 1 ? "their" : "its", kept_units > 1 ? "s" : "");
    out += line;
  }
  std::snprintf(line, sizeof line,
                "  resident %s, pinned RAM %s, disk %s, staging %s, %d slots of %s, CPU computes %s\n",
                format_bytes(resident_bytes).c_str(), format_bytes(ram_bytes).c_str(), format_bytes(disk_bytes).c_str(),
                format_bytes(staging_bytes).c_str(), n_slots, format_bytes(slot_bytes).c_str(),
                format_bytes(cpu_exec_bytes).c_str());
  out += line;
  const double tps = token_seconds > 0 ? double(in.batch) / token_seconds : 0.0;
  if (in.batch == 1) {
    std::snprintf(line, sizeof line, "  predicted token time %.2f ms (%.2f tok/s), bound by %s\n", token_seconds * 1e3, tps,
                  bound.c_str());
  } else {
    std::snprintf(line, sizeof line, "  predicted pass time %.2f ms for %d tokens (%.2f tok/s), bound by %s\n",
                  token_seconds * 1e3, in.batch, tps, bound.c_str());
  }
  out += line;
  char split[48] = "";
  if (t_split > 0) std::snprintf(split, sizeof split, " + split %.2f", t_split * 1e3);
  std::snprintf(line, sizeof line,
                "    exec %.2f ms (cpu %.2f + gpu %.2f%s + %d switches %.2f), h2d %.2f ms, disk %.2f ms, dram %.2f ms, "
                "schedule %.2f ms\n",
                t_exec * 1e3, t_cpu * 1e3, t_gpu * 1e3, split, n_switches, double(n_switches) * in.bw.switch_seconds * 1e3,
                t_h2d * 1e3, t_disk * 1e3, t_dram * 1e3, t_pipeline * 1e3);
  out += line;
  if (alternating_seconds > 0 || split_seconds > 0) {
    auto ms = [](double t) {
      char b[32] = "-";
      if (t > 0) std::snprintf(b, sizeof b, "%.2f", t * 1e3);
      return std::string(b);
    };
    std::snprintf(line, sizeof line,
                  "  hybrid (%s): alternating whole layers %s ms, row split %s ms (hand-offs %.2f ms per split "
                  "layer)\n",
                  hybrid_mode_name(in.hybrid_mode), ms(alternating_seconds).c_str(), ms(split_seconds).c_str(),
                  in.bw.split_seconds * 1e3);
    out += line;
  }
  return out;
}

Result<OffloadPrediction> predict_llama_offload(const std::vector<Unit>& layers, int n_gpu_layers, const Bandwidths& bw,
                                                const std::optional<Unit>& output, int batch) {
  const int n = int(layers.size());
  const int max_n = n + (output ? 1 : 0);
  if (n_gpu_layers < 0 || n_gpu_layers > max_n) {
    return invalid_argument("llama offload: n_gpu_layers " + std::to_string(n_gpu_layers) + " outside 0.." +
                            std::to_string(max_n));
  }
  if (!rates_ok(bw)) return invalid_argument("llama offload: bandwidths and compute rates must be positive");
  if (batch < 1) return invalid_argument("llama offload: batch must be >= 1");
  OffloadPrediction r;
  r.n_gpu_layers = n_gpu_layers;
  const int first_gpu = n - std::min(n_gpu_layers, n);  // llama.cpp offloads the last N layers
  bool have_prev = false;
  Executor prev = Executor::kCpu;
  auto add = [&](const Unit& u, Executor e) {
    const double t = exec_seconds(u, e, batch, bw);
    (e == Executor::kGpu ? r.t_gpu : r.t_cpu) += t;
    if (e == Executor::kGpu) r.gpu_bytes += u.bytes;
    if (have_prev && e != prev) ++r.n_switches;
    have_prev = true;
    prev = e;
  };
  for (int i = 0; i < n; ++i) add(layers[size_t(i)], i >= first_gpu ? Executor::kGpu : Executor::kCpu);
  if (output) add(*output, n_gpu_layers > n ? Executor::kGpu : Executor::kCpu);
  r.token_seconds = r.t_cpu + r.t_gpu + double(r.n_switches) * bw.switch_seconds;
  return r;
}

Result<OffloadPrediction> best_llama_offload(const std::vector<Unit>& layers, uint64_t vram_budget_for_layers,
                                             const Bandwidths& bw, const std::optional<Unit>& output, int batch) {
  std::optional<OffloadPrediction> best;
  const int max_n = int(layers.size()) + (output ? 1 : 0);
  for (int ngl = 0; ngl <= max_n; ++ngl) {
    SLUICE_ASSIGN_OR_RETURN(OffloadPrediction r, predict_llama_offload(layers, ngl, bw, output, batch));
    if (r.gpu_bytes > vram_budget_for_layers) continue;
    if (!best || r.token_seconds < best->token_seconds * (1 - 1e-12)) best = r;
  }
  return *best;  // ngl = 0 has no GPU bytes, so best is set
}

}  // namespace sluice::stream
