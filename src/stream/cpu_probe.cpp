#include "stream/cpu_probe.h"

#include "stream/host_memory.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace sluice::stream {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

std::string CpuProbe::describe() const {
  char buf[192];
  if (shared > 0) {
    std::snprintf(buf, sizeof buf, "%s%s on %d threads (0: all cores): %.1f GB/s alone, %.1f GB/s + H2D %.1f GB/s together",
                  quant::type_name(type), packed ? " packed" : "", threads, alone / 1e9, shared / 1e9, h2d_shared / 1e9);
  } else {
    std::snprintf(buf, sizeof buf, "%s%s on %d threads (0: all cores): %.1f GB/s", quant::type_name(type),
                  packed ? " packed" : "", threads, alone / 1e9);
  }
  std::string s = buf;
  if (flops > 0) {
    std::snprintf(buf, sizeof buf, "; %d tokens %.2f Tops/s (%s kernels)", batch_tokens, flops / 1e12,
                  quant::isa_name(quant::kernels(type).vec_dot_packed_isa));
    s += buf;
  }
  return s;
}

Result<CpuProbe> probe_cpu(backend::Backend& cpu, int threads, const CpuProbeOptions& opts,
                           const std::function<Result<double>(uint64_t, const std::function<void()>&)>& copy_during) {
  if (opts.ne0 <= 0 || opts.reps < 1 || opts.batch_tokens < 0) return invalid_argument("cpu probe: bad options");
  const quant::Kernels& k = quant::kernels(opts.type);
  if (!k.vec_dot || !k.quantize_row || !quant::validate_row(opts.type, opts.ne0).is_ok()) {
    return invalid_argument(std::string("cpu probe: no product kernel for ") + quant::type_name(opts.type) +
                            " rows of " + std::to_string(opts.ne0));
  }
  const int64_t rb = quant::row_bytes(opts.type, opts.ne0);
  const int64_t rows = std::max<int64_t>(16, int64_t(opts.bytes / uint64_t(rb)) / 16 * 16);
  // A few rows quantized from random values, repeated: valid blocks (finite scales) everywhere,
  // while every byte still comes from DRAM.
  constexpr int64_t kSeedRows = 16;
  std::vector<float> vals(size_t(opts.ne0));
  std::vector<uint8_t> seed(size_t(rb * kSeedRows));
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int64_t r = 0; r < kSeedRows; ++r) {
    for (float& f : vals) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      f = float(int64_t(x % 2001) - 1000) * 1e-3f;
    }
    k.quantize_row(vals.data(), seed.data() + r * rb, opts.ne0);
  }
  std::vector<uint8_t> w(size_t(rb * rows));
  for (int64_t r = 0; r < rows; r += kSeedRows) {
    std::memcpy(w.data() + r * rb, seed.data(), size_t(rb * std::min(kSeedRows, rows - r)));
  }
  SLUICE_ASSIGN_OR_RETURN(backend::Tensor xt, cpu.alloc(backend::DType::kF32, opts.ne0, 1));
  SLUICE_ASSIGN_OR_RETURN(backend::Tensor yt, cpu.alloc(backend::DType::kF32, rows, 1));
  std::vector<float> xin(size_t(opts.ne0), 0.5f);
  cpu.upload(xt, xin.data());
  backend::WeightView wv{opts.type, opts.ne0, rows, w.data(), false};
  // The layout the CPU computes hybrid layers from: packed where the backend has one.
  HostBlock packed;
  if (const int64_t pb = cpu.repacked_bytes(wv); pb > 0) {
    SLUICE_ASSIGN_OR_RETURN(packed, alloc_host_block(size_t(pb), "the CPU probe"));
    wv = cpu.repack_weight(wv, packed.get());
    std::vector<uint8_t>().swap(w);
  }
  const double bytes = double(rb) * double(rows);
  // Median of opts.reps products of `work` units each, in units per second (the first product
  // warms up and is not counted).
  auto rate_of = [&](const backend::WeightView& wt, const backend::Tensor& x, const backend::Tensor& y, double work) {
    std::vector<double> rates;
    for (int i = 0; i <= opts.reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      cpu.matmul(wt, x, y);
      cpu.sync();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i > 0) rates.push_back(work / std::max(s, 1e-9));
    }
    return median(rates);
  };
  auto time_products = [&] { return rate_of(wv, xt, yt, bytes); };
  CpuProbe p;
  p.type = opts.type;
  p.threads = threads;
  p.packed = wv.packed;
  p.alone = time_products();
  if (opts.batch_tokens > 0) {
    // The first rows of the same matrix (whole packed groups are a packed matrix of their own).
    const backend::WeightView wb = wv.rows(0, std::clamp<int64_t>(int64_t(opts.batch_bytes / uint64_t(rb)) / 16 * 16, 16, rows));
    SLUICE_ASSIGN_OR_RETURN(backend::Tensor xb, cpu.alloc(backend::DType::kF32, opts.ne0, opts.batch_tokens));
    SLUICE_ASSIGN_OR_RETURN(backend::Tensor yb, cpu.alloc(backend::DType::kF32, wb.ne1, opts.batch_tokens));
    std::vector<float> xs(size_t(opts.ne0) * size_t(opts.batch_tokens));
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = float(int(i % 17) - 8) * 0.0625f;
    cpu.upload(xb, xs.data());
    p.flops = rate_of(wb, xb, yb, 2.0 * double(opts.batch_tokens) * double(opts.ne0) * double(wb.ne1));
    p.batch_tokens = opts.batch_tokens;
  }
  if (copy_during) {
    // Copies sized to outlast the products (three times their time alone, at a nominal 50 GB/s),
    // so every timed product shares DRAM with them; copy_during counts only the copies done
    // while the products ran. (Sized to the products' time alone, the copies ended first once
    // they slowed the products, and the last repetitions ran alone: on the H200 host the 70B's
    // CPU layers then ran at 64-70 GB/s in a token against 97-103 "together" from the probe.)
    const double cpu_s = bytes / p.alone * double(opts.reps + 1);
    const uint64_t copy_bytes = uint64_t(std::clamp(3.0 * cpu_s * 50e9, 256.0 * (1 << 20), 8.0 * (1ull << 30)));
    double shared = 0;
    auto h2d = copy_during(copy_bytes, [&] { shared = time_products(); });
    if (h2d.is_ok()) {
      p.shared = shared;
      p.h2d_shared = *h2d;
    }
  }
  return p;
}

}  // namespace sluice::stream
