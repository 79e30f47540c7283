// The start-up CPU probe (stream/cpu_probe.h) on this machine's CPU backend, small sizes: the
// one-token rate and the batched rate (the planner's cpu_flops) are measured, positive and
// finite, and the description names the batched rate and the kernels behind it.
#include <cmath>
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
