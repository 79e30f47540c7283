// Parity of the CUDA elementwise/row-wise ops (backend/cuda/ops.h) with the CPU backend, and of
// dequantize_to_f16 with quant's scalar reference, on fresh random data (seed printed on failure;
// SLUICE_TEST_SEED replays).
//
// Tolerances (normalized error ||gpu - cpu|| / ||cpu|| over the [rows][cols] region, or exact):
//   add_bias, add                       exact: one f32 add per element on both sides.
//   f32_to_f16, store_rows_f16          exact bits: both round to nearest even.
//   dequantize_to_f16 (every format)    exact bits (0 f16 ulp): the kernels repeat the reference's
//                                       f32 operations one for one, then round to nearest even.
//   rms_norm                            1e-6; expected bit-exact (same f32 roundings, sum of
//                                       squares in double on both sides, only its order differs).
//   rope                                1e-6; angles are bit-identical (same f32 recurrence), cos/sin
//                                       may differ from glibc's cosf/sinf by 1 f32 ulp.
//   swiglu                              1e-6; CUDA expf is within 2 ulp of glibc's expf.
//   geglu                               1e-6; the GPU evaluates 0.5 g (1 + tanhf(y)) unfused, the CPU
//                                       (AVX2) g / (1 + e^(-2y)): the same function, ~2 ulp apart
//                                       but in gelu's negative tail, where both are tiny.
//   scale                               exact: one f32 multiply per element on both sides.
// Every case also checks that nothing outside the op's region changed (row padding of strided
// tensors, cache rows outside [pos0, pos0 + rows)), and outputs that the op must write start
// poisoned (NaN) where the op is not in place.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/layout.h"
#include "backend/cuda/ops.h"
#include "gpu/gpu_util.h"
#include "quant/half.h"
#include "quant/ref.h"

namespace sluice::test::gpu {
namespace {

namespace cu = sluice::backend::cuda;
using backend::DType;
using backend::Tensor;
using backend::WeightView;

constexpr double kNormTol = 1e-6;
constexpr double kRopeTol = 1e-6;
constexpr double kSwigluTol = 1e-6;
constexpr double kGegluTol = 1e-6;

std::unique_ptr<backend::Backend> cpu_backend() { return backend::make_cpu_backend(backend::CpuOptions{}); }

// A host f32 matrix of `rows` rows of `cols` elements, row starts `stride` apart; the padding
// between rows holds random values too, which the ops must leave alone.
struct HostMat {
  std::vector<float> v;
  int64_t rows = 0, cols = 0, stride = 0;
  HostMat(int64_t r, int64_t c, int64_t s, float scale, uint64_t salt)
      : v(random_floats(size_t(r * s), scale, salt)), rows(r), cols(c), stride(s) {}
  Tensor tensor() { return Tensor{v.data(), DType::kF32, cols, rows, stride}; }
  std::vector<float> region() const {
    std::vector<float> out(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[size_t(r * cols + c)] = v[size_t(r * stride + c)];
    return out;
  }
  size_t bytes() const { return v.size() * sizeof(float); }
};

// Elements of the padding (columns >= cols) that differ between two buffers of the same layout.
int64_t padding_changes(const HostMat& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = a.cols; c < a.stride; ++c) {
      const size_t i = size_t(r * a.stride + c);
      n += std::memcmp(&a.v[i], &b[i], sizeof(float)) != 0;
    }
  return n;
}

double region_error(const HostMat& gpu_layout, const std::vector<float>& gpu, const HostMat& cpu) {
  HostMat g = gpu_layout;
  g.v = gpu;
  const std::vector<float> a = g.region(), b = cpu.region();
  return normalized_error(a.data(), b.data(), a.size());
}

int64_t region_mismatches(const std::vector<float>& gpu, const HostMat& cpu) {
  int64_t n = 0;
  for (int64_t r = 0; r < cpu.rows; ++r)
    for (int64_t c = 0; c < cpu.cols; ++c) {
      const size_t i = size_t(r * cpu.stride + c);
      n += std::memcmp(&gpu[i], &cpu.v[i], sizeof(float)) != 0;
    }
  return n;
}

std::vector<float> download_f32(const DeviceBuffer& d, size_t n) {
  std::vector<float> out(n);
  d.download(out.data(), n * sizeof(float));
  return out;
}

void expect_ok(const Status& s) { ASSERT_TRUE(s.is_ok()) << s.message(); }

// ---- rms_norm ---------------------------------------------------------------------------------------

struct NormCase {
  const char* name;
  int64_t rows, cols, group, pad;
  bool in_place;
  float eps;
};

class RmsNorm : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNorm, MatchesCpu) {
  SLUICE_SKIP_WITHOUT_GPU();
  const NormCase& c = GetParam();
  const int64_t stride = c.cols + c.pad;
  const uint64_t salt = std::hash<std::string>{}(c.name);
  HostMat x(c.rows, c.cols, stride, 3.0f, salt);
  const std::vector<float> w = random_floats(size_t(c.group), 1.0f, salt + 1);
  HostMat y_init(c.rows, c.cols, stride, 1.0f, salt + 2);

  DeviceBuffer dx(x.bytes()), dy(y_init.bytes()), dw(w.size() * 4);
  dx.upload(x.v.data(), x.bytes());
  dw.upload(w.data(), w.size() * 4);
  float* out = dx.get<float>();
  if (!c.in_place) {
    // Poisoned region (NaN), random padding: unwritten outputs and stray writes both show.
    std::vector<float> init = y_init.v;
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < c.cols; ++i) init[size_t(r * stride + i)] = std::numeric_limits<float>::quiet_NaN();
    dy.upload(init.data(), y_init.bytes());
    out = dy.get<float>();
  }
  expect_ok(
      cu::rms_norm(dx.get<float>(), stride, out, stride, c.rows, c.cols, dw.get<float>(), c.group, c.eps, nullptr));
  GPU_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = download_f32(c.in_place ? dx : dy, x.v.size());

  HostMat ref = c.in_place ? x : y_init;
  const WeightView wv{quant::Type::kF32, c.group, 1, w.data()};
  cpu_backend()->rms_norm(x.tensor(), wv, c.eps, ref.tensor());

  const double err = region_error(ref, got, ref);
  EXPECT_LE(err, kNormTol) << "seed " << test_seed();
  EXPECT_EQ(padding_changes(ref, got), 0);
  std::printf("OPS rms_norm %-14s err=%.3e bit-mismatches=%lld/%lld\n", c.name, err,
              (long long)region_mismatches(got, ref), (long long)(c.rows * c.cols));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNorm,
                         ::testing::Values(NormCase{"row576", 3, 576, 576, 0, false, 1e-5f},
                                           NormCase{"row4096", 1, 4096, 4096, 0, false, 1e-5f},
                                           NormCase{"row4096_inpl", 33, 4096, 4096, 8, true, 1e-6f},
                                           NormCase{"row8192", 5, 8192, 8192, 4, false, 1e-5f},
                                           NormCase{"row1024_warp", 4, 1024, 1024, 0, true, 1e-6f},
                                           NormCase{"row2048_block", 2, 2048, 2048, 3, false, 1e-6f},
                                           NormCase{"heads128", 7, 4096, 128, 0, false, 1e-6f},
                                           NormCase{"heads128_inpl", 9, 1024, 128, 16, true, 1e-6f},
                                           NormCase{"heads64", 3, 576, 64, 5, false, 1e-5f}),
                         [](const ::testing::TestParamInfo<NormCase>& i) { return std::string(i.param.name); });

// ---- add_bias / add / swiglu ------------------------------------------------------------------------

struct EwCase {
  const char* name;
  int64_t rows, cols, pad;
};
const auto kEwCases = ::testing::Values(EwCase{"one_row", 1, 4096, 0}, EwCase{"rows", 7, 14336, 0},
                                        EwCase{"strided", 5, 1024, 4}, EwCase{"odd_cols", 3, 1001, 2},
                                        EwCase{"odd_stride", 4, 576, 3});
std::string ew_name(const ::testing::TestParamInfo<EwCase>& i) { return i.param.name; }

class AddBias : public ::testing::TestWithParam<EwCase> {};
TEST_P(AddBias, MatchesCpuExactly) {
  SLUICE_SKIP_WITHOUT_GPU();
  const EwCase& c = GetParam();
  const int64_t stride = c.cols + c.pad;
  HostMat y(c.rows, c.cols, stride, 1.0f, 11);
  const std::vector<float> b = random_floats(size_t(c.cols), 1.0f, 12);
  DeviceBuffer dy(y.bytes()), db(b.size() * 4);
  dy.upload(y.v.data(), y.bytes());
  db.upload(b.data(), b.size() * 4);
  expect_ok(cu::add_bias(dy.get<float>(), stride, c.rows, c.cols, db.get<float>(), nullptr));
  GPU_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = download_f32(dy, y.v.size());
  cpu_backend()->add_bias(y.tensor(), WeightView{quant::Type::kF32, c.cols, 1, b.data()});
  EXPECT_EQ(region_mismatches(got, y), 0) << "seed " << test_seed();
  EXPECT_EQ(padding_changes(y, got), 0);
}
INSTANTIATE_TEST_SUITE_P(Shapes, AddBias, kEwCases, ew_name);

class Add : public ::testing::TestWithParam<EwCase> {};
TEST_P(Add, MatchesCpuExactly) {
  SLUICE_SKIP_WITHOUT_GPU();
  const EwCase& c = GetParam();
  // Different strides for dst and src: each row is addressed through its own stride.
  HostMat dst(c.rows, c.cols, c.cols + c.pad, 1.0f, 21), src(c.rows, c.cols, c.cols + 2 * c.pad, 1.0f, 22);
  DeviceBuffer dd(dst.bytes()), ds(src.bytes());
  dd.upload(dst.v.data(), dst.bytes());
  ds.upload(src.v.data(), src.bytes());
  expect_ok(cu::add(dd.get<float>(), dst.stride, ds.get<float>(), src.stride, c.rows, c.cols, nullptr));
  GPU_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = download_f32(dd, dst.v.size());
  cpu_backend()->add(dst.tensor(), src.tensor());
  EXPECT_EQ(region_mismatches(got, dst), 0) << "seed " << test_seed();
  EXPECT_EQ(padding_changes(dst, got), 0);
}
INSTANTIATE_TEST_SUITE_P(Shapes, Add, kEwCases, ew_name);

// Mixture-of-experts row traffic against the CPU backend: gather exactly; scatter_add within 1e-6
// (the CPU may fuse its multiply-add), rows not named and padding untouched. 300 rows crosses the
// 128-row chunks whose indices travel in the kernel's parameters.
TEST(GatherScatter, MatchesCpu) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (const int64_t cols : {int64_t{4096}, int64_t{1001}}) {
    const int64_t n = 300, pad = 4;
    HostMat src(n, cols, cols + pad, 1.0f, 41), dst(n, cols, cols + 2 * pad, 1.0f, 42);
    std::vector<int32_t> rows;
    std::vector<float> scale;
    for (int64_t i = 0; i < n; i += 2) rows.push_back(int32_t((i * 7) % n)), scale.push_back(0.01f * float(i) - 1.0f);
    const int64_t m = int64_t(rows.size());
    HostMat g(m, cols, cols, 0.0f, 43);
    DeviceBuffer ds(src.bytes()), dd(dst.bytes()), dg(g.bytes());
    ds.upload(src.v.data(), src.bytes());
    dd.upload(dst.v.data(), dst.bytes());
    expect_ok(cu::gather_rows(ds.get<float>(), src.stride, n, dg.get<float>(), g.stride, rows.data(), m, cols, nullptr));
    expect_ok(cu::scatter_add_rows(dd.get<float>(), dst.stride, n, dg.get<float>(), g.stride, rows.data(),
                                   scale.data(), m, cols, nullptr));
    GPU_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got_g = download_f32(dg, g.v.size()), got_d = download_f32(dd, dst.v.size());
    auto cpu = cpu_backend();
    cpu->gather_rows(src.tensor(), rows, g.tensor());
    EXPECT_EQ(region_mismatches(got_g, g), 0) << "cols " << cols;
    cpu->scatter_add_rows(dst.tensor(), g.tensor(), rows, scale);
    EXPECT_LT(region_error(dst, got_d, dst), 1e-6) << "cols " << cols;
    EXPECT_EQ(padding_changes(dst, got_d), 0);
  }
  // A row outside the source is an error, not a wild read.
  DeviceBuffer a(64 * 4), b(64 * 4);
  const int32_t bad[] = {5};
  EXPECT_FALSE(cu::gather_rows(a.get<float>(), 16, 4, b.get<float>(), 16, bad, 1, 16, nullptr).is_ok());
}

enum class Alias { kNone, kGate, kUp };
struct SwigluCase {
  EwCase shape;
  Alias alias;
};

class Swiglu : public ::testing::TestWithParam<SwigluCase> {};
TEST_P(Swiglu, MatchesCpu) {
  SLUICE_SKIP_WITHOUT_GPU();
  const EwCase& c = GetParam().shape;
  const Alias alias = GetParam().alias;
  const int64_t stride = c.cols + c.pad;
  // Scale 4: the gate reaches the saturated ends of the sigmoid as well as its middle.
  HostMat gate(c.rows, c.cols, stride, 4.0f, 31), up(c.rows, c.cols, stride, 1.0f, 32),
      out(c.rows, c.cols, stride, 1.0f, 33);
  DeviceBuffer dg(gate.bytes()), du(up.bytes()), dd(out.bytes());
  dg.upload(gate.v.data(), gate.bytes());
  du.upload(up.v.data(), up.bytes());
  std::vector<float> out_init = out.v;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < c.cols; ++i) out_init[size_t(r * stride + i)] = std::numeric_limits<float>::quiet_NaN();
  dd.upload(out_init.data(), out.bytes());
  float* d = alias == Alias::kGate ? dg.get<float>() : alias == Alias::kUp ? du.get<float>() : dd.get<float>();
  expect_ok(cu::swiglu(dg.get<float>(), stride, du.get<float>(), stride, d, stride, c.rows, c.cols, nullptr));
  GPU_CHECK(cudaDeviceSynchronize());
  const DeviceBuffer& result = alias == Alias::kGate ? dg : alias == Alias::kUp ? du : dd;
  const std::vector<float> got = download_f32(result, out.v.size());

  HostMat& ref = alias == Alias::kGate ? gate : alias == Alias::kUp ? up : out;
  const Tensor tg = gate.tensor(), tu = up.tensor(), td = ref.tensor();
  cpu_backend()->swiglu(tg, tu, td);
  const double err = region_error(ref, got, ref);
  EXPECT_LE(err, kSwigluTol) << "seed " << test_seed();
  EXPECT_EQ(padding_changes(ref, got), 0);
  std::printf("OPS swiglu %-10s alias=%d err=%.3e\n", c.name, int(alias), err);
}
INSTANTIATE_TEST_SUITE_P(Shapes, Swiglu,
                         ::testing::Values(SwigluCase{{"rows", 7, 14336, 0}, Alias::kNone},
                                           SwigluCase{{"one_row", 1, 11008, 0}, Alias::kGate},
                                           SwigluCase{{"strided", 5, 1024, 4}, Alias::kUp},
                                           SwigluCase{{"odd_cols", 3, 1001, 2}, Alias::kNone},
                                           SwigluCase{{"odd_cols_alias", 3, 1001, 2}, Alias::kGate}),
                         [](const ::testing::TestParamInfo<SwigluCase>& i) { return std::string(i.param.shape.name); });

// GeGLU (Gemma 3's FFN activation) against the CPU backend, which computes backend::gelu_tanh.
class Geglu : public ::testing::TestWithParam<SwigluCase> {};
TEST_P(Geglu, MatchesCpu) {
  SLUICE_SKIP_WITHOUT_GPU();
  const EwCase& c = GetParam().shape;
  const Alias alias = GetParam().alias;
  const int64_t stride = c.cols + c.pad;
  // Scale 6: the gate reaches both saturated ends of tanh (|x| > 3) as well as its middle.
  HostMat gate(c.rows, c.cols, stride, 6.0f, 131), up(c.rows, c.cols, stride, 1.0f, 132),
      out(c.rows, c.cols, stride, 1.0f, 133);
  DeviceBuffer dg(gate.bytes()), du(up.bytes()), dd(out.bytes());
  dg.upload(gate.v.data(), gate.bytes());
  du.upload(up.v.data(), up.bytes());
  std::vector<float> out_init = out.v;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < c.cols; ++i) out_init[size_t(r * stride + i)] = std::numeric_limits<float>::quiet_NaN();
  dd.upload(out_init.data(), out.bytes());
  float* d = alias == Alias::kGate ? dg.get<float>() : alias == Alias::kUp ? du.get<float>() : dd.get<float>();
  expect_ok(cu::geglu(dg.get<float>(), stride, du.get<float>(), stride, d, stride, c.rows, c.cols, nullptr));
  GPU_CHECK(cudaDeviceSynchronize());
  const DeviceBuffer& result = alias == Alias::kGate ? dg : alias == Alias::kUp ? du : dd;
  const std::vector<float> got = download_f32(result, out.v.size());

  HostMat& ref = alias == Alias::kGate ? gate : alias == Alias::kUp ? up : out;
  const Tensor tg = gate.tensor(), tu = up.tensor(), td = ref.tensor();
  cpu_backend()->geglu(tg, tu, td);
  const double err = region_error(ref, got, ref);
  EXPECT_LE(err, kGegluTol) << "seed " << test_seed();
  EXPECT_EQ(padding_changes(ref, got), 0);
  std::printf("OPS geglu %-10s alias=%d err=%.3e\n", c.name, int(alias), err);
}
INSTANTIATE_TEST_SUITE_P(Shapes, Geglu,
                         ::testing::Values(SwigluCase{{"rows", 7, 2048, 0}, Alias::kNone},
                                           SwigluCase{{"one_row", 1, 2048, 0}, Alias::kGate},
                                           SwigluCase{{"strided", 5, 1024, 4}, Alias::kUp},
                                           SwigluCase{{"odd_cols", 3, 1001, 2}, Alias::kNone}),
                         [](const ::testing::TestParamInfo<SwigluCase>& i) { return std::string(i.param.shape.name); });

// x *= s (Gemma 3's embedding scaling) against the CPU backend, bit for bit.
TEST(Scale, MatchesCpuExactly) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (const EwCase c : {EwCase{"rows", 9, 640, 0}, EwCase{"odd_strided", 3, 1001, 3}}) {
    const int64_t stride = c.cols + c.pad;
    HostMat x(c.rows, c.cols, stride, 2.0f, 141);
    DeviceBuffer dx(x.bytes());
    dx.upload(x.v.data(), x.bytes());
    const float s = std::sqrt(640.0f);
    expect_ok(cu::scale(dx.get<float>(), stride, c.rows, c.cols, s, nullptr));
    GPU_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = download_f32(dx, x.v.size());
    const Tensor tx = x.tensor();
    cpu_backend()->scale(tx, s);
    EXPECT_EQ(region_error(x, got, x), 0.0) << c.name;
    EXPECT_EQ(padding_changes(x, got), 0) << c.name;
  }
}

// ---- rope ---------------------------------------------------------------------------------------------

struct RopeCase {
  const char* name;
  bool neox;
  int n_head, head_dim, n_rot;
  float base, freq_scale;
  bool factors;
  int pos0;
  int64_t rows, pad;
};

class Rope : public ::testing::TestWithParam<RopeCase> {};
TEST_P(Rope, MatchesCpu) {
  SLUICE_SKIP_WITHOUT_GPU();
  const RopeCase& c = GetParam();
  const int64_t cols = int64_t(c.n_head) * c.head_dim, stride = cols + c.pad;
  const uint64_t salt = std::hash<std::string>{}(c.name);
  HostMat x(c.rows, cols, stride, 1.0f, salt);
  // Llama 3.1-like divisors: 1 for high frequencies rising to 8 for low ones.
  std::vector<float> ff(size_t(c.n_rot / 2));
  for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 7.0f * float(i) / float(ff.size());
  DeviceBuffer dx(x.bytes()), dff(ff.size() * 4);
  dx.upload(x.v.data(), x.bytes());
  dff.upload(ff.data(), ff.size() * 4);

  cu::RopeArgs a;
  a.neox = c.neox;
  a.n_head = c.n_head;
  a.head_dim = c.head_dim;
  a.n_rot = c.n_rot;
  a.freq_base = c.base;
  a.freq_scale = c.freq_scale;
  a.freq_factors = c.factors ? dff.get<float>() : nullptr;
  expect_ok(cu::rope(dx.get<float>(), stride, c.rows, a, c.pos0, nullptr));
  GPU_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = download_f32(dx, x.v.size());

  backend::RopeParams p;
  p.mode = c.neox ? backend::RopeMode::kNeox : backend::RopeMode::kNormal;
  p.n_head = c.n_head;
  p.head_dim = c.head_dim;
  p.n_rot = c.n_rot;
  p.freq_base = c.base;
  p.freq_scale = c.freq_scale;
  if (c.factors) p.freq_factors = WeightView{quant::Type::kF32, c.n_rot / 2, 1, ff.data()};
  cpu_backend()->rope(x.tensor(), p, c.pos0);

  const double err = region_error(x, got, x);
  EXPECT_LE(err, kRopeTol) << "seed " << test_seed();
  EXPECT_EQ(padding_changes(x, got), 0);
  std::printf("OPS rope %-22s err=%.3e bit-mismatches=%lld/%lld\n", c.name, err, (long long)region_mismatches(got, x),
              (long long)(c.rows * cols));
}
INSTANTIATE_TEST_SUITE_P(
    Modes, Rope,
    ::testing::Values(
        RopeCase{"llama_q", false, 32, 128, 128, 500000.0f, 1.0f, false, 0, 7, 0},
        RopeCase{"llama_k_pos100000", false, 8, 128, 128, 500000.0f, 1.0f, false, 100000, 3, 0},
        RopeCase{"llama31_factors", false, 32, 128, 128, 500000.0f, 1.0f, true, 4095, 5, 8},
        RopeCase{"normal_partial_scaled", false, 4, 96, 32, 10000.0f, 0.25f, false, 70000, 4, 2},
        RopeCase{"neox_qwen", true, 16, 128, 128, 1000000.0f, 1.0f, false, 17, 6, 0},
        RopeCase{"neox_partial", true, 4, 128, 64, 10000.0f, 1.0f, false, 100000, 3, 4},
        RopeCase{"neox_factors_scaled", true, 8, 64, 64, 10000.0f, 0.5f, true, 131000, 2, 0},
        RopeCase{"smol_many_rows", false, 9, 64, 64, 100000.0f, 1.0f, false, 1000, 300, 0}),
    [](const ::testing::TestParamInfo<RopeCase>& i) { return std::string(i.param.name); });

// ---- f32_to_f16 / store_rows_f16 ---------------------------------------------------------------------

std::vector<uint16_t> download_u16(const DeviceBuffer& d, size_t n) {
  std::vector<uint16_t> out(n);
  d.download(out.data(), n * 2);
  return out;
}

struct HalfCase {
  const char* name;
  int64_t rows, cols, src_pad, dst_pad;
};

class F32ToF16 : public ::testing::TestWithParam<HalfCase> {};
TEST_P(F32ToF16, ExactRoundToNearestEven) {
  SLUICE_SKIP_WITHOUT_GPU();
  const HalfCase& c = GetParam();
  HostMat src(c.rows, c.cols, c.cols + c.src_pad, 2.0f, 41);
  // Values that exercise the rounding: overflow, the 65520 boundary, subnormals, zeros, ties.
  const float specials[] = {65504.0f, 65519.0f, 65520.0f, -1e6f, 1e-5f, -3e-7f, 6.1e-5f, 0.0f, -0.0f,
                            1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f, 5.96e-8f, 2.98e-8f,
                            std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i < std::size(specials) && int64_t(i) < c.cols; ++i) src.v[i] = specials[i];
  const int64_t dst_stride = c.cols + c.dst_pad;
  const size_t dst_n = size_t(c.rows * dst_stride);
  DeviceBuffer ds(src.bytes()), dd(dst_n * 2);
  ds.upload(src.v.data(), src.bytes());
  dd.poison();  // 0xFFFF everywhere: unwritten elements and padding keep it
  expect_ok(cu::f32_to_f16(ds.get<float>(), src.stride, dd.get(), dst_stride, c.rows, c.cols, nullptr));
  GPU_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = download_u16(dd, dst_n);
  int64_t bad = 0, pad_changed = 0;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < dst_stride; ++i) {
      const uint16_t g = got[size_t(r * dst_stride + i)];
      if (i < c.cols) {
        bad += g != quant::fp32_to_fp16(src.v[size_t(r * src.stride + i)]);
      } else {
        pad_changed += g != 0xFFFF;
      }
    }
  EXPECT_EQ(bad, 0) << "seed " << test_seed();
  EXPECT_EQ(pad_changed, 0);
}
INSTANTIATE_TEST_SUITE_P(Shapes, F32ToF16,
                         ::testing::Values(HalfCase{"rows", 3, 4096, 0, 0}, HalfCase{"strided", 5, 1024, 4, 8},
                                           HalfCase{"odd", 5, 13, 4, 2}, HalfCase{"odd_stride", 2, 64, 1, 3}),
                         [](const ::testing::TestParamInfo<HalfCase>& i) { return std::string(i.param.name); });

struct StoreCase {
  const char* name;
  int64_t rows, cols, cache_rows, cache_pad, pos0;
};

class StoreRowsF16 : public ::testing::TestWithParam<StoreCase> {};
TEST_P(StoreRowsF16, MatchesCpuExactly) {
  SLUICE_SKIP_WITHOUT_GPU();
  const StoreCase& c = GetParam();
  HostMat src(c.rows, c.cols, c.cols + 3, 1.0f, 51);
  const int64_t cstride = c.cols + c.cache_pad;
  // The cache starts with earlier "tokens" in it; everything outside the stored rows must survive.
  std::vector<uint16_t> cache(size_t(c.cache_rows * cstride));
  const std::vector<float> prior = random_floats(cache.size(), 1.0f, 52);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = quant::fp32_to_fp16(prior[i]);
  DeviceBuffer ds(src.bytes()), dc(cache.size() * 2);
  ds.upload(src.v.data(), src.bytes());
  dc.upload(cache.data(), cache.size() * 2);
  expect_ok(cu::store_rows_f16(ds.get<float>(), src.stride, c.rows, c.cols, dc.get(), cstride, c.pos0, nullptr));
  GPU_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = download_u16(dc, cache.size());

  const Tensor tc{cache.data(), DType::kF16, c.cols, c.cache_rows, cstride};
  cpu_backend()->store_rows(src.tensor(), tc, c.pos0);
  int64_t bad = 0;
  for (size_t i = 0; i < cache.size(); ++i) bad += got[i] != cache[i];  // stored rows, other rows, padding
  EXPECT_EQ(bad, 0) << "seed " << test_seed();
}
INSTANTIATE_TEST_SUITE_P(Shapes, StoreRowsF16,
                         ::testing::Values(StoreCase{"prefill", 7, 1024, 64, 0, 0},
                                           StoreCase{"decode", 1, 1024, 64, 0, 37},
                                           StoreCase{"strided", 4, 512, 40, 8, 36},
                                           StoreCase{"odd", 3, 129, 10, 3, 5}),
                         [](const ::testing::TestParamInfo<StoreCase>& i) { return std::string(i.param.name); });

// ---- dequantize_to_f16 -----------------------------------------------------------------------------------

// Ordered distance in f16 ulps between two finite f16 bit patterns (0xFFFF, the poison, is NaN
// and counted as a mismatch by the caller before this is used).
int ulp_distance(uint16_t a, uint16_t b) {
  const auto key = [](uint16_t h) { return (h & 0x8000) ? -int(h & 0x7FFF) : int(h); };
  return std::abs(key(a) - key(b));
}

struct DequantCase {
  FormatRef fmt;
  std::string shape;
  int64_t rows, cols;
  size_t w_offset = 0;    // bytes added to the weight pointer (float formats: the scalar path)
  size_t dst_offset = 0;  // bytes added to dst (2: the 2-byte store path)
  bool grouped = false;   // Q6_K / Q8_0 rewritten into the grouped layout (backend/cuda/layout.h) first
};

// Weights and their reference values. Block formats: random blocks from quant's reference
// quantizer (make_matrix). Float formats may have any element count, which make_matrix's 32-wide
// pool does not cover, so those are made directly.
QuantMatrix dequant_input(const FormatRef& f, int64_t rows, int64_t cols, uint64_t salt) {
  if (f.block_elems != 1 || cols % 32 == 0) return make_matrix(f, rows, cols, salt);
  QuantMatrix m;
  const std::vector<float> src = random_floats(size_t(rows * cols), 1.0f, salt);
  m.row_bytes = cols * f.block_bytes;
  m.bytes.resize(size_t(rows * m.row_bytes));
  m.values.resize(size_t(rows * cols));
  f.quantize(src.data(), m.bytes.data(), rows * cols);
  f.dequantize(m.bytes.data(), m.values.data(), rows * cols);
  return m;
}

class DequantF16 : public ::testing::TestWithParam<DequantCase> {};
TEST_P(DequantF16, MatchesReferenceBitExact) {
  SLUICE_SKIP_WITHOUT_GPU();
  const DequantCase& c = GetParam();
  ASSERT_TRUE(cu::dequantize_supported(c.fmt.type)) << c.fmt.name;
  const QuantMatrix m = dequant_input(c.fmt, c.rows, c.cols, std::hash<std::string>{}(c.shape) ^ uint64_t(c.fmt.type));
  const size_t n = size_t(c.rows * c.cols);
  DeviceBuffer dw(m.bytes.size() + c.w_offset), dd(n * 2 + c.dst_offset);
  GPU_CHECK(cudaMemcpy(dw.get<uint8_t>() + c.w_offset, m.bytes.data(), m.bytes.size(), cudaMemcpyHostToDevice));
  dd.poison();
  if (c.grouped) expect_ok(cu::group_weight_blocks(c.fmt.type, dw.get<uint8_t>() + c.w_offset, c.rows, c.cols, nullptr));
  expect_ok(cu::dequantize_to_f16(c.fmt.type, dw.get<uint8_t>() + c.w_offset, c.rows, c.cols,
                                  dd.get<uint8_t>() + c.dst_offset, nullptr, c.grouped));
  GPU_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> got(n);
  GPU_CHECK(cudaMemcpy(got.data(), dd.get<uint8_t>() + c.dst_offset, n * 2, cudaMemcpyDeviceToHost));
  int64_t mismatches = 0, first_bad = -1;
  int max_ulp = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t want = quant::fp32_to_fp16(m.values[i]);
    if (got[i] == want) continue;
    if (first_bad < 0) first_bad = int64_t(i);
    ++mismatches;
    max_ulp = (got[i] & 0x7C00) == 0x7C00 ? 1 << 16 : std::max(max_ulp, ulp_distance(got[i], want));
  }
  EXPECT_EQ(mismatches, 0) << c.fmt.name << " " << c.shape << ": max " << max_ulp << " f16 ulp; first at element "
                           << first_bad << " (row " << (first_bad < 0 ? -1 : first_bad / c.cols) << ", col "
                           << (first_bad < 0 ? -1 : first_bad % c.cols) << "); seed " << test_seed();
}

std::vector<DequantCase> dequant_cases() {
  std::vector<DequantCase> out;
  for (const FormatRef& f : weight_formats()) {
    const bool k = f.block_elems == 256;
    const bool flt = f.block_elems == 1;
    out.push_back({f, "one_row", 1, k ? 256 : 32});
    out.push_back({f, "odd_rows", 7, k ? 512 : 96});
    out.push_back({f, "unaligned_rows", 33, k ? 768 : 288});  // row bytes not a multiple of 16 (most formats)
    out.push_back({f, "odd_rows_1001", 1001, 1024});
    out.push_back({f, "llama8b_ffn_down", 4096, 14336});
    out.push_back({f, "dst_offset", 5, 1024, 0, 2});
    if (flt) {
      out.push_back({f, "odd_count", 3, 7});
      out.push_back({f, "w_offset", 9, 64, size_t(f.block_bytes), 0});
    }
    if (f.type == quant::Type::kQ8_0) {
      out.push_back({f, "grouped_odd_rows", 7, 256, 0, 0, true});
      out.push_back({f, "grouped_llama8b_ffn_down", 4096, 14336, 0, 0, true});
      out.push_back({f, "grouped_dst_offset", 5, 1280, 0, 2, true});
    }
    if (f.type == quant::Type::kQ6_K) {
      out.push_back({f, "grouped_odd_rows", 7, 2048, 0, 0, true});
      out.push_back({f, "grouped_llama8b_ffn_down", 4096, 14336, 0, 0, true});
      out.push_back({f, "grouped_dst_offset", 5, 4096, 0, 2, true});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, DequantF16, ::testing::ValuesIn(dequant_cases()),
                         [](const ::testing::TestParamInfo<DequantCase>& i) {
                           return std::string(i.param.fmt.name) + "_" + i.param.shape;
                         });

// The comparison can fail: a corrupted weight byte range must show up as mismatches.
TEST(DequantF16Control, CorruptedWeightsAreDetected) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (const FormatRef& f : weight_formats()) {
    if (f.type != quant::Type::kQ4_K && f.type != quant::Type::kQ6_K && f.type != quant::Type::kQ8_0) continue;
    const QuantMatrix m = make_matrix(f, 16, 1024, 99);
    const size_t n = 16 * 1024;
    DeviceBuffer dw(m.bytes.size()), dd(n * 2);
    dw.upload(m.bytes.data(), m.bytes.size());
    GPU_CHECK(cudaMemset(dw.get<uint8_t>() + m.bytes.size() / 2, 0x5A, 64));
    expect_ok(cu::dequantize_to_f16(f.type, dw.get(), 16, 1024, dd.get(), nullptr));
    GPU_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> got(n);
    dd.download(got.data(), n * 2);
    int64_t mismatches = 0;
    for (size_t i = 0; i < n; ++i) mismatches += got[i] != quant::fp32_to_fp16(m.values[i]);
    EXPECT_GT(mismatches, 0) << f.name;
  }
}

// ---- argument checks ----------------------------------------------------------------------------------------
// Bad arguments are reported as a Status before anything is launched, so these run without a GPU
// too: the pointers are never dereferenced. With a GPU, the device must be left without a sticky
// error.
TEST(OpsArgs, BadArgumentsReturnStatus) {
  alignas(16) float fake[64] = {};
  float* p = fake;
  const auto code = [](const Status& s) { return s.code(); };
  using E = ErrorCode;
  // rms_norm: group must be positive and divide cols.
  EXPECT_EQ(code(cu::rms_norm(p, 576, p, 576, 1, 576, p, 0, 1e-5f, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::rms_norm(p, 576, p, 576, 1, 576, p, 100, 1e-5f, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::rms_norm(p, 576, p, 576, 1, 576, p, -64, 1e-5f, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::rms_norm(p, 500, p, 576, 1, 576, p, 576, 1e-5f, nullptr)), E::kInvalidArgument);  // stride < cols
  EXPECT_EQ(code(cu::rms_norm(p, 576, p, 576, 1, 576, nullptr, 576, 1e-5f, nullptr)), E::kInvalidArgument);
  // Elementwise ops: strides, null pointers, negative shapes.
  EXPECT_EQ(code(cu::add_bias(p, 3, 2, 4, p, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::add_bias(p, 4, 2, 4, nullptr, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::add(p, 4, p, 3, 2, 4, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::add(p, 4, p, 4, -1, 4, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::swiglu(p, 4, nullptr, 4, p, 4, 2, 4, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::swiglu(p, 4, p, 4, p, 2, 2, 4, nullptr)), E::kInvalidArgument);
  // rope: n_rot odd, larger than head_dim, zero; n_head * head_dim larger than the stride.
  cu::RopeArgs ra;
  ra.n_head = 2;
  ra.head_dim = 16;
  ra.n_rot = 15;
  EXPECT_EQ(code(cu::rope(p, 32, 1, ra, 0, nullptr)), E::kInvalidArgument);
  ra.n_rot = 18;
  EXPECT_EQ(code(cu::rope(p, 32, 1, ra, 0, nullptr)), E::kInvalidArgument);
  ra.n_rot = 0;
  EXPECT_EQ(code(cu::rope(p, 32, 1, ra, 0, nullptr)), E::kInvalidArgument);
  ra.n_rot = 16;
  EXPECT_EQ(code(cu::rope(p, 31, 1, ra, 0, nullptr)), E::kInvalidArgument);
  ra.head_dim = 0;
  EXPECT_EQ(code(cu::rope(p, 32, 1, ra, 0, nullptr)), E::kInvalidArgument);
  // store_rows_f16 / f32_to_f16.
  EXPECT_EQ(code(cu::store_rows_f16(p, 8, 1, 8, p, 8, -1, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::store_rows_f16(p, 8, 1, 8, nullptr, 8, 0, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::f32_to_f16(p, 8, p, 4, 1, 8, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::f32_to_f16(p, 8, reinterpret_cast<uint8_t*>(p) + 1, 8, 1, 8, nullptr)), E::kInvalidArgument);
  // dequantize_to_f16: activation-only and unknown formats are unsupported; bad shapes and
  // misaligned weights are invalid.
  for (const FormatRef& f : weight_formats()) EXPECT_TRUE(cu::dequantize_supported(f.type)) << f.name;
  EXPECT_FALSE(cu::dequantize_supported(quant::Type::kQ8_K));
  EXPECT_FALSE(cu::dequantize_supported(quant::Type::kQ8_1));
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type::kQ8_K, p, 1, 256, p, nullptr)), E::kUnsupported);
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type::kQ8_1, p, 1, 32, p, nullptr)), E::kUnsupported);
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type(77), p, 1, 32, p, nullptr)), E::kUnsupported);
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type::kQ4_K, p, 1, 100, p, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type::kQ4_0, p, -1, 32, p, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type::kQ4_K, reinterpret_cast<uint8_t*>(p) + 2, 1, 256, p, nullptr)),
            E::kInvalidArgument);  // Q4_K blocks are 4-byte aligned
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type::kF32, p, 1, 32, nullptr, nullptr)), E::kInvalidArgument);
  // The grouped layout (layout.h) exists for Q6_K rows of whole 2048-column groups and Q8_0 rows of
  // whole 256-column groups only, 16-byte aligned.
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type::kQ4_K, p, 1, 2048, p, nullptr, true)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type::kQ6_K, p, 1, 1024, p, nullptr, true)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type::kQ6_K, reinterpret_cast<uint8_t*>(p) + 4, 1, 2048, p, nullptr, true)),
            E::kInvalidArgument);
  EXPECT_EQ(code(cu::group_weight_blocks(quant::Type::kQ4_K, p, 1, 2048, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::group_weight_blocks(quant::Type::kQ6_K, p, 1, 4096 + 256, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::group_weight_blocks(quant::Type::kQ8_0, p, 1, 288, nullptr)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::dequantize_to_f16(quant::Type::kQ8_0, p, 1, 288, p, nullptr, true)), E::kInvalidArgument);
  EXPECT_EQ(code(cu::group_weight_blocks(quant::Type::kQ6_K, reinterpret_cast<uint8_t*>(p) + 2, 1, 2048, nullptr)),
            E::kInvalidArgument);
  EXPECT_TRUE(cu::group_weight_blocks(quant::Type::kQ6_K, p, 0, 2048, nullptr).is_ok());
  // Empty work is a successful no-op (nothing is launched, so this holds without a GPU as well).
  EXPECT_TRUE(cu::dequantize_to_f16(quant::Type::kQ6_K, nullptr, 0, 256, nullptr, nullptr).is_ok());
  EXPECT_TRUE(cu::add(p, 4, p, 4, 0, 4, nullptr).is_ok());

  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  } else {
    (void)cudaGetLastError();
  }
}

// The fused decode ops must equal the separate ones bit for bit: rms_norm (or swiglu) followed by
// quantize_activation_q8 on its output.
void expect_same_q8(const cu::Q8Activation& a, const cu::Q8Activation& b, int64_t cols, int rows) {
  std::vector<int8_t> qa(size_t(cols * rows)), qb(qa.size());
  std::vector<float> da(size_t(cols / 32 * rows * 2)), db(da.size());
  GPU_CHECK(cudaMemcpy(qa.data(), a.q, qa.size(), cudaMemcpyDeviceToHost));
  GPU_CHECK(cudaMemcpy(qb.data(), b.q, qb.size(), cudaMemcpyDeviceToHost));
  GPU_CHECK(cudaMemcpy(da.data(), a.ds, da.size() * 4, cudaMemcpyDeviceToHost));
  GPU_CHECK(cudaMemcpy(db.data(), b.ds, db.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(qa, qb);
  EXPECT_EQ(0, std::memcmp(da.data(), db.data(), da.size() * 4));
}

TEST(FusedDecodeOps, NormAndSwigluWithQ8EqualSeparateOps) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (const int rows : {1, 3, 8}) {
    for (const int64_t cols : {int64_t(576), int64_t(4096), int64_t(14336)}) {
      const auto x = random_floats(size_t(rows * cols), 2.0f, 71);
      const auto u = random_floats(size_t(rows * cols), 1.0f, 72);
      const auto w = random_floats(size_t(cols), 0.5f, 73);
      DeviceBuffer dx(x.size() * 4), du(u.size() * 4), dw(w.size() * 4), y1(x.size() * 4), y2(x.size() * 4);
      dx.upload(x.data(), x.size() * 4);
      du.upload(u.data(), u.size() * 4);
      dw.upload(w.data(), w.size() * 4);
      const int64_t qb = cu::q8_activation_bytes(cols, rows);
      DeviceBuffer b1(static_cast<size_t>(qb)), b2(static_cast<size_t>(qb));
      const auto q1 = cu::q8_activation_view(b1.get(), cols, rows), q2 = cu::q8_activation_view(b2.get(), cols, rows);
      // norm
      ASSERT_TRUE(cu::rms_norm_q8(dx.get<float>(), cols, y1.get<float>(), cols, rows, cols, dw.get<float>(), 1e-5f, q1,
                                  nullptr).is_ok());
      ASSERT_TRUE(cu::rms_norm(dx.get<float>(), cols, y2.get<float>(), cols, rows, cols, dw.get<float>(), cols, 1e-5f,
                               nullptr).is_ok());
      ASSERT_TRUE(cu::quantize_activation_q8(y2.get<float>(), q2, nullptr).is_ok());
      GPU_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(download_f32(y1, x.size()), download_f32(y2, x.size())) << "norm rows " << rows << " cols " << cols;
      expect_same_q8(q1, q2, cols, rows);
      // swiglu
      ASSERT_TRUE(cu::swiglu_q8(dx.get<float>(), cols, du.get<float>(), cols, y1.get<float>(), cols, rows, cols, q1,
                                nullptr).is_ok());
      ASSERT_TRUE(cu::swiglu(dx.get<float>(), cols, du.get<float>(), cols, y2.get<float>(), cols, rows, cols, nullptr)
                      .is_ok());
      ASSERT_TRUE(cu::quantize_activation_q8(y2.get<float>(), q2, nullptr).is_ok());
      GPU_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(download_f32(y1, x.size()), download_f32(y2, x.size())) << "swiglu rows " << rows << " cols " << cols;
      expect_same_q8(q1, q2, cols, rows);
      // geglu (Gemma)
      ASSERT_TRUE(cu::geglu_q8(dx.get<float>(), cols, du.get<float>(), cols, y1.get<float>(), cols, rows, cols, q1,
                               nullptr).is_ok());
      ASSERT_TRUE(cu::geglu(dx.get<float>(), cols, du.get<float>(), cols, y2.get<float>(), cols, rows, cols, nullptr)
                      .is_ok());
      ASSERT_TRUE(cu::quantize_activation_q8(y2.get<float>(), q2, nullptr).is_ok());
      GPU_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(download_f32(y1, x.size()), download_f32(y2, x.size())) << "geglu rows " << rows << " cols " << cols;
      expect_same_q8(q1, q2, cols, rows);
    }
  }
}

// Gemma 3's fused decode ops equal the calls they replace, bit for bit:
// - add_rms_norm_q8 with w_src (post-attention norm, residual add, FFN norm) = rms_norm_q8 of src,
//   then add_rms_norm_q8; dst aliasing src (the executor's xn) included;
// - norm_add (post-FFN norm and residual add) = rms_norm_q8 of src, then add;
// - rms_norm_pair (Q and K head norms) = rms_norm of each.
TEST(FusedDecodeOps, GemmaNormsEqualSeparateOps) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (const int rows : {1, 3, 8}) {
    for (const int64_t cols : {int64_t(640), int64_t(2560), int64_t(8192)}) {
      for (const bool alias : {false, true}) {
        const auto x = random_floats(size_t(rows * cols), 2.0f, 181 + uint64_t(rows));
        const auto r = random_floats(size_t(rows * cols), 30.0f, 182 + uint64_t(cols));
        const auto ws = random_floats(size_t(cols), 0.5f, 183), w = random_floats(size_t(cols), 0.5f, 184);
        DeviceBuffer x1(x.size() * 4), x2(x.size() * 4), r1(r.size() * 4), r2(r.size() * 4), dws(ws.size() * 4),
            dw(w.size() * 4), y1(x.size() * 4), y2(x.size() * 4);
        x1.upload(x.data(), x.size() * 4);
        x2.upload(x.data(), x.size() * 4);
        r1.upload(r.data(), r.size() * 4);
        r2.upload(r.data(), r.size() * 4);
        dws.upload(ws.data(), ws.size() * 4);
        dw.upload(w.data(), w.size() * 4);
        y1.poison();
        const int64_t qb = cu::q8_activation_bytes(cols, rows);
        DeviceBuffer b1(static_cast<size_t>(qb)), b2(static_cast<size_t>(qb));
        const auto q1 = cu::q8_activation_view(b1.get(), cols, rows), q2 = cu::q8_activation_view(b2.get(), cols, rows);
        float* out1 = alias ? r1.get<float>() : y1.get<float>();
        ASSERT_TRUE(cu::add_rms_norm_q8(x1.get<float>(), cols, r1.get<float>(), cols, out1, cols, rows, cols,
                                        dw.get<float>(), 1e-6f, q1, nullptr, dws.get<float>())
                        .is_ok());
        ASSERT_TRUE(cu::rms_norm_q8(r2.get<float>(), cols, r2.get<float>(), cols, rows, cols, dws.get<float>(), 1e-6f,
                                    q2, nullptr)
                        .is_ok());
        ASSERT_TRUE(cu::add_rms_norm_q8(x2.get<float>(), cols, r2.get<float>(), cols, y2.get<float>(), cols, rows, cols,
                                        dw.get<float>(), 1e-6f, q2, nullptr)
                        .is_ok());
        GPU_CHECK(cudaDeviceSynchronize());
        const std::string at = "rows " + std::to_string(rows) + " cols " + std::to_string(cols);
        EXPECT_EQ(download_f32(x1, x.size()), download_f32(x2, x.size())) << "residual, " << at;
        EXPECT_EQ(download_f32(alias ? r1 : y1, x.size()), download_f32(y2, x.size())) << "norm, " << at;
        expect_same_q8(q1, q2, cols, rows);
        if (alias) continue;
        // norm_add, from the same inputs
        x1.upload(x.data(), x.size() * 4);
        x2.upload(x.data(), x.size() * 4);
        r1.upload(r.data(), r.size() * 4);
        r2.upload(r.data(), r.size() * 4);
        ASSERT_TRUE(cu::norm_add(x1.get<float>(), cols, r1.get<float>(), cols, rows, cols, dws.get<float>(), 1e-6f,
                                 nullptr)
                        .is_ok());
        ASSERT_TRUE(cu::rms_norm_q8(r2.get<float>(), cols, r2.get<float>(), cols, rows, cols, dws.get<float>(), 1e-6f,
                                    q2, nullptr)
                        .is_ok());
        ASSERT_TRUE(cu::add(x2.get<float>(), cols, r2.get<float>(), cols, rows, cols, nullptr).is_ok());
        GPU_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(download_f32(x1, x.size()), download_f32(x2, x.size())) << "norm_add, " << at;
        EXPECT_EQ(download_f32(r1, x.size()), r) << "norm_add leaves src as it was, " << at;
      }
    }
  }
  // Q/K head norms: Gemma 3 270M (4 heads and 1 KV head of 256), Qwen3 (32 and 8 heads of 128).
  for (const auto& [nq, nk, hd] : {std::tuple{4, 1, 256}, std::tuple{32, 8, 128}}) {
    for (const int rows : {1, 5}) {
      const int64_t qc = int64_t(nq) * hd, kc = int64_t(nk) * hd;
      const auto q = random_floats(size_t(rows * qc), 3.0f, 191), k = random_floats(size_t(rows * kc), 3.0f, 192);
      const auto wq = random_floats(size_t(hd), 0.5f, 193), wk = random_floats(size_t(hd), 0.5f, 194);
      DeviceBuffer q1(q.size() * 4), q2(q.size() * 4), k1(k.size() * 4), k2(k.size() * 4), dwq(wq.size() * 4),
          dwk(wk.size() * 4);
      q1.upload(q.data(), q.size() * 4);
      q2.upload(q.data(), q.size() * 4);
      k1.upload(k.data(), k.size() * 4);
      k2.upload(k.data(), k.size() * 4);
      dwq.upload(wq.data(), wq.size() * 4);
      dwk.upload(wk.data(), wk.size() * 4);
      ASSERT_TRUE(cu::rms_norm_pair(q1.get<float>(), qc, qc, dwq.get<float>(), hd, k1.get<float>(), kc, kc,
                                    dwk.get<float>(), hd, rows, 1e-6f, nullptr)
                      .is_ok());
      ASSERT_TRUE(cu::rms_norm(q2.get<float>(), qc, q2.get<float>(), qc, rows, qc, dwq.get<float>(), hd, 1e-6f, nullptr)
                      .is_ok());
      ASSERT_TRUE(cu::rms_norm(k2.get<float>(), kc, k2.get<float>(), kc, rows, kc, dwk.get<float>(), hd, 1e-6f, nullptr)
                      .is_ok());
      GPU_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(download_f32(q1, q.size()), download_f32(q2, q.size())) << "q heads " << nq << " rows " << rows;
      EXPECT_EQ(download_f32(k1, k.size()), download_f32(k2, k.size())) << "k heads " << nk << " rows " << rows;
      EXPECT_NE(download_f32(q1, q.size()), q) << "normed in place";
    }
  }
}

// add_rms_norm_q8 equals add, then rms_norm, then quantize_activation_q8, bit for bit; dst aliasing
// src (the decode layer's use: xn = norm(x += xn)) included.
TEST(FusedDecodeOps, AddNormWithQ8EqualsSeparateOps) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (const int rows : {1, 3, 8}) {
    for (const int64_t cols : {int64_t(576), int64_t(4096), int64_t(8192)}) {
      for (const bool alias : {false, true}) {
        const auto x = random_floats(size_t(rows * cols), 2.0f, 81 + uint64_t(rows));
        const auto r = random_floats(size_t(rows * cols), 1.0f, 82 + uint64_t(cols));
        const auto w = random_floats(size_t(cols), 0.5f, 83);
        DeviceBuffer x1(x.size() * 4), x2(x.size() * 4), r1(r.size() * 4), r2(r.size() * 4), dw(w.size() * 4),
            y1(x.size() * 4), y2(x.size() * 4);
        x1.upload(x.data(), x.size() * 4);
        x2.upload(x.data(), x.size() * 4);
        r1.upload(r.data(), r.size() * 4);
        r2.upload(r.data(), r.size() * 4);
        dw.upload(w.data(), w.size() * 4);
        y1.poison();
        const int64_t qb = cu::q8_activation_bytes(cols, rows);
        DeviceBuffer b1(static_cast<size_t>(qb)), b2(static_cast<size_t>(qb));
        const auto q1 = cu::q8_activation_view(b1.get(), cols, rows), q2 = cu::q8_activation_view(b2.get(), cols, rows);
        float* out1 = alias ? r1.get<float>() : y1.get<float>();
        ASSERT_TRUE(cu::add_rms_norm_q8(x1.get<float>(), cols, r1.get<float>(), cols, out1, cols, rows, cols,
                                        dw.get<float>(), 1e-6f, q1, nullptr)
                        .is_ok());
        ASSERT_TRUE(cu::add(x2.get<float>(), cols, r2.get<float>(), cols, rows, cols, nullptr).is_ok());
        ASSERT_TRUE(cu::rms_norm(x2.get<float>(), cols, y2.get<float>(), cols, rows, cols, dw.get<float>(), cols, 1e-6f,
                                 nullptr)
                        .is_ok());
        ASSERT_TRUE(cu::quantize_activation_q8(y2.get<float>(), q2, nullptr).is_ok());
        GPU_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(download_f32(x1, x.size()), download_f32(x2, x.size())) << "residual rows " << rows;
        EXPECT_EQ(download_f32(alias ? r1 : y1, x.size()), download_f32(y2, x.size()))
            << "norm rows " << rows << " cols " << cols << " alias " << alias;
        expect_same_q8(q1, q2, cols, rows);
      }
    }
  }
}

// rope_store_kv equals rope(q), rope(k), store_rows(k), store_rows(v) bit for bit: both modes, a
// partial rotation, frequency factors, GQA head counts, several rows at a late position; cache
// rows outside [pos0, pos0 + rows) untouched.
TEST(FusedDecodeOps, RopeStoreKvEqualsSeparateOps) {
  SLUICE_SKIP_WITHOUT_GPU();
  struct C {
    bool neox;
    int n_head, n_head_k, head_dim, n_rot, rows, pos0;
    bool factors;
  };
  const C cases[] = {{false, 32, 8, 128, 128, 1, 37, false}, {true, 16, 4, 128, 64, 5, 4000, false},
                     {false, 9, 3, 64, 64, 8, 100000, true}, {true, 8, 8, 96, 32, 2, 0, true}};
  for (const C& c : cases) {
    const int64_t qc = int64_t(c.n_head) * c.head_dim, kc = int64_t(c.n_head_k) * c.head_dim, vc = kc;
    const int64_t cache_rows = c.pos0 + c.rows + 3;
    const auto q = random_floats(size_t(c.rows * qc), 1.0f, 91);
    const auto k = random_floats(size_t(c.rows * kc), 1.0f, 92);
    const auto v = random_floats(size_t(c.rows * vc), 1.0f, 93);
    std::vector<float> ff(size_t(c.n_rot / 2));
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 7.0f * float(i) / float(ff.size());
    DeviceBuffer q1(q.size() * 4), q2(q.size() * 4), k1(k.size() * 4), k2(k.size() * 4), v1(v.size() * 4),
        dff(ff.size() * 4), kc1(size_t(cache_rows * kc) * 2), kc2(size_t(cache_rows * kc) * 2),
        vc1(size_t(cache_rows * vc) * 2), vc2(size_t(cache_rows * vc) * 2);
    q1.upload(q.data(), q.size() * 4);
    q2.upload(q.data(), q.size() * 4);
    k1.upload(k.data(), k.size() * 4);
    k2.upload(k.data(), k.size() * 4);
    v1.upload(v.data(), v.size() * 4);
    dff.upload(ff.data(), ff.size() * 4);
    for (DeviceBuffer* b : {&kc1, &kc2, &vc1, &vc2}) GPU_CHECK(cudaMemset(b->get(), 0x3C, b->bytes()));
    cu::RopeArgs a;
    a.neox = c.neox;
    a.n_head = c.n_head;
    a.head_dim = c.head_dim;
    a.n_rot = c.n_rot;
    a.freq_base = 500000.0f;
    a.freq_scale = 1.0f;
    a.freq_factors = c.factors ? dff.get<float>() : nullptr;
    ASSERT_TRUE(cu::rope_store_kv(q1.get<float>(), qc, k1.get<float>(), kc, c.n_head_k, v1.get<float>(), vc, vc, c.rows,
                                  a, kc1.get(), kc, vc1.get(), vc, c.pos0, nullptr)
                    .is_ok());
    ASSERT_TRUE(cu::rope(q2.get<float>(), qc, c.rows, a, c.pos0, nullptr).is_ok());
    cu::RopeArgs ak = a;
    ak.n_head = c.n_head_k;
    ASSERT_TRUE(cu::rope(k2.get<float>(), kc, c.rows, ak, c.pos0, nullptr).is_ok());
    ASSERT_TRUE(cu::store_rows_f16(k2.get<float>(), kc, c.rows, kc, kc2.get(), kc, c.pos0, nullptr).is_ok());
    ASSERT_TRUE(cu::store_rows_f16(v1.get<float>(), vc, c.rows, vc, vc2.get(), vc, c.pos0, nullptr).is_ok());
    GPU_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(download_f32(q1, q.size()), download_f32(q2, q.size())) << "q, neox " << c.neox;
    EXPECT_EQ(download_f32(k1, k.size()), download_f32(k2, k.size())) << "k, neox " << c.neox;
    EXPECT_EQ(download_u16(kc1, size_t(cache_rows * kc)), download_u16(kc2, size_t(cache_rows * kc))) << "k cache";
    EXPECT_EQ(download_u16(vc1, size_t(cache_rows * vc)), download_u16(vc2, size_t(cache_rows * vc))) << "v cache";
  }
}

// The Q/K/V GEMV's rope-and-store epilogue (gemv.h, GemvRopeStore) equals the plain GEMVs followed
// by rope_store_kv bit for bit (q, k, v and both caches): the direct kernel's formats (Q4_K, Q5_K,
// grouped Q6_K and Q8_0), Q/K and V in different formats (two launches), 1 and 2 tokens, full and
// partial rotation, frequency factors, a paged cache (a row map) and a device position (the pos0
// argument then wrong on purpose). The epilogue's launch must be taken (status ok); a format
// without the direct kernel is refused with kUnsupported, before anything is launched.
TEST(FusedDecodeOps, QkvRopeStoreEpilogueEqualsSeparateOps) {
  SLUICE_SKIP_WITHOUT_GPU();
  auto made = backend::make_cuda_backend({});
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  backend::Backend& be = **made;
  Result<cu::DeviceInfo> dev = cu::query_device(0);
  ASSERT_TRUE(dev.is_ok());
  using T = quant::Type;
  struct C {
    T qk, v;
    int tokens, n_head, n_head_k, head_dim, n_rot, pos0;
    bool factors, paged, pos_dev;
  };
  const C cases[] = {{T::kQ4_K, T::kQ4_K, 1, 32, 8, 128, 128, 37, false, false, false},
                     {T::kQ4_K, T::kQ6_K, 1, 16, 4, 128, 128, 300, true, true, true},
                     {T::kQ8_0, T::kQ8_0, 2, 16, 4, 128, 64, 4000, false, false, true},
                     {T::kQ5_K, T::kQ6_K, 2, 8, 2, 64, 64, 100000, true, true, false},
                     {T::kQ6_K, T::kQ8_0, 1, 12, 4, 128, 96, 5, true, false, false}};
  const int64_t cols = 2048;
  auto format = [](T t) {
    for (const FormatRef& f : weight_formats()) {
      if (f.type == t) return &f;
    }
    return static_cast<const FormatRef*>(nullptr);
  };
  uint64_t salt = 700;
  for (const C& c : cases) {
    SCOPED_TRACE(std::string(format(c.qk)->name) + "/" + format(c.v)->name + " tokens " + std::to_string(c.tokens) +
                 " pos " + std::to_string(c.pos0));
    const int64_t rows[3] = {int64_t(c.n_head) * c.head_dim, int64_t(c.n_head_k) * c.head_dim,
                             int64_t(c.n_head_k) * c.head_dim};
    const T types[3] = {c.qk, c.qk, c.v};
    WeightView w[3];
    for (int i = 0; i < 3; ++i) {
      const QuantMatrix m = make_matrix(*format(types[i]), rows[i], cols, ++salt);
      auto up = be.upload_weight(WeightView{types[i], cols, rows[i], m.bytes.data()});
      ASSERT_TRUE(up.is_ok()) << up.status().message();
      w[i] = *up;
    }
    const auto x = random_floats(size_t(c.tokens * cols), 1.0f, ++salt);
    DeviceBuffer dx(x.size() * 4), dq8(size_t(cu::q8_activation_bytes(cols, c.tokens)));
    dx.upload(x.data(), x.size() * 4);
    const cu::Q8Activation xq = cu::q8_activation_view(dq8.get(), cols, c.tokens);
    expect_ok(cu::quantize_activation_q8(dx.get<float>(), xq, nullptr));
    const int64_t cache_rows = int64_t(c.pos0) + c.tokens + 3, kvc = rows[1];
    std::vector<DeviceBuffer> y1, y2, caches;
    for (int i = 0; i < 3; ++i) {
      y1.emplace_back(size_t(c.tokens * rows[i]) * 4);
      y2.emplace_back(size_t(c.tokens * rows[i]) * 4);
      y1.back().poison();
      y2.back().poison();
    }
    for (int i = 0; i < 4; ++i) {  // k1, v1, k2, v2
      caches.emplace_back(size_t(cache_rows * kvc) * 2);
      GPU_CHECK(cudaMemset(caches.back().get(), 0x3C, caches.back().bytes()));
    }
    std::vector<float> ff(size_t(c.n_rot / 2));
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 7.0f * float(i) / float(ff.size());
    std::vector<int> map(static_cast<size_t>(cache_rows));
    for (int64_t p = 0; p < cache_rows; ++p) map[size_t(p)] = int(cache_rows - 1 - p);
    DeviceBuffer dff(ff.size() * 4 + 4), dmap(map.size() * 4), dpos(4);
    dff.upload(ff.data(), ff.size() * 4);
    dmap.upload(map.data(), map.size() * 4);
    dpos.upload(&c.pos0, 4);
    cu::RopeArgs a;
    a.n_head = c.n_head;
    a.head_dim = c.head_dim;
    a.n_rot = c.n_rot;
    a.freq_base = 500000.0f;
    a.freq_scale = 0.5f;
    a.freq_factors = c.factors ? dff.get<float>() : nullptr;
    const int* pos_dev = c.pos_dev ? dpos.get<int>() : nullptr;
    const int pos_arg = c.pos_dev ? 0 : c.pos0;
    const int* row_map = c.paged ? dmap.get<int>() : nullptr;
    cu::GemvRopeStore rs;
    expect_ok(cu::rope_store_epilogue(a, rs));
    rs.pos0 = pos_arg;
    rs.pos_dev = pos_dev;
    rs.row_map = row_map;
    // One launch per format, as the backend groups them.
    auto launches = [&](std::vector<DeviceBuffer>& y, DeviceBuffer* kcache, DeviceBuffer* vcache) {
      std::vector<cu::GemvGroupArgs> gs;
      for (int i = 0; i < 3; ++i) {
        if (i > 0 && types[i] == types[i - 1]) {
          gs.back().m[gs.back().n++] = cu::GemvMatrix{w[i].data, rows[i], nullptr, xq, y[size_t(i)].get<float>()};
          continue;
        }
        cu::GemvGroupArgs g;
        g.type = types[i];
        g.grouped = w[i].grouped;
        g.cols = cols;
        g.tokens = c.tokens;
        g.m[g.n++] = cu::GemvMatrix{w[i].data, rows[i], nullptr, xq, y[size_t(i)].get<float>()};
        gs.push_back(g);
      }
      std::vector<cu::GemvRopeStore> epi(gs.size(), rs);
      if (kcache != nullptr) {  // the epilogue's kind and cache of each matrix
        int i = 0;
        for (size_t gi = 0; gi < gs.size(); ++gi) {
          for (int j = 0; j < gs[gi].n; ++j, ++i) {
            epi[gi].kind[j] = i == 0 ? cu::GemvRopeStore::kQ : i == 1 ? cu::GemvRopeStore::kK : cu::GemvRopeStore::kV;
            epi[gi].cache[j] = i == 0 ? nullptr : (i == 1 ? kcache : vcache)->get();
            epi[gi].cache_stride[j] = kvc;
          }
          gs[gi].rope = &epi[gi];
        }
      }
      for (const cu::GemvGroupArgs& g : gs) expect_ok(cu::gemv_group(*dev, g, nullptr));
    };
    launches(y1, &caches[0], &caches[1]);
    launches(y2, nullptr, nullptr);
    expect_ok(cu::rope_store_kv(y2[0].get<float>(), rows[0], y2[1].get<float>(), rows[1], c.n_head_k,
                                y2[2].get<float>(), rows[2], rows[2], c.tokens, a, caches[2].get(), kvc,
                                caches[3].get(), kvc, pos_arg, nullptr, pos_dev, row_map));
    GPU_CHECK(cudaDeviceSynchronize());
    const char* names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; ++i) {
      const size_t n = size_t(c.tokens * rows[i]);
      EXPECT_EQ(download_f32(y1[size_t(i)], n), download_f32(y2[size_t(i)], n)) << names[i];
    }
    EXPECT_EQ(download_u16(caches[0], size_t(cache_rows * kvc)), download_u16(caches[2], size_t(cache_rows * kvc)))
        << "k cache";
    EXPECT_EQ(download_u16(caches[1], size_t(cache_rows * kvc)), download_u16(caches[3], size_t(cache_rows * kvc)))
        << "v cache";
    // The epilogue wrote the token's cache rows (they were 0x3C3C before).
    std::vector<uint16_t> kc = download_u16(caches[0], size_t(cache_rows * kvc));
    const int64_t row = c.paged ? map[size_t(c.pos0)] : c.pos0;
    EXPECT_NE(kc[size_t(row * kvc)], 0x3C3C);
  }
  // No direct kernel: refused before any launch.
  const QuantMatrix m = make_matrix(*format(T::kQ4_0), 256, cols, 1);
  auto up = be.upload_weight(WeightView{T::kQ4_0, cols, 256, m.bytes.data()});
  ASSERT_TRUE(up.is_ok());
  DeviceBuffer dq8(size_t(cu::q8_activation_bytes(cols, 1))), dy(256 * 4), dc(256 * 2 * 8);
  cu::GemvRopeStore rs;
  rs.head_dim = 128;
  rs.half = 64;
  rs.kind[0] = cu::GemvRopeStore::kK;
  rs.cache[0] = dc.get();
  rs.cache_stride[0] = 256;
  cu::GemvGroupArgs g;
  g.type = T::kQ4_0;
  g.cols = cols;
  g.m[g.n++] = cu::GemvMatrix{up->data, 256, nullptr, cu::q8_activation_view(dq8.get(), cols, 1), dy.get<float>()};
  g.rope = &rs;
  EXPECT_EQ(cu::gemv_group(*dev, g, nullptr).code(), ErrorCode::kUnsupported);
}

// Backend::matmul_rope_store_kv on the CUDA backend (the epilogue where it fits) gives what
// matmul_multi + rope_store_kv give, bit for bit: Q4_K Q/K with a grouped Q6_K V, 1 token, and
// 3 tokens (the small-batch products: the two steps).
TEST(FusedDecodeOps, MatmulRopeStoreKvEqualsTwoSteps) {
  SLUICE_SKIP_WITHOUT_GPU();
  auto made = backend::make_cuda_backend({});
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  backend::Backend& be = **made;
  const int64_t cols = 2048, n_head = 16, n_head_k = 4, hd = 128, cache_rows = 64;
  const quant::Type types[3] = {quant::Type::kQ4_K, quant::Type::kQ4_K, quant::Type::kQ6_K};
  const int64_t rows[3] = {n_head * hd, n_head_k * hd, n_head_k * hd};
  WeightView w[3];
  for (int i = 0; i < 3; ++i) {
    const FormatRef* f = nullptr;
    for (const FormatRef& r : weight_formats()) f = r.type == types[i] ? &r : f;
    ASSERT_NE(f, nullptr);
    const QuantMatrix m = make_matrix(*f, rows[i], cols, 800 + uint64_t(i));
    auto up = be.upload_weight(WeightView{types[i], cols, rows[i], m.bytes.data()});
    ASSERT_TRUE(up.is_ok());
    w[i] = *up;
  }
  backend::RopeParams rq{backend::RopeMode::kNormal, int(n_head), int(hd), int(hd), 500000.0f, 1.0f, {}};
  backend::RopeParams rk = rq;
  rk.n_head = int(n_head_k);
  for (int tokens : {1, 3}) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    const auto xv = random_floats(size_t(tokens * cols), 1.0f, 900 + uint64_t(tokens));
    auto x = be.alloc(DType::kF32, cols, tokens);
    ASSERT_TRUE(x.is_ok());
    std::vector<Tensor> y1, y2, c1, c2;
    for (int i = 0; i < 3; ++i) {
      auto a = be.alloc(DType::kF32, rows[i], tokens), b = be.alloc(DType::kF32, rows[i], tokens);
      ASSERT_TRUE(a.is_ok() && b.is_ok());
      y1.push_back(*a);
      y2.push_back(*b);
    }
    const size_t cache_elems = static_cast<size_t>(cache_rows * rows[1]);
    for (int i = 0; i < 2; ++i) {  // zeroed by alloc
      auto a = be.alloc(DType::kF16, rows[1], cache_rows), b = be.alloc(DType::kF16, rows[1], cache_rows);
      ASSERT_TRUE(a.is_ok() && b.is_ok());
      c1.push_back(*a);
      c2.push_back(*b);
    }
    const int pos0 = 9;
    be.upload(*x, xv.data());
    be.matmul_rope_store_kv(std::span<const WeightView, 3>(w, 3), *x, std::span<const Tensor, 3>(y1.data(), 3), rq, rk,
                            backend::SeqRows{0, tokens, pos0, c1[0], c1[1]});
    be.upload(*x, xv.data());
    const WeightView ws[3] = {w[0], w[1], w[2]};
    be.matmul_multi(ws, *x, y2);
    be.rope_store_kv(y2[0], rq, y2[1], rk, y2[2], c2[0], c2[1], pos0);
    for (int i = 0; i < 3; ++i) {
      std::vector<float> a(size_t(tokens * rows[i])), b(a.size());
      be.download(y1[size_t(i)], a.data());
      be.download(y2[size_t(i)], b.data());
      EXPECT_EQ(a, b) << "output " << i;
    }
    GPU_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 2; ++i) {
      std::vector<uint16_t> a(cache_elems), b(cache_elems);
      GPU_CHECK(cudaMemcpy(a.data(), c1[size_t(i)].data, cache_elems * 2, cudaMemcpyDeviceToHost));
      GPU_CHECK(cudaMemcpy(b.data(), c2[size_t(i)].data, cache_elems * 2, cudaMemcpyDeviceToHost));
      EXPECT_EQ(a, b) << (i == 0 ? "k cache" : "v cache");
      EXPECT_NE(a[size_t(pos0 * rows[1])], 0) << "the token's cache row was written";
    }
  }
}

// The decode ops of a mixture-of-experts layer on the CUDA backend: matmul_each over rows of the
// tensor SwiGLU just quantized (one grouped GEMV launch, every expert on its own row) and
// add_rows_scaled equal separate matmul and scatter_add_rows calls bit for bit, in Q4_K and Q6_K
// experts of one layer (mixed formats: two launches).
TEST(FusedDecodeOps, MoeDecodeOpsEqualSeparateOps) {
  SLUICE_SKIP_WITHOUT_GPU();
  auto made = backend::make_cuda_backend({});
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  backend::Backend& be = **made;
  const int k = 5;
  const int64_t n_ff = 768, n_embd = 512;
  const FormatRef* q4 = nullptr;
  const FormatRef* q6 = nullptr;
  for (const FormatRef& f : weight_formats()) {
    if (f.type == quant::Type::kQ4_K) q4 = &f;
    if (f.type == quant::Type::kQ6_K) q6 = &f;
  }
  ASSERT_TRUE(q4 && q6);
  std::vector<QuantMatrix> host;
  std::vector<WeightView> ws;
  for (int i = 0; i < k; ++i) {
    const FormatRef& f = i % 2 ? *q6 : *q4;
    host.push_back(make_matrix(f, n_embd, n_ff, 300 + uint64_t(i)));
  }
  for (int i = 0; i < k; ++i) {
    const FormatRef& f = i % 2 ? *q6 : *q4;
    auto w = be.upload_weight(WeightView{f.type, n_ff, n_embd, host[size_t(i)].bytes.data()});
    ASSERT_TRUE(w.is_ok());
    ws.push_back(*w);
  }
  auto g = be.alloc(DType::kF32, n_ff, k), u = be.alloc(DType::kF32, n_ff, k);
  auto y1 = be.alloc(DType::kF32, n_embd, k), y2 = be.alloc(DType::kF32, n_embd, k);
  auto x1 = be.alloc(DType::kF32, n_embd, 2), x2 = be.alloc(DType::kF32, n_embd, 2);
  ASSERT_TRUE(g.is_ok() && u.is_ok() && y1.is_ok() && y2.is_ok() && x1.is_ok() && x2.is_ok());
  const auto gv = random_floats(size_t(k * n_ff), 1.0f, 401), uv = random_floats(size_t(k * n_ff), 1.0f, 402);
  const auto xv = random_floats(size_t(2 * n_embd), 1.0f, 403);
  const std::vector<float> scale = {0.4f, 0.25f, 0.2f, 0.1f, 0.05f};
  std::vector<Tensor> xs, ys1, ys2;
  for (int i = 0; i < k; ++i) {
    xs.push_back(g->row_range(i, 1));
    ys1.push_back(y1->row_range(i, 1));
    ys2.push_back(y2->row_range(i, 1));
  }
  // Grouped: SwiGLU makes the [k][n_ff] int8 activation, every expert reads its row.
  be.upload(*g, gv.data());
  be.upload(*u, uv.data());
  be.upload(*x1, xv.data());
  be.swiglu(*g, *u, *g);
  be.matmul_each(ws, xs, ys1);
  be.add_rows_scaled(*x1, 1, *y1, scale);
  // Separate: the same SwiGLU, then each expert alone.
  be.upload(*g, gv.data());
  be.upload(*x2, xv.data());
  be.swiglu(*g, *u, *g);
  for (int i = 0; i < k; ++i) be.matmul(ws[size_t(i)], xs[size_t(i)], ys2[size_t(i)]);
  for (int i = 0; i < k; ++i) {
    const int32_t row[] = {1};
    be.scatter_add_rows(*x2, y2->row_range(i, 1), row, std::span<const float>(scale.data() + i, 1));
  }
  std::vector<float> a(size_t(k * n_embd)), b(a.size()), xa(size_t(2 * n_embd)), xb(xa.size());
  be.download(*y1, a.data());
  be.download(*y2, b.data());
  be.download(*x1, xa.data());
  be.download(*x2, xb.data());
  EXPECT_EQ(a, b) << "expert outputs";
  EXPECT_EQ(xa, xb) << "residual rows";
  // And the outputs are right: expert 0 against the reference (exact up to the q8 activation).
  double worst = 0;
  for (int64_t r = 0; r < n_embd; r += 37) {
    double ref = 0, scale_ref = 0;
    for (int64_t c = 0; c < n_ff; ++c) {
      const double gg = gv[size_t(c)], sw = gg / (1.0 + std::exp(-gg)) * uv[size_t(c)];
      ref += double(host[0].values[size_t(r * n_ff + c)]) * sw;
      scale_ref += std::fabs(double(host[0].values[size_t(r * n_ff + c)]) * sw);
    }
    worst = std::max(worst, std::fabs(double(a[size_t(r)]) - ref) / scale_ref);
  }
  EXPECT_LE(worst, 1e-2) << "expert 0 output vs the reference (relative to sum |w x|)";
}


// A pass over several sequences (Backend::rope_store_kv_seqs / attention_seqs): the CUDA backend's
// launches over all the sequences give what one rope_store_kv and one attention call per sequence
// give (the base class's loop): q and k rotated and the caches written bit for bit, attention
// outputs equal up to the key splits' summation order. Sequences at different positions in one
// paged pool (scattered rows, one sequence unpaged on rows 0..), decode rows mixed with a prompt
// chunk, pure-decode passes, GQA with and without a sliding window, 40 sequences (more than one launch holds).
TEST(FusedDecodeOps, SequencesInOneLaunchEqualOneCallEach) {
  SLUICE_SKIP_WITHOUT_GPU();
  auto made = backend::make_cuda_backend({});
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  backend::Backend& be = **made;
  struct C {
    int n_head, n_head_kv, head_dim, window;
    std::vector<int> pos0, n;  // per sequence; sequence 0 is unpaged
  };
  std::vector<C> cases = {
      {32, 8, 128, 0, {7, 0, 130, 64, 300, 1, 17}, {1, 1, 1, 6, 1, 1, 1}},
      {8, 2, 64, 8, {3, 40, 9, 200}, {1, 1, 1, 1}},
      {4, 4, 128, 0, {}, {}},
  };
  for (int i = 0; i < 40; ++i) {
    cases[2].pos0.push_back(11 * i + i % 3);
    cases[2].n.push_back(1);
  }
  uint64_t salt = 900;
  for (const C& c : cases) {
    const int n_seq = int(c.pos0.size());
    const int64_t qc = int64_t(c.n_head) * c.head_dim, kvc = int64_t(c.n_head_kv) * c.head_dim;
    int64_t rows = 0, pool = 0;
    for (int s = 0; s < n_seq; ++s) {
      rows += c.n[size_t(s)];
      pool += c.pos0[size_t(s)] + c.n[size_t(s)];
    }
    pool += 37;
    // Row maps: sequence 0 on pool rows 0.., the others on shuffled rows of the rest.
    std::vector<int32_t> free_rows;
    const int end0 = c.pos0[0] + c.n[0];
    for (int32_t r = end0; r < pool; ++r) free_rows.push_back(r);
    std::mt19937 rng{static_cast<uint32_t>(salt)};
    std::shuffle(free_rows.begin(), free_rows.end(), rng);
    std::vector<int32_t> maps;
    std::vector<int64_t> map_at(size_t(n_seq), -1);
    size_t used = 0;
    for (int s = 1; s < n_seq; ++s) {
      map_at[size_t(s)] = int64_t(maps.size());
      for (int p = 0; p < c.pos0[size_t(s)] + c.n[size_t(s)]; ++p) maps.push_back(free_rows[used++]);
    }
    auto map_t = be.alloc(DType::kI32, int64_t(std::max<size_t>(maps.size(), 1)), 1);
    ASSERT_TRUE(map_t.is_ok());
    if (!maps.empty()) be.upload_i32(*map_t, maps.data());
    const auto qv = random_floats(size_t(rows * qc), 1.0f, ++salt), kv = random_floats(size_t(rows * kvc), 1.0f, ++salt),
               vv = random_floats(size_t(rows * kvc), 1.0f, ++salt),
               cache = random_floats(size_t(pool * kvc), 1.0f, ++salt);
    struct Run {
      Tensor q, k, v, out, kc, vc, staging;
    };
    auto setup = [&](Run& r) {
      auto q = be.alloc(DType::kF32, qc, rows), k = be.alloc(DType::kF32, kvc, rows), v = be.alloc(DType::kF32, kvc, rows);
      auto out = be.alloc(DType::kF32, qc, rows), kc = be.alloc(DType::kF16, kvc, pool),
           vc = be.alloc(DType::kF16, kvc, pool), st = be.alloc(DType::kF32, kvc, pool);
      ASSERT_TRUE(q.is_ok() && k.is_ok() && v.is_ok() && out.is_ok() && kc.is_ok() && vc.is_ok() && st.is_ok());
      r = {*q, *k, *v, *out, *kc, *vc, *st};
      be.upload(r.q, qv.data());
      be.upload(r.k, kv.data());
      be.upload(r.v, vv.data());
      be.upload(r.staging, cache.data());  // every pool row holds keys of some position
      be.store_rows(r.staging, r.kc, 0);
      be.store_rows(r.staging, r.vc, 0);
    };
    auto seqs_of = [&](const Run& r) {
      std::vector<backend::SeqRows> seqs;
      int64_t row0 = 0;
      for (int s = 0; s < n_seq; ++s) {
        const int end = c.pos0[size_t(s)] + c.n[size_t(s)];
        Tensor kc{r.kc.data, r.kc.dtype, r.kc.cols, end, r.kc.stride};
        Tensor vc{r.vc.data, r.vc.dtype, r.vc.cols, end, r.vc.stride};
        if (map_at[size_t(s)] >= 0) {
          kc.row_map = vc.row_map = static_cast<const int32_t*>(map_t->data) + map_at[size_t(s)];
        }
        seqs.push_back({row0, c.n[size_t(s)], c.pos0[size_t(s)], kc, vc});
        row0 += c.n[size_t(s)];
      }
      return seqs;
    };
    backend::RopeParams rq;
    rq.mode = backend::RopeMode::kNeox;
    rq.n_head = c.n_head;
    rq.head_dim = c.head_dim;
    rq.n_rot = c.head_dim;
    rq.freq_base = 10000.0f;
    backend::RopeParams rk = rq;
    rk.n_head = c.n_head_kv;
    const backend::AttentionParams ap{c.n_head, c.n_head_kv, c.head_dim, 1.0f / std::sqrt(float(c.head_dim)), 0,
                                      c.window};
    Run a, b;
    setup(a);
    setup(b);
    const auto sa = seqs_of(a), sb = seqs_of(b);
    be.rope_store_kv_seqs(a.q, rq, a.k, rk, a.v, sa);
    be.attention_seqs(a.q, a.out, ap, sa);
    be.Backend::rope_store_kv_seqs(b.q, rq, b.k, rk, b.v, sb);  // one call per sequence
    be.Backend::attention_seqs(b.q, b.out, ap, sb);
    const std::string at = "case n_head " + std::to_string(c.n_head) + ", " + std::to_string(n_seq) + " sequences";
    auto f32_of = [&](const Tensor& t) {
      std::vector<float> h(size_t(t.rows * t.cols));
      be.download(t, h.data());
      return h;
    };
    auto u16_of = [&](const Tensor& t) {
      be.sync();
      std::vector<uint16_t> h(size_t(t.rows * t.cols));
      GPU_CHECK(cudaMemcpy(h.data(), t.data, h.size() * 2, cudaMemcpyDeviceToHost));
      return h;
    };
    EXPECT_EQ(f32_of(a.q), f32_of(b.q)) << at << ": q";
    EXPECT_EQ(f32_of(a.k), f32_of(b.k)) << at << ": k";
    EXPECT_EQ(u16_of(a.kc), u16_of(b.kc)) << at << ": K cache";
    EXPECT_EQ(u16_of(a.vc), u16_of(b.vc)) << at << ": V cache";
    const auto oa = f32_of(a.out), ob = f32_of(b.out);
    double worst = 0;
    for (size_t i = 0; i < oa.size(); ++i) worst = std::max(worst, double(std::fabs(oa[i] - ob[i])));
    EXPECT_LE(worst, 2e-5) << at << ": attention output";
    // The outputs are attention, not zeros or copies: they differ between sequences.
    EXPECT_NE(std::vector<float>(oa.begin(), oa.begin() + qc), std::vector<float>(oa.end() - qc, oa.end())) << at;
  }
}

}  // namespace
}  // namespace sluice::test::gpu
