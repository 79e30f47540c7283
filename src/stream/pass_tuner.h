// Pass tuning: the number of CPU layers a multi-token pass runs, chosen from the passes' own times.
//
// The cost model places a pass of n tokens (several sequences' decode tokens) with rates measured
// at start-up and learned from the CPU layers (stream/plan.h batch_placement). Its error is a few
// layers: on the H200 host (70B Q4_K_M, 16 GiB free, 32 concurrent) it planned 19 CPU layers at
// 2.55 Tops/s while the layers ran at 2.32, and its copy rate was the probe's shared one, slower
// than the copies reach inside those passes; each layer too many costs a CPU layer's time (~23 ms)
// against a copy's (~9 ms) that hides behind the CPU. A CountTuner corrects that from measurement:
// it starts at the planner's count, times `samples` consecutive passes at each count (median), tries
// one CPU layer fewer and keeps moving down while a step is faster than the best so far by more
// than `min_gain`. A count that is not (a miss) does not end the walk at once: it goes `patience`
// counts further the same way, and moves there if one of them beats the best by the margin. If the
// way down gives nothing, it tries more layers the same way. Then it settles on the best count: the
// last one that beat the best before it by more than min_gain (a count faster by less is measured
// but not taken: within the noise of a median of three passes). A hill climb over one integer: the
// pass time as a function of the count is max(CPU time, copy time) plus the GPU's share, which
// falls and then rises, so the climb stops at the minimum up to noise and the margin.
// Why the patience: a median of three 32-token passes of the 70B varies by several percent, while
// one layer moves the pass by ~4% on the slope; on an H100 host (2026-12-08) the walk stopped at
// 21 CPU layers because 20 measured only 0.8% faster (515.8 against 520.2 ms), where the pass model
// (bench/e2e/pass_model.py, that run's rates) puts 20 at 502 ms and the minimum at 17-18 (~458 ms).
// With per-pass noise of +-4% on that curve, walks from 19-24 settle on average at ~496 ms without
// patience and at ~461 ms with a patience of one (PatienceCarriesTheWalkPastANoisyStep), which
// times two more counts (six passes) at the minimum.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace sluice::stream {

class CountTuner {
 public:
  struct Options {
    int samples = 3;          // passes timed per count (their median is the count's time)
    double min_gain = 0.02;   // a neighbour must be faster by this fraction to be taken
    int patience = 1;         // counts tried past one that is not faster before a direction ends
  };
  // Counts range over 0 .. max_count; start is the planner's (clamped into that range).
  CountTuner(int start, int max_count, Options opts);
  CountTuner(int start, int max_count) : CountTuner(start, max_count, Options{}) {}

  int count() const { return current_; }  // the count the next pass runs
  int start() const { return start_; }
  // The planner's count for this pass size, where the tuner started elsewhere (corrected_start);
  // start() unless set.
  int planned() const { return planned_; }
  void set_planned(int planned) { planned_ = planned; }
  bool settled() const { return settled_; }
  // One pass at count() took `seconds` (ignored unless positive and finite, and, once a count has
  // been measured, unless under kOutlierFactor times the best median: a pass timed to the next
  // pass's start also spans any idle time between them, e.g. a server waiting for requests).
  // True when count() changed (the caller places the next pass anew).
  bool observe(double seconds);
  static constexpr double kOutlierFactor = 4.0;
  int counts_measured() const { return int(measured_.size()); }
  // What was measured, for the stats line: "19 -> 17 (settled; 19: 519.9 ms, 18: 500.0 ms, ...)",
  // or "19 .. 18 (tuning; ...)" while it is still moving.
  std::string describe() const;

 private:
  struct Measured {
    int count;
    double seconds;  // median
  };
  void finish_count(double median);
  void settle();

  Options opts_;
  int start_ = 0, max_count_ = 0, planned_ = 0;
  int current_ = 0;
  int best_ = 0;
  double best_seconds_ = 0;
  int direction_ = -1;       // the direction being explored
  int misses_ = 0;           // counts in direction_ since the best that were not faster
  bool moved_ = false;       // a step in direction_ was taken (so the other way is not tried)
  bool settled_ = false;
  std::vector<double> samples_;
  std::vector<Measured> measured_;
};

// Where a new pass size's tuner starts: the planner's count for it, moved by the correction the
// nearest settled size measured (its settled count minus the planner's count for it), when that
// size is within a quarter of n_tokens; clamped to 0 .. max_count. The planner's error comes
// mostly from its rates, which every size shares, so a size that appears while serving (requests
// joining and finishing change the pass size) starts near its best count instead of walking there.
int corrected_start(int planned, int n_tokens, int max_count, const std::map<int, CountTuner>& tuners);

}  // namespace sluice::stream
