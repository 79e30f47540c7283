// Weight quantizers of the K-quants. Not bit-identical to any other implementation (weights are
// quantized once, offline); sound instead: every sub-block's scale (and min) comes from a search
// over candidate grids with a least-squares refit, the super-block scales are quantized with the
// f16-rounded super scale actually stored, and the quants are recomputed against the final,
// quantized scales so dequantize(quantize(x)) is the best grid point for each element.
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

int clampi(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }
int roundi(float v) { return int(std::lround(v)); }

// Affine fit x ~= scale*q - mn with q in [0, nmax], scale >= 0, mn >= 0 (the K-quant formats
// store mins as non-negative magnitudes subtracted). Minimises squared error over a grid of
// candidate step sizes, each followed by the closed-form least-squares (scale, offset).
void fit_affine(const float* x, int n, int nmax, float* scale, float* mn) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);
  if (hi <= lo) {
    *scale = 0;
    *mn = -lo;
    return;
  }
  float best_err = INFINITY, best_a = (hi - lo) / nmax, best_b = lo;
  auto error_of = [&](float a, float b) {
    float e = 0;
    const float ia = a > 0 ? 1 / a : 0;
    for (int i = 0; i < n; ++i) {
      const int q = clampi(roundi((x[i] - b) * ia), 0, nmax);
      const float r = a * float(q) + b - x[i];
      e += r * r;
    }
    return e;
  };
  best_err = error_of(best_a, best_b);
  for (int k = -10; k <= 10; ++k) {
    const float iscale = (float(nmax) + 0.1f * float(k)) / (hi - lo);
    if (iscale <= 0) continue;
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    for (int i = 0; i < n; ++i) {
      const int q = clampi(roundi((x[i] - lo) * iscale), 0, nmax);
      sq += q;
      sqq += double(q) * q;
      sx += x[i];
      sxq += double(x[i]) * q;
    }
    const double det = n * sqq - sq * sq;
    if (det <= 0) continue;
    double a = (n * sxq - sq * sx) / det;
    double b = (sqq * sx - sq * sxq) / det;
    if (b > 0) {  // offset must be <= 0: refit the scale alone with b = 0
      b = 0;
      a = sqq > 0 ? sxq / sqq : 0;
    }
    if (a <= 0) continue;
    const float err = error_of(float(a), float(b));
    if (err < best_err) {
      best_err = err;
      best_a = float(a);
      best_b = float(b);
    }
  }
  *scale = best_a;
  *mn = -best_b;
}

// Symmetric fit x ~= scale*q with q in [qmin, qmax] (qmin = -qmax-1). The element of largest
// magnitude anchors the grid at either end; least-squares refit per candidate.
float fit_symmetric(const float* x, int n, int qmin, int qmax) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax == 0) return 0;
  auto error_of = [&](float s) {
    const float is = 1 / s;
    float e = 0;
    for (int i = 0; i < n; ++i) {
      const float r = s * float(clampi(roundi(x[i] * is), qmin, qmax)) - x[i];
      e += r * r;
    }
    return e;
  };
  float best_s = max / float(qmin), best_err = error_of(best_s);
  for (int end : {qmin, qmax}) {
    for (int k = -10; k <= 10; ++k) {
      const float target = float(end) + (end < 0 ? -0.1f : 0.1f) * float(k);
      if (target == 0 || (target < 0) != (end < 0)) continue;
      const float iscale = target / max;
      double sxq = 0, sqq = 0;
      for (int i = 0; i < n; ++i) {
        const int q = clampi(roundi(x[i] * iscale), qmin, qmax);
        sxq += double(x[i]) * q;
        sqq += double(q) * q;
      }
      if (sqq == 0 || sxq == 0) continue;
      const float s = float(sxq / sqq);
      const float err = error_of(s);
      if (err < best_err) {
        best_err = err;
        best_s = s;
      }
    }
  }
  return best_s;
}

// Super-block scale for non-negative sub-block values v[0..m) quantized to [0, levels]: the
// stored f16 value (as float), or 0.
float super_scale_unsigned(const float* v, int m, int levels, uint16_t* stored) {
  float mx = 0;
  for (int j = 0; j < m; ++j) mx = std::max(mx, v[j]);
  *stored = fp32_to_fp16(mx / float(levels));
  return fp16_to_fp32(*stored);
}

// Affine K-quants (Q2_K, Q4_K, Q5_K): per sub-block of `sub` elements, q in [0, nmax], integer
// scales and mins in [0, smax]. Outputs q[256], L/M per sub-block and the stored d, dmin.
void quantize_affine_superblock(const float* x, int sub, int nmax, int smax, uint8_t* q, uint8_t* L, uint8_t* M,
                                uint16_t* d16, uint16_t* dmin16) {
  const int nsub = kQK_K / sub;
  float scales[16], mins[16];
  for (int j = 0; j < nsub; ++j) fit_affine(x + sub * j, sub, nmax, &scales[j], &mins[j]);
  const float d = super_scale_unsigned(scales, nsub, smax, d16);
  const float dmin = super_scale_unsigned(mins, nsub, smax, dmin16);
  for (int j = 0; j < nsub; ++j) {
    L[j] = uint8_t(d > 0 ? clampi(roundi(scales[j] / d), 0, smax) : 0);
    M[j] = uint8_t(dmin > 0 ? clampi(roundi(mins[j] / dmin), 0, smax) : 0);
    const float dl = d * float(L[j]), ml = dmin * float(M[j]);
    for (int l = 0; l < sub; ++l) {
      q[sub * j + l] = uint8_t(dl > 0 ? clampi(roundi((x[sub * j + l] + ml) / dl), 0, nmax) : 0);
    }
  }
}

// Symmetric K-quants (Q3_K, Q6_K): 16 sub-blocks of 16, q in [qmin, qmax], signed integer
// scales in [smin, smax] (smin = -smax-1; the largest-magnitude sub-block scale maps to smin).
void quantize_symmetric_superblock(const float* x, int qmin, int qmax, int smin, int smax, int8_t* q, int8_t* L,
                                   uint16_t* d16) {
  float scales[16];
  float amax = 0, max = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = fit_symmetric(x + 16 * j, 16, qmin, qmax);
    if (std::fabs(scales[j]) > amax) {
      amax = std::fabs(scales[j]);
      max = scales[j];
    }
  }
  *d16 = fp32_to_fp16(max / float(smin));
  const float d = fp16_to_fp32(*d16);
  for (int j = 0; j < 16; ++j) {
    L[j] = int8_t(d != 0 ? clampi(roundi(scales[j] / d), smin, smax) : 0);
    const float dl = d * float(L[j]);
    for (int l = 0; l < 16; ++l) {
      q[16 * j + l] = int8_t(dl != 0 ? clampi(roundi(x[16 * j + l] / dl), qmin, qmax) : 0);
    }
  }
}

}  // namespace

void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ2_K*>(dst);
  for (int64_t i = 0; i < super_blocks(n); ++i, src += kQK_K) {
    uint8_t q[kQK_K], L[16], M[16];
    quantize_affine_superblock(src, 16, 3, 15, q, L, M, &b[i].d, &b[i].dmin);
    for (int s = 0; s < 16; ++s) b[i].scales[s] = uint8_t(L[s] | M[s] << 4);
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) b[i].qs[32 * h + l] |= uint8_t(q[128 * h + 32 * k + l] << (2 * k));
  }
}

void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ3_K*>(dst);
  for (int64_t i = 0; i < super_blocks(n); ++i, src += kQK_K) {
    int8_t q[kQK_K], L[16];
    quantize_symmetric_superblock(src, -4, 3, -32, 31, q, L, &b[i].d);
    std::memset(b[i].scales, 0, sizeof(b[i].scales));
    for (int s = 0; s < 16; ++s) {
      const int v = L[s] + 32;
      b[i].scales[s % 8] |= uint8_t((v & 0xF) << (s < 8 ? 0 : 4));
      b[i].scales[8 + s % 4] |= uint8_t((v >> 4) << (2 * (s / 4)));
    }
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    std::memset(b[i].hmask, 0, sizeof(b[i].hmask));
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int v = q[128 * h + 32 * k + l] + 4;
          b[i].qs[32 * h + l] |= uint8_t((v & 3) << (2 * k));
          b[i].hmask[l] |= uint8_t((v >> 2) << (4 * h + k));
        }
  }
}

// 6-bit scales and mins of Q4_K/Q5_K, the inverse of unpack_k_scale.
static void pack_k_scales(const uint8_t* L, const uint8_t* M, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t(L[j] | (L[j + 4] >> 4) << 6);
    s[j + 4] = uint8_t(M[j] | (M[j + 4] >> 4) << 6);
    s[j + 8] = uint8_t((L[j + 4] & 0xF) | (M[j + 4] & 0xF) << 4);
  }
}

void quantize_row_q4_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  for (int64_t i = 0; i < super_blocks(n); ++i, src += kQK_K) {
    uint8_t q[kQK_K], L[8], M[8];
    quantize_affine_superblock(src, 32, 15, 63, q, L, M, &b[i].d, &b[i].dmin);
    pack_k_scales(L, M, b[i].scales);
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l) b[i].qs[32 * p + l] = uint8_t(q[64 * p + l] | q[64 * p + 32 + l] << 4);
  }
}

void quantize_row_q5_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  for (int64_t i = 0; i < super_blocks(n); ++i, src += kQK_K) {
    uint8_t q[kQK_K], L[8], M[8];
    quantize_affine_superblock(src, 32, 31, 63, q, L, M, &b[i].d, &b[i].dmin);
    pack_k_scales(L, M, b[i].scales);
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l) {
        const int lo = q[64 * p + l], hi = q[64 * p + 32 + l];
        b[i].qs[32 * p + l] = uint8_t((lo & 0xF) | (hi & 0xF) << 4);
        b[i].qh[l] |= uint8_t((lo >> 4) << (2 * p) | (hi >> 4) << (2 * p + 1));
      }
  }
}

void quantize_row_q6_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  for (int64_t i = 0; i < super_blocks(n); ++i, src += kQK_K) {
    int8_t q[kQK_K], L[16];
    quantize_symmetric_superblock(src, -32, 31, -128, 127, q, L, &b[i].d);
    std::memcpy(b[i].scales, L, 16);
    std::memset(b[i].ql, 0, sizeof(b[i].ql));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int v = q[128 * h + 32 * k + l] + 32;
          b[i].ql[64 * h + l + 32 * (k & 1)] |= uint8_t((v & 0xF) << (4 * (k >> 1)));
          b[i].qh[32 * h + l] |= uint8_t((v >> 4) << (2 * k));
        }
  }
}

}  // namespace sluice::quant::ref
