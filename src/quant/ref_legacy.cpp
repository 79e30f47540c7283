// Scalar specification of the float formats and the 32-element "legacy" block formats
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1). Layouts: blocks.h.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/status.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/ref.h"

namespace sluice::quant::ref {
namespace {

int64_t blocks_of(int64_t n, int64_t block) {
  SLUICE_CHECK(n >= 0 && n % block == 0, "row length must be a non-negative multiple of the block size");
  return n / block;
}

// The 5th bits of a Q5 block: bit j of the little-endian u32 belongs to element j.
uint32_t load_qh(const uint8_t* qh) {
  return uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
}
void store_qh(uint8_t* qh, uint32_t v) {
  for (int i = 0; i < 4; ++i) qh[i] = uint8_t(v >> (8 * i));
}

// Largest |x| and the signed value that attains it first (ties keep the earliest element).
void signed_absmax(const float* x, int n, float* amax, float* max) {
  *amax = 0;
  *max = 0;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > *amax) {
      *amax = std::fabs(x[j]);
      *max = x[j];
    }
  }
}

}  // namespace

// ---- F32 / F16 / BF16 -------------------------------------------------------------------------

void dequantize_row_f32(const void* src, float* dst, int64_t n) {
  blocks_of(n, 1);
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}
void quantize_row_f32(const float* src, void* dst, int64_t n) {
  blocks_of(n, 1);
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}
void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < blocks_of(n, 1); ++i) dst[i] = fp16_to_fp32(s[i]);
}
void quantize_row_f16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < blocks_of(n, 1); ++i) d[i] = fp32_to_fp16(src[i]);
}
void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < blocks_of(n, 1); ++i) dst[i] = bf16_to_fp32(s[i]);
}
void quantize_row_bf16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < blocks_of(n, 1); ++i) d[i] = fp32_to_bf16(src[i]);
}

// Float dots accumulate in double: the reference is the exact-as-practical sum; SIMD versions
// (f32 lanes) are compared against it with a tolerance.
void vec_dot_f32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  double s = 0;
  for (int64_t i = 0; i < blocks_of(n, 1); ++i) s += double(x[i]) * double(y[i]);
  *out = float(s);
}
void vec_dot_f16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  double s = 0;
  for (int64_t i = 0; i < blocks_of(n, 1); ++i) s += double(fp16_to_fp32(x[i])) * double(fp16_to_fp32(y[i]));
  *out = float(s);
}
void vec_dot_bf16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  double s = 0;
  for (int64_t i = 0; i < blocks_of(n, 1); ++i) s += double(bf16_to_fp32(x[i])) * double(bf16_to_fp32(y[i]));
  *out = float(s);
}

// ---- Q4_0 / Q4_1 ------------------------------------------------------------------------------

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, dst += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = float((b[i].qs[j] & 0xF) - 8) * d;
      dst[j + kQK / 2] = float((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

// Symmetric 4-bit: the element of largest magnitude maps to -8 exactly, so its sign picks which
// end of the asymmetric [-8, 7] range is used fully.
void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, src += kQK) {
    float amax, max;
    signed_absmax(src, kQK, &amax, &max);
    const float d = max / -8;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, int(int8_t(src[j] * id + 8.5f)));
      const int q1 = std::min(15, int(int8_t(src[j + kQK / 2] * id + 8.5f)));
      b[i].qs[j] = uint8_t(q0 | q1 << 4);
    }
  }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, dst += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = float(b[i].qs[j] & 0xF) * d + m;
      dst[j + kQK / 2] = float(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_1*>(dst);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, src += kQK) {
    float lo = src[0], hi = src[0];
    for (int j = 1; j < kQK; ++j) {
      lo = std::min(lo, src[j]);
      hi = std::max(hi, src[j]);
    }
    const float d = (hi - lo) / 15;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(lo);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, int(int8_t((src[j] - lo) * id + 0.5f)));
      const int q1 = std::min(15, int(int8_t((src[j + kQK / 2] - lo) * id + 0.5f)));
      b[i].qs[j] = uint8_t(q0 | q1 << 4);
    }
  }
}

// ---- Q5_0 / Q5_1 ------------------------------------------------------------------------------

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, dst += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (b[i].qs[j] & 0xF) | int((qh >> j) & 1) << 4;
      const int q1 = (b[i].qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
      dst[j] = float(q0 - 16) * d;
      dst[j + kQK / 2] = float(q1 - 16) * d;
    }
  }
}

void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_0*>(dst);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, src += kQK) {
    float amax, max;
    signed_absmax(src, kQK, &amax, &max);
    const float d = max / -16;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(31, int(int8_t(src[j] * id + 16.5f)));
      const int q1 = std::min(31, int(int8_t(src[j + kQK / 2] * id + 16.5f)));
      b[i].qs[j] = uint8_t((q0 & 0xF) | (q1 & 0xF) << 4);
      qh |= uint32_t(q0 >> 4) << j | uint32_t(q1 >> 4) << (j + 16);
    }
    store_qh(b[i].qh, qh);
  }
}

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, dst += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (b[i].qs[j] & 0xF) | int((qh >> j) & 1) << 4;
      const int q1 = (b[i].qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
      dst[j] = float(q0) * d + m;
      dst[j + kQK / 2] = float(q1) * d + m;
    }
  }
}

void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, src += kQK) {
    float lo = src[0], hi = src[0];
    for (int j = 1; j < kQK; ++j) {
      lo = std::min(lo, src[j]);
      hi = std::max(hi, src[j]);
    }
    const float d = (hi - lo) / 31;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(lo);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(31, int(int8_t((src[j] - lo) * id + 0.5f)));
      const int q1 = std::min(31, int(int8_t((src[j + kQK / 2] - lo) * id + 0.5f)));
      b[i].qs[j] = uint8_t((q0 & 0xF) | (q1 & 0xF) << 4);
      qh |= uint32_t(q0 >> 4) << j | uint32_t(q1 >> 4) << (j + 16);
    }
    store_qh(b[i].qh, qh);
  }
}

// ---- Q8_0 / Q8_1 (activation quantizers: bit-identical to ggml's reference) -------------------

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, dst += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK; ++j) dst[j] = float(b[i].qs[j]) * d;
  }
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, src += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) b[i].qs[j] = int8_t(std::round(src[j] * id));
  }
}

void quantize_row_q8_0_rne(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, src += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127;
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) b[i].qs[j] = int8_t(std::nearbyint(src[j] * id));
  }
}

void dequantize_row_q8_1(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, dst += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK; ++j) dst[j] = float(b[i].qs[j]) * d;
  }
}

void quantize_row_q8_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, src += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      b[i].qs[j] = int8_t(std::round(src[j] * id));
      sum += b[i].qs[j];
    }
    b[i].s = fp32_to_fp16(float(sum) * d);
  }
}

void quantize_row_q8_1_rne(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i, src += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127;
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    b[i].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      b[i].qs[j] = int8_t(std::nearbyint(src[j] * id));
      sum += b[i].qs[j];
    }
    b[i].s = fp32_to_fp16(d * float(sum));
  }
}

// ---- dots: integer sum per block, then one float multiply by the block scales -----------------

void vec_dot_q4_0(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0;
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i) {
    int isum = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      isum += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + kQK / 2];
    }
    sum += float(isum) * fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d);
  }
  *out = sum;
}

// sum (d_x q_x + m_x) d_y q_y = d_x d_y sum(q_x q_y) + m_x (d_y sum q_y), the last factor being s.
void vec_dot_q4_1(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ4_1*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  float sum = 0;
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i) {
    int isum = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      isum += (x[i].qs[j] & 0xF) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + kQK / 2];
    }
    sum += fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d) * float(isum) +
           fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
  }
  *out = sum;
}

void vec_dot_q5_0(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ5_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0;
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i) {
    const uint32_t qh = load_qh(x[i].qh);
    int isum = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = ((x[i].qs[j] & 0xF) | int((qh >> j) & 1) << 4) - 16;
      const int q1 = ((x[i].qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4) - 16;
      isum += q0 * y[i].qs[j] + q1 * y[i].qs[j + kQK / 2];
    }
    sum += float(isum) * fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d);
  }
  *out = sum;
}

void vec_dot_q5_1(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ5_1*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  float sum = 0;
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i) {
    const uint32_t qh = load_qh(x[i].qh);
    int isum = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (x[i].qs[j] & 0xF) | int((qh >> j) & 1) << 4;
      const int q1 = (x[i].qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
      isum += q0 * y[i].qs[j] + q1 * y[i].qs[j + kQK / 2];
    }
    sum += fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d) * float(isum) +
           fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
  }
  *out = sum;
}

void vec_dot_q8_0(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0;
  for (int64_t i = 0; i < blocks_of(n, kQK); ++i) {
    int isum = 0;
    for (int j = 0; j < kQK; ++j) isum += x[i].qs[j] * y[i].qs[j];
    sum += float(isum) * fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d);
  }
  *out = sum;
}

}  // namespace sluice::quant::ref
