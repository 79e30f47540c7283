// AVX2 vec_dot_cols (Kernels::vec_dot_cols): one weight row against several activation rows,
// each weight block decoded once and dotted with every column. Same integer sums per block as
// the reference; only the order of f32 additions differs. Formats: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K.
//
// The legacy kernels keep one accumulator per column and add block after block, the order of
// llama.cpp's x86 vec_dot (the min terms of Q4_1 as a scalar FMA chain): their results equal
// llama.cpp's bit for bit (tools/golden/op_parity.cpp checks it), as do Q6_K's here.
//
// Column groups: 8 for the legacy formats (8 f32 accumulators + decoded block + temporaries fit
// the 16 ymm registers), 4 for the K-quants, which also keep one i32 accumulator per column.
#include "quant/simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <cmath>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/simd_x86.h"

namespace sluice::quant::detail {
namespace {

using namespace x86;  // NOLINT(google-build-using-namespace): helper intrinsics

inline __m256i ld256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Legacy formats, one 32-element block per ymm. Signed weights are stored as |q| with the sign
// moved onto the activation (vpsignb), as in the single-column kernels.
struct ColsQ4_0 {
  using W = BlockQ4_0;
  using A = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i decode(const W& x) { return _mm256_sub_epi8(nibbles_32(x.qs), _mm256_set1_epi8(8)); }
};
struct ColsQ4_1 {
  using W = BlockQ4_1;
  using A = BlockQ8_1;
  static constexpr bool kSigned = false;
  static __m256i decode(const W& x) { return nibbles_32(x.qs); }
};
struct ColsQ8_0 {
  using W = BlockQ8_0;
  using A = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i decode(const W& x) { return ld256(x.qs); }
};

template <class F>
struct Legacy {
  template <int NC>
  static void run(int64_t n, const void* w, const uint8_t* a, int64_t a_stride, float* out) {
    using A = typename F::A;
    const auto* x = static_cast<const typename F::W*>(w);
    const int64_t nb = blocks_of(n, kQK);
    __m256 acc[NC];
    float mins[NC];
    for (int c = 0; c < NC; ++c) {
      acc[c] = _mm256_setzero_ps();
      mins[c] = 0;
    }
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i q = F::decode(x[i]);
      const __m256i u = F::kSigned ? _mm256_sign_epi8(q, q) : q;
      const float dx = f16(x[i].d);
      for (int c = 0; c < NC; ++c) {
        const A& y = reinterpret_cast<const A*>(a + c * a_stride)[i];
        __m256i yv = ld256(y.qs);
        if constexpr (F::kSigned) yv = _mm256_sign_epi8(yv, q);
        const __m256i s = dot_u8_s8(u, yv);
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16(y.d)), _mm256_cvtepi32_ps(s), acc[c]);
        if constexpr (!F::kSigned) mins[c] = std::fma(f16(x[i].m), f16(y.s), mins[c]);
      }
    }
    for (int c = 0; c < NC; ++c) out[c] = hsum(acc[c]) + mins[c];
  }
};

// i16 scale vector for one vpmaddubsw result of 32 elements: lanes 0-7 get s0, 8-15 get s1.
inline __m256i scale_pair(int s0, int s1) {
  return _mm256_set_m128i(_mm_set1_epi16(int16_t(s1)), _mm_set1_epi16(int16_t(s0)));
}

// Q4_K: per 64-element part p, the low nibbles (sub-block 2p) and high nibbles (2p+1) are decoded
// once and dotted with every column; each column keeps an exact i32 sum for the super-block.
struct ColsQ4_K {
  template <int NC>
  static void run(int64_t n, const void* w, const uint8_t* a, int64_t a_stride, float* out) {
    const auto* x = static_cast<const BlockQ4_K*>(w);
    const int64_t nb = blocks_of(n, kQK_K);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[NC];
    for (int c = 0; c < NC; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      uint8_t sc[8], mn[8];
      for (int j = 0; j < 8; ++j) unpack_k_scale(x[i].scales, j, &sc[j], &mn[j]);
      const __m128i mn8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn));
      const __m256i mins_dup = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
      __m256i isum[NC];
      for (int c = 0; c < NC; ++c) isum[c] = _mm256_setzero_si256();
      for (int p = 0; p < 4; ++p) {
        const __m256i q = ld256(x[i].qs + 32 * p);
        const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        const __m256i slo = _mm256_set1_epi16(sc[2 * p]), shi = _mm256_set1_epi16(sc[2 * p + 1]);
        for (int c = 0; c < NC; ++c) {
          const int8_t* q8 = (reinterpret_cast<const BlockQ8_K*>(a + c * a_stride) + i)->qs + 64 * p;
          const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld256(q8)), slo);
          const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld256(q8 + 32)), shi);
          isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(plo, phi));
        }
      }
      const float dx = f16(x[i].d), dmx = f16(x[i].dmin);
      for (int c = 0; c < NC; ++c) {
        const auto* y = reinterpret_cast<const BlockQ8_K*>(a + c * a_stride) + i;
        const __m256i msum = _mm256_madd_epi16(mins_dup, ld256(y->bsums));
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * y->d), _mm256_cvtepi32_ps(isum[c]), acc[c]);
        acc[c] = _mm256_fnmadd_ps(_mm256_set1_ps(dmx * y->d), _mm256_cvtepi32_ps(msum), acc[c]);
      }
    }
    for (int c = 0; c < NC; ++c) out[c] = hsum(acc[c]);
  }
};

// Q6_K: u = low4 | high2 << 4 in [0, 63], q = u - 32, with -32 applied through bsums.
struct ColsQ6_K {
  template <int NC>
  static void run(int64_t n, const void* w, const uint8_t* a, int64_t a_stride, float* out) {
    const auto* x = static_cast<const BlockQ6_K*>(w);
    const int64_t nb = blocks_of(n, kQK_K);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    __m256 acc[NC];
    for (int c = 0; c < NC; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
      const __m256i corr = _mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32));
      __m256i isum[NC];
      for (int c = 0; c < NC; ++c)
        isum[c] = _mm256_madd_epi16(corr, ld256((reinterpret_cast<const BlockQ8_K*>(a + c * a_stride) + i)->bsums));
      for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = ld256(x[i].ql + 64 * h), ql1 = ld256(x[i].ql + 64 * h + 32);
        const __m256i qh = ld256(x[i].qh + 32 * h);
        for (int k = 0; k < 4; ++k) {
          // Element 128h + 32k + l: low nibble of ql[64h + 32(k&1) + l] (>> 4 for k >= 2),
          // high bits (qh[32h + l] >> 2k) & 3.
          const __m256i ql = (k & 1) ? ql1 : ql0;
          const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m3);
          const __m256i u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
          const int s = 8 * h + 2 * k;
          const __m256i sv = scale_pair(x[i].scales[s], x[i].scales[s + 1]);
          for (int c = 0; c < NC; ++c) {
            const int8_t* q8 = (reinterpret_cast<const BlockQ8_K*>(a + c * a_stride) + i)->qs + 128 * h + 32 * k;
            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, ld256(q8)), sv));
          }
        }
      }
      const float dx = f16(x[i].d);
      for (int c = 0; c < NC; ++c) {
        const float dy = (reinterpret_cast<const BlockQ8_K*>(a + c * a_stride) + i)->d;
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy), _mm256_cvtepi32_ps(isum[c]), acc[c]);
      }
    }
    for (int c = 0; c < NC; ++c) out[c] = hsum(acc[c]);
  }
};

}  // namespace

void install_avx2_cols(Kernels* t) {
  t[int(Type::kQ4_0)].vec_dot_cols = vec_dot_cols_of<Legacy<ColsQ4_0>, 8>;
  t[int(Type::kQ4_1)].vec_dot_cols = vec_dot_cols_of<Legacy<ColsQ4_1>, 8>;
  t[int(Type::kQ8_0)].vec_dot_cols = vec_dot_cols_of<Legacy<ColsQ8_0>, 8>;
  t[int(Type::kQ4_K)].vec_dot_cols = vec_dot_cols_of<ColsQ4_K, 4>;
  t[int(Type::kQ6_K)].vec_dot_cols = vec_dot_cols_of<ColsQ6_K, 4>;
}

}  // namespace sluice::quant::detail

#else  // not compiled for AVX2: never installed (best_isa() cannot pick it)

namespace sluice::quant::detail {
void install_avx2_cols(Kernels*) {}
}  // namespace sluice::quant::detail

#endif
