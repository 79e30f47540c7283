// Shared helpers for tests: where fixtures and real models live, fresh random data, and the
// normalized error used by every parity test.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace sluice::test {

inline std::string source_dir() {
  const char* env = std::getenv("SLUICE_SOURCE_DIR");
  return env ? env : SLUICE_SOURCE_DIR;
}

inline std::string fixture_path(const std::string& rel) { return source_dir() + "/tests/fixtures/" + rel; }

// Real models are installed under <source>/models/ by scripts/fetch-models.sh.
inline std::string model_path(const std::string& file) { return source_dir() + "/models/" + file; }
inline constexpr const char* kSmolLM2 = "smollm2-135m-instruct-q4_1.gguf";
inline constexpr const char* kGemma3 = "gemma-3-270m-q4_k_m.gguf";  // scripts/fetch-models.sh assembles it

// Skips the test when the model is absent, unless SLUICE_REQUIRE_MODELS is set (scripts/test.sh
// sets it, so CI fails instead of silently skipping).
#define SLUICE_REQUIRE_MODEL(path)                                                    \
  do {                                                                                \
    if (!std::filesystem::exists(path)) {                                             \
      if (std::getenv("SLUICE_REQUIRE_MODELS")) FAIL() << "missing model " << (path); \
      GTEST_SKIP() << "model not installed: " << (path) << " (run scripts/fetch-models.sh)"; \
    }                                                                                 \
  } while (0)

// Fresh random data each run; the seed is printed so a failure can be replayed with
// SLUICE_TEST_SEED=<seed>.
inline uint64_t test_seed() {
  if (const char* s = std::getenv("SLUICE_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  static const uint64_t seed = std::random_device{}();  // immutable after first use
  return seed;
}
inline std::vector<float> random_floats(size_t n, float scale = 1.0f, uint64_t salt = 0) {
  std::mt19937_64 rng(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// The squared norms behind normalized_error: num = ||a - b||^2, den = ||b||^2 (sums of several
// slices add up to the whole's).
struct SquaredNorms {
  double num = 0, den = 0;
  double ratio() const { return std::sqrt(num) / std::max(std::sqrt(den), 1e-30); }
};
inline SquaredNorms squared_norms(const float* a, const float* b, size_t n) {
  SquaredNorms s;
  for (size_t i = 0; i < n; ++i) {
    double d = double(a[i]) - double(b[i]);
    s.num += d * d;
    s.den += double(b[i]) * double(b[i]);
  }
  return s;
}
// ||a - b|| / max(||b||, tiny): the normalized error every parity tolerance is stated in.
inline double normalized_error(const float* a, const float* b, size_t n) { return squared_norms(a, b, n).ratio(); }

}  // namespace sluice::test
