// Wall-clock timing for tok/s reporting (steady clock: immune to clock adjustments).
#pragma once

#include <chrono>

namespace sluice::core {

class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace sluice::core
