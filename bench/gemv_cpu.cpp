// CPU matrix-product throughput per weight format through the backend: decode (gemv, one token)
// in GB/s of weight read, and prefill (gemm, 64 tokens) in tok/s-equivalent GFLOP/s.
// usage: bench_gemv_cpu [threads] [rows] [cols]
//
// Prefill kernel A/B: bench_gemv_cpu tile [tokens] [runs]
// One thread, the batched matmul's loop (16-row chunks x 8-token tiles, activations quantized
// once, untimed) over the Llama-1B projection shapes, with the multi-column kernel
// (vec_dot_cols, one row per call: "old") and the register-blocked tile (vec_dot_tile: "new")
// of the best ISA, alternated run by run so both see the same machine load; median GFLOP/s.
// Where the format has a packed layout (quant::Kernels::vec_dot_packed) its kernel runs in the
// same rotation ("packed": one 16-row group per chunk, as the backend's matmul hands it out).
//
// Threaded: bench_gemv_cpu [threads] [rows] [cols] [tokens]: gemv and a `tokens`-row (default
// 64) gemm through the CPU backend's matmul.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/timer.h"
#include "quant/quant.h"

using namespace sluice;

namespace {

// Fills rows x k weights of type t (64 distinct quantized rows, repeated) and returns them.
std::vector<uint8_t> make_weights(quant::Type t, int64_t rows, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0, 1);
  const int64_t rb = quant::row_bytes(t, k);
  std::vector<uint8_t> w(size_t(rb * rows));
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    if (r < 64) {
      for (auto& x : row) x = nd(rng);
      quant::kernels(t).quantize_row(row.data(), w.data() + r * rb, k);
    } else {
      std::copy(w.begin() + (r % 64) * rb, w.begin() + (r % 64 + 1) * rb, w.begin() + r * rb);
    }
  }
  return w;
}

int tile_ab(int64_t n_tok, int runs) {
  constexpr int64_t kRowBlock = 16, kTokenTile = 8;  // as src/backend/cpu/matmul.cpp
  struct Shape {
    const char* name;
    int64_t rows, k;
  };
  const Shape shapes[] = {{"attn_q/o", 2048, 2048}, {"ffn_gate/up", 8192, 2048}, {"ffn_down", 2048, 8192}};
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  std::printf("isa %s, 1 thread, %lld tokens, median of %d alternated runs\n", quant::isa_name(quant::best_isa()),
              (long long)n_tok, runs);
  std::printf("%-6s %-12s %-11s %6s %14s %14s %7s %14s %10s\n", "type", "shape", "rows x k", "tokens", "old GFLOP/s",
              "new GFLOP/s", "new/old", "packed GFLOP/s", "packed/old");
  for (quant::Type t : {quant::Type::kQ4_K, quant::Type::kQ6_K, quant::Type::kQ8_0, quant::Type::kQ4_0}) {
    const quant::Kernels& wk = quant::kernels(t);
    const bool has_cols = wk.vec_dot_cols != nullptr && wk.vec_dot_cols_isa == wk.vec_dot_isa;
    const bool has_tile = wk.vec_dot_tile != nullptr && wk.vec_dot_tile_isa == wk.vec_dot_isa;
    const bool has_packed = wk.vec_dot_packed != nullptr && wk.vec_dot_packed_isa >= wk.vec_dot_isa;
    for (const Shape& sh : shapes) {
      const auto w = make_weights(t, sh.rows, sh.k, rng);
      const int64_t w_row = quant::row_bytes(t, sh.k);
      const quant::Type at = wk.vec_dot_type;
      const int64_t a_row = quant::row_bytes(at, sh.k);
      std::vector<uint8_t> act(size_t(a_row * n_tok));
      std::vector<float> xf(size_t(sh.k));
      for (int64_t i = 0; i < n_tok; ++i) {
        for (auto& v : xf) v = nd(rng);
        quant::kernels(at).quantize_row(xf.data(), act.data() + i * a_row, sh.k);
      }
      std::vector<float> y_old(size_t(sh.rows * n_tok)), y_new(y_old.size()), y_pk(y_old.size());
      const int64_t gb = has_packed ? wk.packed_bytes(sh.k) : 0;
      std::vector<uint8_t> wpk(has_packed ? size_t(sh.rows / wk.packed_rows * gb) : 0);
      for (int64_t g = 0; has_packed && g < sh.rows / wk.packed_rows; ++g)
        wk.pack_rows(w.data() + g * wk.packed_rows * w_row, w_row, wpk.data() + g * gb, sh.k);
      auto run_packed = [&] {
        for (int64_t g = 0; g < sh.rows / wk.packed_rows; ++g)
          wk.vec_dot_packed(sh.k, wpk.data() + g * gb, 1, act.data(), a_row, int(n_tok),
                            y_pk.data() + g * wk.packed_rows, sh.rows);
      };
      auto run_old = [&] {
        float tile[kTokenTile];
        for (int64_t b = 0; b < sh.rows; b += kRowBlock)
          for (int64_t t0 = 0; t0 < n_tok; t0 += kTokenTile) {
            const int64_t t1 = std::min(n_tok, t0 + kTokenTile);
            for (int64_t o = b; o < std::min(sh.rows, b + kRowBlock); ++o) {
              const uint8_t* wr = w.data() + o * w_row;
              if (has_cols) {
                wk.vec_dot_cols(sh.k, wr, act.data() + t0 * a_row, a_row, int(t1 - t0), tile);
                for (int64_t i = t0; i < t1; ++i) y_old[size_t(i * sh.rows + o)] = tile[i - t0];
              } else {
                for (int64_t i = t0; i < t1; ++i) wk.vec_dot(sh.k, wr, act.data() + i * a_row, &y_old[size_t(i * sh.rows + o)]);
              }
            }
          }
      };
      auto run_new = [&] {
        for (int64_t b = 0; b < sh.rows; b += kRowBlock) {
          const int64_t e = std::min(sh.rows, b + kRowBlock);
          for (int64_t t0 = 0; t0 < n_tok; t0 += kTokenTile) {
            const int64_t t1 = std::min(n_tok, t0 + kTokenTile);
            wk.vec_dot_tile(sh.k, w.data() + b * w_row, w_row, int(e - b), act.data() + t0 * a_row, a_row,
                            int(t1 - t0), y_new.data() + t0 * sh.rows + b, sh.rows);
          }
        }
      };
      std::vector<double> t_old, t_new, t_pk;
      run_old();
      if (has_tile) run_new();
      if (has_packed) run_packed();
      for (int r = 0; r < runs; ++r) {
        core::Timer tm;
        run_old();
        t_old.push_back(tm.seconds());
        if (has_tile) {
          tm.reset();
          run_new();
          t_new.push_back(tm.seconds());
        }
        if (has_packed) {
          tm.reset();
          run_packed();
          t_pk.push_back(tm.seconds());
        }
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double flop = 2.0 * double(sh.rows) * double(sh.k) * double(n_tok);
      const double g_old = flop / median(t_old) / 1e9;
      char dims[32];
      std::snprintf(dims, sizeof dims, "%lldx%lld", (long long)sh.rows, (long long)sh.k);
      if (!has_tile && !has_packed) {
        std::printf("%-6s %-12s %-11s %6lld %14.1f %14s %7s\n", quant::type_name(t), sh.name, dims, (long long)n_tok,
                    g_old, "-", "-");
        continue;
      }
      // The paths must agree (f32 summation order only), or the comparison means nothing.
      auto agrees = [&](const std::vector<float>& y) {
        double num = 0, den = 0;
        for (size_t i = 0; i < y_old.size(); ++i) {
          num += (double(y_old[i]) - y[i]) * (double(y_old[i]) - y[i]);
          den += double(y_old[i]) * y_old[i];
        }
        return num <= 1e-10 * den;
      };
      char tl[32] = "             -       -";
      if (has_tile) {
        const double g_new = flop / median(t_new) / 1e9;
        std::snprintf(tl, sizeof tl, "%14.1f %7.2f", g_new, g_new / g_old);
      }
      char pk[48] = "             -          -";
      if (has_packed) {
        const double g_pk = flop / median(t_pk) / 1e9;
        std::snprintf(pk, sizeof pk, "%14.1f %10.2f", g_pk, g_pk / g_old);
      }
      const bool ok = (!has_tile || agrees(y_new)) && (!has_packed || agrees(y_pk));
      std::printf("%-6s %-12s %-11s %6lld %14.1f %s %s%s\n", quant::type_name(t), sh.name, dims, (long long)n_tok,
                  g_old, tl, pk, ok ? "" : "  MISMATCH");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "tile") == 0)
    return tile_ab(argc > 2 ? std::atoll(argv[2]) : 64, argc > 3 ? std::atoi(argv[3]) : 5);
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  const int64_t n_out = argc > 2 ? std::atoll(argv[2]) : 8192;
  const int64_t k = argc > 3 ? std::atoll(argv[3]) : 2048;
  const int64_t n_tok = argc > 4 ? std::atoll(argv[4]) : 64;
  if (n_tok < 1) {
    std::fprintf(stderr, "bench_gemv_cpu: tokens must be at least 1\n");
    return 2;
  }
  auto be = backend::make_cpu_backend({threads});
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  std::printf("isa %s, W [%lld x %lld]\n", quant::isa_name(quant::best_isa()), (long long)n_out, (long long)k);
  const std::string gemm_head = "gemm" + std::to_string(n_tok) + " GF/s";
  std::printf("%-6s %10s %10s %12s\n", "type", "gemv us", "GB/s", gemm_head.c_str());
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
    const backend::WeightView wp = *be->upload_weight(wv);  // the backend's packed copy where it has one
    auto x = *be->alloc(backend::DType::kF32, k, n_tok);
    auto y = *be->alloc(backend::DType::kF32, n_out, n_tok);
    std::vector<float> xs(size_t(k * n_tok));
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
    double pgemv = 0, pgemm = 0;
    if (wp.packed) {
      be->matmul(wp, x.first_rows(1), y.first_rows(1));
      tm.reset();
      for (int i = 0; i < reps; ++i) be->matmul(wp, x.first_rows(1), y.first_rows(1));
      pgemv = tm.seconds() / reps;
      tm.reset();
      be->matmul(wp, x, y);
      pgemm = tm.seconds();
    }
    std::printf("%-6s %10.1f %10.2f %12.1f", quant::type_name(t), gemv * 1e6, double(w.size()) / gemv / 1e9,
                2.0 * double(n_out) * double(k) * double(n_tok) / gemm / 1e9);
    if (wp.packed)
      std::printf("   packed: %10.1f %10.2f %12.1f", pgemv * 1e6, double(w.size()) / pgemv / 1e9,
                  2.0 * double(n_out) * double(k) * double(n_tok) / pgemm / 1e9);
    std::printf("\n");
  }
}
