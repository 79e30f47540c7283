// AVX-512 VNNI vec_dot_packed for Q4_K, Q6_K and Q8_0 packed 16 rows at a time (BlockQ4_Kx16,
// BlockQ6_Kx16, BlockQ8_0x16, blocks.h).
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
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/status.h"
#include "quant/blocks.h"

// As in cpu_avx512.cpp: GCC 12's reductions and conversions use a self-initialised don't-care operand.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // clang has no such group and would warn about the pragma
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace sluice::quant::detail {
namespace {

constexpr int kGroupRows = 16;
constexpr int kMaxCols = 8;

inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// kPrefetch: each sub-block step asks for 5 lines of the super-block two ahead (2368-byte blocks,
// contiguous across groups), so the stream stays ahead while the copy engine shares DRAM.
template <int T, bool kPrefetch>
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
      if constexpr (kPrefetch) {
        const char* ahead = reinterpret_cast<const char*>(&p + 2) + 320 * j;
        for (int l = 0; l < 5; ++l) _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
      }
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

// Q6_K (BlockQ6_Kx16): per 16-element sub-block s, two 64-byte ql loads and one qh load give four
// vectors of 4 elements x 16 rows (6-bit, unsigned); 4 vpdpbusd per token, then one convert and
// one FMA with d * sc_s (per row) * d_t. The -32 offset is 32 * sum_s sc_s * bsum_s(t): one
// vpdpwssd per two sub-blocks (i16 pair sc_s | sc_s+1 against the token's two bsums), applied once
// per super-block.
template <int T>
void tile_q6_k(int64_t nb, const BlockQ6_Kx16* w, const uint8_t* a, int64_t a_stride, float* out,
               int64_t out_stride) {
  constexpr int kChains = T >= 4 ? 1 : (T == 1 ? 4 : 2);
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ6_Kx16& p = w[i];
    const BlockQ8_K* y[T];
    for (int t = 0; t < T; ++t) y[t] = reinterpret_cast<const BlockQ8_K*>(a + t * a_stride) + i;
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.d)));
    __m512i ioff[T];
    for (int t = 0; t < T; ++t) ioff[t] = _mm512_setzero_si512();
    for (int s = 0; s < 16; ++s) {
      const __m512i sc32 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p.sc[s])));
      const __m512 scd = _mm512_mul_ps(_mm512_cvtepi32_ps(sc32), dv);
      // The same sub-block of the next super-block (or group: groups are contiguous), 3 lines.
      const char* ahead = reinterpret_cast<const char*>(&(&p)[1].sb[s]);
      for (int l = 0; l < 3; ++l) _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
      const __m512i l0 = _mm512_loadu_si512(p.sb[s].ql[0]), l1 = _mm512_loadu_si512(p.sb[s].ql[1]);
      const __m512i h = _mm512_loadu_si512(p.sb[s].qh);
      __m512i v[4];
      v[0] = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
      v[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
      v[2] = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(h, m30));
      v[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4), _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
      __m512i isum[kChains][T];
      for (int k = 0; k < kChains; ++k)
        for (int t = 0; t < T; ++t) isum[k][t] = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c)
        for (int t = 0; t < T; ++t) {
          __m512i& q = isum[c % kChains][t];
          q = _mm512_dpbusd_epi32(q, v[c], bcast32(y[t]->qs + 16 * s + 4 * c));
        }
      for (int t = 0; t < T; ++t) {
        __m512i q = isum[0][t];
        for (int k = 1; k < kChains; ++k) q = _mm512_add_epi32(q, isum[k][t]);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_mul_ps(scd, _mm512_set1_ps(y[t]->d)), acc[t]);
      }
      if (s % 2 == 1) {  // offset term of sub-blocks s - 1 and s
        const __m512i prev = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p.sc[s - 1])));
        const __m512i scp = _mm512_or_si512(_mm512_and_si512(prev, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc32, 16));
        for (int t = 0; t < T; ++t) ioff[t] = _mm512_dpwssd_epi32(ioff[t], scp, bcast32(y[t]->bsums + s - 1));
      }
    }
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ioff[t]), _mm512_mul_ps(dv, _mm512_set1_ps(32.0f * y[t]->d)), acc[t]);
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + t * out_stride, acc[t]);
}

// Q8_0 (BlockQ8_0x16): vpdpbusd wants one unsigned operand, so the activations enter as a + 128
// (a byte xor with 0x80 of the broadcast) against the signed quants, and 128 * wsum[r] is
// subtracted from each block's exact integer sum; then one convert and one FMA with
// d_r * d_t per block and token.
template <int T>
void tile_q8_0(int64_t nb, const BlockQ8_0x16* w, const uint8_t* a, int64_t a_stride, float* out,
               int64_t out_stride) {
  constexpr int kChains = T >= 4 ? 1 : (T == 1 ? 4 : 2);
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ8_0x16& p = w[i];
    // Eight blocks ahead (9 lines each; groups are contiguous): one-token decode is otherwise
    // latency-bound on the stream.
    const char* ahead = reinterpret_cast<const char*>(&p + 8);
    _mm_prefetch(ahead, _MM_HINT_T0);
    const BlockQ8_0* y[T];
    for (int t = 0; t < T; ++t) y[t] = reinterpret_cast<const BlockQ8_0*>(a + t * a_stride) + i;
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.d)));
    const __m512i corr =
        _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.wsum))), 7);
    __m512i isum[kChains][T];
    for (int k = 0; k < kChains; ++k)
      for (int t = 0; t < T; ++t) isum[k][t] = _mm512_setzero_si512();
    for (int c = 0; c < 8; ++c) {
      _mm_prefetch(ahead + 64 * (c + 1), _MM_HINT_T0);
      const __m512i q = _mm512_loadu_si512(p.qs[c]);
      for (int t = 0; t < T; ++t) {
        __m512i& s = isum[c % kChains][t];
        s = _mm512_dpbusd_epi32(s, _mm512_xor_si512(bcast32(y[t]->qs + 4 * c), flip), q);
      }
    }
    for (int t = 0; t < T; ++t) {
      __m512i s = isum[0][t];
      for (int k = 1; k < kChains; ++k) s = _mm512_add_epi32(s, isum[k][t]);
      const float dt = _cvtsh_ss(y[t]->d);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s, corr)), _mm512_mul_ps(dv, _mm512_set1_ps(dt)),
                               acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + t * out_stride, acc[t]);
}

template <class Block>
using TileFn = void (*)(int64_t, const Block*, const uint8_t*, int64_t, float*, int64_t);

template <class Block, template <int> class Tile, int... I>
constexpr std::array<TileFn<Block>, kMaxCols> tile_table(std::integer_sequence<int, I...>) {
  return {&Tile<I + 1>::run...};
}

// SLUICE_CPU_PREFETCH=0 turns the Q4_K prefetch off (read once; A/B benchmarks).
bool q4_prefetch() {
  static const bool kOn = [] {
    const char* e = std::getenv("SLUICE_CPU_PREFETCH");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return kOn;
}

template <int T>
struct Q4Tile {
  static void run(int64_t nb, const BlockQ4_Kx16* w, const uint8_t* a, int64_t as, float* o, int64_t os) {
    if (q4_prefetch()) tile_q4_k<T, true>(nb, w, a, as, o, os);
    else tile_q4_k<T, false>(nb, w, a, as, o, os);
  }
};
template <int T>
struct Q6Tile {
  static void run(int64_t nb, const BlockQ6_Kx16* w, const uint8_t* a, int64_t as, float* o, int64_t os) {
    tile_q6_k<T>(nb, w, a, as, o, os);
  }
};

template <int T>
struct Q8Tile {
  static void run(int64_t nb, const BlockQ8_0x16* w, const uint8_t* a, int64_t as, float* o, int64_t os) {
    tile_q8_0<T>(nb, w, a, as, o, os);
  }
};

// Token tiles outside, groups inside: a tile's activations stay in L1 while the groups (a chunk
// of the matrix, in L2) pass over them.
template <class Block, template <int> class Tile, int64_t kBlockElems = kQK_K>
void vec_dot_packed(int64_t n, const void* w, int n_groups, const void* a, int64_t a_stride, int n_cols, float* out,
                    int64_t out_stride) {
  SLUICE_CHECK(n_groups >= 0 && n_cols >= 0, "vec_dot_packed: negative group or column count");
  static constexpr std::array<TileFn<Block>, kMaxCols> kTable =
      tile_table<Block, Tile>(std::make_integer_sequence<int, kMaxCols>{});
  const int64_t nb = n / kBlockElems;
  const auto* wp = static_cast<const Block*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int c = 0; c < n_cols; c += kMaxCols) {
    const int nc = std::min(kMaxCols, n_cols - c);
    for (int g = 0; g < n_groups; ++g)
      kTable[size_t(nc - 1)](nb, wp + g * nb, ab + c * a_stride, a_stride, out + c * out_stride + g * kGroupRows,
                             out_stride);
  }
}

}  // namespace

PackedFn avx512_packed(Type t) {
  switch (t) {
    case Type::kQ4_K: return vec_dot_packed<BlockQ4_Kx16, Q4Tile>;
    case Type::kQ6_K: return vec_dot_packed<BlockQ6_Kx16, Q6Tile>;
    case Type::kQ8_0: return vec_dot_packed<BlockQ8_0x16, Q8Tile, kQK>;
    default: return nullptr;
  }
}

void install_avx512_packed(Kernels* t) {
  for (Type type : {Type::kQ4_K, Type::kQ6_K, Type::kQ8_0}) t[int(type)].vec_dot_packed = avx512_packed(type);
}

}  // namespace sluice::quant::detail

#else  // not compiled for AVX-512: never installed (best_isa() cannot pick it)

namespace sluice::quant::detail {
void install_avx512_packed(Kernels*) {}
PackedFn avx512_packed(Type) { return nullptr; }
}  // namespace sluice::quant::detail

#endif
