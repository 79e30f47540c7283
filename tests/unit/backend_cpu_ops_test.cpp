// Every CPU backend op against a plain scalar reference on fresh random data. Tolerances are
// normalized errors (test_util.h) and say what they allow for.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "test_util.h"

namespace sluice::backend {
namespace {

using quant::Type;

struct Fixture {
  explicit Fixture(int threads, bool simd = true) : be(make_cpu_backend({threads, simd})) {}
  Tensor f32(int64_t cols, int64_t rows, const std::vector<float>& v) {
    auto t = be->alloc(DType::kF32, cols, rows);
    EXPECT_TRUE(t.is_ok());
    if (!v.empty()) be->upload(*t, v.data());
    return *t;
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<float> v(size_t(t.rows * t.cols));
    be->download(t, v.data());
    return v;
  }
  std::unique_ptr<Backend> be;
};

// A weight of `type` holding `w` quantized; `deq` receives the values the kernel really sees.
std::vector<uint8_t> quantize_matrix(Type type, const std::vector<float>& w, int64_t ne0, int64_t ne1,
                                     std::vector<float>* deq) {
  const auto& k = quant::kernels(type);
  const int64_t rb = quant::row_bytes(type, ne0);
  std::vector<uint8_t> q(size_t(rb * ne1));
  deq->resize(w.size());
  for (int64_t r = 0; r < ne1; ++r) {
    k.quantize_row(w.data() + r * ne0, q.data() + r * rb, ne0);
    k.dequantize_row(q.data() + r * rb, deq->data() + r * ne0, ne0);
  }
  return q;
}

// Reference y = x W^T in double, with x rounded through the activation format exactly as the
// backend does (quantize to vec_dot_type, dequantize): what remains is summation order only.
std::vector<float> ref_matmul(Type type, const std::vector<float>& wdeq, const std::vector<float>& x, int64_t k,
                              int64_t n_out, int64_t n_tok) {
  const Type at = quant::kernels(type).vec_dot_type;
  const auto& ak = quant::kernels(at);
  std::vector<float> xq(x.size());
  std::vector<uint8_t> buf(size_t(quant::row_bytes(at, k)));
  for (int64_t t = 0; t < n_tok; ++t) {
    ak.quantize_row(x.data() + t * k, buf.data(), k);
    ak.dequantize_row(buf.data(), xq.data() + t * k, k);
  }
  std::vector<float> y(size_t(n_tok * n_out));
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t o = 0; o < n_out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < k; ++i) s += double(wdeq[size_t(o * k + i)]) * double(xq[size_t(t * k + i)]);
      y[size_t(t * n_out + o)] = float(s);
    }
  return y;
}

class MatmulTest : public ::testing::TestWithParam<Type> {};

// Tolerance 1e-4: same quantized operands, only the kernels' f32 summation order differs (and
// per-block f16 scale products in the K-quant dots). Q4_1/Q5_1: 5e-3, because their Q8_1
// activation blocks carry d * sum(q) rounded to f16 (2^-11 relative), which the weight block's
// min multiplies and the sum over blocks partly cancels (measured up to 1.6e-3 over seeds).
TEST_P(MatmulTest, GemvAndGemmMatchReference) {
  const Type type = GetParam();
  const double tol = (type == Type::kQ4_1 || type == Type::kQ5_1) ? 5e-3 : 1e-4;
  // Unquantized f32 math differs by the weights' own quantization error on gaussian data.
  const double loose = type == Type::kQ2_K ? 0.4 : type == Type::kQ3_K ? 0.25 : 0.15;
  const int64_t k = 512, n_out = 200;
  std::vector<float> wdeq;
  const auto w = test::random_floats(size_t(k * n_out), 1.0f, 1);
  const auto wq = quantize_matrix(type, w, k, n_out, &wdeq);
  const WeightView wv{type, k, n_out, wq.data()};
  for (int threads : {1, 3}) {
    Fixture f(threads);
    for (int64_t n_tok : {1, 7, 70}) {
      const auto x = test::random_floats(size_t(k * n_tok), 1.0f, 2 + n_tok);
      const Tensor xt = f.f32(k, n_tok, x), yt = f.f32(n_out, n_tok, {});
      f.be->matmul(wv, xt, yt);
      const auto y = f.get(yt);
      const auto ref = ref_matmul(type, wdeq, x, k, n_out, n_tok);
      EXPECT_LT(test::normalized_error(y.data(), ref.data(), y.size()), tol)
          << quant::type_name(type) << " threads=" << threads << " n_tok=" << n_tok;
      // End to end against unquantized f32 math: what activation + weight quantization cost.
      // Loose, but catches a wrong pairing of formats (which gives errors ~1).
      std::vector<float> exact(y.size());
      for (int64_t t = 0; t < n_tok; ++t)
        for (int64_t o = 0; o < n_out; ++o) {
          double s = 0;
          for (int64_t i = 0; i < k; ++i) s += double(w[size_t(o * k + i)]) * x[size_t(t * k + i)];
          exact[size_t(t * n_out + o)] = float(s);
        }
      EXPECT_LT(test::normalized_error(y.data(), exact.data(), y.size()), loose) << quant::type_name(type);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MatmulTest,
                         ::testing::Values(Type::kF32, Type::kF16, Type::kBF16, Type::kQ4_0, Type::kQ4_1, Type::kQ5_0,
                                           Type::kQ5_1, Type::kQ8_0, Type::kQ2_K, Type::kQ3_K, Type::kQ4_K,
                                           Type::kQ5_K, Type::kQ6_K),
                         [](const auto& info) { return std::string(quant::type_name(info.param)); });

// A batch must give the rows of one-token calls: prefill == decode, up to the f32 summation order
// of the multi-column kernels (normalized error 1e-6; bit-identical where a format has none).
TEST(CpuOps, GemmRowsEqualGemv) {
  const int64_t k = 256, n_out = 96, n_tok = 40;
  std::vector<float> wdeq;
  const auto wq = quantize_matrix(Type::kQ4_K, test::random_floats(size_t(k * n_out), 1, 3), k, n_out, &wdeq);
  const WeightView wv{Type::kQ4_K, k, n_out, wq.data()};
  Fixture f(2);
  const auto x = test::random_floats(size_t(k * n_tok), 1, 4);
  const Tensor xt = f.f32(k, n_tok, x), yt = f.f32(n_out, n_tok, {});
  f.be->matmul(wv, xt, yt);
  const auto y = f.get(yt);
  for (int64_t t = 0; t < n_tok; ++t) {
    const Tensor yr = f.f32(n_out, 1, {});
    f.be->matmul(wv, xt.row_range(t, 1), yr);
    const auto one = f.get(yr);
    ASSERT_LT(test::normalized_error(one.data(), y.data() + t * n_out, size_t(n_out)), 1e-6) << "row " << t;
  }
}

// Row-invariant mode (Backend::set_row_invariant, speculative verification): every row of a batch
// is bit for bit the one-row call's, for every format, repacked (upload_weight) or as in the
// file, several weights in one job. Off, the multi-column kernels may differ (the test above).
TEST(CpuOps, RowInvariantBatchesEqualOneRowCalls) {
  const int64_t k = 512, n_out = 48, n_tok = 9;
  for (Type type : {Type::kF32, Type::kF16, Type::kBF16, Type::kQ4_0, Type::kQ4_1, Type::kQ5_0, Type::kQ5_1,
                    Type::kQ8_0, Type::kQ2_K, Type::kQ3_K, Type::kQ4_K, Type::kQ5_K, Type::kQ6_K}) {
    SCOPED_TRACE(quant::type_name(type));
    std::vector<float> deq;
    const auto wq = quantize_matrix(type, test::random_floats(size_t(k * n_out), 1, 50), k, n_out, &deq);
    const auto wq2 = quantize_matrix(type, test::random_floats(size_t(k * n_out), 1, 51), k, n_out, &deq);
    Fixture f(2);
    const WeightView file[] = {{type, k, n_out, wq.data()}, {type, k, n_out, wq2.data()}};
    auto up0 = f.be->upload_weight(file[0]), up1 = f.be->upload_weight(file[1]);
    ASSERT_TRUE(up0.is_ok() && up1.is_ok());
    const Tensor xt = f.f32(k, n_tok, test::random_floats(size_t(k * n_tok), 1, 52));
    for (const bool uploaded : {false, true}) {
      const WeightView ws[] = {uploaded ? *up0 : file[0], uploaded ? *up1 : file[1]};
      const Tensor ys[] = {f.f32(n_out, n_tok, {}), f.f32(n_out, n_tok, {})};
      ASSERT_TRUE(f.be->set_row_invariant(true)) << "the CPU backend has the mode";
      f.be->matmul_multi(ws, xt, ys);
      f.be->set_row_invariant(false);
      for (int i = 0; i < 2; ++i) {
        const auto batch = f.get(ys[i]);
        for (int64_t t = 0; t < n_tok; ++t) {
          const Tensor yr = f.f32(n_out, 1, {});
          f.be->matmul(ws[i], xt.row_range(t, 1), yr);
          const auto one = f.get(yr);
          EXPECT_EQ(0, std::memcmp(one.data(), batch.data() + t * n_out, size_t(n_out) * 4))
              << "weight " << i << (uploaded ? " (uploaded)" : " (file layout)") << " row " << t;
        }
      }
    }
  }
}

// Several weights over one input in one job (Q/K/V, gate/up), with different activation
// formats (Q8_K, Q8_0, F32): bit-identical to separate matmul calls.
TEST(CpuOps, MatmulMultiEqualsSeparateCalls) {
  const int64_t k = 256;
  const Type types[] = {Type::kQ4_K, Type::kQ8_0, Type::kF32};
  const int64_t outs[] = {96, 40, 24};
  std::vector<std::vector<uint8_t>> wq;
  std::vector<WeightView> ws;
  for (int i = 0; i < 3; ++i) {
    std::vector<float> deq;
    wq.push_back(quantize_matrix(types[i], test::random_floats(size_t(k * outs[i]), 1, 20 + i), k, outs[i], &deq));
  }
  for (int i = 0; i < 3; ++i) ws.push_back({types[i], k, outs[i], wq[size_t(i)].data()});
  for (int64_t n_tok : {1, 9}) {
    Fixture f(3);
    const Tensor xt = f.f32(k, n_tok, test::random_floats(size_t(k * n_tok), 1, 30));
    std::vector<Tensor> multi, single;
    for (int i = 0; i < 3; ++i) {
      multi.push_back(f.f32(outs[i], n_tok, {}));
      single.push_back(f.f32(outs[i], n_tok, {}));
      f.be->matmul(ws[size_t(i)], xt, single.back());
    }
    f.be->matmul_multi(ws, xt, multi);
    for (int i = 0; i < 3; ++i) {
      const auto a = f.get(multi[size_t(i)]), b = f.get(single[size_t(i)]);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "part " << i << " n_tok " << n_tok;
    }
  }
}

// Weights each with its own input in one job (a decode step's experts): bit-identical to
// separate matmul calls, with inputs of different row counts (decode rows and prefill batches),
// one input shared by two weights, repacked and file-layout weights, more weights than one job
// holds (the backend splits them), and in row-invariant mode.
TEST(CpuOps, MatmulEachEqualsSeparateCalls) {
  const int64_t k = 512;
  const Type types[] = {Type::kQ4_K, Type::kQ6_K, Type::kQ8_0, Type::kF16, Type::kQ5_K};
  constexpr int kParts = 41;
  Fixture f(3);
  std::vector<std::vector<uint8_t>> wq;
  std::vector<WeightView> ws;
  std::vector<Tensor> xs, each, single;
  int n_packed = 0;
  for (int i = 0; i < kParts; ++i) {
    const Type type = types[i % 5];
    const int64_t n_out = 16 * (1 + i % 4), n_tok = (i % 7 == 3) ? 9 : (i % 5 == 4 ? 3 : 1);
    std::vector<float> deq;
    wq.push_back(quantize_matrix(type, test::random_floats(size_t(k * n_out), 1, 60 + i), k, n_out, &deq));
    const WeightView file{type, k, n_out, wq.back().data()};
    WeightView w = file;
    if (i % 2 == 0) {  // every other weight repacked where its format has a packed layout
      auto up = f.be->upload_weight(file);
      ASSERT_TRUE(up.is_ok());
      w = *up;
      n_packed += w.packed ? 1 : 0;
    }
    ws.push_back(w);
    if (i == 10) {
      xs.push_back(xs.back());  // an input shared with the previous weight (same rows)
    } else {
      xs.push_back(f.f32(k, n_tok, test::random_floats(size_t(k * n_tok), 1, 200 + i)));
    }
    each.push_back(f.f32(n_out, xs.back().rows, {}));
    single.push_back(f.f32(n_out, xs.back().rows, {}));
  }
  for (const bool invariant : {false, true}) {
    SCOPED_TRACE(invariant ? "row-invariant" : "default");
    f.be->set_row_invariant(invariant);
    for (int i = 0; i < kParts; ++i) f.be->matmul(ws[size_t(i)], xs[size_t(i)], single[size_t(i)]);
    f.be->matmul_each(ws, xs, each);
    for (int i = 0; i < kParts; ++i) {
      const auto a = f.get(each[size_t(i)]), b = f.get(single[size_t(i)]);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
          << "part " << i << " " << quant::type_name(ws[size_t(i)].type) << " rows " << xs[size_t(i)].rows;
    }
  }
  f.be->set_row_invariant(false);
  // The reference kernel table packs Q4_K, Q6_K and Q8_0 (the isa_ref. run of this test): the
  // packed path must have run there.
  if (const char* isa = std::getenv("SLUICE_QUANT_ISA"); isa != nullptr && std::string(isa) == "ref") {
    EXPECT_GT(n_packed, 0);
  }
}

TEST(CpuOps, RmsNormWholeRowAndPerHead) {
  Fixture f(2);
  const int64_t cols = 384, rows = 5;
  for (int64_t group : {cols, int64_t(64)}) {
    const auto x = test::random_floats(size_t(cols * rows), 3.0f, 5);
    const auto w = test::random_floats(size_t(group), 1.0f, 6);
    const Tensor xt = f.f32(cols, rows, x), yt = f.f32(cols, rows, {});
    f.be->rms_norm(xt, {Type::kF32, group, 1, w.data()}, 1e-5f, yt);
    const auto y = f.get(yt);
    std::vector<float> ref(y.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < cols; g += group) {
        double ss = 0;
        for (int64_t i = 0; i < group; ++i) ss += double(x[size_t(r * cols + g + i)]) * x[size_t(r * cols + g + i)];
        const double s = 1.0 / std::sqrt(ss / double(group) + 1e-5);
        for (int64_t i = 0; i < group; ++i)
          ref[size_t(r * cols + g + i)] = float(x[size_t(r * cols + g + i)] * s * w[size_t(i)]);
      }
    EXPECT_LT(test::normalized_error(y.data(), ref.data(), y.size()), 1e-6) << "group " << group;  // f32 rounding
    f.be->rms_norm(xt, {Type::kF32, group, 1, w.data()}, 1e-5f, xt);  // in place
    const auto y2 = f.get(xt);
    EXPECT_EQ(0, std::memcmp(y2.data(), y.data(), y.size() * 4));
  }
}

TEST(CpuOps, Elementwise) {
  Fixture f(2);
  const int64_t cols = 3000, rows = 7;  // large enough to take the threaded path
  const auto a = test::random_floats(size_t(cols * rows), 2, 7), b = test::random_floats(size_t(cols * rows), 2, 8);
  const auto bias = test::random_floats(size_t(cols), 1, 9);
  const Tensor at = f.f32(cols, rows, a), bt = f.f32(cols, rows, b), dt = f.f32(cols, rows, {});
  f.be->swiglu(at, bt, dt);
  auto d = f.get(dt);
  std::vector<float> ref(d.size());
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = float(a[i] / (1.0 + std::exp(-double(a[i]))) * b[i]);
  EXPECT_LT(test::normalized_error(d.data(), ref.data(), d.size()), 1e-6);
  f.be->add(dt, at);
  d = f.get(dt);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += a[i];
  EXPECT_LT(test::normalized_error(d.data(), ref.data(), d.size()), 1e-6);
  f.be->add_bias(dt, {Type::kF32, cols, 1, bias.data()});
  d = f.get(dt);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += bias[i % size_t(cols)];
  EXPECT_LT(test::normalized_error(d.data(), ref.data(), d.size()), 1e-6);
}

// GeGLU against backend::gelu_tanh's formula in double (1e-6: f32 rounding of the same formula, and
// libm's tanhf or the AVX2 path's exponential, ~2 ulp), on both the SIMD and the portable path,
// gate values reaching tanh's saturated ends (and beyond the AVX2 path's clamp, |x| > 40), odd
// widths (the scalar tail); then the two paths against each other elementwise; and scale, exact.
TEST(CpuOps, GegluSimdAndPortableMatchReference) {
  const int64_t cols = 2051, rows = 5;
  auto a = test::random_floats(size_t(cols * rows), 6, 27);
  const auto b = test::random_floats(size_t(cols * rows), 2, 28);
  a[0] = 60.0f, a[1] = -60.0f, a[2] = 0.0f, a[3] = 1e-20f, a[4] = -9.5f, a[5] = 9.5f;
  std::vector<float> ref(a.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = a[i];
    ref[i] = float(0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x))) * b[i]);
  }
  std::vector<float> outs[2];
  for (bool simd : {true, false}) {
    SCOPED_TRACE(simd ? "simd" : "portable");
    Fixture f(2, simd);
    const Tensor at = f.f32(cols, rows, a), bt = f.f32(cols, rows, b), dt = f.f32(cols, rows, {});
    f.be->geglu(at, bt, dt);
    outs[simd] = f.get(dt);
    EXPECT_LT(test::normalized_error(outs[simd].data(), ref.data(), ref.size()), 1e-6);
    EXPECT_EQ(outs[simd][0], ref[0]);  // saturated: g * u
    EXPECT_LT(std::fabs(outs[simd][1]), 1e-30f);  // -60 / (1 + e^88) on the AVX2 path, 0 on the other
    EXPECT_EQ(outs[simd][2], 0.0f);
  }
  // Elementwise: relative 4e-6, plus the portable path's own absolute error where gelu's tail
  // cancels (1 + tanhf(y) for y << 0: about one f32 ulp of 1, times |g u| / 2).
  for (size_t i = 0; i < ref.size(); ++i) {
    const float tol = 4e-6f * std::fabs(outs[0][i]) + 2e-7f * std::fabs(a[i] * b[i]);
    ASSERT_NEAR(outs[1][i], outs[0][i], tol) << "element " << i << " x " << a[i];
  }
}

TEST(CpuOps, GegluAndScale) {
  Fixture f(2);
  const int64_t cols = 2048, rows = 7;
  const auto a = test::random_floats(size_t(cols * rows), 6, 17), b = test::random_floats(size_t(cols * rows), 2, 18);
  const Tensor at = f.f32(cols, rows, a), bt = f.f32(cols, rows, b), dt = f.f32(cols, rows, {});
  f.be->geglu(at, bt, dt);
  auto d = f.get(dt);
  std::vector<float> ref(d.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = a[i];
    ref[i] = float(0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x))) * b[i]);
  }
  EXPECT_LT(test::normalized_error(d.data(), ref.data(), d.size()), 1e-6);
  // In place (dst aliasing gate), as the layer loop calls it.
  f.be->geglu(at, bt, at);
  EXPECT_EQ(0, std::memcmp(f.get(at).data(), d.data(), d.size() * 4));
  f.be->scale(dt, 25.298221f);
  const auto s = f.get(dt);
  for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(s[i], d[i] * 25.298221f) << i;
}

// Mixture-of-experts row traffic: gather copies rows exactly; scatter_add adds scale * row into the
// chosen destination rows only (1e-6: one product and one sum per element, possibly fused).
TEST(CpuOps, GatherAndScatterAddRows) {
  Fixture f(2);
  const int64_t cols = 3000, n = 9;  // wide enough for the threaded path
  const auto a = test::random_floats(size_t(cols * n), 1, 31), b = test::random_floats(size_t(cols * n), 1, 32);
  const std::vector<int32_t> rows = {8, 2, 5, 0};
  const std::vector<float> scale = {0.5f, -1.25f, 2.0f, 0.125f};
  const Tensor src = f.f32(cols, n, a), dst = f.f32(cols, n, b), g = f.f32(cols, int64_t(rows.size()), {});
  f.be->gather_rows(src, rows, g);
  const auto got = f.get(g);
  for (size_t i = 0; i < rows.size(); ++i)
    ASSERT_EQ(0, std::memcmp(got.data() + i * cols, a.data() + rows[i] * cols, size_t(cols) * 4)) << i;
  f.be->scatter_add_rows(dst, g, rows, scale);
  const auto d = f.get(dst);
  std::vector<float> ref = b;
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < cols; ++c) ref[size_t(rows[i] * cols + c)] += scale[i] * a[size_t(rows[i] * cols + c)];
  EXPECT_LT(test::normalized_error(d.data(), ref.data(), d.size()), 1e-6);
  for (int64_t r : {1, 3, 4, 6, 7})  // rows no expert wrote stay bit-identical
    EXPECT_EQ(0, std::memcmp(d.data() + r * cols, b.data() + r * cols, size_t(cols) * 4)) << r;
}

TEST(CpuOps, GetRowsDequantizes) {
  Fixture f(2);
  const int64_t k = 256, n = 50;
  std::vector<float> deq;
  const auto q = quantize_matrix(Type::kQ8_0, test::random_floats(size_t(k * n), 1, 10), k, n, &deq);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  const Tensor dt = f.f32(k, int64_t(ids.size()), {});
  f.be->get_rows({Type::kQ8_0, k, n, q.data()}, ids, dt);
  const auto d = f.get(dt);
  for (size_t t = 0; t < ids.size(); ++t)
    ASSERT_EQ(0, std::memcmp(d.data() + t * k, deq.data() + ids[t] * k, size_t(k) * 4));
}

// Reference RoPE with angles from pow() in double: the backend's f32 recurrence must agree to
// 1e-4 (angle error grows with position; positions here reach ~200).
TEST(CpuOps, RopeNormalNeoxFactorsScale) {
  Fixture f(2);
  const int n_head = 4, hd = 64, rows = 6, pos0 = 190;
  for (RopeMode mode : {RopeMode::kNormal, RopeMode::kNeox}) {
    for (int n_rot : {64, 32}) {
      for (bool factors : {false, true}) {
        const auto x = test::random_floats(size_t(n_head * hd * rows), 1, 11);
        std::vector<float> ff(size_t(n_rot / 2));
        for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + float(i % 5);
        RopeParams p{mode, n_head, hd, n_rot, 10000.0f, 0.5f, {}};
        if (factors) p.freq_factors = {Type::kF32, n_rot / 2, 1, ff.data()};
        const Tensor xt = f.f32(n_head * hd, rows, x);
        f.be->rope(xt, p, pos0);
        const auto y = f.get(xt);
        std::vector<float> ref = x;
        for (int t = 0; t < rows; ++t)
          for (int h = 0; h < n_head; ++h)
            for (int i = 0; i < n_rot / 2; ++i) {
              double th = double(pos0 + t) * std::pow(10000.0, -2.0 * i / n_rot) * 0.5;
              if (factors) th /= ff[size_t(i)];
              const int i0 = mode == RopeMode::kNormal ? 2 * i : i;
              const int i1 = mode == RopeMode::kNormal ? 2 * i + 1 : i + n_rot / 2;
              const size_t base = size_t((t * n_head + h) * hd);
              const double a = x[base + i0], b = x[base + i1];
              ref[base + i0] = float(a * std::cos(th) - b * std::sin(th));
              ref[base + i1] = float(a * std::sin(th) + b * std::cos(th));
            }
        EXPECT_LT(test::normalized_error(y.data(), ref.data(), y.size()), 1e-4)
            << "mode " << int(mode) << " n_rot " << n_rot << " factors " << factors;
      }
    }
  }
}

// Attention against a double-precision softmax over the same f16 cache contents. Tolerance 3e-3:
// the backend rounds q and the probabilities to f16 (as llama.cpp does), ~5e-4 relative each.
TEST(CpuOps, AttentionCausalGqa) {
  // Both the SIMD paths (head dim multiple of 16 or 8) and the portable one (simd off, or hd = 12);
  // several query rows (the batched orders of the AVX-512 path) and one (its decode order, with
  // hd = 80 leaving a 16-element remainder after the 64-element steps).
  // window > 0: a sliding window (Gemma 3's local layers), query t sees (pos0 + t - window, pos0 + t];
  // 5 < rows, so rows start their windows at different positions.
  struct Case {
    bool simd;
    int hd, rows;
    int window = 0;
  };
  for (auto [simd, hd, rows, window] :
       {Case{true, 64, 9}, Case{false, 64, 9}, Case{true, 12, 9}, Case{true, 64, 1}, Case{true, 80, 1},
        Case{true, 80, 9}, Case{true, 24, 1}, Case{true, 64, 9, 5}, Case{false, 64, 9, 5}, Case{true, 64, 1, 20},
        Case{true, 12, 9, 40}}) {
  SCOPED_TRACE(testing::Message() << "simd " << simd << " hd " << hd << " rows " << rows << " window " << window);
  Fixture f(3, simd);
  const int n_head = 8, n_kv = 2, pos0 = 37, n_ctx = 64;
  const float scale = 1.0f / std::sqrt(float(hd));
  const auto kv_k = test::random_floats(size_t(n_ctx * n_kv * hd), 1, 12);
  const auto kv_v = test::random_floats(size_t(n_ctx * n_kv * hd), 1, 13);
  const auto q = test::random_floats(size_t(rows * n_head * hd), 1, 14);
  auto kc = f.be->alloc(DType::kF16, n_kv * hd, n_ctx), vc = f.be->alloc(DType::kF16, n_kv * hd, n_ctx);
  ASSERT_TRUE(kc.is_ok() && vc.is_ok());
  const Tensor ks = f.f32(n_kv * hd, n_ctx, kv_k), vs = f.f32(n_kv * hd, n_ctx, kv_v);
  f.be->store_rows(ks, *kc, 0);
  f.be->store_rows(vs, *vc, 0);
  const auto k16 = f.get(*kc), v16 = f.get(*vc);  // the f16-rounded cache
  for (size_t i = 0; i < k16.size(); ++i) ASSERT_EQ(k16[i], quant::fp16_to_fp32(quant::fp32_to_fp16(kv_k[i])));
  const Tensor qt = f.f32(n_head * hd, rows, q), ot = f.f32(n_head * hd, rows, {});
  f.be->attention(qt, *kc, *vc, ot, {n_head, n_kv, hd, scale, pos0, window});
  const auto o = f.get(ot);
  std::vector<float> ref(o.size());
  for (int t = 0; t < rows; ++t)
    for (int h = 0; h < n_head; ++h) {
      const int g = h / (n_head / n_kv);
      const int n = pos0 + t + 1;
      const int j0 = window > 0 ? std::max(0, n - window) : 0;
      std::vector<double> s(static_cast<size_t>(n), 0.0);
      double mx = -1e300, sum = 0;
      for (int j = j0; j < n; ++j) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += double(q[size_t((t * n_head + h) * hd + i)]) * k16[size_t((j * n_kv + g) * hd + i)];
        s[size_t(j)] = d * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      for (int j = j0; j < n; ++j) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
      for (int i = 0; i < hd; ++i) {
        double acc = 0;
        for (int j = j0; j < n; ++j) acc += s[size_t(j)] / sum * v16[size_t((j * n_kv + g) * hd + i)];
        ref[size_t((t * n_head + h) * hd + i)] = float(acc);
      }
    }
  EXPECT_LT(test::normalized_error(o.data(), ref.data(), o.size()), 3e-3);
  }
}

// Row-invariant mode: each query row of a batched attention call has the bits of a one-row call
// at its position (both AVX-512 orders differ otherwise; hd 256 is Gemma 3's, 80 leaves a
// remainder after the 64-element steps), with and without a sliding window.
TEST(CpuOps, AttentionRowInvariantEqualsOneRowCalls) {
  for (auto [hd, window] : {std::pair{64, 0}, std::pair{80, 0}, std::pair{256, 0}, std::pair{256, 6}}) {
    SCOPED_TRACE(testing::Message() << "hd " << hd << " window " << window);
    Fixture f(2);
    // More than 64 keys (the V side's lane split differs) and values spread over many binades
    // (so the two orders round differently).
    const int n_head = 4, n_kv = 2, rows = 7, pos0 = 90, n_ctx = pos0 + rows;
    auto spread = [](std::vector<float> v) {
      for (size_t i = 0; i < v.size(); ++i) v[i] *= float(1 << (i * 7 % 13));
      return v;
    };
    const float scale = 1.0f / std::sqrt(float(hd));
    auto kc = f.be->alloc(DType::kF16, n_kv * hd, n_ctx), vc = f.be->alloc(DType::kF16, n_kv * hd, n_ctx);
    ASSERT_TRUE(kc.is_ok() && vc.is_ok());
    f.be->store_rows(f.f32(n_kv * hd, n_ctx, spread(test::random_floats(size_t(n_ctx * n_kv * hd), 1, 60))), *kc, 0);
    f.be->store_rows(f.f32(n_kv * hd, n_ctx, spread(test::random_floats(size_t(n_ctx * n_kv * hd), 1, 61))), *vc, 0);
    const Tensor qt = f.f32(n_head * hd, rows, test::random_floats(size_t(rows * n_head * hd), 0.01f, 62));
    const Tensor ot = f.f32(n_head * hd, rows, {});
    f.be->set_row_invariant(true);
    f.be->attention(qt, *kc, *vc, ot, {n_head, n_kv, hd, scale, pos0, window});
    f.be->set_row_invariant(false);
    const auto batch = f.get(ot);
    for (int t = 0; t < rows; ++t) {
      const Tensor o1 = f.f32(n_head * hd, 1, {});
      f.be->attention(qt.row_range(t, 1), *kc, *vc, o1, {n_head, n_kv, hd, scale, pos0 + t, window});
      const auto one = f.get(o1);
      EXPECT_EQ(0, std::memcmp(one.data(), batch.data() + size_t(t) * n_head * hd, one.size() * 4)) << "row " << t;
    }
  }
}

}  // namespace
}  // namespace sluice::backend
