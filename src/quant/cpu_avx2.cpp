// AVX2 + FMA + F16C kernels. Each computes the same per-block integer sums as the scalar
// reference (ref_*.cpp) and differs from it only in the order of f32 additions.
#include "quant/simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <cmath>

#include "core/status.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/ref.h"
#include "quant/simd_x86.h"

namespace sluice::quant::detail {
namespace {

using namespace x86;  // NOLINT(google-build-using-namespace): helper intrinsics

int64_t nblocks(int64_t n, int64_t block) {
  SLUICE_CHECK(n >= 0 && n % block == 0, "row length must be a non-negative multiple of the block size");
  return n / block;
}

// ---- float formats ----------------------------------------------------------------------------

void vec_dot_f32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += x[i] * y[i];
  *out = s;
}

void vec_dot_f16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  auto ld = [](const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(ld(x + i + 8 * k), ld(y + i + 8 * k), acc[k]);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += f16(x[i]) * f16(y[i]);
  *out = s;
}

// bf16 -> f32 is a 16-bit left shift of the bits.
inline __m256 load_bf16(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

void vec_dot_bf16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(load_bf16(x + i + 8 * k), load_bf16(y + i + 8 * k), acc[k]);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]);
  *out = s;
}

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) dst[i] = f16(s[i]);
}

void quantize_row_f16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
}

// ---- legacy formats x Q8_0 / Q8_1 -------------------------------------------------------------
// Two independent accumulators hide FMA latency; each block adds d_x*d_y*float(sum_i32).

void vec_dot_q4_0(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = nblocks(n, kQK);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const __m256i eight = _mm256_set1_epi8(8);
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m256i q0 = _mm256_sub_epi8(nibbles_32(x[i].qs), eight);
    const __m256i q1 = _mm256_sub_epi8(nibbles_32(x[i + 1].qs), eight);
    const __m256i s0 = dot_s8_s8(q0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs)));
    const __m256i s1 = dot_s8_s8(q1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i + 1].qs)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * f16(y[i].d)), _mm256_cvtepi32_ps(s0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i + 1].d) * f16(y[i + 1].d)), _mm256_cvtepi32_ps(s1), acc1);
  }
  for (; i < nb; ++i) {
    const __m256i q = _mm256_sub_epi8(nibbles_32(x[i].qs), eight);
    const __m256i s = dot_s8_s8(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * f16(y[i].d)), _mm256_cvtepi32_ps(s), acc0);
  }
  *out = hsum(_mm256_add_ps(acc0, acc1));
}

// One accumulator chain in llama.cpp's x86 order (ggml-cpu's AVX2 kernel, which its AVX-512
// builds run too), so that a Q4_1 model's logits equal llama.cpp's bit for bit on x86: per block
// in turn, lane j += (d_x * d_y) * (i32 sum over elements 4j..4j+3) as one FMA, the min terms
// m_x * s_y in a scalar FMA chain, then hsum (lanes (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then
// 0+1) plus the min chain. The AVX2 and AVX-512 vec_dot_cols kernels follow the same order.
void vec_dot_q4_1(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ4_1*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  const int64_t nb = nblocks(n, kQK);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i s = dot_u8_s8(nibbles_32(x[i].qs), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * f16(y[i].d)), _mm256_cvtepi32_ps(s), acc);
    mins = std::fma(f16(x[i].m), f16(y[i].s), mins);
  }
  *out = hsum(acc) + mins;
}

void vec_dot_q5_0(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ5_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = nblocks(n, kQK);
  __m256 acc = _mm256_setzero_ps();
  const __m256i bit4 = _mm256_set1_epi8(0x10), sixteen = _mm256_set1_epi8(16);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i hi = _mm256_and_si256(bits_to_bytes(x[i].qh), bit4);
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibbles_32(x[i].qs), hi), sixteen);
    const __m256i s = dot_s8_s8(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * f16(y[i].d)), _mm256_cvtepi32_ps(s), acc);
  }
  *out = hsum(acc);
}

void vec_dot_q5_1(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ5_1*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  const int64_t nb = nblocks(n, kQK);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = _mm256_or_si256(nibbles_32(x[i].qs), _mm256_and_si256(bits_to_bytes(x[i].qh), bit4));
    const __m256i s = dot_u8_s8(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * f16(y[i].d)), _mm256_cvtepi32_ps(s), acc);
    mins += f16(x[i].m) * f16(y[i].s);
  }
  *out = hsum(acc) + mins;
}

void vec_dot_q8_0(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = nblocks(n, kQK);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  auto ld = [](const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); };
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m256i s0 = dot_s8_s8(ld(x[i].qs), ld(y[i].qs));
    const __m256i s1 = dot_s8_s8(ld(x[i + 1].qs), ld(y[i + 1].qs));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * f16(y[i].d)), _mm256_cvtepi32_ps(s0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i + 1].d) * f16(y[i + 1].d)), _mm256_cvtepi32_ps(s1), acc1);
  }
  for (; i < nb; ++i) {
    const __m256i s = dot_s8_s8(ld(x[i].qs), ld(y[i].qs));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * f16(y[i].d)), _mm256_cvtepi32_ps(s), acc0);
  }
  *out = hsum(_mm256_add_ps(acc0, acc1));
}

// ---- activation quantizers (bit-identical to ref::quantize_row_q8_{0,1}_rne / q8_k) ----------

// Returns amax of 32 floats and leaves the four rounded i32 vectors of x * (127/amax).
inline float q8_block(const float* x, __m256i* q) {
  __m256 v[4];
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    m = _mm256_max_ps(m, _mm256_and_ps(v[k], abs_mask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const __m256 mul = _mm256_set1_ps(amax != 0 ? 127.0f / amax : 0.0f);
  for (int k = 0; k < 4; ++k)
    q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return amax;
}

inline void store_q8(const __m256i* q, int8_t* dst) {
  const __m256i a = _mm256_packs_epi32(q[0], q[1]);
  const __m256i b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i p = _mm256_packs_epi16(a, b);  // lane-interleaved; fix order with a dword permute
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < nblocks(n, kQK); ++i) {
    __m256i q[4];
    const float amax = q8_block(src + kQK * i, q);
    b[i].d = fp32_to_fp16(amax / 127);
    store_q8(q, b[i].qs);
  }
}

void quantize_row_q8_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < nblocks(n, kQK); ++i) {
    __m256i q[4];
    const float amax = q8_block(src + kQK * i, q);
    const float d = amax / 127;
    b[i].d = fp32_to_fp16(d);
    const int sum = hsum(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    b[i].s = fp32_to_fp16(d * float(sum));
    store_q8(q, b[i].qs);
  }
}

void quantize_row_q8_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t i = 0; i < nblocks(n, kQK_K); ++i) {
    const float* x = src + kQK_K * i;
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < kQK_K; k += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    if (amax == 0) {
      std::memset(&b[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The signed extreme is the first element whose magnitude equals amax (as the reference).
    float max = 0;
    const __m256 target = _mm256_set1_ps(amax);
    for (int k = 0; k < kQK_K; k += 8) {
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask), target, _CMP_EQ_OQ));
      if (mask) {
        max = x[k + __builtin_ctz(unsigned(mask))];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m256 mul = _mm256_set1_ps(iscale);
    for (int k = 0; k < kQK_K; k += 32) {
      __m256i q[4];
      for (int j = 0; j < 4; ++j) {
        // cvtps rounds to nearest-even like the reference's nearest_int; cap at 127 as it does.
        q[j] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * j), mul)),
                                _mm256_set1_epi32(127));
      }
      store_q8(q, b[i].qs + k);
    }
    for (int g = 0; g < 16; ++g) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 16 * g));
      const __m256i w16 = _mm256_cvtepi8_epi16(v);
      const __m256i s32 = _mm256_madd_epi16(w16, _mm256_set1_epi16(1));
      b[i].bsums[g] = int16_t(hsum(s32));
    }
    b[i].d = 1 / iscale;
  }
}

// ---- K-quants x Q8_K --------------------------------------------------------------------------

inline __m256i ld256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// i16 scale vector for one maddubs result of 32 elements: lanes 0-7 (elements 0..15) get s0,
// lanes 8-15 (elements 16..31) get s1.
inline __m256i scale_pair(int s0, int s1) {
  return _mm256_set_m128i(_mm_set1_epi16(int16_t(s1)), _mm_set1_epi16(int16_t(s0)));
}

// sum_g scales16[g] * bsums[g] over the 16 groups, scales given as 16 i16.
inline int dot_bsums(__m256i scales16, const int16_t* bsums) {
  return hsum(_mm256_madd_epi16(scales16, ld256(bsums)));
}

void vec_dot_q2_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < nblocks(n, kQK_K); ++i) {
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F)));
    mins += y[i].d * f16(x[i].dmin) * float(dot_bsums(mn16, y[i].bsums));
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = ld256(x[i].qs + 32 * h);
      for (int k = 0; k < 4; ++k) {
        const __m256i qk = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
        const __m256i p = _mm256_maddubs_epi16(qk, ld256(y[i].qs + 128 * h + 32 * k));
        const int s = 8 * h + 2 * k;
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scale_pair(x[i].scales[s] & 0xF, x[i].scales[s + 1] & 0xF)));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * f16(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  *out = hsum(acc) - mins;
}

void vec_dot_q3_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nblocks(n, kQK_K); ++i) {
    int16_t sc[16];
    for (int s = 0; s < 16; ++s) sc[s] = int16_t(unpack_q3k_scale(x[i].scales, s) - 32);
    const __m256i sc16 = ld256(sc);
    // q = u - 4 with u = low2 | hbit << 2 in [0, 7]: sum q*y = sum u*y - 4 * bsum.
    int isum = -4 * dot_bsums(sc16, y[i].bsums);
    const __m256i hm = ld256(x[i].hmask);
    __m256i acc_i = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = ld256(x[i].qs + 32 * h);
      for (int k = 0; k < 4; ++k) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + k), one);
        const __m256i u = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2));
        const __m256i p = _mm256_maddubs_epi16(u, ld256(y[i].qs + 128 * h + 32 * k));
        const int s = 8 * h + 2 * k;
        acc_i = _mm256_add_epi32(acc_i, _mm256_madd_epi16(p, scale_pair(sc[s], sc[s + 1])));
      }
    }
    isum += hsum(acc_i);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * y[i].d), _mm256_set1_ps(float(isum)), acc);
  }
  *out = _mm256_cvtss_f32(acc);
}

// Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins (layout in blocks.h). With the 12
// bytes read as little-endian words a = s[0..4), b = s[4..8), c = s[8..12):
//   scales 0-3 = a & 0x3F..,  scales 4-7 = (c & 0x0F..) | ((a >> 6) & 0x03..) << 4
//   mins   0-3 = b & 0x3F..,  mins   4-7 = ((c >> 4) & 0x0F..) | ((b >> 6) & 0x03..) << 4
// Returns the 8 scales as i16 lanes and the min term sum_j mn_j * (bsums[2j] + bsums[2j+1]).
inline __m128i k_scales(const uint8_t* s, const int16_t* bsums, int* min_dot) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint64_t sc = uint64_t(a & 0x3F3F3F3Fu) | uint64_t((c & 0x0F0F0F0Fu) | ((a >> 6) & 0x03030303u) << 4) << 32;
  const uint64_t mn = uint64_t(b & 0x3F3F3F3Fu) | uint64_t(((c >> 4) & 0x0F0F0F0Fu) | ((b >> 6) & 0x03030303u) << 4) << 32;
  const __m128i mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(mn)));
  const __m128i pair = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums)),
                                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums + 8)));
  __m128i m = _mm_madd_epi16(mn16, pair);
  m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0xB1));
  *min_dot = _mm_cvtsi128_si32(m);
  return _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc)));
}

// i16 lane j of v broadcast to all 16 lanes of a 256-bit vector.
template <int j>
inline __m256i bcast16(__m256i v2) {
  return _mm256_shuffle_epi8(v2, _mm256_set1_epi16(int16_t((2 * j) | (2 * j + 1) << 8)));
}

void vec_dot_q4_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < nblocks(n, kQK_K); ++i) {
    int min_dot;
    const __m256i sc = _mm256_broadcastsi128_si256(k_scales(x[i].scales, y[i].bsums, &min_dot));
    const float dy = y[i].d;
    mins += dy * f16(x[i].dmin) * float(min_dot);
    const uint8_t* q4 = x[i].qs;
    const int8_t* q8 = y[i].qs;
    auto part = [&](int p, __m256i slo, __m256i shi) {
      const __m256i q = ld256(q4 + 32 * p);
      const __m256i plo = _mm256_maddubs_epi16(_mm256_and_si256(q, m4), ld256(q8 + 64 * p));
      const __m256i phi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), ld256(q8 + 64 * p + 32));
      return _mm256_add_epi32(_mm256_madd_epi16(plo, slo), _mm256_madd_epi16(phi, shi));
    };
    const __m256i s0 = _mm256_add_epi32(part(0, bcast16<0>(sc), bcast16<1>(sc)), part(1, bcast16<2>(sc), bcast16<3>(sc)));
    const __m256i s1 = _mm256_add_epi32(part(2, bcast16<4>(sc), bcast16<5>(sc)), part(3, bcast16<6>(sc), bcast16<7>(sc)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * f16(x[i].d)), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
  }
  *out = hsum(acc) - mins;
}

void vec_dot_q5_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < nblocks(n, kQK_K); ++i) {
    int min_dot;
    alignas(16) int16_t sc[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(sc), k_scales(x[i].scales, y[i].bsums, &min_dot));
    const float dy = y[i].d;
    mins += dy * f16(x[i].dmin) * float(min_dot);
    const __m256i qh = ld256(x[i].qh);
    __m256i s0 = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i q = ld256(x[i].qs + 32 * p);
      const __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one), 4);
      const __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one), 4);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), hlo);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hhi);
      const __m256i plo = _mm256_maddubs_epi16(lo, ld256(y[i].qs + 64 * p));
      const __m256i phi = _mm256_maddubs_epi16(hi, ld256(y[i].qs + 64 * p + 32));
      s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(plo, _mm256_set1_epi16(sc[2 * p])));
      s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(phi, _mm256_set1_epi16(sc[2 * p + 1])));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * f16(x[i].d)), _mm256_cvtepi32_ps(s0), acc);
  }
  *out = hsum(acc) - mins;
}

void vec_dot_q6_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nblocks(n, kQK_K); ++i) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
    // q = u - 32 with u in [0, 63]: sum q*y = sum u*y - 32 * bsum, per 16-group.
    const int corr = 32 * dot_bsums(sc16, y[i].bsums);
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = ld256(x[i].ql + 64 * h), ql1 = ld256(x[i].ql + 64 * h + 32);
      const __m256i qh = ld256(x[i].qh + 32 * h);
      const __m256i u0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
      const __m256i u1 = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
      const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
      const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
      const int8_t* sc = x[i].scales + 8 * h;
      const int8_t* q8 = y[i].qs + 128 * h;
      s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(u0, ld256(q8)), scale_pair(sc[0], sc[1])));
      s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(u1, ld256(q8 + 32)), scale_pair(sc[2], sc[3])));
      s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(u2, ld256(q8 + 64)), scale_pair(sc[4], sc[5])));
      s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(u3, ld256(q8 + 96)), scale_pair(sc[6], sc[7])));
    }
    const __m256i tot = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_setr_epi32(corr, 0, 0, 0, 0, 0, 0, 0));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * y[i].d), _mm256_cvtepi32_ps(tot), acc);
  }
  *out = hsum(acc);
}

}  // namespace

void install_avx2(Kernels* t) {
  t[int(Type::kF32)].vec_dot = vec_dot_f32;
  t[int(Type::kF16)].vec_dot = vec_dot_f16;
  t[int(Type::kF16)].dequantize_row = dequantize_row_f16;
  t[int(Type::kF16)].quantize_row = quantize_row_f16;
  t[int(Type::kBF16)].vec_dot = vec_dot_bf16;
  t[int(Type::kQ4_0)].vec_dot = vec_dot_q4_0;
  t[int(Type::kQ4_1)].vec_dot = vec_dot_q4_1;
  t[int(Type::kQ5_0)].vec_dot = vec_dot_q5_0;
  t[int(Type::kQ5_1)].vec_dot = vec_dot_q5_1;
  t[int(Type::kQ8_0)].vec_dot = vec_dot_q8_0;
  t[int(Type::kQ8_0)].quantize_row = quantize_row_q8_0;
  t[int(Type::kQ8_1)].quantize_row = quantize_row_q8_1;
  t[int(Type::kQ8_K)].quantize_row = quantize_row_q8_k;
  t[int(Type::kQ2_K)].vec_dot = vec_dot_q2_k;
  t[int(Type::kQ3_K)].vec_dot = vec_dot_q3_k;
  t[int(Type::kQ4_K)].vec_dot = vec_dot_q4_k;
  t[int(Type::kQ5_K)].vec_dot = vec_dot_q5_k;
  t[int(Type::kQ6_K)].vec_dot = vec_dot_q6_k;
}

}  // namespace sluice::quant::detail

#else  // not compiled for AVX2: never installed (best_isa() cannot pick it)

namespace sluice::quant::detail {
void install_avx2(Kernels*) {}
}  // namespace sluice::quant::detail

#endif
