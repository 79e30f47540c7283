// Every block layout of the GGUF/ggml tensor formats, defined once. The structs are the on-disk
// byte layout (little-endian, no padding): a row of n elements is n / kBlockElems blocks laid
// end to end. Scales stored as IEEE binary16 are kept as raw uint16_t bits (see half.h).
//
// Notation in the diagrams: q = quantized value, d = scale, m = min (or offset), bpw = bits per
// weight. Element index i within a block runs 0..kBlockElems-1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sluice::quant {

inline constexpr int kQK = 32;    // elements per block of the "legacy" formats
inline constexpr int kQK_K = 256; // elements per super-block of the K-quants
inline constexpr int kKScaleBytes = 12;  // packed 6-bit scales+mins of Q4_K/Q5_K

// Q4_0: 18 bytes / 32 = 4.5 bpw.  x[i] = d * (q[i] - 8), q in [0, 15].
//   [d:f16][qs[16]] ; qs[j] = q[j] | q[j+16] << 4 (low nibbles hold the first half).
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Q4_1: 20 bytes / 32 = 5 bpw.  x[i] = d * q[i] + m, q in [0, 15]. Nibble order as Q4_0.
//   [d:f16][m:f16][qs[16]]
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// Q5_0: 22 bytes / 32 = 5.5 bpw.  x[i] = d * (q[i] - 16), q in [0, 31].
//   [d:f16][qh:4 bytes = u32 LE][qs[16]]
//   q[j]    = (qs[j] & 0xF) | ((qh >> j)        & 1) << 4     j in [0,16)
//   q[j+16] = (qs[j] >> 4)  | ((qh >> (j + 16)) & 1) << 4
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// Q5_1: 24 bytes / 32 = 6 bpw.  x[i] = d * q[i] + m, q in [0, 31]. Bits as Q5_0.
//   [d:f16][m:f16][qh:4][qs[16]]
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// Q8_0: 34 bytes / 32 = 8.5 bpw.  x[i] = d * q[i], q in [-127, 127] (quantizer never emits -128).
//   [d:f16][qs[32]:i8]
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q8_1: 36 bytes / 32 = 9 bpw. Activation format for Q4_1/Q5_1. As Q8_0 plus
//   s = f16(d * sum(q)), which lets the weight's min term be applied once per block.
//   [d:f16][s:f16][qs[32]:i8]
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_1) == 36);

// Q2_K: 84 bytes / 256 = 2.625 bpw. 16 sub-blocks of 16.
//   [scales[16]][qs[64]][d:f16][dmin:f16]
//   scales[s] = sc | mn << 4 (4 bits each); x = d*sc*q - dmin*mn, q in [0,3].
//   Element i = 128*h + 32*k + l (h in {0,1}, k in [0,4), l in [0,32)):
//     q = (qs[32*h + l] >> (2*k)) & 3, sub-block s = 8*h + 2*k + l/16.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// Q3_K: 110 bytes / 256 = 3.4375 bpw. 16 sub-blocks of 16; symmetric.
//   [hmask[32]][qs[64]][scales[12]][d:f16]
//   Element i = 128*h + 32*k + l as in Q2_K: low 2 bits = (qs[32*h + l] >> (2*k)) & 3,
//   high bit = (hmask[l] >> (4*h + k)) & 1; q = low + 4*high - 4 in [-4, 3].
//   6-bit scale of sub-block s (stored +32): low 4 bits = s < 8 ? scales[s] & 0xF
//   : scales[s-8] >> 4; high 2 bits = (scales[8 + s%4] >> (2*(s/4))) & 3. x = d*(sc-32)*q.
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// Q4_K: 144 bytes / 256 = 4.5 bpw. 8 sub-blocks of 32.
//   [d:f16][dmin:f16][scales[12]][qs[128]]
//   6-bit sc/mn of sub-block j (see unpack_k_scale): j < 4: sc = s[j] & 63, mn = s[j+4] & 63;
//   j >= 4: sc = (s[j+4] & 0xF) | (s[j-4] >> 6) << 4, mn = (s[j+4] >> 4) | (s[j] >> 6) << 4.
//   Element i = 64*p + 32*hi + l: q = hi ? qs[32p + l] >> 4 : qs[32p + l] & 0xF, sub-block
//   j = 2p + hi. x = d*sc*q - dmin*mn, q in [0,15].
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q5_K: 176 bytes / 256 = 5.5 bpw. As Q4_K plus a fifth bit per element:
//   [d:f16][dmin:f16][scales[12]][qh[32]][qs[128]]
//   element i = 64*p + 32*hi + l gets bit 4 from (qh[l] >> (2p + hi)) & 1; q in [0,31].
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// Q6_K: 210 bytes / 256 = 6.5625 bpw. 16 sub-blocks of 16; symmetric, int8 scales.
//   [ql[128]][qh[64]][scales[16]:i8][d:f16]
//   Element i = 128*h + 32*k + l (k in [0,4), l in [0,32)):
//     low 4 bits  = (ql[64h + l + 32*(k&1)] >> (4*(k>>1))) & 0xF
//     high 2 bits = (qh[32h + l] >> (2k)) & 3
//     q = low | high << 4, minus 32 -> [-32, 31]; sub-block s = 8h + 2k + l/16; x = d*sc[s]*q.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// Q8_K: 292 bytes / 256. Activation format for the K-quants (never stored in files by ggml).
//   [d:f32][qs[256]:i8][bsums[16]:i16]; x = d*q; bsums[g] = sum of qs[16g .. 16g+16).
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// Q4_K packed 16 rows at a time (Kernels::pack_rows; not a file format): one super-block of 256
// elements of rows r = 0..15, 2368 bytes (the 16 plain blocks take 2304: the 6-bit scales and
// mins are stored unpacked as bytes). A packed matrix is its groups of 16 rows one after the
// other, each group its super-blocks in order.
//   d[r], dmin[r]: row r's f16 super-block scales
//   sc[j][r], mn[j][r]: row r's 6-bit scale and min of sub-block j (unpack_k_scale)
//   qs[j][c][4r + b] = q(r, 32j + 8c + b) | q(r, 32j + 8c + 4 + b) << 4   (c, b in [0,4))
// so that the low nibbles of one 64-byte qs[j][c] are elements 32j+8c .. +3 of all 16 rows (one
// u8x4 lane per row) and the high nibbles the next four.
struct BlockQ4_Kx16 {
  uint16_t d[16];
  uint16_t dmin[16];
  uint8_t sc[8][16];
  uint8_t mn[8][16];
  uint8_t qs[8][4][64];
};
static_assert(sizeof(BlockQ4_Kx16) == 2368);

// Q6_K packed 16 rows at a time: one super-block of rows r = 0..15, 3360 bytes (as 16 plain
// blocks). q(r, e) is the unsigned 6-bit value (the weight is d * sc * (q - 32)).
//   d[r]: row r's f16 scale; sc[s][r]: row r's int8 scale of 16-element sub-block s
//   sb[s].ql[c][4r + b] = lo4(q(r, 16s + 8c + b)) | lo4(q(r, 16s + 8c + 4 + b)) << 4   (c in [0,2))
//   sb[s].qh[4r + b] = hi2(q(r, 16s + b)) | hi2(q(r, 16s + 4 + b)) << 2 | hi2(q(r, 16s + 8 + b)) << 4
//                      | hi2(q(r, 16s + 12 + b)) << 6
// A sub-block's 192 bytes are contiguous, so a kernel reads one ascending stream (with ql and qh
// in separate regions, one-token decode stalled on memory at half the row kernel's speed).
struct BlockQ6_Kx16 {
  uint16_t d[16];
  int8_t sc[16][16];
  struct Sub {
    uint8_t ql[2][64];
    uint8_t qh[64];
  } sb[16];
};
static_assert(sizeof(BlockQ6_Kx16) == 3360);

// Q8_0 packed 16 rows at a time: one 32-element block of rows r = 0..15, 576 bytes (plain: 544).
//   d[r]: row r's f16 scale; wsum[r]: the sum of row r's 32 quants (|sum| <= 4096)
//   qs[c][4r + b] = q(r, 4c + b)   (c in [0,8))
// The kernel feeds activations + 128 (unsigned) and these signed quants to vpdpbusd, then takes
// 128 * wsum back out of each integer sum.
struct BlockQ8_0x16 {
  uint16_t d[16];
  int16_t wsum[16];
  int8_t qs[8][64];
};
static_assert(sizeof(BlockQ8_0x16) == 576);

// 6-bit scale and min of sub-block j in [0,8) of Q4_K/Q5_K (layout in BlockQ4_K).
inline void unpack_k_scale(const uint8_t* s, int j, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = uint8_t((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *mn = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Biased 6-bit scale (0..63; subtract 32) of sub-block s in [0,16) of Q3_K.
inline int unpack_q3k_scale(const uint8_t* sc, int s) {
  const int lo = s < 8 ? (sc[s] & 0xF) : (sc[s - 8] >> 4);
  const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
  return lo | hi << 4;
}

}  // namespace sluice::quant
