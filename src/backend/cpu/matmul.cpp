// Matrix products y = x W^T for weights in any quant format. Activations are quantized once per
// call to the weight format's vec_dot_type (Q8_0, Q8_1, Q8_K, F16, ...), exactly the pairing of
// llama.cpp's CPU backend, then every output element is one quant vec_dot.
//
// Decode (one row of x) is bound by reading W once: output rows are split into chunks handed
// out dynamically across threads. Prefill (many rows) reuses each weight row across a tile of
// tokens while it is in L1, so W is streamed from memory once per tile rather than per token.
#include <algorithm>
#include <string>

#include "backend/cpu/cpu_backend.h"

namespace sluice::backend::cpu {
namespace {

// Output rows per work chunk in the batched path (16 rows of a 4096-wide Q4_K matrix are 37 KiB:
// they stay in L2 while a token tile streams past).
constexpr int64_t kRowBlock = 16;
// Tokens per tile: the tile's quantized activations (<= 32 x 4.5 KiB for 4096 wide) stay in L2.
constexpr int64_t kTokenTile = 32;

}  // namespace

void CpuBackend::matmul(const WeightView& w, const Tensor& x, const Tensor& y) {
  SLUICE_CHECK(x.dtype == DType::kF32 && y.dtype == DType::kF32, "matmul: f32 activations expected");
  SLUICE_CHECK(x.cols == w.ne0 && y.cols == w.ne1 && x.rows == y.rows,
               "matmul: shapes x[" + std::to_string(x.rows) + "," + std::to_string(x.cols) + "] W[" +
                   std::to_string(w.ne0) + "," + std::to_string(w.ne1) + "] y[" + std::to_string(y.rows) +
                   "," + std::to_string(y.cols) + "]");
  const quant::Kernels& wk = quant::kernels(w.type);
  SLUICE_CHECK(wk.vec_dot != nullptr, std::string("matmul: no vec_dot for ") + quant::type_name(w.type));
  const quant::Type at = wk.vec_dot_type;
  const quant::Kernels& ak = quant::kernels(at);
  const int64_t n_tok = x.rows;
  const int64_t n_out = w.ne1;
  const int64_t k = w.ne0;
  const int64_t w_row = w.row_bytes();
  const int64_t a_row = quant::row_bytes(at, k);
  const auto* wd = static_cast<const uint8_t*>(w.data);

  // Activations in vec_dot_type, row t at act + t * a_stride.
  const uint8_t* act;
  int64_t a_stride;
  if (at == quant::Type::kF32) {
    act = static_cast<const uint8_t*>(x.data);
    a_stride = x.stride * 4;
  } else {
    SLUICE_CHECK(act_q_.reserve(size_t(n_tok * a_row)), "matmul: out of memory for activations");
    uint8_t* q = act_q_.data();
    for_rows(n_tok, 1, n_tok * k, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) ak.quantize_row(static_cast<const float*>(x.data) + t * x.stride, q + t * a_row, k);
    });
    act = q;
    a_stride = a_row;
  }
  auto* yd = static_cast<float*>(y.data);
  const int64_t y_stride = y.stride;

  if (n_tok == 1) {
    // Enough chunks (8 per thread) that a descheduled thread does not hold up the op.
    const int64_t grain = std::max<int64_t>(4, n_out / (8 * pool_.size()));
    for_rows(n_out, grain, n_out * k, [&](int64_t b, int64_t e, int) {
      for (int64_t o = b; o < e; ++o) wk.vec_dot(k, wd + o * w_row, act, yd + o);
    });
    return;
  }
  for_rows(n_out, kRowBlock, n_out * k * n_tok, [&](int64_t b, int64_t e, int) {
    for (int64_t t0 = 0; t0 < n_tok; t0 += kTokenTile) {
      const int64_t t1 = std::min(n_tok, t0 + kTokenTile);
      for (int64_t o = b; o < e; ++o) {
        const uint8_t* wr = wd + o * w_row;
        for (int64_t t = t0; t < t1; ++t) wk.vec_dot(k, wr, act + t * a_stride, yd + t * y_stride + o);
      }
    }
  });
}

}  // namespace sluice::backend::cpu
