// Row-interleaved (packed) layouts: the packing functions and the scalar specification of
// vec_dot_packed (Kernels, quant.h; layout BlockQ4_Kx16 in blocks.h). Portable code: the packing
// runs once per weight at load, and the reference is what the SIMD kernels are tested against.
#include <cstring>

#include "core/status.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/simd.h"

namespace sluice::quant::detail {
namespace {

constexpr int kGroupRows = 16;

int64_t packed_bytes_q4_k(int64_t n) { return n / kQK_K * int64_t(sizeof(BlockQ4_Kx16)); }

// Element l in [0,32) of sub-block j of a plain Q4_K block.
inline int q4k_elem(const BlockQ4_K& b, int j, int l) {
  const uint8_t byte = b.qs[32 * (j / 2) + l];
  return j % 2 == 0 ? byte & 0xF : byte >> 4;
}

// Runs once per weight at load and, for layers streamed from disk, once per layer and pass
// (docs/STREAMING.md): each row's block is decoded once into its 256 values, then scattered.
void pack_rows_q4_k(const void* src, int64_t src_stride, void* dst, int64_t n) {
  const int64_t nb = n / kQK_K;
  auto* out = static_cast<BlockQ4_Kx16*>(dst);
  uint8_t q[kQK_K];
  for (int64_t i = 0; i < nb; ++i) {
    BlockQ4_Kx16& p = out[i];
    for (int r = 0; r < kGroupRows; ++r) {
      const auto& b = reinterpret_cast<const BlockQ4_K*>(static_cast<const uint8_t*>(src) + r * src_stride)[i];
      p.d[r] = b.d;
      p.dmin[r] = b.dmin;
      for (int j = 0; j < 8; ++j) unpack_k_scale(b.scales, j, &p.sc[j][r], &p.mn[j][r]);
      for (int j = 0; j < 8; ++j)
        for (int l = 0; l < 32; ++l) q[32 * j + l] = q4k_elem(b, j, l);
      for (int j = 0; j < 8; ++j)
        for (int c = 0; c < 4; ++c)
          for (int e = 0; e < 4; ++e) p.qs[j][c][4 * r + e] = uint8_t(q[32 * j + 8 * c + e] | q[32 * j + 8 * c + 4 + e] << 4);
    }
  }
}

// The loops of a scalar reference over packed rows: out[c][g * 16 + r] = the sum over blocks of
// term(block, r, activation block), added in order as the plain reference adds its terms.
template <class Block, class ActBlock = BlockQ8_K, int64_t kBlockElems = kQK_K, class Term>
void packed_ref(int64_t n, const void* w, int n_groups, const void* a, int64_t a_stride, int n_cols, float* out,
                int64_t out_stride, Term term) {
  SLUICE_CHECK(n_groups >= 0 && n_cols >= 0, "vec_dot_packed: negative group or column count");
  const int64_t nb = n / kBlockElems;
  const auto* wp = static_cast<const Block*>(w);
  for (int g = 0; g < n_groups; ++g)
    for (int c = 0; c < n_cols; ++c) {
      const auto* y = reinterpret_cast<const ActBlock*>(static_cast<const uint8_t*>(a) + c * a_stride);
      for (int r = 0; r < kGroupRows; ++r) {
        float sum = 0;
        for (int64_t i = 0; i < nb; ++i) sum += term(wp[g * nb + i], r, y[i]);
        out[c * out_stride + g * kGroupRows + r] = sum;
      }
    }
}

// The scalar reference vec_dot's arithmetic (ref_kquants.cpp, vec_dot_kmin) on packed rows: bit
// for bit the plain reference, so the packing itself is tested exactly.
void vec_dot_packed_q4_k_ref(int64_t n, const void* w, int n_groups, const void* a, int64_t a_stride, int n_cols,
                             float* out, int64_t out_stride) {
  packed_ref<BlockQ4_Kx16>(n, w, n_groups, a, a_stride, n_cols, out, out_stride,
                           [](const BlockQ4_Kx16& p, int r, const BlockQ8_K& y) {
                             int isum = 0, msum = 0;
                             for (int j = 0; j < 8; ++j) {
                               int dot = 0;
                               for (int ch = 0; ch < 4; ++ch)
                                 for (int e = 0; e < 4; ++e) {
                                   const uint8_t byte = p.qs[j][ch][4 * r + e];
                                   dot += (byte & 0xF) * y.qs[32 * j + 8 * ch + e] +
                                          (byte >> 4) * y.qs[32 * j + 8 * ch + 4 + e];
                                 }
                               isum += p.sc[j][r] * dot;
                               msum += p.mn[j][r] * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
                             }
                             const float d = fp16_to_fp32(p.d[r]) * y.d;
                             const float dmin = fp16_to_fp32(p.dmin[r]) * y.d;
                             return d * float(isum) - dmin * float(msum);
                           });
}

int64_t packed_bytes_q6_k(int64_t n) { return n / kQK_K * int64_t(sizeof(BlockQ6_Kx16)); }

void pack_rows_q6_k(const void* src, int64_t src_stride, void* dst, int64_t n) {
  const int64_t nb = n / kQK_K;
  auto* out = static_cast<BlockQ6_Kx16*>(dst);
  uint8_t q[kQK_K];  // one row's unsigned 6-bit values (layout in blocks.h), decoded once
  for (int64_t i = 0; i < nb; ++i) {
    BlockQ6_Kx16& p = out[i];
    for (int r = 0; r < kGroupRows; ++r) {
      const auto& b = reinterpret_cast<const BlockQ6_K*>(static_cast<const uint8_t*>(src) + r * src_stride)[i];
      p.d[r] = b.d;
      // Element 128 * half + 32 * k + l: low 4 bits from ql[64 * half + 32 * (k & 1) + l] (high
      // nibble when k >= 2), high 2 bits from qh[32 * half + l] >> 2k; one pass over ql and qh.
      for (int half = 0; half < 2; ++half)
        for (int l = 0; l < 32; ++l) {
          const int lo0 = b.ql[64 * half + l], lo1 = b.ql[64 * half + 32 + l], hi = b.qh[32 * half + l];
          q[128 * half + l] = uint8_t((lo0 & 0xF) | (hi & 3) << 4);
          q[128 * half + 32 + l] = uint8_t((lo1 & 0xF) | (hi >> 2 & 3) << 4);
          q[128 * half + 64 + l] = uint8_t((lo0 >> 4) | (hi >> 4 & 3) << 4);
          q[128 * half + 96 + l] = uint8_t((lo1 >> 4) | (hi >> 6 & 3) << 4);
        }
      for (int s = 0; s < 16; ++s) {
        p.sc[s][r] = b.scales[s];
        const uint8_t* v = q + 16 * s;
        for (int c = 0; c < 2; ++c)
          for (int e = 0; e < 4; ++e) p.sb[s].ql[c][4 * r + e] = uint8_t((v[8 * c + e] & 0xF) | (v[8 * c + 4 + e] & 0xF) << 4);
        for (int e = 0; e < 4; ++e) {
          int h = 0;
          for (int k = 0; k < 4; ++k) h |= (v[4 * k + e] >> 4) << (2 * k);
          p.sb[s].qh[4 * r + e] = uint8_t(h);
        }
      }
    }
  }
}

// The scalar reference vec_dot_q6_k's arithmetic (ref_kquants.cpp) on packed rows.
void vec_dot_packed_q6_k_ref(int64_t n, const void* w, int n_groups, const void* a, int64_t a_stride, int n_cols,
                             float* out, int64_t out_stride) {
  packed_ref<BlockQ6_Kx16>(n, w, n_groups, a, a_stride, n_cols, out, out_stride,
                           [](const BlockQ6_Kx16& p, int r, const BlockQ8_K& y) {
                             int isum = 0;
                             for (int s = 0; s < 16; ++s) {
                               int dot = 0;
                               for (int e = 0; e < 16; ++e) {  // chunk e / 8, high nibble when e % 8 >= 4
                                 const uint8_t lo = p.sb[s].ql[e / 8][4 * r + e % 4];
                                 const int lo4 = e % 8 < 4 ? lo & 0xF : lo >> 4;
                                 const int hi2 = (p.sb[s].qh[4 * r + e % 4] >> (2 * (e / 4))) & 3;
                                 dot += ((lo4 | hi2 << 4) - 32) * y.qs[16 * s + e];
                               }
                               isum += p.sc[s][r] * dot;
                             }
                             return fp16_to_fp32(p.d[r]) * y.d * float(isum);
                           });
}

int64_t packed_bytes_q8_0(int64_t n) { return n / kQK * int64_t(sizeof(BlockQ8_0x16)); }

void pack_rows_q8_0(const void* src, int64_t src_stride, void* dst, int64_t n) {
  const int64_t nb = n / kQK;
  auto* out = static_cast<BlockQ8_0x16*>(dst);
  for (int64_t i = 0; i < nb; ++i) {
    BlockQ8_0x16& p = out[i];
    for (int r = 0; r < kGroupRows; ++r) {
      const auto& b = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(src) + r * src_stride)[i];
      p.d[r] = b.d;
      int sum = 0;
      for (int e = 0; e < kQK; ++e) sum += b.qs[e];
      for (int c = 0; c < kQK / 4; ++c) std::memcpy(&p.qs[c][4 * r], b.qs + 4 * c, 4);
      p.wsum[r] = int16_t(sum);
    }
  }
}

// The scalar reference vec_dot_q8_0's arithmetic (ref_legacy.cpp) on packed rows.
void vec_dot_packed_q8_0_ref(int64_t n, const void* w, int n_groups, const void* a, int64_t a_stride, int n_cols,
                             float* out, int64_t out_stride) {
  packed_ref<BlockQ8_0x16, BlockQ8_0, kQK>(n, w, n_groups, a, a_stride, n_cols, out, out_stride,
                                           [](const BlockQ8_0x16& p, int r, const BlockQ8_0& y) {
                                             int isum = 0;
                                             for (int e = 0; e < kQK; ++e) isum += p.qs[e / 4][4 * r + e % 4] * y.qs[e];
                                             return float(isum) * fp16_to_fp32(p.d[r]) * fp16_to_fp32(y.d);
                                           });
}

}  // namespace

void install_packed_ref(Kernels* t) {
  Kernels& k8 = t[int(Type::kQ8_0)];
  k8.packed_rows = kGroupRows;
  k8.packed_bytes = packed_bytes_q8_0;
  k8.pack_rows = pack_rows_q8_0;
  k8.vec_dot_packed = vec_dot_packed_q8_0_ref;
  Kernels& k = t[int(Type::kQ4_K)];
  k.packed_rows = kGroupRows;
  k.packed_bytes = packed_bytes_q4_k;
  k.pack_rows = pack_rows_q4_k;
  k.vec_dot_packed = vec_dot_packed_q4_k_ref;
  Kernels& k6 = t[int(Type::kQ6_K)];
  k6.packed_rows = kGroupRows;
  k6.packed_bytes = packed_bytes_q6_k;
  k6.pack_rows = pack_rows_q6_k;
  k6.vec_dot_packed = vec_dot_packed_q6_k_ref;
}

}  // namespace sluice::quant::detail
