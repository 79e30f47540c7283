// AVX-512 VNNI vec_dot_packed for Q4_K packed 16 rows at a time (BlockQ4_Kx16, blocks.h).
//
// Lanes are rows. One 64-byte load of qs[j][c] gives, after the nibble split, two zmm whose i32
// lane r holds four consecutive elements of row r; vpdpbusd multiplies them with four activation
// bytes broadcast from memory (the same for every row) and adds into lane r. So per 64
// multiply-adds: one vpdpbusd, one broadcast load, and 1/T of a weight load and nibble split for a
// tile of T tokens. The row-by-row kernels (cpu_avx512.cpp, cpu_avx512_tile.cpp) need a
// horizontal reduction per row and scale shuffles per sub-block instead.
// Per sub-block j and token t the exact 32-element integer sum is converted once and scaled by
// (d_r * sc_j[r]) * d_t; the min term sum_j mn_j[r] * bsum_j(t) is one vpdpwssd per sub-block
// (i16 pairs mn|mn against the token's two 16-element bsums) and is applied once per super-block.
// Integer sums are the reference's exactly; only f32 summation order differs.
// Tile: 16 rows x up to 8 tokens; with 8 tokens the 8 accumulator chains per sub-block hide
// vpdpbusd's latency. Fewer tokens (decode, ragged tails) split each chain in two or four.
#include "quant/simd.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__) && defined(__AVX512BF16__)

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "core/status.h"
#include "quant/blocks.h"

// As in cpu_avx512.cpp: GCC 12's reductions and conversions use a self-initialised don't-care operand.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace sluice::quant::detail {
namespace {

constexpr int kGroupRows = 16;
constexpr int kMaxCols = 8;

inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <int T>
void tile_q4_k(int64_t nb, const BlockQ4_Kx16* w, const uint8_t* a, int64_t a_stride, float* out,
               int64_t out_stride) {
  constexpr int kChains = T >= 4 ? 1 : (T == 1 ? 4 : 2);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ4_Kx16& p = w[i];
    const BlockQ8_K* y[T];
    for (int t = 0; t < T; ++t) y[t] = reinterpret_cast<const BlockQ8_K*>(a + t * a_stride) + i;
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.d)));
    __m512i imin[T];
    for (int t = 0; t < T; ++t) imin[t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p.sc[j]));
      const __m128i mn8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p.mn[j]));
      const __m512 scd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc8)), dv);
      const __m512i mn32 = _mm512_cvtepu8_epi32(mn8);
      const __m512i mnp = _mm512_or_si512(mn32, _mm512_slli_epi32(mn32, 16));  // i16 pair (mn, mn)
      __m512i isum[kChains][T];
      for (int k = 0; k < kChains; ++k)
        for (int t = 0; t < T; ++t) isum[k][t] = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        const __m512i raw = _mm512_loadu_si512(p.qs[j][c]);
        const __m512i lo = _mm512_and_si512(raw, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        const int off = 32 * j + 8 * c;
        for (int t = 0; t < T; ++t) {
          __m512i& s = isum[c % kChains][t];
          s = _mm512_dpbusd_epi32(s, lo, bcast32(y[t]->qs + off));
          s = _mm512_dpbusd_epi32(s, hi, bcast32(y[t]->qs + off + 4));
        }
      }
      for (int t = 0; t < T; ++t) {
        __m512i s = isum[0][t];
        for (int k = 1; k < kChains; ++k) s = _mm512_add_epi32(s, isum[k][t]);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scd, _mm512_set1_ps(y[t]->d)), acc[t]);
        imin[t] = _mm512_dpwssd_epi32(imin[t], mnp, bcast32(y[t]->bsums + 2 * j));
      }
    }
    const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.dmin)));
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(imin[t]), _mm512_mul_ps(dmv, _mm512_set1_ps(y[t]->d)), acc[t]);
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + t * out_stride, acc[t]);
}

using TileFn = void (*)(int64_t, const BlockQ4_Kx16*, const uint8_t*, int64_t, float*, int64_t);

template <int... I>
constexpr std::array<TileFn, kMaxCols> tile_table(std::integer_sequence<int, I...>) {
  return {&tile_q4_k<I + 1>...};
}

// Token tiles outside, groups inside: a tile's activations stay in L1 while the groups (a chunk
// of the matrix, in L2) pass over them.
void vec_dot_packed_q4_k(int64_t n, const void* w, int n_groups, const void* a, int64_t a_stride, int n_cols,
                         float* out, int64_t out_stride) {
  SLUICE_CHECK(n_groups >= 0 && n_cols >= 0, "vec_dot_packed: negative group or column count");
  static constexpr std::array<TileFn, kMaxCols> kTable = tile_table(std::make_integer_sequence<int, kMaxCols>{});
  const int64_t nb = n / kQK_K;
  const auto* wp = static_cast<const BlockQ4_Kx16*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int c = 0; c < n_cols; c += kMaxCols) {
    const int nc = std::min(kMaxCols, n_cols - c);
    for (int g = 0; g < n_groups; ++g)
      kTable[size_t(nc - 1)](nb, wp + g * nb, ab + c * a_stride, a_stride, out + c * out_stride + g * kGroupRows,
                             out_stride);
  }
}

}  // namespace

void install_avx512_packed(Kernels* t) { t[int(Type::kQ4_K)].vec_dot_packed = vec_dot_packed_q4_k; }

}  // namespace sluice::quant::detail

#else  // not compiled for AVX-512: never installed (best_isa() cannot pick it)

namespace sluice::quant::detail {
void install_avx512_packed(Kernels*) {}
}  // namespace sluice::quant::detail

#endif
