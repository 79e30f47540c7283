// AVX-512 VNNI vec_dot_tile (Kernels::vec_dot_tile): a block of weight rows x activation columns
// per register tile, for the formats of Q4_K_M files (Q4_K, Q6_K).
//
// Why a tile beats vec_dot_cols here: on the server cores this targets, 512-bit integer
// multiplies issue on one port, and vec_dot_cols spends two of them per 64 elements (vpmaddubsw
// then vpdpwssd with the sub-block scales) plus a min term per column. The tile kernels
//  - form 4-element sums with one vpdpbusd per 64 elements (u8 weights x s8 activations, exact),
//    narrow two such vectors to i16 (|sum| <= 4 * 63 * 128 < 2^15, so vpackssdw never saturates)
//    and apply the sub-block scales with one vpdpwssd per 128 elements: 3 multiplies per 128
//    elements instead of 4;
//  - apply Q4_K's min term with lanes = columns: the activation side (bsums per sub-block,
//    transposed so that lane c is column c) is prepared once per super-block and shared by every
//    row of the tile, and one vpmaddwd per sub-block pair covers 8 columns at once;
//  - read each column's scale factor d_row * d_col from a small table, so the f32 step per
//    (row, column, super-block) is one convert and one FMA.
// Integer sums per super-block are exactly the reference's; only f32 addition order differs (and
// Q4_K's min term is accumulated in its own f32 vector per row, subtracted at the end).
//
// Tile: kRows x kCols = 1 x 8 per register block (the driver walks all rows of the call). 8
// columns fill the ymm lanes of the min term, and the matmul hands 8-token tiles. Measured on a
// Zen 4 (same-run A/B, bench_gemv_cpu tile): 1 x 8 beat vec_dot_cols by 1.09-1.14x, while
// 2 x 8 (16 accumulators next to a row's decode: the compiler spills), 2 x 4 and 4 x 4 (the
// activation side prepared twice per 8 tokens, weights decoded twice) ran at 0.85-1.09x. The
// kernels are written for any kRows x kCols; retune both on the target machine.
#include "quant/simd.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__) && defined(__AVX512BF16__)

#include <algorithm>
#include <array>
#include <utility>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/simd_x86.h"

// As in cpu_avx512.cpp: GCC 12's reductions use a self-initialised don't-care operand.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // clang has no such group and would warn about the pragma
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace sluice::quant::detail {
namespace {

using namespace x86;  // NOLINT(google-build-using-namespace): helper intrinsics

constexpr int kRows = 1;
constexpr int kCols = 8;

inline __m256i ld256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m512i ld512(const void* p) { return _mm512_loadu_si512(p); }

// vpshufb control for a zmm whose every 128-bit lane holds the same 8 i16 words: i16 word
// positions 0-3 of lane k take word lo[k], positions 4-7 take word hi[k].
struct WordPick {
  alignas(64) uint8_t b[64];
};
constexpr WordPick word_pick(std::array<int, 4> lo, std::array<int, 4> hi) {
  WordPick p{};
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 8; ++j) {
      const int w = j < 4 ? lo[size_t(k)] : hi[size_t(k)];
      p.b[16 * k + 2 * j] = uint8_t(2 * w);
      p.b[16 * k + 2 * j + 1] = uint8_t(2 * w + 1);
    }
  return p;
}

// vpermw indices for Q6_K's 16 scales (i16 words 0-15 of a zmm): lane k, positions 0-3 take
// scale lo + k, positions 4-7 scale hi + k.
struct WordIdx {
  alignas(64) int16_t w[32];
};
constexpr WordIdx q6_scale_idx(int lo, int hi) {
  WordIdx p{};
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 8; ++j) p.w[8 * k + j] = int16_t((j < 4 ? lo : hi) + k);
  return p;
}

// Lane c of W[m] = word m of x[c] (8 columns x 4 i32 words, transposed).
inline void transpose_8x4(const __m128i x[8], __m256i W[4]) {
  const __m256i A = _mm256_setr_m128i(x[0], x[4]), B = _mm256_setr_m128i(x[1], x[5]);
  const __m256i C = _mm256_setr_m128i(x[2], x[6]), D = _mm256_setr_m128i(x[3], x[7]);
  const __m256i t0 = _mm256_unpacklo_epi32(A, B), t1 = _mm256_unpackhi_epi32(A, B);
  const __m256i t2 = _mm256_unpacklo_epi32(C, D), t3 = _mm256_unpackhi_epi32(C, D);
  W[0] = _mm256_unpacklo_epi64(t0, t2);
  W[1] = _mm256_unpackhi_epi64(t0, t2);
  W[2] = _mm256_unpacklo_epi64(t1, t3);
  W[3] = _mm256_unpackhi_epi64(t1, t3);
}

// Q4_K/Q5_K packed 6-bit scales and mins (layout in blocks.h) as 8 u8 each.
inline void k_scales_mins(const uint8_t* s, uint64_t* sc, uint64_t* mn) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  *sc = uint64_t(a & 0x3F3F3F3Fu) | uint64_t((c & 0x0F0F0F0Fu) | ((a >> 6) & 0x03030303u) << 4) << 32;
  *mn = uint64_t(b & 0x3F3F3F3Fu) | uint64_t(((c >> 4) & 0x0F0F0F0Fu) | ((b >> 6) & 0x03030303u) << 4) << 32;
}

// Sum of the 16 f32 lanes of acc[r][c] plus the per-column term of row r, written as
// out[c * out_stride + r].
template <int R, int C>
inline void store_tile(__m512 (&acc)[R][C], const float (&extra)[R][8], float* out, int64_t out_stride) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[c * out_stride + r] = _mm512_reduce_add_ps(acc[r][c]) + extra[r][c];
}

// ---- Q4_K -------------------------------------------------------------------------------------
// q[p] = elements 64p..64p+63 (sub-blocks 2p in i32 lanes 0-7, 2p+1 in lanes 8-15 of a vpdpbusd
// result). vpackssdw(d0, d1) gives, per 128-bit lane k, four words of d0's lane k then four of
// d1's: sub-blocks {0, 2} for k < 2 and {1, 3} for k >= 2; likewise {4, 6} / {5, 7} from d2, d3.
struct TileQ4_K {
  static constexpr WordPick kPick01 = word_pick({0, 0, 1, 1}, {2, 2, 3, 3});
  static constexpr WordPick kPick23 = word_pick({4, 4, 5, 5}, {6, 6, 7, 7});

  template <int R, int C>
  static void run(int64_t n, const uint8_t* w, int64_t w_stride, const uint8_t* a, int64_t a_stride, float* out,
                  int64_t out_stride) {
    static_assert(C <= 8, "the min term keeps one column per ymm lane");
    const int64_t nb = blocks_of(n, kQK_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
    const __m512i pick01 = ld512(kPick01.b), pick23 = ld512(kPick23.b);
    __m512 acc[R][C];
    __m256 macc[R];
    for (int r = 0; r < R; ++r) {
      macc[r] = _mm256_setzero_ps();
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < nb; ++i) {
      // Activation side, shared by the R rows: d per column, and the sums of each 32-element
      // sub-block j as i16 pairs (j = 2m, 2m + 1) in i32 word m, transposed to lanes = columns.
      alignas(32) float dy[8] = {};
      __m128i x[8];
      for (int c = 0; c < 8; ++c) {
        if (c >= C) {
          x[c] = _mm_setzero_si128();
          continue;
        }
        const BlockQ8_K& y = reinterpret_cast<const BlockQ8_K*>(a + c * a_stride)[i];
        dy[c] = y.d;
        const __m256i s = _mm256_madd_epi16(ld256(y.bsums), _mm256_set1_epi16(1));  // |s| <= 4096
        x[c] = _mm_packs_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      }
      __m256i bsp[4];
      transpose_8x4(x, bsp);
      const __m256 dyv = _mm256_load_ps(dy);
      for (int r = 0; r < R; ++r) {
        const BlockQ4_K& xb = reinterpret_cast<const BlockQ4_K*>(w + r * w_stride)[i];
        uint64_t sc, mn;
        k_scales_mins(xb.scales, &sc, &mn);
        const float d = f16(xb.d), dmin = f16(xb.dmin);
        // Min term for all columns: sum_j mn_j * bsum_j, one vpmaddwd per pair of sub-blocks.
        const __m256i mw = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(mn))));
        __m256i msum = _mm256_madd_epi16(_mm256_shuffle_epi32(mw, 0x00), bsp[0]);
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(_mm256_shuffle_epi32(mw, 0x55), bsp[1]));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(_mm256_shuffle_epi32(mw, 0xAA), bsp[2]));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(_mm256_shuffle_epi32(mw, 0xFF), bsp[3]));
        macc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(_mm256_set1_ps(dmin), dyv), macc[r]);
        // Scale table for the main term; read back as broadcast operands.
        alignas(32) float ddy[8];
        _mm256_store_ps(ddy, _mm256_mul_ps(_mm256_set1_ps(d), dyv));
        const __m512i sw = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc))));
        const __m512i s01 = _mm512_shuffle_epi8(sw, pick01), s23 = _mm512_shuffle_epi8(sw, pick23);
        // Nibbles in element order, as in cpu_avx512.cpp's KQ45.
        __m512i q[4];
        for (int h = 0; h < 2; ++h) {
          const __m512i raw = ld512(xb.qs + 64 * h);
          const __m512i lo = _mm512_and_si512(raw, m4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
          q[2 * h] = _mm512_shuffle_i64x2(lo, hi, 0x44);
          q[2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, 0xEE);
        }
        for (int c = 0; c < C; ++c) {
          const int8_t* yq = reinterpret_cast<const BlockQ8_K*>(a + c * a_stride)[i].qs;
          const __m512i d0 = _mm512_dpbusd_epi32(zero, q[0], ld512(yq));
          const __m512i d1 = _mm512_dpbusd_epi32(zero, q[1], ld512(yq + 64));
          const __m512i d2 = _mm512_dpbusd_epi32(zero, q[2], ld512(yq + 128));
          const __m512i d3 = _mm512_dpbusd_epi32(zero, q[3], ld512(yq + 192));
          __m512i isum = _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(d0, d1), s01);
          isum = _mm512_dpwssd_epi32(isum, _mm512_packs_epi32(d2, d3), s23);
          acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(ddy[c]), acc[r][c]);
        }
      }
    }
    float mins[R][8];
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(mins[r], macc[r]);
      for (float& v : mins[r]) v = -v;
    }
    store_tile<R, C>(acc, mins, out, out_stride);
  }
};

// ---- Q6_K -------------------------------------------------------------------------------------
// u[g] = elements 64g..64g+63 (6-bit, unsigned), 128-bit lane k = sub-block 4g + k. vpackssdw of
// (d0, d1) holds sub-blocks k and 4 + k in lane k; (d2, d3) sub-blocks 8 + k and 12 + k. The -32
// offset enters the integer sum through bsums, as in the one-row kernel.
struct TileQ6_K {
  static constexpr WordIdx kIdx01 = q6_scale_idx(0, 4);
  static constexpr WordIdx kIdx23 = q6_scale_idx(8, 12);

  template <int R, int C>
  static void run(int64_t n, const uint8_t* w, int64_t w_stride, const uint8_t* a, int64_t a_stride, float* out,
                  int64_t out_stride) {
    const int64_t nb = blocks_of(n, kQK_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), zero = _mm512_setzero_si512();
    const __m512i idx01 = ld512(kIdx01.w), idx23 = ld512(kIdx23.w);
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      alignas(32) float dy[8] = {};
      for (int c = 0; c < C; ++c) dy[c] = reinterpret_cast<const BlockQ8_K*>(a + c * a_stride)[i].d;
      const __m256 dyv = _mm256_load_ps(dy);
      for (int r = 0; r < R; ++r) {
        const BlockQ6_K& xb = reinterpret_cast<const BlockQ6_K*>(w + r * w_stride)[i];
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.scales)));
        const __m256i corr = _mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32));
        const __m512i scz = _mm512_zextsi256_si512(sc16);
        const __m512i s01 = _mm512_permutexvar_epi16(idx01, scz), s23 = _mm512_permutexvar_epi16(idx23, scz);
        alignas(32) float ddy[8];
        _mm256_store_ps(ddy, _mm256_mul_ps(_mm256_set1_ps(f16(xb.d)), dyv));
        // Same decode as cpu_avx512.cpp's KQ6.
        __m512i u[4];
        for (int h = 0; h < 2; ++h) {
          const __m512i ql = ld512(xb.ql + 64 * h);
          const __m256i qh = ld256(xb.qh + 32 * h);
          const __m512i hb = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
          u[2 * h] = _mm512_ternarylogic_epi64(ql, _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30), m4, 0xE4);
          u[2 * h + 1] = _mm512_ternarylogic_epi64(_mm512_srli_epi16(ql, 4), _mm512_and_si512(hb, m30), m4, 0xE4);
        }
        for (int c = 0; c < C; ++c) {
          const BlockQ8_K& y = reinterpret_cast<const BlockQ8_K*>(a + c * a_stride)[i];
          const __m512i d0 = _mm512_dpbusd_epi32(zero, u[0], ld512(y.qs));
          const __m512i d1 = _mm512_dpbusd_epi32(zero, u[1], ld512(y.qs + 64));
          const __m512i d2 = _mm512_dpbusd_epi32(zero, u[2], ld512(y.qs + 128));
          const __m512i d3 = _mm512_dpbusd_epi32(zero, u[3], ld512(y.qs + 192));
          __m512i isum = _mm512_zextsi256_si512(_mm256_madd_epi16(corr, ld256(y.bsums)));
          isum = _mm512_dpwssd_epi32(isum, _mm512_packs_epi32(d0, d1), s01);
          isum = _mm512_dpwssd_epi32(isum, _mm512_packs_epi32(d2, d3), s23);
          acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(ddy[c]), acc[r][c]);
        }
      }
    }
    const float none[R][8] = {};
    store_tile<R, C>(acc, none, out, out_stride);
  }
};

// ---- driver -----------------------------------------------------------------------------------
// Full kRows x kCols tiles, then the exact-size instance for the ragged last rows / columns, so
// no tile computes (or reads) rows or columns it was not given.
using TileFn = void (*)(int64_t, const uint8_t*, int64_t, const uint8_t*, int64_t, float*, int64_t);

template <class K, int I>
constexpr TileFn tile_instance() {
  return &K::template run<I / kCols + 1, I % kCols + 1>;
}

template <class K, int... I>
constexpr std::array<TileFn, kRows * kCols> tile_table(std::integer_sequence<int, I...>) {
  return {tile_instance<K, I>()...};
}

template <class K>
void vec_dot_tile_of(int64_t n, const void* w, int64_t w_stride, int n_rows, const void* a, int64_t a_stride,
                     int n_cols, float* out, int64_t out_stride) {
  SLUICE_CHECK(n_rows >= 0 && n_cols >= 0, "vec_dot_tile: negative row or column count");
  static constexpr std::array<TileFn, kRows * kCols> kTable =
      tile_table<K>(std::make_integer_sequence<int, kRows * kCols>{});
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int c = 0; c < n_cols; c += kCols) {
    const int nc = std::min(kCols, n_cols - c);
    for (int r = 0; r < n_rows; r += kRows) {
      const int nr = std::min(kRows, n_rows - r);
      kTable[size_t((nr - 1) * kCols + nc - 1)](n, wb + r * w_stride, w_stride, ab + c * a_stride, a_stride,
                                                out + c * out_stride + r, out_stride);
    }
  }
}

}  // namespace

void install_avx512_tile(Kernels* t) {
  t[int(Type::kQ4_K)].vec_dot_tile = vec_dot_tile_of<TileQ4_K>;
  t[int(Type::kQ6_K)].vec_dot_tile = vec_dot_tile_of<TileQ6_K>;
}

}  // namespace sluice::quant::detail

#else  // not compiled for AVX-512: never installed (best_isa() cannot pick it)

namespace sluice::quant::detail {
void install_avx512_tile(Kernels*) {}
}  // namespace sluice::quant::detail

#endif
