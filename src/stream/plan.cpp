#include "stream/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
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

const char* executor_name(Executor e) { return e == Executor::kGpu ? "gpu" : "cpu"; }

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

namespace {

// Fills in the cost terms of a plan whose homes and executors are set.
void score(const PlanInput& in, Plan& p) {
  double exec = 0, h2d = 0, disk = 0, dram = 0;
  for (size_t i = 0; i < in.units.size(); ++i) {
    const double b = double(in.units[i].bytes);
    const UnitPlan& u = p.units[i];
    if (!in.has_gpu) {
      exec += b / in.bw.cpu;
      if (u.home == Home::kDisk) disk += b;
      continue;
    }
    if (u.exec == Executor::kCpu) {
      exec += b / in.bw.cpu;
      dram += b;
    } else {
      exec += b / in.bw.vram;
      if (u.home != Home::kVram) {
        h2d += b;
        dram += b;
      }
    }
    if (u.home == Home::kDisk) disk += b;
  }
  p.t_exec = exec;
  p.t_h2d = in.has_gpu ? h2d / in.bw.h2d : 0;
  p.t_disk = disk / in.bw.disk;
  p.t_dram = in.has_gpu ? dram / in.bw.dram : 0;
  p.token_seconds = std::max({p.t_exec, p.t_h2d, p.t_disk, p.t_dram});
  p.bound = p.token_seconds == p.t_exec ? "compute" : p.token_seconds == p.t_h2d ? "h2d" : p.token_seconds == p.t_disk ? "disk" : "dram";
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

}  // namespace

Result<Plan> make_plan(const PlanInput& in) {
  if (in.units.empty()) return invalid_argument("plan: no weight units");
  if (in.min_slots < 1) return invalid_argument("plan: min_slots must be >= 1");
  const Bandwidths& bw = in.bw;
  if (!(bw.vram > 0 && bw.h2d > 0 && bw.disk > 0 && bw.cpu > 0 && bw.dram > 0)) {
    return invalid_argument("plan: bandwidths must be positive");
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
      // Hand B units to the CPU one at a time (smallest first for fine steps) while it helps.
      std::vector<size_t> ram_units;
      for (size_t idx : streamed) {
        if (p.units[idx].home == Home::kRam) ram_units.push_back(idx);
      }
      std::reverse(ram_units.begin(), ram_units.end());
      for (size_t idx : ram_units) {
        Plan trial = p;
        trial.units[idx].exec = Executor::kCpu;
        score(in, trial);
        if (trial.token_seconds >= p.token_seconds) break;
        p = std::move(trial);
      }
    }
    p.ram_bytes = p.disk_bytes = p.cpu_exec_bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t b = in.units[i].bytes;
      if (in.has_gpu && p.units[i].home == Home::kRam) p.ram_bytes += b;
      if (p.units[i].home == Home::kDisk) p.disk_bytes += b;
      if (p.units[i].exec == Executor::kCpu) p.cpu_exec_bytes += b;
    }
    if (!best || p.token_seconds < best->token_seconds * (1 - 1e-12)) best = std::move(p);
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

void score_plan(const PlanInput& in, Plan& p) {
  SLUICE_CHECK(p.units.size() == in.units.size(), "score_plan: plan and input differ in unit count");
  p.resident_bytes = p.ram_bytes = p.disk_bytes = p.cpu_exec_bytes = 0;
  for (size_t i = 0; i < in.units.size(); ++i) {
    const uint64_t b = in.units[i].bytes;
    if (p.units[i].home == Home::kVram || (!in.has_gpu && p.units[i].home == Home::kRam)) p.resident_bytes += b;
    if (in.has_gpu && p.units[i].home == Home::kRam) p.ram_bytes += b;
    if (p.units[i].home == Home::kDisk) p.disk_bytes += b;
    if (p.units[i].exec == Executor::kCpu) p.cpu_exec_bytes += b;
  }
  score(in, p);
}

std::string Plan::describe(const PlanInput& in) const {
  std::string out;
  char line[256];
  // Runs of consecutive units with the same placement, e.g. "blk.0 .. blk.24  A:vram gpu".
  size_t i = 0;
  while (i < units.size()) {
    size_t j = i;
    uint64_t bytes = 0;
    while (j < units.size() && units[j].home == units[i].home && units[j].exec == units[i].exec) bytes += in.units[j++].bytes;
    std::string names = in.units[i].name + (j - i > 1 ? " .. " + in.units[j - 1].name : "");
    std::snprintf(line, sizeof line, "  %-28s %-7s %-4s %3zu units %12s\n", names.c_str(), home_name(units[i].home),
                  executor_name(units[i].exec), j - i, format_bytes(bytes).c_str());
    out += line;
    i = j;
  }
  std::snprintf(line, sizeof line,
                "  resident %s, pinned RAM %s, disk %s, staging %s, %d slots of %s, CPU computes %s\n",
                format_bytes(resident_bytes).c_str(), format_bytes(ram_bytes).c_str(), format_bytes(disk_bytes).c_str(),
                format_bytes(staging_bytes).c_str(), n_slots, format_bytes(slot_bytes).c_str(),
                format_bytes(cpu_exec_bytes).c_str());
  out += line;
  std::snprintf(line, sizeof line,
                "  predicted token time %.2f ms (%.2f tok/s), bound by %s: exec %.2f ms, h2d %.2f ms, disk %.2f ms, dram %.2f ms\n",
                token_seconds * 1e3, token_seconds > 0 ? 1.0 / token_seconds : 0.0, bound.c_str(), t_exec * 1e3, t_h2d * 1e3,
                t_disk * 1e3, t_dram * 1e3);
  out += line;
  return out;
}

}  // namespace sluice::stream
