// Causal GQA attention over an F16 (or F32) KV cache, with the precision choices of llama.cpp's
// CPU path without flash attention, so greedy outputs agree with it: q is rounded to f16 for the
// q.k dot (f32 accumulation), the softmax is f32 with a double-precision sum, and the
// probabilities are rounded to f16 before weighting V (f32 accumulation).
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "quant/half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sluice::backend::cpu {
namespace {

// Softmax numerators in place: scores[j] = exp(scores[j] - mx); returns 1 / their sum, summed in
// double as llama.cpp does. Shared by the F16C path and the portable path.
float exp_inverse_sum(float* scores, int64_t n_kv, float mx) {
  double sum = 0;
  for (int64_t j = 0; j < n_kv; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += double(scores[j]);
  }
  return float(1.0 / sum);
}

#if defined(__x86_64__)
// One (query row, head) over an F16 cache with F16C/FMA: the per-position dot and the V update
// are 8-wide conversions and FMAs instead of a kernel call per position, which at a few hundred
// positions is most of a small model's decode time. Same rounding points as the generic path.
// Precondition: hd % 8 == 0; scratch `qf` holds hd floats, `scores` n_kv floats.
__attribute__((target("avx2,fma,f16c"))) void attend_f16_avx2(const float* q, const uint16_t* k, int64_t k_stride,
                                                               const uint16_t* v, int64_t v_stride, int64_t n_kv,
                                                               int64_t hd, float scale, float* qf, float* scores,
                                                               float* out) {
  for (int64_t i = 0; i < hd; i += 8) {  // q rounded to f16, as the f16 dot product sees it
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(q + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(qf + i, _mm256_cvtph_ps(h));
  }
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n_kv; ++j) {
    const uint16_t* kr = k + j * k_stride;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < hd; i += 8) {
      const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kr + i)));
      acc = _mm256_fmadd_ps(kv, _mm256_loadu_ps(qf + i), acc);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    const float s = _mm_cvtss_f32(s4) * scale;
    scores[j] = s;
    mx = std::max(mx, s);
  }
  const float inv = exp_inverse_sum(scores, n_kv, mx);
  for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n_kv; ++j) {
    const float pj = _cvtsh_ss(_cvtss_sh(scores[j] * inv, _MM_FROUND_TO_NEAREST_INT));  // probabilities in f16
    if (pj == 0.0f) continue;
    const __m256 p = _mm256_set1_ps(pj);
    const uint16_t* vr = v + j * v_stride;
    for (int64_t i = 0; i < hd; i += 8) {
      const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + i)));
      _mm256_storeu_ps(out + i, _mm256_fmadd_ps(p, vv, _mm256_loadu_ps(out + i)));
    }
  }
}
#endif

}  // namespace

bool cpu_has_f16c_fma() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

void CpuBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                           const AttentionParams& p) {
  const int64_t hd = p.head_dim;
  SLUICE_CHECK(q.dtype == DType::kF32 && out.dtype == DType::kF32, "attention: f32 q/out expected");
  SLUICE_CHECK(k_cache.dtype == v_cache.dtype, "attention: k and v caches differ in dtype");
  SLUICE_CHECK(p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0, "attention: bad head counts");
  SLUICE_CHECK(q.cols == p.n_head * hd && out.cols == q.cols && out.rows == q.rows, "attention: bad q/out shape");
  SLUICE_CHECK(k_cache.cols == p.n_head_kv * hd && v_cache.cols == k_cache.cols, "attention: bad cache shape");
  SLUICE_CHECK(p.pos0 >= 0 && p.pos0 + q.rows <= k_cache.rows, "attention: positions beyond cache");
  const int64_t n_ctx = p.pos0 + q.rows;
  const int group = p.n_head / p.n_head_kv;
  const bool f16 = k_cache.dtype == DType::kF16;
  const quant::Kernels& h = quant::kernels(quant::Type::kF16);
  const quant::Kernels& f = quant::kernels(quant::Type::kF32);

  // Per-thread scratch: scores[n_ctx] | v row[hd] | acc[hd] | q in f16[hd] (as floats' space).
  const size_t need = size_t(n_ctx + 3 * hd) * sizeof(float);
  for (auto& s : scratch_) SLUICE_CHECK(s.reserve(need), "attention: out of memory for scratch");

  const int64_t n_items = q.rows * p.n_head;
  const int64_t work = n_items * n_ctx * hd;
  for_rows(n_items, 1, work, [&](int64_t b, int64_t e, int ith) {
    float* scores = reinterpret_cast<float*>(scratch_[size_t(ith)].data());
    float* vrow = scores + n_ctx;
    float* acc = vrow + hd;
    void* qv = acc + hd;
    for (int64_t item = b; item < e; ++item) {
      const int64_t t = item / p.n_head;
      const int64_t head = item % p.n_head;
      const int64_t kvh = head / group;
      const int64_t n_kv = p.pos0 + t + 1;
      const float* qr = static_cast<const float*>(q.data) + t * q.stride + head * hd;
      const uint8_t elem = f16 ? 2 : 4;
      const auto* kb = static_cast<const uint8_t*>(k_cache.data) + kvh * hd * elem;
      const auto* vb = static_cast<const uint8_t*>(v_cache.data) + kvh * hd * elem;
      const int64_t ks = k_cache.stride * elem, vs = v_cache.stride * elem;

      float* orow = static_cast<float*>(out.data) + t * out.stride + head * hd;
#if defined(__x86_64__)
      if (f16 && simd_f16_ && hd % 8 == 0) {
        attend_f16_avx2(qr, reinterpret_cast<const uint16_t*>(kb), k_cache.stride, reinterpret_cast<const uint16_t*>(vb),
                        v_cache.stride, n_kv, hd, p.scale, vrow, scores, orow);
        continue;
      }
#endif
      const quant::Kernels& dot = f16 ? h : f;
      dot.quantize_row(qr, qv, hd);
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n_kv; ++j) {
        float s;
        dot.vec_dot(hd, kb + j * ks, qv, &s);
        s *= p.scale;
        scores[j] = s;
        mx = std::max(mx, s);
      }
      const float inv = exp_inverse_sum(scores, n_kv, mx);
      std::fill(acc, acc + hd, 0.0f);
      for (int64_t j = 0; j < n_kv; ++j) {
        float pj = scores[j] * inv;
        if (f16) pj = quant::fp16_to_fp32(quant::fp32_to_fp16(pj));
        if (pj == 0.0f) continue;
        dot.dequantize_row(vb + j * vs, vrow, hd);
        for (int64_t d = 0; d < hd; ++d) acc[d] += pj * vrow[d];
      }
      std::copy(acc, acc + hd, orow);
    }
  });
}

}  // namespace sluice::backend::cpu
