// Pass tuning: the number of CPU layers a multi-token pass runs, chosen from the passes' own times.
//
// The cost model places a pass of n tokens (several sequences' decode tokens) with rates measured
// at start-up and learned from the CPU layers (stream/plan.h batch_placement). Its error is a few
// layers: on the H200 host (70B Q4_K_M, 16 GiB free, 32 concurrent) it planned 19 CPU layers at
// 2.55 Tops/s while the layers ran at 2.32, and its copy rate was the probe's shared one, slower
// than the copies reach inside those passes; each layer too many costs a CPU layer's time (~23 ms)
// against a copy's (~9 ms) that hides behind the CPU. A CountTuner corrects that from measurement:
// it starts at the planner's count, times `samples` consecutive passes at each count (median), tries
// one CPU layer fewer and keeps moving down while each step is faster by more than `min_gain`; if
// the first step down is not faster, it tries one more layer, and keeps moving up the same way.
// Then it settles on the best count: the last one that beat the best before it by more than
// min_gain (a neighbour faster by less is measured but not taken: within the noise of a median of
// three passes). A hill climb over one integer: the pass time as a function of the count is
// max(CPU time, copy time) plus the GPU's share, which falls and then rises, so the climb stops
// at the minimum up to noise and the margin.
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
