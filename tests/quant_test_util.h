// Weight rows for kernel tests: shared by the tile and packed-layout tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quant/half.h"
#include "quant/quant.h"
#include "test_util.h"

namespace sluice::quant {

// Byte offsets of the f16 scale fields of a block (kept finite and moderate in raw random blocks).
inline std::vector<int> f16_fields(Type t) {
  switch (t) {
    case Type::kQ4_0: case Type::kQ5_0: case Type::kQ8_0: return {0};
    case Type::kQ4_1: case Type::kQ5_1: case Type::kQ4_K: case Type::kQ5_K: return {0, 2};
    case Type::kQ2_K: return {80, 82};
    case Type::kQ3_K: return {108};
    case Type::kQ6_K: return {208};
    default: return {};
  }
}

// n_rows weight rows of n elements at w_stride bytes: even rows from the reference quantizer,
// odd rows raw random blocks (any bit pattern the format allows) with finite scales.
inline std::vector<uint8_t> weight_rows(Type t, int64_t n, int n_rows, int64_t w_stride, uint64_t salt) {
  std::vector<uint8_t> w(size_t(w_stride * std::max(n_rows, 1)), 0xA5);
  std::mt19937_64 rng(test::test_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  std::normal_distribution<float> g(0.0f, 0.05f);
  const int64_t rb = row_bytes(t, n);
  const bool is_float = t == Type::kF32 || t == Type::kF16 || t == Type::kBF16;
  for (int r = 0; r < n_rows; ++r) {
    uint8_t* row = w.data() + r * w_stride;
    if (r % 2 == 0 || is_float) {
      const auto f = test::random_floats(size_t(n), 0.5f, salt * 131 + uint64_t(r));
      kernels_for(t, Isa::kRef)->quantize_row(f.data(), row, n);
      continue;
    }
    for (int64_t b = 0; b < rb; ++b) row[b] = uint8_t(rng());
    const int64_t bb = traits(t).block_bytes;
    for (int64_t off = 0; off < rb; off += bb)
      for (int f : f16_fields(t)) {
        const uint16_t h = fp32_to_fp16(g(rng));
        std::memcpy(row + off + f, &h, 2);
      }
  }
  return w;
}

}  // namespace sluice::quant
