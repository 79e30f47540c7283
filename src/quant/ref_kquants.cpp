// Scalar specification of the K-quant formats (256-element super-blocks): dequantize, the Q8_K
// activation quantizer (bit-identical to ggml's reference, bsums included) and vec_dot against
// Q8_K. Weight quantizers are in ref_kquantize.cpp. Layouts: blocks.h.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/status.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/ref.h"

namespace sluice::quant::ref {
namespace {

int64_t super_blocks(int64_t n) {
  SLUICE_CHECK(n >= 0 && n % kQK_K == 0, "row length must be a non-negative multiple of 256");
  return n / kQK_K;
}

// Round to nearest, ties to even, exact for |x| < 2^22 (adding 1.5*2^23 puts the integer in the
// low mantissa bits). Kept in this form because Q8_K must round exactly like ggml's quantizer.
int nearest_int(float x) {
  const float v = x + 12582912.f;
  int32_t i;
  std::memcpy(&i, &v, sizeof(i));
  return (i & 0x007FFFFF) - 0x00400000;
}

// Unpacked quants of one super-block, element order (see blocks.h for the bit positions).
void unpack_q2_k(const BlockQ2_K& b, int8_t* q) {
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) q[128 * h + 32 * k + l] = int8_t((b.qs[32 * h + l] >> (2 * k)) & 3);
}
void unpack_q3_k(const BlockQ3_K& b, int8_t* q) {
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int lo = (b.qs[32 * h + l] >> (2 * k)) & 3;
        const int hi = (b.hmask[l] >> (4 * h + k)) & 1;
        q[128 * h + 32 * k + l] = int8_t(lo + 4 * hi - 4);
      }
}
void unpack_q4_k(const BlockQ4_K& b, int8_t* q) {
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l) {
      q[64 * p + l] = int8_t(b.qs[32 * p + l] & 0xF);
      q[64 * p + 32 + l] = int8_t(b.qs[32 * p + l] >> 4);
    }
}
void unpack_q5_k(const BlockQ5_K& b, int8_t* q) {
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l) {
      q[64 * p + l] = int8_t((b.qs[32 * p + l] & 0xF) | ((b.qh[l] >> (2 * p)) & 1) << 4);
      q[64 * p + 32 + l] = int8_t((b.qs[32 * p + l] >> 4) | ((b.qh[l] >> (2 * p + 1)) & 1) << 4);
    }
}
void unpack_q6_k(const BlockQ6_K& b, int8_t* q) {
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int lo = (b.ql[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0xF;
        const int hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
        q[128 * h + 32 * k + l] = int8_t((lo | hi << 4) - 32);
      }
}

int dot16(const int8_t* a, const int8_t* b, int len) {
  int s = 0;
  for (int i = 0; i < len; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

// ---- dequantize -------------------------------------------------------------------------------

void dequantize_row_q2_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ2_K*>(src);
  int8_t q[kQK_K];
  for (int64_t i = 0; i < super_blocks(n); ++i, dst += kQK_K) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    unpack_q2_k(b[i], q);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * float(b[i].scales[s] & 0xF), ml = dmin * float(b[i].scales[s] >> 4);
      for (int l = 0; l < 16; ++l) dst[16 * s + l] = dl * float(q[16 * s + l]) - ml;
    }
  }
}

void dequantize_row_q3_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ3_K*>(src);
  int8_t q[kQK_K];
  for (int64_t i = 0; i < super_blocks(n); ++i, dst += kQK_K) {
    const float d = fp16_to_fp32(b[i].d);
    unpack_q3_k(b[i], q);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * float(unpack_q3k_scale(b[i].scales, s) - 32);
      for (int l = 0; l < 16; ++l) dst[16 * s + l] = dl * float(q[16 * s + l]);
    }
  }
}

namespace {

// Q4_K and Q5_K share the super-block scheme (8 sub-blocks of 32, 6-bit scale and min each);
// only the unpacking of the quants differs (unpack_q4_k / unpack_q5_k, chosen by overload).
void unpack_kmin(const BlockQ4_K& b, int8_t* q) { unpack_q4_k(b, q); }
void unpack_kmin(const BlockQ5_K& b, int8_t* q) { unpack_q5_k(b, q); }

template <class Block>
void dequantize_row_kmin(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const Block*>(src);
  int8_t q[kQK_K];
  for (int64_t i = 0; i < super_blocks(n); ++i, dst += kQK_K) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    unpack_kmin(b[i], q);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      unpack_k_scale(b[i].scales, j, &sc, &mn);
      const float dl = d * float(sc), ml = dmin * float(mn);
      for (int l = 0; l < 32; ++l) dst[32 * j + l] = dl * float(q[32 * j + l]) - ml;
    }
  }
}

}  // namespace

void dequantize_row_q4_k(const void* src, float* dst, int64_t n) { dequantize_row_kmin<BlockQ4_K>(src, dst, n); }
void dequantize_row_q5_k(const void* src, float* dst, int64_t n) { dequantize_row_kmin<BlockQ5_K>(src, dst, n); }

void dequantize_row_q6_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  int8_t q[kQK_K];
  for (int64_t i = 0; i < super_blocks(n); ++i, dst += kQK_K) {
    const float d = fp16_to_fp32(b[i].d);
    unpack_q6_k(b[i], q);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * float(b[i].scales[s]);
      for (int l = 0; l < 16; ++l) dst[16 * s + l] = dl * float(q[16 * s + l]);
    }
  }
}

void dequantize_row_q8_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < super_blocks(n); ++i, dst += kQK_K) {
    for (int j = 0; j < kQK_K; ++j) dst[j] = b[i].d * float(b[i].qs[j]);
  }
}

// The element of largest magnitude (first one on ties) maps to -127 exactly; d = 1/iscale is
// stored in f32. An all-zero block stores d = 0 and zero quants and sums.
void quantize_row_q8_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < super_blocks(n); ++i, src += kQK_K) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(src[j]);
      if (ax > amax) {
        amax = ax;
        max = src[j];
      }
    }
    if (amax == 0) {
      std::memset(&b[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) b[i].qs[j] = int8_t(std::min(127, nearest_int(iscale * src[j])));
    for (int g = 0; g < kQK_K / 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += b[i].qs[16 * g + l];
      b[i].bsums[g] = int16_t(s);
    }
    b[i].d = 1 / iscale;
  }
}

// ---- vec_dot against Q8_K ---------------------------------------------------------------------
// Each is sum over sub-blocks of (integer scale) * (integer dot of quants), times the f32
// product of super-block scales; the min terms use Q8_K's bsums.

void vec_dot_q2_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  int8_t q[kQK_K];
  float sum = 0;
  for (int64_t i = 0; i < super_blocks(n); ++i) {
    unpack_q2_k(x[i], q);
    int isum = 0, msum = 0;
    for (int s = 0; s < 16; ++s) {
      isum += (x[i].scales[s] & 0xF) * dot16(q + 16 * s, y[i].qs + 16 * s, 16);
      msum += (x[i].scales[s] >> 4) * y[i].bsums[s];
    }
    const float dall = y[i].d * fp16_to_fp32(x[i].d);
    const float dmin = y[i].d * fp16_to_fp32(x[i].dmin);
    sum += dall * float(isum) - dmin * float(msum);
  }
  *out = sum;
}

void vec_dot_q3_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  int8_t q[kQK_K];
  float sum = 0;
  for (int64_t i = 0; i < super_blocks(n); ++i) {
    unpack_q3_k(x[i], q);
    int isum = 0;
    for (int s = 0; s < 16; ++s) {
      isum += (unpack_q3k_scale(x[i].scales, s) - 32) * dot16(q + 16 * s, y[i].qs + 16 * s, 16);
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * float(isum);
  }
  *out = sum;
}

namespace {

template <class Block>
void vec_dot_kmin(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  int8_t q[kQK_K];
  float sum = 0;
  for (int64_t i = 0; i < super_blocks(n); ++i) {
    unpack_kmin(x[i], q);
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      unpack_k_scale(x[i].scales, j, &sc, &mn);
      isum += sc * dot16(q + 32 * j, y[i].qs + 32 * j, 32);
      msum += mn * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    }
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    const float dmin = fp16_to_fp32(x[i].dmin) * y[i].d;
    sum += d * float(isum) - dmin * float(msum);
  }
  *out = sum;
}

}  // namespace

void vec_dot_q4_k(int64_t n, const void* w, const void* a, float* out) { vec_dot_kmin<BlockQ4_K>(n, w, a, out); }
void vec_dot_q5_k(int64_t n, const void* w, const void* a, float* out) { vec_dot_kmin<BlockQ5_K>(n, w, a, out); }

void vec_dot_q6_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  int8_t q[kQK_K];
  float sum = 0;
  for (int64_t i = 0; i < super_blocks(n); ++i) {
    unpack_q6_k(x[i], q);
    int isum = 0;
    for (int s = 0; s < 16; ++s) isum += x[i].scales[s] * dot16(q + 16 * s, y[i].qs + 16 * s, 16);
    sum += fp16_to_fp32(x[i].d) * y[i].d * float(isum);
  }
  *out = sum;
}

}  // namespace sluice::quant::ref
