// Which layers a forward pass runs: the layer mask (self-draft passes, --skip-layers) and the
// early-exit test (--early-exit), kept out of the layer loop so that forward.cpp only asks
// "run layer l?" and "stop after layer l?" (Model::set_layer_mask / set_early_exit, model.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace sluice::model {

class LayerGate {
 public:
  Status set_mask(std::vector<bool> run, int n_layer) {
    if (!run.empty() && int(run.size()) != n_layer) {
      return invalid_argument("layer mask has " + std::to_string(run.size()) + " entries, the model has " +
                              std::to_string(n_layer) + " layers");
    }
    run_ = std::move(run);
    all_ = true;
    for (bool r : run_) all_ = all_ && r;
    if (all_) run_.clear();
    if (!all_ && run_ != keyed_) {  // a mask not seen last: its steps are other ops
      keyed_ = run_;
      ++mask_key_;
    }
    return Status::ok();
  }
  Status set_early_exit(float threshold, int min_layer, int n_layer) {
    if (!std::isfinite(threshold) || threshold > 1) {
      return invalid_argument("early-exit threshold must be <= 1 (a cosine similarity; <= 0: off)");
    }
    if (threshold > 0 && (min_layer < 0 || min_layer >= n_layer)) {
      return invalid_argument("early-exit minimum layer " + std::to_string(min_layer) + " outside [0, " +
                              std::to_string(n_layer) + ")");
    }
    threshold_ = threshold > 0 ? threshold : 0;
    min_layer_ = min_layer;
    return Status::ok();
  }

  const std::vector<bool>& mask() const { return run_; }  // empty: every layer
  // Every layer runs and no pass can exit early: the pass is the model's full, replayable one.
  bool full() const { return all_ && threshold_ <= 0; }
  // Whether a one-token pass issues the same ops every token (no early exit), and the key that
  // names those ops (Backend::replay_step): 1 with every layer, another per mask. A mask set again
  // after passes without one (a self-draft's draft passes between verifications) keeps its key.
  bool replayable() const { return threshold_ <= 0; }
  uint64_t step_key() const { return all_ ? 1 : 1 + mask_key_; }
  bool runs(int layer) const { return run_.empty() || run_[size_t(layer)]; }
  // Early exit applies to passes of one token (decode, draft): it needs the hidden state per layer.
  bool watches(int64_t n_tokens) const { return threshold_ > 0 && n_tokens == 1; }
  // Whether the pass needs the hidden state after `layer` (watched passes).
  bool wants(int layer) const { return layer + 1 >= min_layer_; }
  // After layer `layer` ran (watched passes), with its output: true when the pass should stop,
  // the cosine similarity of this layer's input (the previous run layer's output) and output
  // having reached the threshold.
  bool converged(int layer, std::span<const float> x) {
    bool stop = false;
    if (layer >= min_layer_ && prev_.size() == x.size()) {
      double dot = 0, a = 0, b = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        dot += double(prev_[i]) * x[i];
        a += double(prev_[i]) * prev_[i];
        b += double(x[i]) * x[i];
      }
      stop = a > 0 && b > 0 && dot / std::sqrt(a * b) >= threshold_;
    }
    prev_.assign(x.begin(), x.end());
    if (stop) ++counts_.early_exits;
    return stop;
  }
  void count_pass() {
    ++counts_.passes;
    prev_.clear();
  }
  void count_layer() { ++counts_.layers_run; }
  // A replayed step (Backend::replay_step): a pass of the mask's layers, counted without the loop.
  void count_replayed(int n_layer) {
    ++counts_.passes;
    counts_.layers_run += run_.empty() ? n_layer : int64_t(std::count(run_.begin(), run_.end(), true));
  }
  Model::LayerCounts counts() const { return counts_; }

 private:
  std::vector<bool> run_;  // empty: every layer
  bool all_ = true;
  std::vector<bool> keyed_;  // the last mask given a step key, and its number
  uint64_t mask_key_ = 0;
  float threshold_ = 0;
  int min_layer_ = 0;
  std::vector<float> prev_;  // the watched layer's input (last token)
  Model::LayerCounts counts_;
};

}  // namespace sluice::model
