// Parity of the CUDA GEMV kernels (backend/cuda/gemv.h) with quant/'s scalar reference, for every
// weight format on small, odd and Llama-3-8B layer shapes, 1..8 tokens.
//
// Two comparisons per case, both as normalized error ||y - y_ref|| / ||y_ref||:
//   exact   y_ref = (reference-dequantized W) . (the activation the kernel actually multiplied):
//           for Q formats the GPU's q8 activation, downloaded and expanded; for F32/F16/BF16 the
//           f32 x. What is left is f32 accumulation order: tolerance 2e-5.
//   e2e     y_ref = (reference-dequantized W) . (f32 x): adds the q8 activation rounding
//           (~0.4% per element, about 5e-3 normalized in theory): tolerance 2e-2 for Q formats
//           where there are at least 64 outputs. Below 64 outputs a normalized error is one or a
//           few random draws relative to a sum that may nearly cancel (a 1-output case measured
//           1.8), so there only the exact comparison is made, with tolerance 1e-4.
// The q8 activation itself must equal the CPU path's round-to-nearest-even quantizer bit for bit.
// Outputs are poisoned with NaN before each run; a NaN anywhere fails.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/gemv.h"
#include "backend/cuda/layout.h"
#include "gpu/gpu_util.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/ref.h"

namespace sluice::test::gpu {
namespace {

namespace cu = sluice::backend::cuda;

constexpr double kExactTol = 2e-5;
constexpr double kExactTolFew = 1e-4;  // fewer than 64 outputs
constexpr double kE2eTolQ8 = 2e-2;

struct Case {
  int64_t rows;
  int64_t cols;
  int tokens;
  int variant = -1;      // GemvArgs::variant (launch shape; -1 = by shape)
  bool grouped = false;  // Q6_K / Q8_0 rewritten into the grouped layout (backend/cuda/layout.h) on the device
};

struct Outcome {
  double exact_err = 0;
  double e2e_err = 0;
  bool all_finite = true;
};

// Runs one gemv on fresh data. `corrupt` flips weight bits on the device after the reference was
// computed (the negative control: the comparison must then fail).
Outcome run_case(const FormatRef& f, const Case& c, uint64_t salt, bool corrupt = false) {
  Result<cu::DeviceInfo> dev = cu::query_device(0);
  SLUICE_CHECK(dev.is_ok(), dev.status().message());
  const QuantMatrix m = make_matrix(f, c.rows, c.cols, salt);
  const std::vector<float> x = random_floats(size_t(c.cols * c.tokens), 1.0f, salt + 1000);

  DeviceBuffer w(m.bytes.size()), dx(x.size() * 4), dy(size_t(c.rows * c.tokens) * 4);
  DeviceBuffer dq(size_t(cu::q8_activation_bytes(c.cols, c.tokens)));
  w.upload(m.bytes.data(), m.bytes.size());
  dx.upload(x.data(), x.size() * 4);
  dy.poison();
  dq.poison();
  if (c.grouped) {
    const Status gs = cu::group_weight_blocks(f.type, w.get(), c.rows, c.cols, nullptr);
    SLUICE_CHECK(gs.is_ok(), gs.message());
  }
  if (corrupt) GPU_CHECK(cudaMemset(w.get(), 0x5A, m.bytes.size() / 2));

  cu::GemvArgs g;
  g.type = f.type;
  g.w = w.get();
  g.rows = c.rows;
  g.cols = c.cols;
  g.tokens = c.tokens;
  g.variant = c.variant;
  g.grouped = c.grouped;
  g.x = dx.get<float>();
  g.y = dy.get<float>();
  const bool q8 = cu::gemv_needs_q8(f.type);
  std::vector<float> x_used = x;
  if (q8) {
    g.xq = cu::q8_activation_view(dq.get(), c.cols, c.tokens);
    const Status qs = cu::quantize_activation_q8(dx.get<float>(), g.xq, nullptr);
    SLUICE_CHECK(qs.is_ok(), qs.message());
  }
  const Status st = cu::gemv(*dev, g, nullptr);
  SLUICE_CHECK(st.is_ok(), st.message());
  GPU_CHECK(cudaDeviceSynchronize());

  if (q8) {
    // The activation the kernel multiplied, expanded exactly: q * d (f32 d).
    const int64_t nq = c.cols * c.tokens, nb = nq / 32;
    std::vector<int8_t> q(static_cast<size_t>(nq));
    std::vector<float2> ds(static_cast<size_t>(nb));
    GPU_CHECK(cudaMemcpy(q.data(), g.xq.q, size_t(nq), cudaMemcpyDeviceToHost));
    GPU_CHECK(cudaMemcpy(ds.data(), g.xq.ds, size_t(nb) * sizeof(float2), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < nq; ++i) x_used[size_t(i)] = float(q[size_t(i)]) * ds[size_t(i / 32)].x;
  }
  std::vector<float> y(size_t(c.rows * c.tokens));
  dy.download(y.data(), y.size() * 4);

  Outcome o;
  for (float v : y) o.all_finite = o.all_finite && std::isfinite(v);
  o.exact_err = normalized_error_d(y, ref_gemv(m.values, x_used, c.rows, c.cols, c.tokens));
  o.e2e_err = q8 ? normalized_error_d(y, ref_gemv(m.values, x, c.rows, c.cols, c.tokens)) : o.exact_err;
  return o;
}

struct Param {
  FormatRef fmt;
  std::string shape_name;
  Case c;
};

class GemvParity : public ::testing::TestWithParam<Param> {};

TEST_P(GemvParity, MatchesScalarReference) {
  SLUICE_SKIP_WITHOUT_GPU();
  const Param& p = GetParam();
  const Outcome o = run_case(p.fmt, p.c, std::hash<std::string>{}(p.shape_name) ^ uint64_t(p.fmt.type));
  const bool q8 = cu::gemv_needs_q8(p.fmt.type);
  EXPECT_TRUE(o.all_finite) << "unwritten (NaN-poisoned) or non-finite outputs";
  const bool few = p.c.rows * p.c.tokens < 64;
  EXPECT_LE(o.exact_err, few ? kExactTolFew : kExactTol) << "seed " << test_seed();
  if (!few) {
    EXPECT_LE(o.e2e_err, q8 ? kE2eTolQ8 : kExactTol) << "seed " << test_seed();
  }
  // One greppable line per case for the report (scripts/gpu-check.sh collects them).
  std::printf("PARITY %-5s %-12s rows=%-6lld cols=%-6lld tokens=%d exact=%.3e e2e=%.3e\n", p.fmt.name,
              p.shape_name.c_str(), (long long)p.c.rows, (long long)p.c.cols, p.c.tokens, o.exact_err, o.e2e_err);
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const FormatRef& f : weight_formats()) {
    const bool k = f.block_elems == 256;
    // Small and odd shapes; "unaligned" rows have a byte length that is not a multiple of 16 for
    // the formats with 2-byte aligned blocks (the 4-byte word copies), aligned for the others:
    // only 2-byte aligned for Q4_0, Q5_0, Q8_0 (288 columns) and Q3_K, Q6_K (768), so every other
    // row's chunks start 2 bytes into a word. "unaligned4" rows are 4- or 8- but not 16-byte
    // aligned for Q4_0, Q4_1, Q5_0, Q8_0 (576 and 4672 columns), Q2_K, Q3_K, Q6_K (512, 1536,
    // 2560); "unaligned2" rows 2-byte aligned over several chunks a row (Q4_0, Q5_0, Q8_0 at 4704
    // columns, Q3_K, Q6_K at 3840), the last chunk of the last row ending on half a word: several
    // tokens, both launch shapes.
    const std::vector<std::pair<std::string, Case>> shapes = {
        {"tiny", {1, 256, 1}},
        {"small", {64, 256, 1}},
        {"odd_rows", {7, 512, 1}},
        {"odd_rows2", {1001, 1024, 1}},
        {"unaligned", {33, k ? 768 : 288, 1}},
        {"unaligned_b3", {17, k ? 768 : 288, 3}},
        {"unaligned4", {33, k ? 512 : 576, 1}},
        {"unaligned4_b3", {65, k ? 1536 : 576, 3}},
        {"unaligned4_long_b2", {77, k ? 2560 : 4672, 2}},
        {"unaligned4_v1_b8", {300, k ? 2560 : 4672, 8, 1}},
        {"unaligned4_v0_b1", {1001, k ? 1536 : 576, 1, 0}},
        {"unaligned2_long", {77, k ? 3840 : 4704, 1}},
        {"unaligned2_long_b2", {33, k ? 3840 : 4704, 2}},
        {"unaligned2_v1_b8", {301, k ? 3840 : 4704, 8, 1}},
        {"unaligned2_v0_b5", {129, k ? 2304 : 1120, 5, 0}},
        {"batch2", {257, 1024, 2}},
        {"batch5", {129, 2048, 5}},
        {"batch8", {300, 4096, 8}},
        {"4096x4096", {4096, 4096, 1}},
        {"14336x4096", {14336, 4096, 1}},
        {"4096x14336", {4096, 14336, 1}},
        {"4096x4096_b4", {4096, 4096, 4}},
        // The direct kernel's instantiations (Q4_K/Q5_K at 1..2 tokens): ring depth by row length
        // (>= 12288 columns: long), rows of whole 2048-column steps or not, one or two tokens.
        {"4096_b2", {300, 4096, 2}},
        {"long_b2", {300, 14336, 2}},
        {"long_part", {77, 12544, 1}},
        {"long_part_b2", {77, 12544, 2}},
        // Q4_K rows of whole steps take DirectQ4_KC's coalesced lane map by default (4096_b2,
        // 14336x4096, ...); variant 3 keeps DirectQ45_K's one piece per lane there.
        {"piece_lanes_4096", {1001, 4096, 1, 3}},
        {"piece_lanes_long_b2", {300, 14336, 2, 3}},
        // The second launch shape (4 warps, 4 KB stages).
        {"v1_odd_rows2", {1001, 1024, 1, 1}},
        {"v1_batch5", {129, 2048, 5, 1}},
        {"v1_4096x14336", {4096, 14336, 1, 1}},
        {"v1_14336x4096", {14336, 4096, 1, 1}},
        {"v0_14336x4096", {14336, 4096, 1, 0}},
    };
    for (const auto& [name, c] : shapes) out.push_back({f, name, c});
    if (f.type != quant::Type::kQ6_K && f.type != quant::Type::kQ8_0) continue;
    // The grouped layout: the direct kernel (1..2 tokens; the coalesced lane maps FmtQ6_KGC /
    // FmtQ8_0GC on rows of whole 2048-column steps, their ring depths by row length; variant 3: the
    // one-piece-per-lane maps there too), the staged shapes (variants 0 and 1, 3+ tokens) reading
    // whole groups from shared memory. Q8_0 rows may end inside a 2048-column row step (its groups
    // are 256 columns).
    std::vector<std::pair<std::string, Case>> grouped = {
        {"grouped_small", {7, 2048, 1, -1, true}},
        {"grouped_4096", {1001, 4096, 1, -1, true}},
        {"grouped_4096_b2", {300, 4096, 2, -1, true}},
        {"grouped_14336x4096", {14336, 4096, 1, -1, true}},
        {"grouped_4096x14336", {4096, 14336, 1, -1, true}},
        {"grouped_long_b2", {300, 14336, 2, -1, true}},
        {"grouped_v0", {1001, 4096, 1, 0, true}},
        {"grouped_v1_b2", {300, 14336, 2, 1, true}},
        {"grouped_b3", {129, 2048, 3, -1, true}},
        {"grouped_b8", {300, 4096, 8, -1, true}},
        {"grouped_piece_lanes_4096", {1001, 4096, 1, 3, true}},
        {"grouped_piece_lanes_long_b2", {300, 14336, 2, 3, true}},
    };
    if (f.type == quant::Type::kQ8_0) {
      grouped.push_back({"grouped_part", {77, 1280, 1, -1, true}});
      grouped.push_back({"grouped_long_part_b2", {77, 12544, 2, -1, true}});
      grouped.push_back({"grouped_one_group", {33, 256, 1, -1, true}});
    }
    for (const auto& [name, c] : grouped) out.push_back({f, name, c});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, GemvParity, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           return std::string(i.param.fmt.name) + "_" + i.param.shape_name;
                         });

// Several matrices in one launch (gemv_group): Q/K/V-like row counts that do not divide evenly,
// each matrix with its own activation, every launch shape. Each output is compared with its own
// reference (exact: the q8 activation the kernel multiplied), so a row sent to the wrong matrix,
// activation or output fails.
TEST(GemvGroup, MatchesScalarReferencePerMatrix) {
  SLUICE_SKIP_WITHOUT_GPU();
  Result<cu::DeviceInfo> dev = cu::query_device(0);
  ASSERT_TRUE(dev.is_ok());
  const int64_t rows[] = {1001, 64, 257, 3};
  constexpr int kN = 4;
  std::vector<std::pair<FormatRef, bool>> fmts;  // (format, grouped layout)
  for (const FormatRef& f : weight_formats()) {
    if (f.type == quant::Type::kQ4_K || f.type == quant::Type::kQ6_K || f.type == quant::Type::kQ8_0 ||
        f.type == quant::Type::kF16 || f.type == quant::Type::kQ5_0 || f.type == quant::Type::kQ4_1) {
      fmts.emplace_back(f, false);
    }
    if (f.type == quant::Type::kQ6_K || f.type == quant::Type::kQ8_0) fmts.emplace_back(f, true);
  }
  for (const auto& [f, grouped] : fmts) {
    // Ungrouped, also rows 4- but not 16-byte aligned (Q6_K 1536, Q8_0/Q5_0/Q4_1 576 columns) and
    // only 2-byte aligned (Q6_K 3840, Q8_0/Q5_0 4704).
    std::vector<int64_t> col_list = {grouped && f.type == quant::Type::kQ6_K ? 2048 : 1024};
    if (!grouped) col_list.push_back(f.block_elems == 256 ? 1536 : 576);
    if (!grouped) col_list.push_back(f.block_elems == 256 ? 3840 : 4704);
    std::vector<std::pair<int64_t, int>> runs;  // (cols, tokens)
    for (const int64_t cols : col_list) {
      for (int tokens : {1, 2, 3}) runs.emplace_back(cols, tokens);
    }
    for (const auto& [cols, tokens] : runs) {
      for (int variant = -1; variant < cu::kGemvVariants; ++variant) {
        std::vector<QuantMatrix> ms;
        std::vector<std::vector<float>> xs, x_used(kN);
        std::vector<DeviceBuffer> w, dx, dy, dq;
        cu::GemvGroupArgs g;
        g.type = f.type;
        g.grouped = grouped;
        g.cols = cols;
        g.tokens = tokens;
        g.variant = variant;
        const bool q8 = cu::gemv_needs_q8(f.type);
        for (int i = 0; i < kN; ++i) {
          const uint64_t salt = uint64_t(f.type) * 100 + uint64_t(i) * 10 + uint64_t(tokens) + uint64_t(variant + 1) * 1000;
          ms.push_back(make_matrix(f, rows[i], cols, salt));
          xs.push_back(random_floats(size_t(cols * tokens), 1.0f, salt + 7));
          w.emplace_back(ms[size_t(i)].bytes.size());
          dx.emplace_back(xs[size_t(i)].size() * 4);
          dy.emplace_back(size_t(rows[i] * tokens) * 4);
          dq.emplace_back(size_t(cu::q8_activation_bytes(cols, tokens)));
        }
        for (int i = 0; i < kN; ++i) {
          w[size_t(i)].upload(ms[size_t(i)].bytes.data(), ms[size_t(i)].bytes.size());
          if (grouped) {
            ASSERT_TRUE(cu::group_weight_blocks(f.type, w[size_t(i)].get(), rows[i], cols, nullptr).is_ok());
          }
          dx[size_t(i)].upload(xs[size_t(i)].data(), xs[size_t(i)].size() * 4);
          dy[size_t(i)].poison();
          cu::GemvMatrix& m = g.m[g.n++];
          m.w = w[size_t(i)].get();
          m.rows = rows[i];
          m.x = dx[size_t(i)].get<float>();
          m.y = dy[size_t(i)].get<float>();
          x_used[size_t(i)] = xs[size_t(i)];
          if (q8) {
            m.xq = cu::q8_activation_view(dq[size_t(i)].get(), cols, tokens);
            ASSERT_TRUE(cu::quantize_activation_q8(m.x, m.xq, nullptr).is_ok());
            GPU_CHECK(cudaDeviceSynchronize());
            const int64_t nq = cols * tokens;
            std::vector<int8_t> q(static_cast<size_t>(nq));
            std::vector<float2> ds(static_cast<size_t>(nq / 32));
            GPU_CHECK(cudaMemcpy(q.data(), m.xq.q, size_t(nq), cudaMemcpyDeviceToHost));
            GPU_CHECK(cudaMemcpy(ds.data(), m.xq.ds, ds.size() * sizeof(float2), cudaMemcpyDeviceToHost));
            for (int64_t e = 0; e < nq; ++e) x_used[size_t(i)][size_t(e)] = float(q[size_t(e)]) * ds[size_t(e / 32)].x;
          }
        }
        const Status st = cu::gemv_group(*dev, g, nullptr);
        ASSERT_TRUE(st.is_ok()) << st.message();
        GPU_CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < kN; ++i) {
          std::vector<float> y(size_t(rows[i] * tokens));
          dy[size_t(i)].download(y.data(), y.size() * 4);
          bool finite = true;
          for (float v : y) finite = finite && std::isfinite(v);
          EXPECT_TRUE(finite) << f.name << (grouped ? " grouped" : "") << " matrix " << i << " variant " << variant;
          const double err = normalized_error_d(y, ref_gemv(ms[size_t(i)].values, x_used[size_t(i)], rows[i], cols, tokens));
          EXPECT_LE(err, kExactTolFew) << f.name << (grouped ? " grouped" : "") << " matrix " << i << " tokens " << tokens
                                       << " variant " << variant << " cols " << cols
                                       << " seed " << test_seed();
        }
      }
    }
  }
}

// The device's grouping (layout.h) gives the host reference's bytes, group by group.
TEST(WeightGroups, DeviceMatchesHostLayout) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (const FormatRef& f : weight_formats()) {
    if (f.type != quant::Type::kQ6_K && f.type != quant::Type::kQ8_0) continue;
    const int64_t rows = 37, cols = 6144;
    const QuantMatrix m = make_matrix(f, rows, cols, 4242);
    DeviceBuffer w(m.bytes.size());
    w.upload(m.bytes.data(), m.bytes.size());
    ASSERT_TRUE(cu::group_weight_blocks(f.type, w.get(), rows, cols, nullptr).is_ok());
    std::vector<uint8_t> got(m.bytes.size()), want(m.bytes.size());
    w.download(got.data(), got.size());
    const size_t gb = size_t(cu::group_bytes(f.type));
    for (size_t g = 0; g < want.size() / gb; ++g) cu::group_blocks_host(f.type, m.bytes.data() + g * gb, want.data() + g * gb);
    EXPECT_EQ(got, want) << f.name;
    EXPECT_NE(got, m.bytes) << f.name;  // the layout is not the GGUF order
  }
}

// The comparison can fail: corrupted weights must be caught.
TEST(GemvParityControl, CorruptedWeightsAreDetected) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (const FormatRef& f : weight_formats()) {
    if (f.type != quant::Type::kQ4_K && f.type != quant::Type::kQ8_0 && f.type != quant::Type::kF16) continue;
    const Outcome o = run_case(f, {64, 1024, 1}, 77, /*corrupt=*/true);
    EXPECT_GT(o.exact_err, 100 * kExactTol) << f.name;
  }
}

// The q8 activation equals the CPU path's round-to-nearest-even quantizer: same q bytes, and the
// kernel's d is the reference's f16 d exactly (llama.cpp's activation blocks carry f16 scales too).
TEST(GemvActivation, Q8MatchesCpuQuantizer) {
  SLUICE_SKIP_WITHOUT_GPU();
  const int64_t cols = 4096;
  const int tokens = 3;
  std::vector<float> x = random_floats(size_t(cols * tokens), 2.0f, 5);
  for (int i = 0; i < 32; ++i) x[size_t(64 + i)] = 0.0f;  // an all-zero block: d = 0, q = 0
  DeviceBuffer dx(x.size() * 4), dq(size_t(cu::q8_activation_bytes(cols, tokens)));
  dx.upload(x.data(), x.size() * 4);
  dq.poison();
  const cu::Q8Activation a = cu::q8_activation_view(dq.get(), cols, tokens);
  ASSERT_TRUE(cu::quantize_activation_q8(dx.get<float>(), a, nullptr).is_ok());
  GPU_CHECK(cudaDeviceSynchronize());
  std::vector<int8_t> q(size_t(cols * tokens));
  std::vector<float2> ds(size_t(cols * tokens / 32));
  GPU_CHECK(cudaMemcpy(q.data(), a.q, q.size(), cudaMemcpyDeviceToHost));
  GPU_CHECK(cudaMemcpy(ds.data(), a.ds, ds.size() * sizeof(float2), cudaMemcpyDeviceToHost));
  std::vector<quant::BlockQ8_1> ref(size_t(cols * tokens / 32));
  quant::ref::quantize_row_q8_1_rne(x.data(), ref.data(), cols * tokens);
  int64_t q_mismatch = 0, d_mismatch = 0, s_bad = 0;
  for (size_t b = 0; b < ref.size(); ++b) {
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      q_mismatch += q[b * 32 + size_t(j)] != ref[b].qs[j];
      sum += q[b * 32 + size_t(j)];
    }
    d_mismatch += ds[b].x != quant::fp16_to_fp32(ref[b].d);
    s_bad += std::fabs(ds[b].y - ds[b].x * float(sum)) > 1e-6f * std::fabs(ds[b].x * float(sum));
  }
  EXPECT_EQ(q_mismatch, 0);
  EXPECT_EQ(d_mismatch, 0);
  EXPECT_EQ(s_bad, 0);
}

TEST(GemvArgs, RejectsBadShapes) {
  SLUICE_SKIP_WITHOUT_GPU();
  Result<cu::DeviceInfo> dev = cu::query_device(0);
  ASSERT_TRUE(dev.is_ok());
  DeviceBuffer w(4096), x(4096), y(4096);
  cu::GemvArgs g;
  g.type = quant::Type::kQ4_K;
  g.w = w.get();
  g.rows = 1;
  g.cols = 100;  // not a multiple of 256
  g.x = x.get<float>();
  g.y = y.get<float>();
  EXPECT_EQ(cu::gemv(*dev, g, nullptr).code(), ErrorCode::kInvalidArgument);
  g.cols = 256;  // q8 activation missing
  EXPECT_EQ(cu::gemv(*dev, g, nullptr).code(), ErrorCode::kInvalidArgument);
  g.type = quant::Type::kF32;
  g.tokens = 9;
  EXPECT_EQ(cu::gemv(*dev, g, nullptr).code(), ErrorCode::kInvalidArgument);
  g.type = quant::Type::kQ8_K;  // activation-only format
  g.tokens = 1;
  EXPECT_EQ(cu::gemv(*dev, g, nullptr).code(), ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace sluice::test::gpu
