// bench_quant: vec_dot throughput per format and ISA, in weight bytes per second, over a weight
// matrix larger than the last-level cache, next to the DRAM read bandwidth measured in the same
// run. Usage: bench_quant [matrix_MiB=256] [threads=hardware_concurrency]
//
// Weights are random raw blocks with finite f16 scales (throughput does not depend on values);
// the activation row is quantized once to the format's vec_dot_type and stays in cache, so the
// number is the rate at which a gemv streams this format's weights. Fastest of 5 runs (the
// least disturbed by other load on a shared machine). A matrix that fits the cache (e.g. 4 MiB)
// measures the kernels' compute rate instead of DRAM.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "quant/half.h"
#include "quant/quant.h"

using namespace sluice::quant;  // NOLINT(google-build-using-namespace): a benchmark program

namespace {

constexpr int64_t kCols = 4096;  // elements per weight row (a typical hidden size)
constexpr int kDotCols = 8;      // activation rows per vec_dot_cols call (a prefill tile)

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename F>
double best_seconds(F&& f, int runs = 5) {
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(seconds_since(t0));
  }
  return *std::min_element(t.begin(), t.end());
}

// Runs body(begin, end) over [0, n) split across `threads` threads.
template <typename F>
void parallel_for(int64_t n, int threads, F&& body) {
  if (threads <= 1) {
    body(int64_t(0), n);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = n * t / threads, e = n * (t + 1) / threads;
    pool.emplace_back([&body, b, e] { body(b, e); });
  }
  for (auto& th : pool) th.join();
}

// Streaming read bandwidth: every thread sums its slice of a buffer much larger than the LLC.
double dram_gbs(const std::vector<uint64_t>& buf, int threads) {
  std::vector<uint64_t> sums(size_t(threads) * 8);
  const double s = best_seconds([&] {
    parallel_for(threads, threads, [&](int64_t tb, int64_t) {
      const size_t b = buf.size() * size_t(tb) / size_t(threads), e = buf.size() * size_t(tb + 1) / size_t(threads);
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (size_t i = b; i + 4 <= e; i += 4) {
        a0 += buf[i];
        a1 += buf[i + 1];
        a2 += buf[i + 2];
        a3 += buf[i + 3];
      }
      sums[size_t(tb) * 8] = a0 + a1 + a2 + a3;
    });
  });
  uint64_t sink = 0;
  for (auto v : sums) sink += v;
  if (sink == 42) std::puts("");  // keeps the sums observable
  return double(buf.size() * 8) / s / 1e9;
}

std::vector<int> f16_fields(Type t) {
  switch (t) {
    case Type::kQ4_0: case Type::kQ5_0: case Type::kQ8_0: return {0};
    case Type::kQ4_1: case Type::kQ5_1: case Type::kQ4_K: case Type::kQ5_K: return {0, 2};
    case Type::kQ2_K: return {80, 82};
    case Type::kQ3_K: return {108};
    case Type::kQ6_K: return {208};
    default: return {};
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 256;
  const int threads = argc > 2 ? std::atoi(argv[2]) : int(std::max(1u, std::thread::hardware_concurrency()));
  if (mib <= 0 || threads <= 0) {
    std::fprintf(stderr, "usage: bench_quant [matrix_MiB>0] [threads>0]\n");
    return 2;
  }
  const size_t bytes = size_t(mib) << 20;
  std::vector<uint8_t> w(bytes);
  std::mt19937_64 rng(1);
  std::vector<uint64_t> dram(bytes * 2 / 8);
  for (auto& v : dram) v = rng();
  const double bw1 = dram_gbs(dram, 1), bwn = dram_gbs(dram, threads);
  dram.clear();
  dram.shrink_to_fit();
  std::printf("weight matrix %lld MiB, rows of %lld elements, %d threads, best ISA %s\n", (long long)mib,
              (long long)kCols, threads, isa_name(best_isa()));
  std::printf("DRAM streaming read: %.1f GB/s (1 thread), %.1f GB/s (%d threads)\n\n", bw1, bwn, threads);
  std::printf("vec_dot: one activation row. cols8: vec_dot_cols with %d activation rows, weight bytes/s\n", kDotCols);
  std::printf("(each weight row is read once for %d dots); loop8: the fallback, %d vec_dot calls per row.\n",
              kDotCols, kDotCols);
  std::printf("A row is printed per ISA whose own code runs (isa = the code's ISA, not the table's).\n\n");
  std::printf("%-6s %-7s %9s %9s %9s | %-7s %9s %9s %9s %9s\n", "format", "isa", "1T GB/s", "allT GB/s", "allT/DRAM",
              "cols", "1T cols8", "allT cols8", "1T loop8", "allT loop8");

  const Type types[] = {Type::kF32,  Type::kF16,  Type::kBF16, Type::kQ4_0, Type::kQ4_1, Type::kQ5_0, Type::kQ5_1,
                        Type::kQ8_0, Type::kQ2_K, Type::kQ3_K, Type::kQ4_K, Type::kQ5_K, Type::kQ6_K};
  std::vector<float> act_f = std::vector<float>(size_t(kCols));
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (auto& v : act_f) v = g(rng);
  for (Type t : types) {
    const int64_t rb = row_bytes(t, kCols);
    const int64_t rows = int64_t(bytes) / rb;
    // Random blocks with finite scales (float formats: small random values).
    for (auto& b : w) b = uint8_t(rng());
    const int64_t bb = traits(t).block_bytes;
    for (int64_t off = 0; off + bb <= rows * rb; off += bb) {
      for (int f : f16_fields(t)) {
        const uint16_t h = fp32_to_fp16(0.01f * g(rng));
        std::memcpy(&w[size_t(off + f)], &h, 2);
      }
      if (t == Type::kF32) {
        const float v = g(rng);
        std::memcpy(&w[size_t(off)], &v, 4);
      } else if (t == Type::kF16) {
        const uint16_t h = fp32_to_fp16(g(rng));
        std::memcpy(&w[size_t(off)], &h, 2);
      } else if (t == Type::kBF16) {
        const uint16_t h = fp32_to_bf16(g(rng));
        std::memcpy(&w[size_t(off)], &h, 2);
      }
    }
    bool printed[3] = {false, false, false};
    for (Isa isa : {Isa::kRef, Isa::kAvx2, Isa::kAvx512}) {
      const Kernels* k = kernels_for(t, isa);
      if (!k) continue;
      // A higher table may reuse a lower ISA's vec_dot: measure each piece of code once, under
      // the ISA it was written for.
      if (printed[int(k->vec_dot_isa)] && (k->vec_dot_cols == nullptr || k->vec_dot_cols_isa != isa)) continue;
      printed[int(k->vec_dot_isa)] = true;
      const int64_t ab = row_bytes(k->vec_dot_type, kCols);
      std::vector<uint8_t> act(size_t(ab * kDotCols));
      for (int c = 0; c < kDotCols; ++c) {
        std::vector<float> col(act_f);
        std::rotate(col.begin(), col.begin() + 64 * c, col.end());  // distinct columns
        kernels_for(k->vec_dot_type, isa)->quantize_row(col.data(), act.data() + c * ab, kCols);
      }
      std::vector<float> out(static_cast<size_t>(rows) * kDotCols);
      auto run = [&](int nt, int mode) {  // 0: vec_dot, 1: vec_dot_cols, 2: loop of vec_dot
        return best_seconds([&] {
          parallel_for(rows, nt, [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
              const uint8_t* wr = w.data() + r * rb;
              float* o = &out[size_t(r) * kDotCols];
              if (mode == 0) k->vec_dot(kCols, wr, act.data(), o);
              if (mode == 1) k->vec_dot_cols(kCols, wr, act.data(), ab, kDotCols, o);
              if (mode == 2)
                for (int c = 0; c < kDotCols; ++c) k->vec_dot(kCols, wr, act.data() + c * ab, o + c);
            }
          });
        });
      };
      const double gb = double(rows * rb) / 1e9;
      const double s1 = run(1, 0), sn = run(threads, 0);
      std::printf("%-6s %-7s %9.1f %9.1f %9.2f | ", type_name(t), isa_name(k->vec_dot_isa), gb / s1, gb / sn,
                  gb / sn / bwn);
      if (k->vec_dot_cols != nullptr && isa != Isa::kRef && k->vec_dot_cols_isa == isa) {
        const double c1 = run(1, 1), cn = run(threads, 1), l1 = run(1, 2), ln = run(threads, 2);
        std::printf("%-7s %9.1f %9.1f %9.1f %9.1f\n", isa_name(isa), gb / c1, gb / cn, gb / l1, gb / ln);
      } else {
        std::printf("%-7s\n", "-");
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
