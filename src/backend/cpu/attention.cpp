// Causal GQA attention over an F16 (or F32) KV cache, with the precision choices of llama.cpp's
// CPU path without flash attention, so greedy outputs agree with it: q is rounded to f16 for the
// q.k dot (f32 accumulation), the softmax is f32 with a double-precision sum, and the
// probabilities are rounded to f16 before weighting V (f32 accumulation).
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/exp_avx512.h"
#include "quant/half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// GCC 12's AVX-512 headers give some intrinsics a don't-care operand made from a
// self-initialised variable, and -Wuninitialized then flags every caller; it is never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // clang has no such group and would warn about the pragma
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
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

// The cache row of the j-th key a query attends to: `rows` is the paged cache's map from its first
// key on (Tensor::row_map), or nullptr where the keys are consecutive rows from the first one.
inline int64_t cache_row(const int32_t* rows, int64_t j) { return rows ? int64_t(rows[j]) : j; }

#if defined(__x86_64__)
// One (query row, head) over an F16 cache with F16C/FMA: the per-position dot and the V update
// are 8-wide conversions and FMAs instead of a kernel call per position, which at a few hundred
// positions is most of a small model's decode time. Same rounding points as the generic path.
// Precondition: hd % 8 == 0; scratch `qf` holds hd floats, `scores` n_kv floats.
__attribute__((target("avx2,fma,f16c"))) void attend_f16_avx2(const float* q, const uint16_t* k, int64_t k_stride,
                                                               const uint16_t* v, int64_t v_stride,
                                                               const int32_t* rows, int64_t n_kv, int64_t hd,
                                                               float scale, float* qf, float* scores, float* out) {
  for (int64_t i = 0; i < hd; i += 8) {  // q rounded to f16, as the f16 dot product sees it
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(q + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(qf + i, _mm256_cvtph_ps(h));
  }
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n_kv; ++j) {
    const uint16_t* kr = k + cache_row(rows, j) * k_stride;
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
    const uint16_t* vr = v + cache_row(rows, j) * v_stride;
    for (int64_t i = 0; i < hd; i += 8) {
      const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + i)));
      _mm256_storeu_ps(out + i, _mm256_fmadd_ps(p, vv, _mm256_loadu_ps(out + i)));
    }
  }
}

// One (query row, head) over an F16 cache in the f32 operation order of llama.cpp's CPU
// attention without flash attention, built for AVX-512 (F, no FP16), so the result is equal to
// its bit for bit. Its graph is q.k = mul_mat(K, q in f16), softmax, out = mul_mat(V^T, p in
// f16). f16 x f16 products are exact in f32, so only the order of additions matters, and that
// depends on the batch:
// - one token (decode): every dot product is ggml's f16 vec_dot: four 16-lane accumulators over
//   64-element steps, then (a0 + a2) + (a1 + a3) and a tree sum of the 16 lanes
//   (_mm512_reduce_add_ps), the remainder (n % 64) added in double;
// - several tokens (prefill): both products go through its tinyBLAS f16 GEMM: one 16-lane
//   accumulator per output over 16-element steps, then the same tree sum of the lanes.
// Its key count is padded to a multiple of 256 with masked positions, whose probabilities are
// exactly 0: they add nothing, so we skip them, and the V-side dot has no remainder (position j
// goes to lane j % 64, or j % 16 batched). The softmax: scores * scale, e^(s - max) with
// exp_avx512 16 positions at a time, each group's tree sum added in double.
// Preconditions: hd % 16 == 0. Scratch: qf hd floats, scores n_kv rounded up to 16, part 64 * hd.
__attribute__((target("avx512f"))) inline __m512 ld16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
__attribute__((target("avx512f,avx512dq,f16c,fma"))) void attend_f16_avx512(
    const float* q, const uint16_t* k, int64_t k_stride, const uint16_t* v, int64_t v_stride, const int32_t* rows,
    int64_t n_kv, int64_t hd, float scale, bool batched, float* qf, float* scores, float* part, float* out) {
  const int64_t main = batched ? hd : hd & ~int64_t(63);
  for (int64_t i = 0; i < hd; ++i) qf[i] = _cvtsh_ss(_cvtss_sh(q[i], _MM_FROUND_TO_NEAREST_INT));
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n_kv; ++j) {
    const uint16_t* kr = k + cache_row(rows, j) * k_stride;
    double sum;
    if (batched) {
      __m512 a = _mm512_setzero_ps();
      for (int64_t i = 0; i < hd; i += 16) a = _mm512_fmadd_ps(ld16(kr + i), _mm512_loadu_ps(qf + i), a);
      sum = _mm512_reduce_add_ps(a);
    } else {
      __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      for (int64_t i = 0; i < main; i += 64)
        for (int c = 0; c < 4; ++c) a[c] = _mm512_fmadd_ps(ld16(kr + i + 16 * c), _mm512_loadu_ps(qf + i + 16 * c), a[c]);
      sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3])));
    }
    for (int64_t i = main; i < hd; ++i) sum += double(_cvtsh_ss(kr[i]) * qf[i]);
    const float s = float(sum) * scale;
    scores[j] = s;
    mx = std::max(mx, s);
  }
  // Softmax over groups of 16 positions; lanes past n_kv are masked (exp = 0) as in llama.cpp.
  const int64_t n16 = (n_kv + 15) & ~int64_t(15);
  for (int64_t j = n_kv; j < n16; ++j) scores[j] = -std::numeric_limits<float>::infinity();
  double total = 0;
  for (int64_t j = 0; j < n16; j += 16) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(scores + j), _mm512_set1_ps(mx)));
    _mm512_storeu_ps(scores + j, e);
    total += double(_mm512_reduce_add_ps(e));
  }
  const float inv = float(1.0 / total);
  // V side: part[o][d] accumulates the positions j with j % lanes == o in order, vectorised
  // over d; then the lanes are reduced in the order of llama.cpp's kernel.
  const int64_t lanes = batched ? 16 : 64;
  std::fill(part, part + lanes * hd, 0.0f);
  for (int64_t j = 0; j < n_kv; ++j) {
    const float pj = _cvtsh_ss(_cvtss_sh(scores[j] * inv, _MM_FROUND_TO_NEAREST_INT));
    if (pj == 0.0f) continue;
    const __m512 p = _mm512_set1_ps(pj);
    const uint16_t* vr = v + cache_row(rows, j) * v_stride;
    float* acc = part + (j & (lanes - 1)) * hd;
    for (int64_t d = 0; d < hd; d += 16)
      _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(ld16(vr + d), p, _mm512_loadu_ps(acc + d)));
  }
  for (int64_t d = 0; d < hd; d += 16) {
    const float* pd = part + d;
    __m512 c[16];
    for (int l = 0; l < 16; ++l)
      c[l] = batched ? _mm512_loadu_ps(pd + l * hd)
                     : _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(pd + l * hd), _mm512_loadu_ps(pd + (32 + l) * hd)),
                                     _mm512_add_ps(_mm512_loadu_ps(pd + (16 + l) * hd), _mm512_loadu_ps(pd + (48 + l) * hd)));
    for (int l = 0; l < 8; ++l) c[l] = _mm512_add_ps(c[l + 8], c[l]);
    for (int l = 0; l < 4; ++l) c[l] = _mm512_add_ps(c[l + 4], c[l]);
    _mm512_storeu_ps(out + d, _mm512_add_ps(_mm512_add_ps(c[0], c[2]), _mm512_add_ps(c[1], c[3])));
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
  SLUICE_CHECK(p.window >= 0, "attention: negative window");
  SLUICE_CHECK(k_cache.row_map == v_cache.row_map, "attention: k and v caches differ in paging");
  const int64_t n_ctx = p.pos0 + q.rows;
  const int group = p.n_head / p.n_head_kv;
  const bool f16 = k_cache.dtype == DType::kF16;
  const quant::Kernels& h = quant::kernels(quant::Type::kF16);
  const quant::Kernels& f = quant::kernels(quant::Type::kF32);

  // Per-thread scratch: scores[n_ctx + 16] | v row[hd] | acc[64 * hd] | q in f16[hd] (as floats'
  // space); acc is 64 rows for the AVX-512 path's per-lane partial sums.
#if defined(__x86_64__)
  const bool avx512 = cpu_has_avx512_exp();
#endif
  const size_t need = size_t(n_ctx + 16 + 66 * hd) * sizeof(float);
  for (auto& s : scratch_) SLUICE_CHECK(s.reserve(need), "attention: out of memory for scratch");

  const int64_t n_items = q.rows * p.n_head;
  const int64_t work = n_items * n_ctx * hd;
  for_rows(n_items, 1, work, [&](int64_t b, int64_t e, int ith) {
    float* scores = reinterpret_cast<float*>(scratch_[size_t(ith)].data());
    float* vrow = scores + n_ctx + 16;
    float* acc = vrow + hd;
    void* qv = acc + 64 * hd;
    for (int64_t item = b; item < e; ++item) {
      const int64_t t = item / p.n_head;
      const int64_t head = item % p.n_head;
      const int64_t kvh = head / group;
      // Positions [first, pos0 + t]: every earlier one, or the sliding window's.
      const int64_t first = p.first_key(int(t));
      const int64_t n_kv = p.pos0 + t + 1 - first;
      const float* qr = static_cast<const float*>(q.data) + t * q.stride + head * hd;
      const uint8_t elem = f16 ? 2 : 4;
      const int64_t ks = k_cache.stride * elem, vs = v_cache.stride * elem;
      // Paged: the map from the first key on, over the head's column base; else its first row.
      const int32_t* rows = k_cache.row_map ? k_cache.row_map + first : nullptr;
      const int64_t r0 = rows ? 0 : first;
      const auto* kb = static_cast<const uint8_t*>(k_cache.data) + kvh * hd * elem + r0 * ks;
      const auto* vb = static_cast<const uint8_t*>(v_cache.data) + kvh * hd * elem + r0 * vs;

      float* orow = static_cast<float*>(out.data) + t * out.stride + head * hd;
#if defined(__x86_64__)
      if (f16 && simd_f16_ && avx512 && hd % 16 == 0) {
        attend_f16_avx512(qr, reinterpret_cast<const uint16_t*>(kb), k_cache.stride,
                          reinterpret_cast<const uint16_t*>(vb), v_cache.stride, rows, n_kv, hd, p.scale, q.rows > 1 && !row_invariant_, vrow,
                          scores, acc, orow);
        continue;
      }
      if (f16 && simd_f16_ && hd % 8 == 0) {
        attend_f16_avx2(qr, reinterpret_cast<const uint16_t*>(kb), k_cache.stride, reinterpret_cast<const uint16_t*>(vb),
                        v_cache.stride, rows, n_kv, hd, p.scale, vrow, scores, orow);
        continue;
      }
#endif
      const quant::Kernels& dot = f16 ? h : f;
      dot.quantize_row(qr, qv, hd);
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n_kv; ++j) {
        float s;
        dot.vec_dot(hd, kb + cache_row(rows, j) * ks, qv, &s);
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
        dot.dequantize_row(vb + cache_row(rows, j) * vs, vrow, hd);
        for (int64_t d = 0; d < hd; ++d) acc[d] += pj * vrow[d];
      }
      std::copy(acc, acc + hd, orow);
    }
  });
}

}  // namespace sluice::backend::cpu
