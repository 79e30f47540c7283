// GEMV weight-read bandwidth per format and Llama-3-8B layer shape, against the device's own
// copy bandwidth measured in the same run.
//
//   bench_gpu_gemv [--quick] [--variants | --variant N] [--formats a,b] [--shapes PREFIX,PREFIX] [--csv FILE]
//
// --shapes keeps the shapes whose names start with one of the prefixes (e.g. "gate+up,ffn_down").
// Default: the launch shape gemv() picks (v = -1); --variants times every shape (0..3) instead.
// Shapes with several parts are one gemv_group launch over several matrices (Q/K/V, gate/up).
// Formats q6_kg, q8_0g: Q6_K / Q8_0 in the grouped layout the CUDA backend uploads (backend/cuda/layout.h).
//
// Per case: a CUDA graph of N back-to-back gemv launches (decode runs them captured too), cycling
// over enough copies of the matrix that they exceed 4x the L2 (each launch reads from DRAM, not
// cache); replayed 7 times after a warm-up; median time per launch. GB/s counts weight bytes
// only (activations and outputs are < 0.5% of them). Copy bandwidth: cudaMemcpy device to device
// of 1 GiB, bytes read + written, median of 10.
// Weights are random quantized blocks (64 distinct rows from quant's reference quantizer, tiled).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/gemv.h"
#include "backend/cuda/layout.h"
#include "core/status.h"
#include "quant/quant.h"
#include "quant/ref.h"

namespace {

namespace cu = sluice::backend::cuda;
using sluice::quant::Type;

#define BENCH_CHECK(call)                                                                          \
  do {                                                                                             \
    const cudaError_t _e = (call);                                                                 \
    if (_e != cudaSuccess) ::sluice::check_failed(__FILE__, __LINE__, #call, cudaGetErrorString(_e)); \
  } while (0)
#define BENCH_OK(expr)                                        \
  do {                                                        \
    const ::sluice::Status _s = (expr);                       \
    SLUICE_CHECK(_s.is_ok(), _s.message());                   \
  } while (0)

struct Format {
  Type type;
  const char* name;
  int block_elems, block_bytes;
  void (*quantize)(const float*, void*, int64_t);
  bool grouped = false;  // Q6_K / Q8_0 in the CUDA backend's grouped layout (backend/cuda/layout.h)
};

const Format kFormats[] = {
    {Type::kF32, "f32", 1, 4, sluice::quant::ref::quantize_row_f32},
    {Type::kF16, "f16", 1, 2, sluice::quant::ref::quantize_row_f16},
    {Type::kBF16, "bf16", 1, 2, sluice::quant::ref::quantize_row_bf16},
    {Type::kQ4_0, "q4_0", 32, 18, sluice::quant::ref::quantize_row_q4_0},
    {Type::kQ4_1, "q4_1", 32, 20, sluice::quant::ref::quantize_row_q4_1},
    {Type::kQ5_0, "q5_0", 32, 22, sluice::quant::ref::quantize_row_q5_0},
    {Type::kQ5_1, "q5_1", 32, 24, sluice::quant::ref::quantize_row_q5_1},
    {Type::kQ8_0, "q8_0", 32, 34, sluice::quant::ref::quantize_row_q8_0},
    {Type::kQ2_K, "q2_k", 256, 84, sluice::quant::ref::quantize_row_q2_k},
    {Type::kQ3_K, "q3_k", 256, 110, sluice::quant::ref::quantize_row_q3_k},
    {Type::kQ4_K, "q4_k", 256, 144, sluice::quant::ref::quantize_row_q4_k},
    {Type::kQ5_K, "q5_k", 256, 176, sluice::quant::ref::quantize_row_q5_k},
    {Type::kQ6_K, "q6_k", 256, 210, sluice::quant::ref::quantize_row_q6_k},
    {Type::kQ6_K, "q6_kg", 256, 210, sluice::quant::ref::quantize_row_q6_k, true},
    {Type::kQ8_0, "q8_0g", 32, 34, sluice::quant::ref::quantize_row_q8_0, true},
};

// One launch over one or more matrices of `cols` columns (gemv_group: Q/K/V or gate/up together).
struct Shape {
  const char* name;
  int64_t cols;
  std::vector<int64_t> parts;  // rows of each matrix
  int64_t rows() const {
    int64_t r = 0;
    for (int64_t p : parts) r += p;
    return r;
  }
};
const Shape kShapes[] = {
    {"attn_q/o 4096x4096", 4096, {4096}},
    {"attn_k/v 1024x4096", 4096, {1024}},
    {"qkv 4096+1024+1024", 4096, {4096, 1024, 1024}},
    {"ffn_up/gate 14336x4096", 4096, {14336}},
    {"gate+up 2x14336x4096", 4096, {14336, 14336}},
    {"ffn_down 4096x14336", 14336, {4096}},
    {"output 128256x4096", 4096, {128256}},
    {"70B attn_q/o 8192x8192", 8192, {8192}},
    {"70B gate+up 2x28672x8192", 8192, {28672, 28672}},
    {"70B ffn_down 8192x28672", 28672, {8192}},
    // Rows of 15 Q6_K blocks (Gemma 3 12B's width): only 2-byte aligned in Q6_K and Q8_0.
    {"3840-col gate+up 2x15360x3840", 3840, {15360, 15360}},
    {"3840-col output 262144x3840", 3840, {262144}},
};
const Shape& shape_named(const char* prefix) {
  for (const Shape& s : kShapes) {
    if (std::strncmp(s.name, prefix, std::strlen(prefix)) == 0) return s;
  }
  SLUICE_CHECK(false, std::string("no bench shape ") + prefix);
  return kShapes[0];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double copy_bandwidth_gbs() {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  BENCH_CHECK(cudaMalloc(&a, bytes));
  BENCH_CHECK(cudaMalloc(&b, bytes));
  BENCH_CHECK(cudaMemset(a, 0x3C, bytes));
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int i = 0; i < 12; ++i) {
    BENCH_CHECK(cudaEventRecord(e0));
    BENCH_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    BENCH_CHECK(cudaEventRecord(e1));
    BENCH_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 2) ms.push_back(t);
  }
  BENCH_CHECK(cudaEventDestroy(e0));
  BENCH_CHECK(cudaEventDestroy(e1));
  BENCH_CHECK(cudaFree(a));
  BENCH_CHECK(cudaFree(b));
  return 2.0 * double(bytes) / (median(ms) * 1e-3) / 1e9;
}

struct Result {
  double us = 0, gbs = 0;
  int64_t bytes = 0;
};

Result bench_case(const cu::DeviceInfo& dev, const Format& f, const Shape& s, int tokens, int variant,
                  std::mt19937_64& rng) {
  const int64_t row_bytes = s.cols / f.block_elems * f.block_bytes;
  const int64_t rows = s.rows();
  const int64_t mat_bytes = rows * row_bytes;
  const int copies = int(std::clamp<int64_t>((4 * dev.l2_bytes + mat_bytes - 1) / mat_bytes, 1, 32));
  // 64 distinct random rows from the reference quantizer, tiled over every copy on the device.
  const int64_t seed_rows = std::min<int64_t>(64, rows);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> src(size_t(seed_rows * s.cols));
  for (auto& v : src) v = nd(rng);
  std::vector<uint8_t> seed(size_t(seed_rows * row_bytes));
  for (int64_t r = 0; r < seed_rows; ++r) f.quantize(src.data() + r * s.cols, seed.data() + r * row_bytes, s.cols);
  uint8_t* w = nullptr;
  const int64_t total = mat_bytes * copies;
  BENCH_CHECK(cudaMalloc(&w, size_t(total)));
  BENCH_CHECK(cudaMemcpy(w, seed.data(), seed.size(), cudaMemcpyHostToDevice));
  for (int64_t done = int64_t(seed.size()); done < total;) {
    const int64_t n = std::min(done, total - done);
    BENCH_CHECK(cudaMemcpy(w + done, w, size_t(n), cudaMemcpyDeviceToDevice));
    done += n;
  }
  if (f.grouped) BENCH_OK(cu::group_weight_blocks(f.type, w, rows * copies, s.cols, nullptr));
  float *x = nullptr, *y = nullptr;
  void* qbuf = nullptr;
  std::vector<float> hx(size_t(s.cols * tokens));
  for (auto& v : hx) v = nd(rng);
  BENCH_CHECK(cudaMalloc(&x, hx.size() * 4));
  BENCH_CHECK(cudaMalloc(&y, size_t(rows * tokens) * 4));
  BENCH_CHECK(cudaMalloc(&qbuf, size_t(cu::q8_activation_bytes(s.cols, tokens))));
  BENCH_CHECK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));

  cudaStream_t st;
  BENCH_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cu::GemvGroupArgs g;
  g.type = f.type;
  g.cols = s.cols;
  g.tokens = tokens;
  g.variant = variant;
  g.grouped = f.grouped;
  cu::Q8Activation xq;
  if (cu::gemv_needs_q8(f.type)) {
    xq = cu::q8_activation_view(qbuf, s.cols, tokens);
    BENCH_OK(cu::quantize_activation_q8(x, xq, st));
  }
  const int launches = std::max(copies, 20);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) {
    g.n = 0;
    int64_t r0 = 0;
    for (int64_t part : s.parts) {
      g.m[g.n++] = cu::GemvMatrix{w + (i % copies) * mat_bytes + r0 * row_bytes, part, x, xq, y + r0 * tokens};
      r0 += part;
    }
    BENCH_OK(cu::gemv_group(dev, g, st));
  }
  BENCH_CHECK(cudaStreamEndCapture(st, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));
  std::vector<double> us;
  for (int rep = 0; rep < 8; ++rep) {
    BENCH_CHECK(cudaEventRecord(e0, st));
    BENCH_CHECK(cudaGraphLaunch(exec, st));
    BENCH_CHECK(cudaEventRecord(e1, st));
    BENCH_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep > 0) us.push_back(double(ms) * 1e3 / launches);
  }
  BENCH_CHECK(cudaGetLastError());
  BENCH_CHECK(cudaEventDestroy(e0));
  BENCH_CHECK(cudaEventDestroy(e1));
  BENCH_CHECK(cudaGraphExecDestroy(exec));
  BENCH_CHECK(cudaGraphDestroy(graph));
  BENCH_CHECK(cudaStreamDestroy(st));
  BENCH_CHECK(cudaFree(w));
  BENCH_CHECK(cudaFree(x));
  BENCH_CHECK(cudaFree(y));
  BENCH_CHECK(cudaFree(qbuf));
  Result r;
  r.us = median(us);
  r.bytes = mat_bytes;
  r.gbs = double(mat_bytes) / (r.us * 1e-6) / 1e9;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, variants = false;
  int one_variant = -2;  // --variant N: only launch shape N
  const char* csv_path = nullptr;
  std::string only;  // --formats a,b,c: only these formats
  std::vector<std::string> shapes;  // --shapes p,q: only shapes whose names start with p or q
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--variants")) variants = true;
    else if (!std::strcmp(argv[i], "--variant") && i + 1 < argc) one_variant = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
    else if (!std::strcmp(argv[i], "--formats") && i + 1 < argc) only = std::string(",") + argv[++i] + ",";
    else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) {
      std::string list = argv[++i];
      for (size_t b = 0; b <= list.size();) {
        const size_t e = std::min(list.find(',', b), list.size());
        if (e > b) shapes.push_back(list.substr(b, e - b));
        b = e + 1;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--variants | --variant N] [--formats a,b] [--shapes p,q] [--csv FILE]\n", argv[0]);
      return 2;
    }
  }
  auto dev = cu::query_device(0);
  if (!dev.is_ok()) {
    std::fprintf(stderr, "bench_gpu_gemv: %s\n", dev.status().message().c_str());
    return 1;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double copy_gbs = copy_bandwidth_gbs();
  std::printf("device: %s, %d SMs, L2 %lld MB; device copy (1 GiB D2D, read+write): %.0f GB/s\n", prop.name,
              dev->sm_count, (long long)(dev->l2_bytes >> 20), copy_gbs);
  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (csv) std::fprintf(csv, "format,shape,rows,cols,tokens,variant,weight_bytes,median_us,gbs,ratio_to_copy\n");
  std::printf("%-6s %-24s %3s %2s %9s %10s %9s %7s\n", "format", "shape", "tok", "v", "MB", "median_us", "GB/s", "%copy");
  std::mt19937_64 rng(12345);
  auto run = [&](const Format& f, const Shape& s, int tokens) {
    if (!only.empty() && only.find(std::string(",") + f.name + ",") == std::string::npos) return;
    if (f.grouped && !cu::groupable(f.type, s.cols)) return;
    if (!shapes.empty() && std::none_of(shapes.begin(), shapes.end(), [&](const std::string& p) {
          return std::strncmp(s.name, p.c_str(), p.size()) == 0;
        })) {
      return;
    }
    int v_first = variants ? 0 : -1, v_last = variants ? cu::kGemvVariants - 1 : -1;
    if (one_variant >= -1) v_first = v_last = one_variant;
    for (int variant = v_first; variant <= v_last; ++variant) {
      const Result r = bench_case(*dev, f, s, tokens, variant, rng);
      std::printf("%-6s %-24s %3d %2d %9.2f %10.2f %9.0f %6.1f%%\n", f.name, s.name, tokens, variant,
                  double(r.bytes) / 1e6, r.us, r.gbs, 100.0 * r.gbs / copy_gbs);
      if (csv) {
        std::fprintf(csv, "%s,%s,%lld,%lld,%d,%d,%lld,%.3f,%.1f,%.4f\n", f.name, s.name, (long long)s.rows(),
                     (long long)s.cols, tokens, variant, (long long)r.bytes, r.us, r.gbs, r.gbs / copy_gbs);
      }
      std::fflush(stdout);
    }
  };
  for (const Format& f : kFormats) {
    for (const Shape& s : kShapes) {
      if (quick && (s.rows() > 20000 || std::strncmp(s.name, "70B", 3) == 0)) continue;
      run(f, s, 1);
    }
  }
  // Small batches (speculative decoding, several sequences): bytes read once for all tokens.
  for (const Format& f : kFormats) {
    if (f.type != Type::kQ4_K && f.type != Type::kQ8_0 && f.type != Type::kQ6_K) continue;
    for (int tokens : {2, 4, 8}) run(f, shape_named("ffn_up/gate"), tokens);
  }
  if (csv) std::fclose(csv);
  return 0;
}
