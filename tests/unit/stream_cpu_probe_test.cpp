// The start-up CPU probe (stream/cpu_probe.h) on this machine's CPU backend, small sizes: the
// one-token rate and the batched rate (the planner's cpu_flops) are measured, positive and
// finite, and the description names the batched rate and the kernels behind it.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "backend/backend.h"
#include "stream/cpu_probe.h"
#include "test_util.h"

namespace sluice::stream {
namespace {

CpuProbeOptions small(quant::Type t, int batch_tokens) {
  CpuProbeOptions o;
  o.type = t;
  o.ne0 = 512;
  o.bytes = 4ull << 20;
  o.reps = 2;
  o.batch_tokens = batch_tokens;
  o.batch_bytes = 1ull << 20;
  return o;
}

TEST(CpuProbe, MeasuresTheBatchedRate) {
  backend::CpuOptions co;
  co.n_threads = 2;
  const auto cpu = backend::make_cpu_backend(co);
  for (quant::Type t : {quant::Type::kQ4_K, quant::Type::kQ8_0}) {
    auto p = probe_cpu(*cpu, 2, small(t, 8));
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    EXPECT_GT(p->alone, 0.0);
    EXPECT_TRUE(std::isfinite(p->alone));
    EXPECT_GT(p->flops, 0.0) << quant::type_name(t);
    EXPECT_TRUE(std::isfinite(p->flops));
    EXPECT_EQ(p->batch_tokens, 8);
    EXPECT_EQ(p->shared, 0.0);  // no copy engine given
    const std::string d = p->describe();
    EXPECT_NE(d.find("8 tokens"), std::string::npos) << d;
    EXPECT_NE(d.find("Tops/s"), std::string::npos) << d;
  }
}

TEST(CpuProbe, BatchedRateIsOptional) {
  backend::CpuOptions co;
  co.n_threads = 1;
  const auto cpu = backend::make_cpu_backend(co);
  auto p = probe_cpu(*cpu, 1, small(quant::Type::kQ4_K, 0));
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_GT(p->alone, 0.0);
  EXPECT_EQ(p->flops, 0.0);
  EXPECT_EQ(p->describe().find("Tops/s"), std::string::npos) << p->describe();
}

// The copies asked for while the products are timed again must outlast them even when sharing
// DRAM slows the products down (here: up to 3x their time alone, at the nominal 50 GB/s the
// probe sizes them by), so no timed repetition runs without them; the shared rates are the
// products' timed inside copy_during and the H2D rate it returns.
TEST(CpuProbe, CopiesOutlastTheSharedProducts) {
  backend::CpuOptions co;
  co.n_threads = 1;
  const auto cpu = backend::make_cpu_backend(co);
  CpuProbeOptions o = small(quant::Type::kQ4_K, 0);
  o.bytes = 64ull << 20;  // products long enough that the copies' 256 MiB floor does not decide
  uint64_t asked = 0;
  auto copy = [&](uint64_t bytes, const std::function<void()>& during) -> Result<double> {
    asked = bytes;
    during();
    return 42e9;
  };
  auto p = probe_cpu(*cpu, 1, o, copy);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_GT(p->shared, 0.0);
  EXPECT_EQ(p->h2d_shared, 42e9);
  const double alone_s = double(o.bytes) / p->alone * double(o.reps + 1);  // ~ the probe's own estimate
  const double want = std::min(2.9 * alone_s * 50e9, 8.0 * double(1ull << 30));
  EXPECT_GE(double(asked), std::max(want, 256.0 * (1 << 20))) << "copies of " << asked << " bytes";
}

TEST(CpuProbe, RejectsBadOptions) {
  backend::CpuOptions co;
  co.n_threads = 1;
  const auto cpu = backend::make_cpu_backend(co);
  CpuProbeOptions o = small(quant::Type::kQ4_K, 8);
  o.ne0 = 100;  // not a multiple of Q4_K's 256-element block
  EXPECT_FALSE(probe_cpu(*cpu, 1, o).is_ok());
  o = small(quant::Type::kQ4_K, 8);
  o.reps = 0;
  EXPECT_FALSE(probe_cpu(*cpu, 1, o).is_ok());
}

}  // namespace
}  // namespace sluice::stream
