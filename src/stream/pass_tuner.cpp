#include "stream/pass_tuner.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>

#include "core/status.h"

namespace sluice::stream {

CountTuner::CountTuner(int start, int max_count, Options opts) : opts_(opts) {
  SLUICE_CHECK(max_count >= 0, "CountTuner: negative count range");
  SLUICE_CHECK(opts_.samples >= 1 && opts_.min_gain >= 0 && opts_.patience >= 0,
               "CountTuner: samples must be >= 1, min_gain and patience >= 0");
  max_count_ = max_count;
  start_ = std::clamp(start, 0, max_count);
  current_ = best_ = planned_ = start_;
  if (max_count_ == 0) settled_ = true;  // nothing to choose
}

bool CountTuner::observe(double seconds) {
  if (settled_ || !(seconds > 0) || !std::isfinite(seconds)) return false;
  if (!measured_.empty() && seconds > kOutlierFactor * best_seconds_) return false;
  samples_.push_back(seconds);
  if (int(samples_.size()) < opts_.samples) return false;
  const auto mid = samples_.begin() + std::ptrdiff_t(samples_.size() / 2);
  std::nth_element(samples_.begin(), mid, samples_.end());
  const double median = *mid;
  samples_.clear();
  const int before = current_;
  finish_count(median);
  return current_ != before;
}

void CountTuner::finish_count(double median) {
  measured_.push_back({current_, median});
  bool further = false;  // the next count is one past current_ (a miss within the patience)
  if (measured_.size() == 1) {  // the planner's count
    best_seconds_ = median;
  } else if (median < best_seconds_ * (1 - opts_.min_gain)) {
    best_ = current_;
    best_seconds_ = median;
    moved_ = true;
    misses_ = 0;
  } else if (++misses_ <= opts_.patience) {
    further = true;  // not faster: one more step the same way before this direction is given up
  } else if (direction_ < 0 && !moved_) {
    direction_ = 1;  // fewer was no faster: try more
    misses_ = 0;
  } else {
    return settle();
  }
  int next = (further ? current_ : best_) + direction_;
  const auto outside = [&](int c) { return c < 0 || c > max_count_; };
  if (outside(next) && direction_ < 0 && !moved_) {  // no count below: try more
    direction_ = 1;
    misses_ = 0;
    next = best_ + 1;
  }
  if (outside(next)) return settle();
  current_ = next;
}

void CountTuner::settle() {
  current_ = best_;
  settled_ = true;
}

std::string CountTuner::describe() const {
  std::string s = std::to_string(start_) + (settled_ ? " -> " : " .. ") + std::to_string(current_) +
                  (settled_ ? " (settled;" : " (tuning;");
  if (planned_ != start_) s += " planner " + std::to_string(planned_) + ";";
  char item[64];
  for (size_t i = 0; i < measured_.size(); ++i) {
    std::snprintf(item, sizeof item, "%s %d: %.1f ms", i > 0 ? "," : "", measured_[i].count, measured_[i].seconds * 1e3);
    s += item;
  }
  return s + ")";
}

int corrected_start(int planned, int n_tokens, int max_count, const std::map<int, CountTuner>& tuners) {
  const CountTuner* nearest = nullptr;
  int distance = 0;
  for (const auto& [n, t] : tuners) {
    const int d = std::abs(n - n_tokens);
    if (!t.settled() || 4 * d > n_tokens || (nearest != nullptr && d >= distance)) continue;
    nearest = &t;
    distance = d;
  }
  const int correction = nearest != nullptr ? nearest->count() - nearest->planned() : 0;
  return std::clamp(planned + correction, 0, std::max(max_count, 0));
}

}  // namespace sluice::stream
