// CPU matrix-product throughput per weight format through the backend: decode (gemv, one token)
// in GB/s of weight read, and prefill (gemm, 64 tokens) in tok/s-equivalent GFLOP/s.
// usage: bench_gemv_cpu [threads] [rows] [cols]
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/timer.h"
#include "quant/quant.h"

using namespace sluice;

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  const int64_t n_out = argc > 2 ? std::atoll(argv[2]) : 8192;
  const int64_t k = argc > 3 ? std::atoll(argv[3]) : 2048;
  auto be = backend::make_cpu_backend({threads});
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  std::printf("isa %s, W [%lld x %lld]\n", quant::isa_name(quant::best_isa()), (long long)n_out, (long long)k);
  std::printf("%-6s %10s %10s %12s\n", "type", "gemv us", "GB/s", "gemm64 GF/s");
  for (quant::Type t : {quant::Type::kF16, quant::Type::kQ4_0, quant::Type::kQ4_1, quant::Type::kQ8_0, quant::Type::kQ4_K,
                        quant::Type::kQ5_K, quant::Type::kQ6_K}) {
    const int64_t rb = quant::row_bytes(t, k);
    std::vector<uint8_t> w(size_t(rb * n_out));
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n_out; ++r) {
      if (r < 64) {
        for (auto& x : row) x = nd(rng);
        quant::kernels(t).quantize_row(row.data(), w.data() + r * rb, k);
      } else {
        std::copy(w.begin() + (r % 64) * rb, w.begin() + (r % 64 + 1) * rb, w.begin() + r * rb);
      }
    }
    const backend::WeightView wv{t, k, n_out, w.data()};
    auto x = *be->alloc(backend::DType::kF32, k, 64);
    auto y = *be->alloc(backend::DType::kF32, n_out, 64);
    std::vector<float> xs(size_t(k * 64));
    for (auto& v : xs) v = nd(rng);
    be->upload(x, xs.data());
    const int reps = 20;
    be->matmul(wv, x.first_rows(1), y.first_rows(1));
    core::Timer tm;
    for (int i = 0; i < reps; ++i) be->matmul(wv, x.first_rows(1), y.first_rows(1));
    const double gemv = tm.seconds() / reps;
    tm.reset();
    be->matmul(wv, x, y);
    const double gemm = tm.seconds();
    std::printf("%-6s %10.1f %10.2f %12.1f\n", quant::type_name(t), gemv * 1e6, double(w.size()) / gemv / 1e9,
                2.0 * double(n_out) * double(k) * 64 / gemm / 1e9);
  }
}
