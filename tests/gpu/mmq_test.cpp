// Parity of the int8 tensor-core small-batch products (backend/cuda/mmq.h) with quant/'s scalar
// reference, for Q4_K, Q6_K and Q8_0 (these two in GGUF order and in the grouped layout of
// backend/cuda/layout.h) on odd, Llama-3-8B-layer and split-column shapes, 1..32 tokens, one
// matrix and several per launch.
//
// The comparison is gemv_test's "exact" one: y_ref = (reference-dequantized W) . (the q8
// activation the kernel multiplied, downloaded and expanded), in double; what is left is f32
// accumulation order, tolerance 2e-5 normalized (1e-4 below 64 outputs). Outputs are poisoned
// with NaN first. Every case runs twice: the second launch must give the same bits (the column
// splits are added in a fixed order, and each launch leaves its arrival counters at zero).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/layout.h"
#include "backend/cuda/mmq.h"
#include "gpu/gpu_util.h"

namespace sluice::test::gpu {
namespace {

namespace cu = sluice::backend::cuda;

constexpr double kExactTol = 2e-5;
constexpr double kExactTolFew = 1e-4;

const FormatRef& format(quant::Type t) {
  for (const FormatRef& f : weight_formats()) {
    if (f.type == t) return f;
  }
  SLUICE_CHECK(false, "no such format");
  return weight_formats()[0];
}

// A matrix, its activation (quantized on the GPU) and output buffers, and the reference.
struct Mat {
  Mat(const FormatRef& f, int64_t rows_, int64_t cols, int tokens, uint64_t salt)
      : m(make_matrix(f, rows_, cols, salt)),
        w(m.bytes.size()),
        dx(size_t(cols * tokens) * 4),
        dq(size_t(cu::q8_activation_bytes(cols, tokens))),
        dy(size_t(rows_ * tokens) * 4),
        rows(rows_) {
    const std::vector<float> x = random_floats(size_t(cols * tokens), 1.0f, salt + 1000);
    w.upload(m.bytes.data(), m.bytes.size());
    dx.upload(x.data(), x.size() * 4);
    xq = cu::q8_activation_view(dq.get(), cols, tokens);
    const Status st = cu::quantize_activation_q8(dx.get<float>(), xq, nullptr);
    SLUICE_CHECK(st.is_ok(), st.message());
    GPU_CHECK(cudaDeviceSynchronize());
    const int64_t nq = cols * tokens;
    std::vector<int8_t> q(static_cast<size_t>(nq));
    std::vector<float2> ds(static_cast<size_t>(nq / 32));
    GPU_CHECK(cudaMemcpy(q.data(), xq.q, size_t(nq), cudaMemcpyDeviceToHost));
    GPU_CHECK(cudaMemcpy(ds.data(), xq.ds, ds.size() * sizeof(float2), cudaMemcpyDeviceToHost));
    x_used.resize(size_t(nq));
    for (int64_t i = 0; i < nq; ++i) x_used[size_t(i)] = float(q[size_t(i)]) * ds[size_t(i / 32)].x;
  }
  QuantMatrix m;
  DeviceBuffer w, dx, dq, dy;
  int64_t rows = 0;
  cu::Q8Activation xq;
  std::vector<float> x_used;  // the activation the kernel multiplies, expanded
};

// Runs g (scratch sized by mmq_scratch_needed, counters zeroed once) twice; returns the outputs
// of each matrix from both runs.
struct Runs {
  std::vector<std::vector<float>> first, second;
};
Runs run(const cu::GemvGroupArgs& g, std::vector<Mat>& mats) {
  Result<cu::DeviceInfo> dev = cu::query_device(0);
  SLUICE_CHECK(dev.is_ok(), dev.status().message());
  cu::MmqScratch s = cu::mmq_scratch_needed(*dev, g);
  DeviceBuffer partials(size_t(std::max<int64_t>(s.partial_bytes, 4))), counters(size_t(std::max<int64_t>(s.counters_n, 1)) * 4);
  GPU_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
  if (s.partial_bytes > 0) s.partials = partials.get();
  if (s.counters_n > 0) s.counters = counters.get<int>();
  Runs out;
  for (int rep = 0; rep < 2; ++rep) {
    for (Mat& a : mats) a.dy.poison();
    const Status st = cu::mmq(*dev, g, s, nullptr);
    SLUICE_CHECK(st.is_ok(), st.message());
    GPU_CHECK(cudaDeviceSynchronize());
    auto& dst = rep == 0 ? out.first : out.second;
    for (Mat& a : mats) {
      std::vector<float> y(size_t(a.rows * g.tokens));
      a.dy.download(y.data(), y.size() * 4);
      dst.push_back(std::move(y));
    }
  }
  return out;
}

struct Case {
  quant::Type type;
  int64_t rows, cols;
  int tokens;
  bool grouped = false;  // Q6_K / Q8_0 in the grouped layout (backend/cuda/layout.h)
};

// Rewrites a matrix's device copy into the grouped layout.
void group_on_device(Mat& a, quant::Type t, int64_t cols) {
  const Status st = cu::group_weight_blocks(t, a.w.get(), a.rows, cols, nullptr);
  SLUICE_CHECK(st.is_ok(), st.message());
  GPU_CHECK(cudaDeviceSynchronize());
}

class MmqParity : public ::testing::TestWithParam<Case> {};

TEST_P(MmqParity, MatchesScalarReference) {
  SLUICE_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const FormatRef& f = format(c.type);
  ASSERT_TRUE(cu::mmq_supported(c.type, c.cols));
  std::vector<Mat> mats;
  mats.emplace_back(f, c.rows, c.cols, c.tokens, uint64_t(c.rows * 7 + c.cols * 3 + c.tokens) ^ uint64_t(c.type));
  if (c.grouped) group_on_device(mats[0], c.type, c.cols);
  cu::GemvGroupArgs g;
  g.type = c.type;
  g.grouped = c.grouped;
  g.cols = c.cols;
  g.tokens = c.tokens;
  g.n = 1;
  g.m[0] = cu::GemvMatrix{mats[0].w.get(), c.rows, nullptr, mats[0].xq, mats[0].dy.get<float>()};
  const Runs r = run(g, mats);
  const std::vector<float>& y = r.first[0];
  bool finite = true;
  for (float v : y) finite = finite && std::isfinite(v);
  EXPECT_TRUE(finite) << "unwritten (NaN-poisoned) or non-finite outputs";
  const double err = normalized_error_d(y, ref_gemv(mats[0].m.values, mats[0].x_used, c.rows, c.cols, c.tokens));
  EXPECT_LE(err, c.rows * c.tokens < 64 ? kExactTolFew : kExactTol) << "seed " << test_seed();
  EXPECT_EQ(0, std::memcmp(y.data(), r.second[0].data(), y.size() * 4)) << "a second launch gave other bits";
  std::printf("MMQ %-5s%s rows=%-6lld cols=%-6lld tokens=%-2d exact=%.3e\n", f.name, c.grouped ? " grouped" : "",
              (long long)c.rows, (long long)c.cols, c.tokens, err);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (quant::Type t : {quant::Type::kQ4_K, quant::Type::kQ6_K, quant::Type::kQ8_0}) {
    const std::vector<Case> shapes = {
        {t, 1, 512, 9},       {t, 7, 512, 1},        {t, 130, 1024, 17},   {t, 1001, 1024, 32},
        {t, 300, 4096, 9},    {t, 129, 2048, 12},    {t, 64, 512, 25},     {t, 4096, 4096, 32},
        {t, 4096, 14336, 24}, {t, 14336, 4096, 16},  {t, 1024, 4096, 8},
    };
    out.insert(out.end(), shapes.begin(), shapes.end());
  }
  for (quant::Type t : {quant::Type::kQ6_K, quant::Type::kQ8_0}) {
    const std::vector<Case> grouped = {
        {t, 7, 2048, 3, true},       {t, 300, 4096, 9, true},     {t, 1001, 2048, 32, true},
        {t, 4096, 14336, 24, true},  {t, 14336, 4096, 16, true},  {t, 1024, 4096, 8, true},
    };
    out.insert(out.end(), grouped.begin(), grouped.end());
  }
  out.push_back({quant::Type::kQ8_0, 130, 1280, 17, true});  // rows of 5 groups
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return std::string(format(i.param.type).name) + "_" + std::to_string(i.param.rows) + "x" +
         std::to_string(i.param.cols) + "_t" + std::to_string(i.param.tokens) + (i.param.grouped ? "_grouped" : "");
}

INSTANTIATE_TEST_SUITE_P(Formats, MmqParity, ::testing::ValuesIn(cases()), case_name);

// Several matrices per launch (Q/K/V-like rows that do not fill a tile), each with its own
// activation and output: a row sent to the wrong matrix, activation or output fails.
TEST(MmqGroup, MatchesScalarReferencePerMatrix) {
  SLUICE_SKIP_WITHOUT_GPU();
  const int64_t cols = 2048;
  const int64_t rows[] = {1001, 64, 257, 3};
  for (int fi = 0; fi < 5; ++fi) {
    const quant::Type t = fi == 0 ? quant::Type::kQ4_K : fi >= 3 ? quant::Type::kQ8_0 : quant::Type::kQ6_K;
    const bool grouped = fi == 2 || fi == 4;
    for (int tokens : {13, 32}) {
      std::vector<Mat> mats;
      cu::GemvGroupArgs g;
      g.type = t;
      g.grouped = grouped;
      g.cols = cols;
      g.tokens = tokens;
      for (int i = 0; i < 4; ++i) {
        mats.emplace_back(format(t), rows[i], cols, tokens, uint64_t(t) * 100 + uint64_t(i) * 10 + uint64_t(tokens));
        if (grouped) group_on_device(mats.back(), t, cols);
      }
      for (Mat& a : mats) g.m[g.n++] = cu::GemvMatrix{a.w.get(), a.rows, nullptr, a.xq, a.dy.get<float>()};
      const Runs r = run(g, mats);
      for (size_t i = 0; i < mats.size(); ++i) {
        const double err = normalized_error_d(r.first[i], ref_gemv(mats[i].m.values, mats[i].x_used, mats[i].rows,
                                                                   cols, tokens));
        EXPECT_LE(err, kExactTolFew) << format(t).name << (grouped ? " grouped" : "") << " matrix " << i << " tokens "
                                     << tokens;
        EXPECT_EQ(0, std::memcmp(r.first[i].data(), r.second[i].data(), r.first[i].size() * 4));
      }
    }
  }
}

// The comparison can fail: corrupted weights must be caught.
TEST(MmqParityControl, CorruptedWeightsAreDetected) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (quant::Type t : {quant::Type::kQ4_K, quant::Type::kQ6_K, quant::Type::kQ8_0}) {
    std::vector<Mat> mats;
    mats.emplace_back(format(t), 256, 1024, 16, 77);
    GPU_CHECK(cudaMemset(mats[0].w.get(), 0x5A, mats[0].m.bytes.size() / 2));
    cu::GemvGroupArgs g;
    g.type = t;
    g.cols = 1024;
    g.tokens = 16;
    g.n = 1;
    g.m[0] = cu::GemvMatrix{mats[0].w.get(), 256, nullptr, mats[0].xq, mats[0].dy.get<float>()};
    const Runs r = run(g, mats);
    const double err = normalized_error_d(r.first[0], ref_gemv(mats[0].m.values, mats[0].x_used, 256, 1024, 16));
    EXPECT_GT(err, 100 * kExactTol) << format(t).name;
  }
}

TEST(MmqArgs, RejectsWhatItCannotDo) {
  SLUICE_SKIP_WITHOUT_GPU();
  Result<cu::DeviceInfo> dev = cu::query_device(0);
  ASSERT_TRUE(dev.is_ok());
  EXPECT_FALSE(cu::mmq_supported(quant::Type::kQ5_0, 4096));
  EXPECT_FALSE(cu::mmq_supported(quant::Type::kQ6_K, 768));  // odd number of 210-byte blocks
  EXPECT_TRUE(cu::mmq_supported(quant::Type::kQ4_K, 768));
  std::vector<Mat> mats;
  mats.emplace_back(format(quant::Type::kQ4_K), 64, 512, 32, 5);
  cu::GemvGroupArgs g;
  g.type = quant::Type::kQ4_K;
  g.cols = 512;
  g.n = 1;
  g.m[0] = cu::GemvMatrix{mats[0].w.get(), 64, nullptr, mats[0].xq, mats[0].dy.get<float>()};
  g.tokens = cu::kMaxMmqTokens + 1;
  EXPECT_FALSE(cu::mmq(*dev, g, {}, nullptr).is_ok());
  g.tokens = 32;
  g.type = quant::Type::kQ5_0;
  EXPECT_FALSE(cu::mmq(*dev, g, {}, nullptr).is_ok());
  g.type = quant::Type::kQ4_K;
  g.grouped = true;  // no grouped layout but Q6_K's
  EXPECT_FALSE(cu::mmq(*dev, g, {}, nullptr).is_ok());
  g.grouped = false;
  g.m[0].xq.q = nullptr;
  EXPECT_FALSE(cu::mmq(*dev, g, {}, nullptr).is_ok());
}

}  // namespace
}  // namespace sluice::test::gpu
