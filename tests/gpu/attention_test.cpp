// Parity of the CUDA attention (backend/cuda/attention.h) with the CPU backend and with a
// double-precision reference, for decode (flash-decoding splits + combine) and prefill (tiled
// online softmax): head_dim 32..256, GQA ratios 1, 3, 4, 8, 16, pos0 0 and > 0, contexts 1 to
// 131072, 1..719 query rows, with and without a sliding window.
//
// Inputs: K/V are random f16 values; q is random and rounded to f16-representable floats, so the
// CPU backend's rounding of q to f16 for its dot products changes nothing. Two normalized errors
// ||out - ref|| / ||ref||:
//   exact  ref = the attention of exactly these inputs in double precision, on every row of up to
//          three heads (first, middle, last). What is left is f32 rounding of the dot products,
//          exponentials and sums: tolerance 2e-5. A key too many or too few at any row (a mask
//          off by one) costs about 1 / context, far above it.
//   cpu    ref = the CPU backend's attention op on all rows and heads. It rounds each normalized
//          probability to f16 before weighting V (as llama.cpp's CPU path does); a relative error
//          of up to 2^-11 per probability gives ~3e-4 normalized: tolerance 2e-3. This catches a
//          wrong KV head for any query head (errors of order 1).
// Outputs and the workspace are poisoned with 0xFF (NaN) before each run, and cache rows past the
// last position any query sees hold f16 NaN: an unwritten output, a stale workspace slot or a read
// past the causal end shows as NaN. Argument checks need no GPU and run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/gemv.h"
#include "gpu/gpu_util.h"
#include "quant/half.h"

namespace sluice::test::gpu {
namespace {

namespace cu = sluice::backend::cuda;
namespace be = sluice::backend;

constexpr double kExactTol = 2e-5;
constexpr double kCpuTol = 2e-3;
constexpr int kSlackRows = 5;  // NaN cache rows after the last position

struct Case {
  std::string name;
  int n_head;
  int n_head_kv;
  int head_dim;
  int pos0;
  int n_tokens;
  float q_scale = 1.0f;  // > 1: peaked softmax (scores of many units), stresses the running max
  int sm_count = 0;      // 0: the device's; else forces the decode split plan of such a GPU
  int pad = 0;           // extra elements per row of q, out, K and V (a multiple of 8)
  int window = 0;        // sliding window (Gemma 3's local layers): query t sees (pos0 + t - window, pos0 + t]
  int first_key(int t) const { return window > 0 ? std::max(0, pos0 + t - window + 1) : 0; }
};

struct Outcome {
  double exact_err = 0;
  double cpu_err = 0;
  bool all_finite = true;
  bool q8_checked = false;  // decode with a dense output: the combine wrote out's int8 activation
  int64_t q8_mismatches = 0;  // its bytes vs quantize_activation_q8 of out
};

float round_f16(float x) { return quant::fp16_to_fp32(quant::fp32_to_fp16(x)); }

// Row-major [rows][cols] floats into a [rows][stride] buffer of the given element type.
std::vector<float> with_stride(const std::vector<float>& a, int64_t rows, int64_t cols, int64_t stride) {
  std::vector<float> s(size_t(rows * stride), 0.0f);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(a.begin() + r * cols, cols, s.begin() + r * stride);
  return s;
}
std::vector<uint16_t> to_f16_strided(const std::vector<float>& a, int64_t rows, int64_t cols, int64_t stride) {
  std::vector<uint16_t> s(size_t(rows * stride), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) s[size_t(r * stride + c)] = quant::fp32_to_fp16(a[size_t(r * cols + c)]);
  return s;
}

// out[t][h] in double for one head, all query rows.
void exact_head(const Case& c, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                int h, std::vector<double>& out_rows) {
  const int hd = c.head_dim;
  const int64_t q_cols = int64_t(c.n_head) * hd, kv_cols = int64_t(c.n_head_kv) * hd;
  const int kvh = h / (c.n_head / c.n_head_kv);
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<double> s;
  for (int t = 0; t < c.n_tokens; ++t) {
    const int n = c.pos0 + t + 1;
    const int j0 = c.first_key(t);
    s.assign(size_t(n), 0.0);
    const float* qr = q.data() + t * q_cols + int64_t(h) * hd;
    double mx = -INFINITY;
    for (int j = j0; j < n; ++j) {
      const float* kr = k.data() + j * kv_cols + int64_t(kvh) * hd;
      double d = 0;
      for (int i = 0; i < hd; ++i) d += double(qr[i]) * double(kr[i]);
      s[size_t(j)] = d * scale;
      mx = std::max(mx, s[size_t(j)]);
    }
    double sum = 0;
    for (int j = j0; j < n; ++j) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
    std::vector<double> o(size_t(hd), 0.0);
    for (int j = j0; j < n; ++j) {
      const float* vr = v.data() + j * kv_cols + int64_t(kvh) * hd;
      for (int i = 0; i < hd; ++i) o[size_t(i)] += s[size_t(j)] * double(vr[i]);
    }
    for (int i = 0; i < hd; ++i) out_rows.push_back(o[size_t(i)] / sum);
  }
}

// `corrupt`: the device copy of the V row at position pos0 (seen by every query row) is
// overwritten after the host data was made (the negative control: the comparison must then fail).
Outcome run_case(const Case& c, bool corrupt = false) {
  const int hd = c.head_dim;
  const int64_t q_cols = int64_t(c.n_head) * hd, kv_cols = int64_t(c.n_head_kv) * hd;
  const int n_ctx = c.pos0 + c.n_tokens;
  const int64_t rows = n_ctx + kSlackRows;
  const uint64_t salt = std::hash<std::string>{}(c.name);

  std::vector<float> q = random_floats(size_t(c.n_tokens * q_cols), c.q_scale, salt);
  std::vector<float> k = random_floats(size_t(rows * kv_cols), 1.0f, salt + 1);
  std::vector<float> v = random_floats(size_t(rows * kv_cols), 1.0f, salt + 2);
  for (float& x : q) x = round_f16(x);
  for (float& x : k) x = round_f16(x);
  for (float& x : v) x = round_f16(x);
  for (int64_t i = n_ctx * kv_cols; i < rows * kv_cols; ++i) k[size_t(i)] = v[size_t(i)] = NAN;
  // Rows before every query's window are NaN too: a read of them shows.
  for (int64_t i = 0; i < int64_t(c.first_key(0)) * kv_cols; ++i) k[size_t(i)] = v[size_t(i)] = NAN;

  // GPU run.
  int sm = c.sm_count;
  if (sm == 0) GPU_CHECK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
  const int64_t q_stride = q_cols + c.pad, kv_stride = kv_cols + c.pad;
  const std::vector<float> q_s = with_stride(q, c.n_tokens, q_cols, q_stride);
  const std::vector<uint16_t> k16 = to_f16_strided(k, rows, kv_cols, kv_stride);
  const std::vector<uint16_t> v16 = to_f16_strided(v, rows, kv_cols, kv_stride);
  DeviceBuffer dq(q_s.size() * 4), dk(k16.size() * 2), dv(v16.size() * 2), dout(q_s.size() * 4);
  const int64_t ws_bytes = cu::attention_workspace_bytes(c.n_tokens, c.n_head, hd, int(rows));
  DeviceBuffer dws{static_cast<size_t>(ws_bytes)};
  dq.upload(q_s.data(), q_s.size() * 4);
  dk.upload(k16.data(), k16.size() * 2);
  dv.upload(v16.data(), v16.size() * 2);
  dout.poison();
  dws.poison();
  if (corrupt) GPU_CHECK(cudaMemset(dv.get<uint16_t>() + int64_t(c.pos0) * kv_stride, 0x3C, size_t(kv_cols) * 2));

  cu::AttentionArgs a;
  a.q = dq.get<float>();
  a.q_stride = q_stride;
  a.n_tokens = c.n_tokens;
  a.k_cache = dk.get();
  a.k_stride = kv_stride;
  a.v_cache = dv.get();
  a.v_stride = kv_stride;
  a.out = dout.get<float>();
  a.out_stride = q_stride;
  a.n_head = c.n_head;
  a.n_head_kv = c.n_head_kv;
  a.head_dim = hd;
  a.scale = 1.0f / std::sqrt(float(hd));
  a.pos0 = c.pos0;
  a.window = c.window;
  const int64_t q8_bytes = cu::q8_activation_bytes(q_cols, c.n_tokens);
  DeviceBuffer dq8(static_cast<size_t>(q8_bytes)), dq8_ref(static_cast<size_t>(q8_bytes));
  dq8.poison();
  const cu::Q8Activation xq = cu::q8_activation_view(dq8.get(), q_cols, c.n_tokens);
  a.out_q = xq.q;
  a.out_ds = xq.ds;
  const bool q8 = cu::attention_writes_q8(a);
  const Status st = cu::attention(a, dws.get(), ws_bytes, sm, nullptr);
  SLUICE_CHECK(st.is_ok(), st.message());
  GPU_CHECK(cudaDeviceSynchronize());
  Outcome o;
  if (q8) {
    const cu::Q8Activation ref = cu::q8_activation_view(dq8_ref.get(), q_cols, c.n_tokens);
    SLUICE_CHECK(cu::quantize_activation_q8(a.out, ref, nullptr).is_ok(), "quantize");
    GPU_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> got(static_cast<size_t>(q8_bytes)), want(static_cast<size_t>(q8_bytes));
    dq8.download(got.data(), got.size());
    dq8_ref.download(want.data(), want.size());
    o.q8_checked = true;
    for (size_t i = 0; i < got.size(); ++i) o.q8_mismatches += got[i] != want[i];
  }
  std::vector<float> out_s(q_s.size());
  dout.download(out_s.data(), out_s.size() * 4);
  std::vector<float> out(size_t(c.n_tokens * q_cols));
  for (int t = 0; t < c.n_tokens; ++t)
    std::copy_n(out_s.begin() + t * q_stride, q_cols, out.begin() + t * q_cols);

  for (float x : out) o.all_finite = o.all_finite && std::isfinite(x);

  // CPU backend, all heads.
  {
    std::unique_ptr<be::Backend> cpu = be::make_cpu_backend({});
    Result<be::Tensor> tq = cpu->alloc(be::DType::kF32, q_cols, c.n_tokens);
    Result<be::Tensor> tk = cpu->alloc(be::DType::kF16, kv_cols, rows);
    Result<be::Tensor> tv = cpu->alloc(be::DType::kF16, kv_cols, rows);
    Result<be::Tensor> to = cpu->alloc(be::DType::kF32, q_cols, c.n_tokens);
    SLUICE_CHECK(tq.is_ok() && tk.is_ok() && tv.is_ok() && to.is_ok(), "cpu alloc");
    cpu->upload(*tq, q.data());
    cpu->upload(*tk, k.data());
    cpu->upload(*tv, v.data());
    be::AttentionParams p;
    p.n_head = c.n_head;
    p.n_head_kv = c.n_head_kv;
    p.head_dim = hd;
    p.scale = a.scale;
    p.pos0 = c.pos0;
    p.window = c.window;
    cpu->attention(*tq, *tk, *tv, *to, p);
    std::vector<float> ref(out.size());
    cpu->download(*to, ref.data());
    o.cpu_err = normalized_error(out.data(), ref.data(), out.size());
  }

  // Double precision, every row of the first, a middle and the last head.
  std::vector<int> heads = {0, c.n_head / 2, c.n_head - 1};
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  std::vector<double> want;
  std::vector<float> got;
  for (int h : heads) {
    exact_head(c, q, k, v, h, want);
    for (int t = 0; t < c.n_tokens; ++t)
      for (int i = 0; i < hd; ++i) got.push_back(out[size_t(t * q_cols + int64_t(h) * hd + i)]);
  }
  o.exact_err = normalized_error_d(got, want);
  return o;
}

class AttentionParity : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionParity, MatchesReferences) {
  SLUICE_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const Outcome o = run_case(c);
  EXPECT_TRUE(o.all_finite) << "unwritten (NaN-poisoned) or non-finite outputs";
  EXPECT_LE(o.exact_err, kExactTol) << "seed " << test_seed();
  EXPECT_LE(o.cpu_err, kCpuTol) << "seed " << test_seed();
  // Decode rows with a dense output: the combine's int8 activation equals quantizing out afterwards.
  EXPECT_EQ(o.q8_checked, c.n_tokens <= 4 && c.pad == 0);
  EXPECT_EQ(o.q8_mismatches, 0);
  // One greppable line per case for the report.
  std::printf("ATTN %-26s heads=%d/%d hd=%d pos0=%d tokens=%d exact=%.3e cpu=%.3e\n", c.name.c_str(), c.n_head,
              c.n_head_kv, c.head_dim, c.pos0, c.n_tokens, o.exact_err, o.cpu_err);
}

std::vector<Case> cases() {
  return {
      // Decode (<= 4 rows): split keys + combine; up to attn::kSinglePassKeys (256) keys one split
      // whose kernel writes the output itself. Context = pos0 + tokens.
      {"decode_ctx1", 32, 8, 64, 0, 1},
      {"decode_ctx256_single_4tok", 32, 8, 128, 252, 4},  // the longest single-split context
      {"decode_ctx130_single_hd256", 8, 1, 256, 129, 1},
      {"decode_ctx7_smollm2", 9, 3, 64, 6, 1},
      {"decode_ctx7_2tok", 9, 3, 64, 5, 2},
      {"decode_ctx257_mha", 8, 8, 128, 256, 1},
      {"decode_ctx257_g4_2tok", 32, 8, 128, 255, 2},
      {"decode_ctx4096_g8", 32, 4, 128, 4095, 1},
      {"decode_ctx4096_hd64_4tok", 32, 8, 64, 4092, 4},
      {"decode_ctx4096_1sm", 32, 8, 128, 4095, 1, 1.0f, 1},          // one split of 64 tiles
      // 32 splits of 128 keys; the last starts at 3968, so it is empty for rows 0 and 1.
      {"decode_ctx3970_empty_splits", 8, 8, 128, 3966, 4, 1.0f, 100000},
      {"decode_ctx4096_peaked", 32, 8, 128, 4095, 1, 8.0f},
      {"decode_ctx1000_mqa16", 16, 1, 64, 999, 1},
      {"decode_ctx1000_g6", 12, 2, 128, 998, 2},
      {"decode_strided", 9, 3, 128, 300, 2, 1.0f, 0, 8},
      {"decode_ctx32768", 32, 8, 128, 32767, 1},
      {"decode_ctx131072", 4, 1, 128, 131071, 1},
      {"decode_hd32", 8, 2, 32, 700, 1},
      {"decode_hd96", 8, 2, 96, 700, 2},
      {"decode_hd160", 8, 2, 160, 700, 1},
      {"decode_hd192", 8, 2, 192, 700, 1},
      {"decode_hd224", 8, 2, 224, 700, 1},
      {"decode_hd256", 8, 2, 256, 700, 3},
      // Prefill (> 4 rows): 32-row query tiles, 64- or 32-key tiles.
      {"prefill_5tok", 9, 3, 64, 0, 5},
      {"prefill_ctx7", 9, 3, 64, 0, 7},
      {"prefill_17tok", 32, 8, 128, 0, 17},
      {"prefill_17tok_ctx257", 9, 3, 64, 240, 17},
      {"prefill_512tok", 32, 8, 128, 0, 512},
      {"prefill_512tok_mha_hd64", 8, 8, 64, 0, 512},
      {"prefill_512tok_ctx4096_g8", 32, 4, 128, 3584, 512},
      {"prefill_100tok_peaked", 32, 8, 128, 300, 100, 8.0f},
      {"prefill_strided", 9, 3, 128, 37, 45, 1.0f, 0, 8},
      {"prefill_hd32", 8, 2, 32, 50, 33},
      {"prefill_hd96", 8, 2, 96, 50, 33},
      {"prefill_hd160", 8, 2, 160, 50, 33},
      {"prefill_hd192", 8, 2, 192, 50, 33},
      {"prefill_hd224", 8, 2, 224, 50, 33},
      {"prefill_hd256", 8, 2, 256, 50, 65},
      // Sliding window (Gemma 3's local layers; rows before the first query's window are NaN).
      // Gemma 3 270M's shape: 4 query heads, 1 KV head, head_dim 256, window 512.
      {"window_decode_gemma3", 4, 1, 256, 700, 1, 1.0f, 0, 0, 512},
      {"window_decode_gemma3_3tok", 4, 1, 256, 1000, 3, 1.0f, 0, 0, 512},
      {"window_decode_inside", 4, 1, 256, 100, 1, 1.0f, 0, 0, 512},  // window longer than the context
      {"window_decode_splits", 8, 2, 128, 4000, 4, 1.0f, 100000, 0, 1000},  // many splits over the window
      {"window_decode_tiny", 8, 2, 64, 300, 4, 1.0f, 0, 0, 3},              // window shorter than the rows
      {"window_prefill_gemma3_719tok", 4, 1, 256, 0, 719, 1.0f, 0, 0, 512},
      // A 5-key window: most key tiles hold no visible key for many rows (the -inf running max).
      {"window_prefill_tiny", 8, 2, 128, 37, 45, 1.0f, 0, 0, 5},
      {"window_prefill_ctx400", 8, 2, 64, 300, 100, 4.0f, 0, 8, 40},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionParity, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The comparison can fail: a changed V row must be caught on both paths.
TEST(AttentionParityControl, CorruptedCacheIsDetected) {
  SLUICE_SKIP_WITHOUT_GPU();
  const Outcome d = run_case({"control_decode", 32, 8, 128, 256, 1}, /*corrupt=*/true);
  EXPECT_GT(d.exact_err, 100 * kExactTol);
  EXPECT_GT(d.cpu_err, kCpuTol);
  const Outcome p = run_case({"control_prefill", 32, 8, 128, 200, 57}, /*corrupt=*/true);
  EXPECT_GT(p.exact_err, 100 * kExactTol);
  EXPECT_GT(p.cpu_err, kCpuTol);
}

// ---- argument checks: host-side, before any CUDA call, so no GPU is needed ----------------------

cu::AttentionArgs fake_args(const std::vector<float>& host) {
  // Pointers are never dereferenced on these paths; 16-byte aligned so only the tested field is bad.
  const float* base = host.data();
  while (reinterpret_cast<uintptr_t>(base) % 16 != 0) ++base;
  cu::AttentionArgs a;
  a.q = base;
  a.q_stride = 32 * 128;
  a.n_tokens = 1;
  a.k_cache = base;
  a.k_stride = 8 * 128;
  a.v_cache = base;
  a.v_stride = 8 * 128;
  a.out = const_cast<float*>(base);
  a.out_stride = 32 * 128;
  a.n_head = 32;
  a.n_head_kv = 8;
  a.head_dim = 128;
  a.scale = 0.088f;
  a.pos0 = 4095;
  return a;
}

TEST(AttentionArgs, UnsupportedHeadDim) {
  const std::vector<float> host(64);
  for (int hd : {0, 16, 80, 100, 288, 512}) {
    cu::AttentionArgs a = fake_args(host);
    a.head_dim = hd;
    a.q_stride = a.out_stride = int64_t(a.n_head) * std::max(hd, 1);
    a.k_stride = a.v_stride = int64_t(a.n_head_kv) * std::max(hd, 1);
    const Status st = cu::attention(a, nullptr, 0, 132, nullptr);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << hd;
    EXPECT_NE(st.message().find("head_dim"), std::string::npos) << st.message();
  }
}

TEST(AttentionArgs, WorkspaceTooSmall) {
  const std::vector<float> host(64);
  const cu::AttentionArgs a = fake_args(host);
  for (int64_t bytes : {int64_t(0), int64_t(64), int64_t(4096)}) {
    const Status st = cu::attention(a, reinterpret_cast<void*>(uintptr_t(256)), bytes, 132, nullptr);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << bytes;
    EXPECT_NE(st.message().find("workspace"), std::string::npos) << st.message();
  }
  const Status null_ws = cu::attention(a, nullptr, int64_t(1) << 30, 132, nullptr);
  EXPECT_EQ(null_ws.code(), ErrorCode::kInvalidArgument);
}

TEST(AttentionArgs, BadShapes) {
  const std::vector<float> host(64);
  const auto expect_invalid = [](const cu::AttentionArgs& a, const char* what) {
    const Status st = cu::attention(a, nullptr, 0, 132, nullptr);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << what << ": " << st.message();
  };
  cu::AttentionArgs a = fake_args(host);
  a.n_head_kv = 5;  // 32 % 5 != 0
  a.k_stride = a.v_stride = 5 * 128;
  expect_invalid(a, "heads");
  a = fake_args(host);
  a.k_stride += 4;  // rows no longer 16-byte aligned
  expect_invalid(a, "k stride");
  a = fake_args(host);
  a.k_stride = 7 * 128;  // shorter than a row
  expect_invalid(a, "short stride");
  a = fake_args(host);
  a.pos0 = -1;
  expect_invalid(a, "pos0");
  a = fake_args(host);
  a.v_cache = reinterpret_cast<const uint8_t*>(a.v_cache) + 2;
  expect_invalid(a, "v pointer");
  a = fake_args(host);
  a.out = nullptr;
  expect_invalid(a, "null out");
  a = fake_args(host);
  const Status sm = cu::attention(a, nullptr, 0, 0, nullptr);
  EXPECT_EQ(sm.code(), ErrorCode::kInvalidArgument);
}

// Workspace sizing: grows with the context up to the split cap, is the same for every batch of
// more than 4 rows (prefill needs none; the figure covers the decode calls), 0 for empty shapes.
TEST(AttentionArgs, WorkspaceBytes) {
  const int64_t row = 128 * 4 + 8;  // partial output + (max, sum)
  EXPECT_EQ(cu::attention_workspace_bytes(1, 32, 128, 131072), 32 * 256 * row);
  EXPECT_EQ(cu::attention_workspace_bytes(1, 32, 128, 1 << 20), 32 * 256 * row);
  EXPECT_EQ(cu::attention_workspace_bytes(1, 32, 128, 1), 32 * 1 * row);
  EXPECT_LE(cu::attention_workspace_bytes(1, 32, 128, 4096), cu::attention_workspace_bytes(1, 32, 128, 8192));
  EXPECT_EQ(cu::attention_workspace_bytes(512, 32, 128, 4096), cu::attention_workspace_bytes(4, 32, 128, 4096));
  EXPECT_EQ(cu::attention_workspace_bytes(2, 32, 128, 4096), 2 * cu::attention_workspace_bytes(1, 32, 128, 4096));
  EXPECT_EQ(cu::attention_workspace_bytes(0, 32, 128, 4096), 0);
  EXPECT_EQ(cu::attention_workspace_bytes(1, 32, 128, 0), 0);
}

}  // namespace
}  // namespace sluice::test::gpu
