// AMX-INT8 vec_dot_packed for Q8_0 packed 16 rows at a time (BlockQ8_0x16, blocks.h), for
// batches: 16 tokens x 16 rows per tile product (tdpbssd, 16 x 16 x 32 multiply-adds).
//
// Layout: C[token][row] += A[token][k] * B[k / 4][4 * row + k % 4]. A is 16 tokens' bytes of one
// 32-element block, loaded straight from the Q8_0 activation rows with the activation stride; B
// is the packed block itself (its qs[c] line holds elements 4c .. 4c + 3 of every row, as a B
// tile wants them). Four blocks per round accumulate in tmm0-3 (A in tmm4/tmm6, B in tmm5/tmm7
// alternately, so the four products are independent); the round's C tiles are stored (4 KB) and
// a vector epilogue applies the scales.
//
// The exact integer sum per (token, row, block) is what the AVX-512 kernel forms with vpdpbusd
// (cpu_avx512_packed.cpp), and the f32 steps after it are that kernel's, op for op and in the same
// order per token (convert, times d_row * d_token, added in block order). So the results equal
// the AVX-512 kernel's bit for bit (a test checks it) and which kernel a token tile takes never
// changes a model's output. Tokens past the last whole 16-token tile run the AVX-512 kernel.
//
// Measured (H200 host, 16-core Xeon with AMX, one thread, 32 tokens, bench_gemv_cpu tile, same
// call; GFLOP/s, AMX vs AVX-512 packed): Q8_0 297 vs 248, 228 vs 222, 231 vs 212 on the Llama-1B
// shapes. Q4_K and Q6_K were written the same way (their nibbles / 6-bit values unpacked into a
// B buffer) and lost: Q4_K 335 / 255 / 298 vs 337 / 262 / 266, Q6_K 195 / 154 / 161 vs 246 / 225
// / 244, and 3.03 vs 2.86 Tops/s for Q4_K on all 16 cores. With a K-quant's scale per 32- or
// 16-element sub-block, the per-sub-block f32 epilogue (convert, scale, add per token and row)
// costs as much as the AVX-512 kernel's whole multiply work, so tiles only remove the smaller
// part; the unpacking and the tile store/reload add to it. Those formats keep the AVX-512 kernel.
// A BF16 version (weights unpacked and scaled to BF16 B tiles, one epilogue per super-block) and
// an INT8 one with the scale folded into two byte tiles per weight (exact; one epilogue per
// super-block) were tried too; their numbers and why they were not kept are in docs/FORMATS.md.
#include "quant/simd.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__) && defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_INT8__)

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/status.h"
#include "quant/blocks.h"

// As in cpu_avx512.cpp: GCC 12's conversions use a self-initialised don't-care operand.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // clang has no such group and would warn about the pragma
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace sluice::quant::detail {
namespace {

constexpr int kGroupRows = 16;
constexpr int kTileTokens = 16;

// LDTILECFG's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// C: 16 tokens x 16 i32; A: 16 tokens x k_bytes; B: k_bytes / 4 lines of 16 rows x 4 bytes.
constexpr TileConfig make_config(int k_bytes) {
  TileConfig c{};
  for (int t = 0; t < 4; ++t) {
    c.rows[t] = kTileTokens;
    c.colsb[t] = 64;
  }
  for (int t : {4, 6}) {
    c.rows[t] = kTileTokens;
    c.colsb[t] = uint16_t(k_bytes);
  }
  for (int t : {5, 7}) {
    c.rows[t] = uint8_t(k_bytes / 4);
    c.colsb[t] = 64;
  }
  return c;
}

// Loads a tile configuration for the calling thread and releases the tile state on exit.
class TileScope {
 public:
  explicit TileScope(const TileConfig& c) { _tile_loadconfig(&c); }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// The four products of a round: C[k] = A_k * B_k (signed x signed) for the blocks at a[k] / b[k]
// (k < count). GCC's tileloadd asm names no memory operand: the barrier keeps the loads after
// every earlier store.
inline void round_products(const uint8_t* const a[4], int64_t a_stride, const uint8_t* const b[4], int count) {
  __asm__ volatile("" ::: "memory");
#define SLUICE_AMX_STEP(K, TA, TB)   \
  _tile_zero(K);                     \
  _tile_loadd(TA, a[K], a_stride);   \
  _tile_loadd(TB, b[K], 64);         \
  _tile_dpbssd(K, TA, TB);
  SLUICE_AMX_STEP(0, 4, 5)
  if (count > 1) { SLUICE_AMX_STEP(1, 6, 7) }
  if (count > 2) { SLUICE_AMX_STEP(2, 4, 5) }
  if (count > 3) { SLUICE_AMX_STEP(3, 6, 7) }
#undef SLUICE_AMX_STEP
}

// Stores C tiles 0 .. count-1 into c[k][token][row].
inline void store_c(int32_t (*c)[kTileTokens][kGroupRows], int count) {
  _tile_stored(0, c[0], 64);
  if (count > 1) _tile_stored(1, c[1], 64);
  if (count > 2) _tile_stored(2, c[2], 64);
  if (count > 3) _tile_stored(3, c[3], 64);
}

// One group of 16 rows x 16 tokens of Q8_0: B is the packed block itself (qs[c] = elements
// 4c .. 4c + 3 of every row), signed x signed.
void amx_q8_0(int64_t nb, const BlockQ8_0x16* w, const uint8_t* a, int64_t a_stride, float* out,
              int64_t out_stride) {
  alignas(64) int32_t cq[4][kTileTokens][kGroupRows];
  __m512 acc[kTileTokens];
#pragma GCC unroll 16
  for (int t = 0; t < kTileTokens; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t i0 = 0; i0 < nb; i0 += 4) {
    const int count = int(std::min<int64_t>(4, nb - i0));
    const uint8_t* as[4] = {};
    const uint8_t* bs[4] = {};
    for (int k = 0; k < count; ++k) {
      as[k] = reinterpret_cast<const uint8_t*>((reinterpret_cast<const BlockQ8_0*>(a) + i0 + k)->qs);
      bs[k] = reinterpret_cast<const uint8_t*>(w[i0 + k].qs[0]);
    }
    round_products(as, a_stride, bs, count);
    store_c(cq, count);
    for (int k = 0; k < count; ++k) {
      const BlockQ8_0x16& p = w[i0 + k];
      const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.d)));
#pragma GCC unroll 16
      for (int t = 0; t < kTileTokens; ++t) {
        const float dt = _cvtsh_ss(reinterpret_cast<const BlockQ8_0*>(a + t * a_stride)[i0 + k].d);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cq[k][t])), _mm512_mul_ps(dv, _mm512_set1_ps(dt)),
                                 acc[t]);
      }
    }
  }
  for (int t = 0; t < kTileTokens; ++t) _mm512_storeu_ps(out + t * out_stride, acc[t]);
}

// Whole 16-token tiles on AMX (token tiles outside, groups inside, as the AVX-512 kernel walks
// them), the rest of the tokens through the AVX-512 kernel.
void vec_dot_packed_q8_0(int64_t n, const void* w, int n_groups, const void* a, int64_t a_stride, int n_cols,
                         float* out, int64_t out_stride) {
  SLUICE_CHECK(n_groups >= 0 && n_cols >= 0, "vec_dot_packed: negative group or column count");
  static constexpr TileConfig kConfig = make_config(kQK);
  const int64_t nb = n / kQK;
  const auto* wp = static_cast<const BlockQ8_0x16*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  const int whole = nb > 0 && n_groups > 0 ? n_cols / kTileTokens * kTileTokens : 0;
  if (whole > 0) {
    const TileScope scope(kConfig);
    for (int c = 0; c < whole; c += kTileTokens)
      for (int g = 0; g < n_groups; ++g)
        amx_q8_0(nb, wp + g * nb, ab + c * a_stride, a_stride, out + c * out_stride + g * kGroupRows, out_stride);
  }
  if (whole < n_cols)
    avx512_packed(Type::kQ8_0)(n, w, n_groups, ab + whole * a_stride, a_stride, n_cols - whole,
                               out + whole * out_stride, out_stride);
}

}  // namespace

bool install_amx_packed(Kernels* t) {
  t[int(Type::kQ8_0)].vec_dot_packed = vec_dot_packed_q8_0;
  return true;
}

}  // namespace sluice::quant::detail

#else  // not compiled for AMX: nothing installed, and the registry then has no AMX table

namespace sluice::quant::detail {
bool install_amx_packed(Kernels*) { return false; }
}  // namespace sluice::quant::detail

#endif
