// Dev-only: bit-level comparison of sluice's CPU kernels with a llama.cpp CPU build's (ggml-cpu)
// on random data. Not part of the sluice build: it links sluice_quant and sluice_backend_cpu
// from a sluice build and the static ggml libraries of a llama.cpp build (see op_parity.sh).
//
// For each weight format it quantizes random rows with ggml, quantizes random activations with
// both sides' activation quantizer (must agree byte for byte), then compares every dot product
// of ggml's vec_dot with sluice's vec_dot and vec_dot_cols (each ISA table this CPU runs) bit
// for bit. It also compares SwiGLU (ggml_vec_swiglu_f32) with the CPU backend's swiglu.
// Prints, per kernel, how many of the results differ in any bit and the largest relative gap.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "quant/quant.h"

extern "C" void ggml_vec_swiglu_f32(int n, float* y, const float* x, const float* g);

namespace {

using sluice::quant::Isa;
using sluice::quant::Type;

struct Tally {
  int n = 0, diff = 0;
  double worst = 0;
  void add(float a, float b) {
    ++n;
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    if (ua != ub) {
      ++diff;
      worst = std::max(worst, std::fabs(double(a) - double(b)) / std::max(1e-30, std::fabs(double(b))));
    }
  }
  void print(const char* what) const {
    std::printf("  %-34s %6d/%-6d differ%s", what, diff, n, diff ? "" : " (bit-identical)");
    if (diff) std::printf(", worst relative %.2e", worst);
    std::printf("\n");
  }
};

void check_format(ggml_type gt, Type st, int64_t n, int rows, int cols, std::mt19937& rng) {
  const auto* tr = ggml_get_type_traits_cpu(gt);
  const ggml_type at = tr->vec_dot_type;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> wf(size_t(rows) * n), af(size_t(cols) * n);
  for (auto& v : wf) v = nd(rng);
  for (auto& v : af) v = nd(rng) * 2.0f;
  const size_t wrow = ggml_row_size(gt, n), arow = ggml_row_size(at, n);
  std::vector<uint8_t> w(wrow * rows), a(arow * cols), a_ours(arow * cols);
  ggml_quantize_chunk(gt, wf.data(), w.data(), 0, rows, n, nullptr);
  for (int c = 0; c < cols; ++c) {
    if (at == GGML_TYPE_F32) {
      std::memcpy(a.data() + c * arow, af.data() + size_t(c) * n, arow);
    } else {
      // The activation format's own quantizer (the weight type's from_float is its weight quantizer).
      ggml_get_type_traits_cpu(at)->from_float(af.data() + size_t(c) * n, a.data() + c * arow, n);
    }
  }
  std::printf("%s (n=%lld, %d rows x %d columns), activations %s:\n", ggml_type_name(gt), (long long)n, rows, cols,
              ggml_type_name(at));
  std::vector<float> ref(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      tr->vec_dot(int(n), &ref[size_t(r) * cols + c], 0, w.data() + r * wrow, 0, a.data() + c * arow, 0, 1);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    const sluice::quant::Kernels* k = sluice::quant::kernels_for(st, isa);
    if (!k) continue;
    const sluice::quant::Kernels* ak = sluice::quant::kernels_for(k->vec_dot_type, isa);
    if (at != GGML_TYPE_F32) {
      int bad = 0;
      for (int c = 0; c < cols; ++c) {
        ak->quantize_row(af.data() + size_t(c) * n, a_ours.data() + c * arow, n);
        bad += std::memcmp(a_ours.data() + c * arow, a.data() + c * arow, arow) != 0;
      }
      std::printf("  %s activation quantizer: %d/%d rows differ\n", sluice::quant::isa_name(isa), bad, cols);
    }
    Tally td, tc;
    std::vector<float> out(cols);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        float v;
        k->vec_dot(n, w.data() + r * wrow, a.data() + c * arow, &v);
        td.add(v, ref[size_t(r) * cols + c]);
      }
      if (k->vec_dot_cols) {
        k->vec_dot_cols(n, w.data() + r * wrow, a.data(), int64_t(arow), cols, out.data());
        for (int c = 0; c < cols; ++c) tc.add(out[c], ref[size_t(r) * cols + c]);
      }
    }
    char name[96];
    std::snprintf(name, sizeof name, "vec_dot (%s code)", sluice::quant::isa_name(k->vec_dot_isa));
    td.print(name);
    if (k->vec_dot_cols) {
      std::snprintf(name, sizeof name, "vec_dot_cols (%s code)", sluice::quant::isa_name(k->vec_dot_cols_isa));
      tc.print(name);
    }
  }
}

void check_swiglu(std::mt19937& rng) {
  const int n = 4096 + 7;
  std::normal_distribution<float> nd(0.0f, 4.0f);
  std::vector<float> g(n), u(n), ref(n), ours(n);
  for (auto& v : g) v = nd(rng);
  for (auto& v : u) v = nd(rng);
  g[0] = -100.0f;  // exp overflow range
  g[1] = 100.0f;
  ggml_vec_swiglu_f32(n, ref.data(), g.data(), u.data());
  sluice::backend::CpuOptions opts;
  opts.n_threads = 1;
  auto be = sluice::backend::make_cpu_backend(opts);
  using sluice::backend::Tensor;
  auto t = [n](float* p) {
    Tensor x;
    x.data = p;
    x.dtype = sluice::backend::DType::kF32;
    x.rows = 1;
    x.cols = n;
    x.stride = n;
    return x;
  };
  be->swiglu(t(g.data()), t(u.data()), t(ours.data()));
  Tally ts;
  for (int i = 0; i < n; ++i) ts.add(ours[i], ref[i]);
  std::printf("swiglu (n=%d):\n", n);
  ts.print("CpuBackend::swiglu");
}

}  // namespace

int main() {
  ggml_cpu_init();
  std::mt19937 rng(1234);
  const int rows = 64, cols = 13;
  check_format(GGML_TYPE_Q4_1, Type::kQ4_1, 576, rows, cols, rng);
  check_format(GGML_TYPE_Q4_1, Type::kQ4_1, 1536, rows, cols, rng);
  check_format(GGML_TYPE_Q8_0, Type::kQ8_0, 576, rows, cols, rng);
  check_format(GGML_TYPE_Q4_0, Type::kQ4_0, 576, rows, cols, rng);
  check_format(GGML_TYPE_Q6_K, Type::kQ6_K, 512, rows, cols, rng);
  check_format(GGML_TYPE_Q4_K, Type::kQ4_K, 512, rows, cols, rng);
  check_format(GGML_TYPE_F16, Type::kF16, 576, rows, cols, rng);
  check_swiglu(rng);
  return 0;
}
