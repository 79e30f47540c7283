// Every ISA's vec_dot_tile against the scalar reference vec_dot, on fresh random data.
// Tolerance: normalized error (test_util.h) <= 1e-5 over all outputs of one (format, n), every
// shape's: the kernels form the reference's per-block integer sums exactly and differ only in f32
// summation order (and, for Q4_K, in applying the min term in its own f32 accumulator). Not per
// shape: a shape with one output makes the error one dot product's relative error, which
// cancellation can lift far above the f32 order's effect (AVX-512, 2-core VM, 2026-11-29: 19 of
// 200 seeds failed, all at 1 x 1 or 2 x 1, up to 5.1e-4; e.g. -0.602444 against -0.602453).
// Shapes: row and column counts below, at and above the register tile (1 x 8 on AVX-512; the
// kernels are written for any rows x columns), odd counts for the ragged edges, padded strides,
// and an output stride wider than the rows; every output outside the tile must stay untouched.
// A planted bug (one output taken from the wrong column) must fail the same check, so the check
// cannot pass vacuously.
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace sluice::quant {
namespace {

constexpr Type kWeightTypes[] = {Type::kF32,  Type::kF16,  Type::kBF16, Type::kQ4_0, Type::kQ4_1,
                                 Type::kQ5_0, Type::kQ5_1, Type::kQ8_0, Type::kQ2_K, Type::kQ3_K,
                                 Type::kQ4_K, Type::kQ5_K, Type::kQ6_K};
constexpr float kSentinel = 12345.0f;

class QuantTile : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (kernels_for(Type::kF32, GetParam()) == nullptr)
      GTEST_SKIP() << "this CPU lacks " << isa_name(GetParam()) << "; its kernels are not tested here";
  }
};

struct TileCase {
  int64_t n;
  int n_rows, n_cols;
};

// Runs `tile` on one case and returns the squared norms of its error against the reference
// vec_dot of each (row, column) (test_util.h; they add up over cases); flags writes outside the
// n_rows x n_cols block.
test::SquaredNorms tile_error(const Kernels& k, Type t, Isa isa, const TileCase& tc, uint64_t salt, bool* wrote_outside,
                              void (*tile)(int64_t, const void*, int64_t, int, const void*, int64_t, int, float*,
                                           int64_t)) {
  const Type at = k.vec_dot_type;
  const int64_t w_stride = row_bytes(t, tc.n) + 40;   // padded, not a multiple of 64
  const int64_t a_stride = row_bytes(at, tc.n) + 68;
  const int64_t out_stride = tc.n_rows + 3;
  const auto w = weight_rows(t, tc.n, tc.n_rows, w_stride, salt);
  std::vector<uint8_t> act(size_t(a_stride * std::max(tc.n_cols, 1)));
  for (int c = 0; c < tc.n_cols; ++c) {
    const auto af = test::random_floats(size_t(tc.n), 2.0f, salt * 977 + uint64_t(c));
    kernels_for(at, isa)->quantize_row(af.data(), act.data() + c * a_stride, tc.n);
  }
  std::vector<float> out(size_t(out_stride * (tc.n_cols + 1)), kSentinel);
  tile(tc.n, w.data(), w_stride, tc.n_rows, act.data(), a_stride, tc.n_cols, out.data(), out_stride);
  std::vector<float> got, want;
  *wrote_outside = false;
  for (int c = 0; c <= tc.n_cols; ++c)
    for (int64_t r = 0; r < out_stride; ++r) {
      const float v = out[size_t(c * out_stride + r)];
      if (c == tc.n_cols || r >= tc.n_rows) {
        *wrote_outside |= v != kSentinel;
        continue;
      }
      float ref = NAN;
      kernels_for(t, Isa::kRef)->vec_dot(tc.n, w.data() + r * w_stride, act.data() + c * a_stride, &ref);
      got.push_back(v);
      want.push_back(ref);
    }
  return test::squared_norms(got.data(), want.data(), got.size());
}

std::vector<TileCase> tile_cases(Type t) {
  const int64_t be = traits(t).block_elems;
  const int64_t unit = std::max<int64_t>(256, be);
  std::vector<TileCase> cs;
  for (int64_t n : {unit, 3 * unit, 8 * unit})
    for (auto [r, c] : {std::pair{1, 1}, {2, 8}, {1, 8}, {2, 1}, {3, 5}, {5, 9}, {16, 8}, {7, 13}, {4, 16}, {0, 3},
                        {3, 0}})
      cs.push_back({n, r, c});
  if (be == 1) cs.push_back({300, 3, 5});
  return cs;
}

TEST_P(QuantTile, VecDotTileMatchesReference) {
  const Isa isa = GetParam();
  int tested = 0;
  for (Type t : kWeightTypes) {
    const Kernels* k = kernels_for(t, isa);
    if (k->vec_dot_tile == nullptr) continue;
    ++tested;
    uint64_t salt = 1;
    std::map<int64_t, test::SquaredNorms> by_n;
    for (const TileCase& tc : tile_cases(t)) {
      bool outside = false;
      const test::SquaredNorms e = tile_error(*k, t, isa, tc, salt++, &outside, k->vec_dot_tile);
      by_n[tc.n].num += e.num;
      by_n[tc.n].den += e.den;
      EXPECT_FALSE(outside) << isa_name(isa) << " " << type_name(t) << " wrote outside " << tc.n_rows << "x"
                            << tc.n_cols;
    }
    for (const auto& [n, e] : by_n) {
      EXPECT_LE(e.ratio(), 1e-5) << isa_name(isa) << " " << type_name(t) << " n=" << n << " seed " << test::test_seed();
    }
  }
  EXPECT_GE(tested, isa == Isa::kRef ? 13 : isa == Isa::kAvx512 ? 2 : 0) << isa_name(isa);
  // The formats of Q4_K_M files have a tile kernel of the table's own ISA on AVX-512.
  if (isa == Isa::kAvx512)
    for (Type t : {Type::kQ4_K, Type::kQ6_K}) {
      EXPECT_NE(kernels_for(t, isa)->vec_dot_tile, nullptr) << type_name(t);
      EXPECT_EQ(kernels_for(t, isa)->vec_dot_tile_isa, isa) << type_name(t);
    }
}

// A tile kernel of this ISA with a planted indexing bug: the last odd row's output for the last
// column is that row's output for the column before it. (weight_rows fills odd rows with random
// bytes, whose outputs dominate the normalized error; a wrong output of an even, quantized-data
// row can be diluted below the tolerance: 1 seed in ~400 on Q6_K.)
template <Isa kIsa, Type kType>
void planted_bug(int64_t n, const void* w, int64_t w_stride, int n_rows, const void* a, int64_t a_stride, int n_cols,
                 float* out, int64_t out_stride) {
  kernels_for(kType, kIsa)->vec_dot_tile(n, w, w_stride, n_rows, a, a_stride, n_cols, out, out_stride);
  const int r = (n_rows - 1) % 2 == 1 ? n_rows - 1 : n_rows - 2;
  if (r >= 0 && n_cols > 1) out[(n_cols - 1) * out_stride + r] = out[(n_cols - 2) * out_stride + r];
}

TEST_P(QuantTile, PlantedBugIsCaught) {
  const Isa isa = GetParam();
  auto bugged = [&](Type t) {
    switch (isa) {
      case Isa::kRef: return t == Type::kQ4_K ? planted_bug<Isa::kRef, Type::kQ4_K> : planted_bug<Isa::kRef, Type::kQ6_K>;
      case Isa::kAvx2: return t == Type::kQ4_K ? planted_bug<Isa::kAvx2, Type::kQ4_K> : planted_bug<Isa::kAvx2, Type::kQ6_K>;
      case Isa::kAvx512:
      case Isa::kAmx:  // the AMX table's tile kernels are the AVX-512 ones
        return t == Type::kQ4_K ? planted_bug<Isa::kAvx512, Type::kQ4_K> : planted_bug<Isa::kAvx512, Type::kQ6_K>;
    }
    return planted_bug<Isa::kRef, Type::kQ4_K>;
  };
  for (Type t : {Type::kQ4_K, Type::kQ6_K}) {
    const Kernels* k = kernels_for(t, isa);
    if (k->vec_dot_tile == nullptr) continue;
    // The largest case of the main test: the one wrong output is diluted the most there.
    const TileCase tc{8 * 256, 7, 13};
    bool outside = false;
    EXPECT_GT(tile_error(*k, t, isa, tc, 99, &outside, bugged(t)).ratio(), 1e-5) << isa_name(isa) << " " << type_name(t);
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, QuantTile, ::testing::Values(Isa::kRef, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace sluice::quant
