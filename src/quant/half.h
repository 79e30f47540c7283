// Exact IEEE binary16 (fp16) and bfloat16 conversions, bit-level and portable. Every fp16 and
// bf16 value is exactly representable as fp32, so widening is exact; narrowing rounds to nearest,
// ties to even, with overflow to infinity and NaN kept NaN (quiet). The F16C instructions give the
// same results; the SIMD files use them and tests check them against these over all 65536 inputs.
#pragma once

#include <bit>
#include <cstdint>

namespace sluice::quant {

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // 112 = 127 - 15
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: value = mant * 2^-24; normalise so the leading 1 becomes implicit.
    int e = 113;  // exponent field of 2^-14 (the fp16 subnormal scale) in fp32 is 113
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (uint32_t(e) << 23) | ((mant & 0x3FF) << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return uint16_t(sign | 0x7E00 | ((ax >> 13) & 0x3FF));  // quiet NaN
  if (ax >= 0x477FF000u) return uint16_t(sign | 0x7C00);  // >= 65520 rounds to inf
  if (ax >= 0x38800000u) {
    // Normal fp16 range (>= 2^-14): drop 13 mantissa bits with round-to-nearest-even. A carry
    // out of the mantissa correctly bumps the exponent.
    const uint32_t rebias = ax - (112u << 23);
    const uint32_t round = 0xFFFu + ((rebias >> 13) & 1);
    return uint16_t(sign | ((rebias + round) >> 13));
  }
  if (ax < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 itself ties to even 0)
  // Subnormal result: value / 2^-24 rounded to an integer, ties to even.
  const uint32_t e = ax >> 23;
  const uint32_t mant = (ax & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - e;  // 2^(e-127) * mant/2^23 / 2^-24 = mant >> (126 - e)
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;
  return uint16_t(sign | q);
}

inline float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((x >> 16) | 0x40);  // quiet NaN
  return uint16_t((x + 0x7FFFu + ((x >> 16) & 1)) >> 16);
}

}  // namespace sluice::quant
