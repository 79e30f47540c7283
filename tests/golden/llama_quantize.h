// llama.cpp's llama-quantize reproduced byte for byte, for the golden tests' requantized models:
// `llama-quantize --allow-requantize IN.gguf OUT.gguf <FTYPE>` without an importance matrix, for
// dense llama-family models, writes the same file as requantize() below (the golden test checks
// the sha256 the fixture recorded from the real tool). CI has no llama.cpp build, so this is how it
// gets the very bytes llama.cpp was run on without committing ~100 MB files.
//
// What is reproduced, from llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp):
// - src/llama-quant.cpp llama_model_quantize_impl: metadata copied in order, split keys dropped,
//   general.quantization_version (2) and general.file_type (the ftype) removed and appended in
//   that order (ggml's gguf_set_val_* removes a key and appends it); tensors in the model
//   loader's order (layer number, then name: llama_model_loader::weight_name_comparer); a tensor
//   whose target type is its own type copied as is, any other dequantized to f32 (ggml-base's
//   to_float) and quantized with ggml_quantize_chunk, which without an importance matrix is the
//   format's quantize_row_*_ref; data padded to 32 bytes; n_dims as ggml_n_dims.
// - llama_tensor_get_type / llama_tensor_get_type_impl / tensor_type_fallback: the per-tensor type
//   of the five ftypes below for a dense (n_expert <= 1) non-Falcon model with no type overrides:
//   2-D+ tensors named *weight but not *_norm.weight are quantized; token_embd (when the output is
//   tied to it) and output take Q8_0 when ne[0] is not a multiple of the target's block, else Q6_K
//   (unless the target is Q8_0); attn_v and ffn_down get more bits on use_more_bits() layers
//   (Q4_K_M, Q5_K_M: Q6_K) or Q3_K (Q2_K); attn_output Q3_K (Q2_K); a tensor whose ne[0] the type's
//   block does not divide falls back (Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0).
// - ggml/src/ggml-quants.c quantize_row_{q3_K,q4_K,q5_K,q6_K}_ref with make_q3_quants,
//   make_qx_quants, make_qkx2_quants and nearest_int, ported statement for statement in float
//   (ggml-base is built for baseline x86-64: no FMA contraction; so are the tests). Q4_0, Q5_0,
//   Q5_1 and Q8_0 use sluice's reference quantizers, which are the same code as ggml's _ref
//   (src/quant/ref_legacy.cpp); dequantization uses sluice's reference too (x * d + m as ggml's).
// Q2_K's own quantizer is not ported: SmolLM2 (ne[0] = 576 for all but ffn_down) never uses it;
// a model that needs it gets an error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace sluice::test::llama_quantize {

// llama.h's llama_ftype values of the formats the golden tests use.
enum class Ftype : uint32_t { kQ8_0 = 7, kQ2_K = 10, kQ4_K_M = 15, kQ5_K_M = 17, kQ6_K = 18 };

inline const char* ftype_name(Ftype f) {
  switch (f) {
    case Ftype::kQ8_0: return "Q8_0";
    case Ftype::kQ2_K: return "Q2_K";
    case Ftype::kQ4_K_M: return "Q4_K_M";
    case Ftype::kQ5_K_M: return "Q5_K_M";
    case Ftype::kQ6_K: return "Q6_K";
  }
  return "?";
}

namespace detail {

using quant::Type;
constexpr int kQK_K = 256;
constexpr float kGroupMaxEps = 1e-15f;  // GROUP_MAX_EPS

inline int nearest_int(float fval) {
  float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

template <typename T>
T max_(T a, T b) { return a > b ? a : b; }  // ggml's MAX
template <typename T>
T min_(T a, T b) { return a < b ? a : b; }  // ggml's MIN

inline float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type, const float* qw) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = float(-nmax) / max;
  if (rmse_type == 0) {
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      L[i] = int8_t(nmax + max_(-nmax, min_(nmax - 1, l)));
    }
    return 1 / iscale;
  }
  bool return_early = false;
  if (rmse_type < 0) {
    rmse_type = -rmse_type;
    return_early = true;
  }
  auto weight = [&](int i) {
    return qw ? qw[i]
              : rmse_type == 1 ? x[i] * x[i]
              : rmse_type == 2 ? 1.0f
              : rmse_type == 3 ? std::fabs(x[i])
                               : std::sqrt(std::fabs(x[i]));
  };
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = max_(-nmax, min_(nmax - 1, l));
    L[i] = int8_t(l + nmax);
    float w = weight(i);
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  if (return_early) return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = max_(-nmax, min_(nmax - 1, l));
      float w = weight(i);
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        L[i] = int8_t(nmax + max_(-nmax, min_(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

inline float make_q3_quants(int n, int nmax, const float* x, int8_t* L, bool do_rmse) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = float(-nmax) / max;
  if (do_rmse) {
    float sumlx = 0;
    float suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = max_(-nmax, min_(nmax - 1, l));
      L[i] = int8_t(l);
      float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    for (int itry = 0; itry < 5; ++itry) {
      int n_changed = 0;
      for (int i = 0; i < n; ++i) {
        float w = x[i] * x[i];
        float slx = sumlx - w * x[i] * float(L[i]);
        if (slx > 0) {
          float sl2 = suml2 - w * float(L[i]) * float(L[i]);
          int new_l = nearest_int(x[i] * sl2 / slx);
          new_l = max_(-nmax, min_(nmax - 1, new_l));
          if (new_l != L[i]) {
            slx += w * x[i] * float(new_l);
            sl2 += w * float(new_l) * float(new_l);
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
              L[i] = int8_t(new_l);
              sumlx = slx;
              suml2 = sl2;
              ++n_changed;
            }
          }
        }
      }
      if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
  }
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = max_(-nmax, min_(nmax - 1, l));
    L[i] = int8_t(l + nmax);
  }
  return 1 / iscale;
}

inline float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                              uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = float(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(max_(0, min_(nmax, l)));
    float diff = scale * float(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    float w = weights[i];
    best_error += w * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = max_(0, min_(nmax, l));
      Laux[i] = uint8_t(l);
      float w = weights[i];
      sum_l += w * float(l);
      sum_l2 += w * float(l) * float(l);
      sum_xl += w * float(l) * x[i];
    }
    float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * float(Laux[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        float w = weights[i];
        cur_error += w * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = uint8_t((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

inline float f16(uint16_t h) { return quant::fp16_to_fp32(h); }
inline uint16_t to_f16(float f) { return quant::fp32_to_fp16(f); }

inline void quantize_row_q3_K(const float* x, quant::BlockQ3_K* y, int64_t k) {
  const int64_t nb = k / kQK_K;
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  for (int64_t i = 0; i < nb; i++) {
    float max_scale = 0;
    float amax = 0;
    for (int j = 0; j < kQK_K / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j, true);
      float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    std::memset(y[i].scales, 0, 12);
    if (max_scale != 0) {
      float iscale = -32.f / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j) {
        int8_t l = int8_t(nearest_int(iscale * scales[j]));
        l = int8_t(max_<int>(-32, min_<int>(31, l)) + 32);
        if (j < 8) {
          y[i].scales[j] = uint8_t(l & 0xF);
        } else {
          y[i].scales[j - 8] = uint8_t(y[i].scales[j - 8] | ((l & 0xF) << 4));
        }
        l = int8_t(l >> 4);
        y[i].scales[j % 4 + 8] = uint8_t(y[i].scales[j % 4 + 8] | (l << (2 * (j / 4))));
      }
      y[i].d = to_f16(1 / iscale);
    } else {
      y[i].d = to_f16(0.f);
    }
    int8_t sc;
    for (int j = 0; j < kQK_K / 16; ++j) {
      sc = int8_t(j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4);
      sc = int8_t((sc | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
      float d = f16(y[i].d) * float(sc);
      if (d == 0) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = max_(-4, min_(3, l));
        L[16 * j + ii] = int8_t(l + 4);
      }
    }
    std::memset(y[i].hmask, 0, kQK_K / 8);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < kQK_K; ++j) {
      if (L[j] > 3) {
        y[i].hmask[m] = uint8_t(y[i].hmask[m] | hm);
        L[j] = int8_t(L[j] - 4);
      }
      if (++m == kQK_K / 8) {
        m = 0;
        hm = uint8_t(hm << 1);
      }
    }
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        y[i].qs[j / 4 + l] =
            uint8_t(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
      }
    }
    x += kQK_K;
  }
}

// Q4_K (nmax 15, 20 steps from -1) and Q5_K (nmax 31, 15 steps from -0.5) share the scale search.
template <typename Block, int kNmax>
void quantize_row_k_affine(const float* x, Block* y, int64_t k, float rmin, int nstep) {
  const int64_t nb = k / kQK_K;
  uint8_t L[kQK_K];
  uint8_t Laux[32];
  float weights[32];
  float mins[kQK_K / 32];
  float scales[kQK_K / 32];
  for (int64_t i = 0; i < nb; i++) {
    float max_scale = 0;
    float max_min = 0;
    for (int j = 0; j < kQK_K / 32; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = make_qkx2_quants(32, kNmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
      float scale = scales[j];
      if (scale > max_scale) max_scale = scale;
      float min = mins[j];
      if (min > max_min) max_min = min;
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < kQK_K / 32; ++j) {
      uint8_t ls = uint8_t(nearest_int(inv_scale * scales[j]));
      uint8_t lm = uint8_t(nearest_int(inv_min * mins[j]));
      ls = min_<uint8_t>(63, ls);
      lm = min_<uint8_t>(63, lm);
      if (j < 4) {
        y[i].scales[j] = ls;
        y[i].scales[j + 4] = lm;
      } else {
        y[i].scales[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
        y[i].scales[j - 4] = uint8_t(y[i].scales[j - 4] | ((ls >> 4) << 6));
        y[i].scales[j - 0] = uint8_t(y[i].scales[j - 0] | ((lm >> 4) << 6));
      }
    }
    y[i].d = to_f16(max_scale / 63.f);
    y[i].dmin = to_f16(max_min / 63.f);
    uint8_t sc, m;
    for (int j = 0; j < kQK_K / 32; ++j) {
      get_scale_min_k4(j, y[i].scales, &sc, &m);
      const float d = f16(y[i].d) * float(sc);
      if (d == 0) continue;
      const float dm = f16(y[i].dmin) * float(m);
      for (int ii = 0; ii < 32; ++ii) {
        int l = nearest_int((x[32 * j + ii] + dm) / d);
        l = max_(0, min_(kNmax, l));
        L[32 * j + ii] = uint8_t(l);
      }
    }
    if constexpr (kNmax == 15) {
      uint8_t* q = y[i].qs;
      for (int j = 0; j < kQK_K; j += 64) {
        for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
        q += 32;
      }
    } else {
      uint8_t* qh = y[i].qh;
      uint8_t* ql = y[i].qs;
      std::memset(qh, 0, kQK_K / 8);
      uint8_t m1 = 1, m2 = 2;
      for (int n = 0; n < kQK_K; n += 64) {
        for (int j = 0; j < 32; ++j) {
          int l1 = L[n + j];
          if (l1 > 15) {
            l1 -= 16;
            qh[j] = uint8_t(qh[j] | m1);
          }
          int l2 = L[n + j + 32];
          if (l2 > 15) {
            l2 -= 16;
            qh[j] = uint8_t(qh[j] | m2);
          }
          ql[j] = uint8_t(l1 | (l2 << 4));
        }
        m1 = uint8_t(m1 << 2);
        m2 = uint8_t(m2 << 2);
        ql += 32;
      }
    }
    x += kQK_K;
  }
}

inline void quantize_row_q6_K(const float* x, quant::BlockQ6_K* y, int64_t k) {
  const int64_t nb = k / kQK_K;
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  for (int64_t i = 0; i < nb; i++) {
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1, nullptr);
      scales[ib] = scale;
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(quant::BlockQ6_K));
      y[i].d = to_f16(0.f);
      x += kQK_K;
      continue;
    }
    float iscale = -128.f / max_scale;
    y[i].d = to_f16(1 / iscale);
    for (int ib = 0; ib < kQK_K / 16; ++ib) y[i].scales[ib] = int8_t(min_(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < kQK_K / 16; ++j) {
      float d = f16(y[i].d) * float(y[i].scales[j]);
      if (d == 0) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = max_(-32, min_(31, l));
        L[16 * j + ii] = int8_t(l + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l + 0] & 0xF;
        const uint8_t q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF;
        const uint8_t q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = uint8_t(q1 | (q3 << 4));
        ql[l + 32] = uint8_t(q2 | (q4 << 4));
        qh[l] = uint8_t((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                        ((L[j + l + 96] >> 4) << 6));
      }
      ql += 64;
      qh += 32;
    }
    x += kQK_K;
  }
}

// ggml_quantize_chunk without an importance matrix: the format's _ref quantizer over the rows.
inline Status quantize_rows(Type t, const float* x, uint8_t* dst, int64_t n) {
  switch (t) {
    case Type::kQ3_K: quantize_row_q3_K(x, reinterpret_cast<quant::BlockQ3_K*>(dst), n); return Status::ok();
    case Type::kQ4_K:
      quantize_row_k_affine<quant::BlockQ4_K, 15>(x, reinterpret_cast<quant::BlockQ4_K*>(dst), n, -1.f, 20);
      return Status::ok();
    case Type::kQ5_K:
      quantize_row_k_affine<quant::BlockQ5_K, 31>(x, reinterpret_cast<quant::BlockQ5_K*>(dst), n, -0.5f, 15);
      return Status::ok();
    case Type::kQ6_K: quantize_row_q6_K(x, reinterpret_cast<quant::BlockQ6_K*>(dst), n); return Status::ok();
    case Type::kQ4_0:
    case Type::kQ5_0:
    case Type::kQ5_1:
    case Type::kQ8_0:
      // sluice's reference quantizers of these are ggml's _ref code (src/quant/ref_legacy.cpp).
      quant::kernels_for(t, quant::Isa::kRef)->quantize_row(x, dst, n);
      return Status::ok();
    default:
      return unsupported(std::string("llama_quantize: ggml's quantizer for ") + quant::type_name(t) +
                         " is not ported (tests/golden/llama_quantize.h)");
  }
}

enum class Category { kTokenEmbd, kOutput, kAttnV, kAttnK, kAttnQ, kAttnOutput, kAttnQkv, kFfnDown, kFfnGate, kFfnUp, kOther };

inline Category category_of(const std::string& n) {
  if (n == "output.weight") return Category::kOutput;
  if (n == "token_embd.weight") return Category::kTokenEmbd;
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("attn_qkv.weight")) return Category::kAttnQkv;
  if (has("attn_v.weight")) return Category::kAttnV;
  if (has("attn_k.weight")) return Category::kAttnK;
  if (has("attn_q.weight")) return Category::kAttnQ;
  if (has("attn_output.weight")) return Category::kAttnOutput;
  if (has("ffn_up")) return Category::kFfnUp;
  if (has("ffn_gate")) return Category::kFfnGate;
  if (has("ffn_down")) return Category::kFfnDown;
  return Category::kOther;
}

inline int64_t block_of(Type t) { return quant::traits(t).block_elems; }

// tensor_type_fallback
inline Type fallback(Type t, int64_t ncols) {
  if (ncols % block_of(t) == 0) return t;
  Type r = t;
  switch (t) {
    case Type::kQ2_K:
    case Type::kQ3_K: r = Type::kQ4_0; break;
    case Type::kQ4_K: r = Type::kQ5_0; break;
    case Type::kQ5_K: r = Type::kQ5_1; break;
    case Type::kQ6_K: r = Type::kQ8_0; break;
    default: break;
  }
  return ncols % block_of(r) == 0 ? r : Type::kF16;
}

// The model loader's tensor order: layer number ("blk.N.", -1 otherwise), then name.
inline int layer_number(const std::string& name) {
  int l = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &l) != 1) l = -1;
  return l;
}

}  // namespace detail

// The type llama-quantize gives each tensor of `in` (in the output's order), for `ftype`.
struct Plan {
  std::vector<const gguf::TensorInfo*> order;
  std::vector<quant::Type> types;
};

inline Result<Plan> plan(const gguf::File& in, Ftype ftype) {
  using namespace detail;
  Plan p;
  for (const auto& t : in.tensors()) p.order.push_back(&t);
  std::stable_sort(p.order.begin(), p.order.end(), [](const gguf::TensorInfo* a, const gguf::TensorInfo* b) {
    const int la = layer_number(a->name), lb = layer_number(b->name);
    return la != lb ? la < lb : a->name < b->name;
  });
  SLUICE_ASSIGN_OR_RETURN(const std::string arch, in.get_string("general.architecture"));
  if (arch != "llama") return unsupported("llama_quantize: only the llama architecture is reproduced, not " + arch);
  if (in.find("llama.expert_count")) return unsupported("llama_quantize: MoE models are not reproduced");
  SLUICE_ASSIGN_OR_RETURN(const uint64_t n_layer, in.get_uint("llama.block_count"));
  SLUICE_ASSIGN_OR_RETURN(const uint64_t n_head, in.get_uint("llama.attention.head_count"));
  auto kv = in.get_uint("llama.attention.head_count_kv");
  const uint64_t n_head_kv = kv.is_ok() ? *kv : n_head;
  const uint64_t n_gqa = n_head_kv ? n_head / n_head_kv : 0;
  Type def;
  switch (ftype) {
    case Ftype::kQ8_0: def = Type::kQ8_0; break;
    case Ftype::kQ2_K: def = Type::kQ2_K; break;
    case Ftype::kQ4_K_M: def = Type::kQ4_K; break;
    case Ftype::kQ5_K_M: def = Type::kQ5_K; break;
    case Ftype::kQ6_K: def = Type::kQ6_K; break;
    default: return invalid_argument("llama_quantize: unknown ftype");
  }
  int n_attention_wv = 0;
  bool tied = true;
  for (const auto* t : p.order) {
    const Category c = category_of(t->name);
    if (c == Category::kAttnV || c == Category::kAttnQkv) ++n_attention_wv;
    if (c == Category::kOutput) tied = false;
  }
  const int n_ffn_down = int(n_layer);
  int i_attention_wv = 0, i_ffn_down = 0;
  auto use_more_bits = [](int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
  for (const auto* t : p.order) {
    const std::string& name = t->name;
    const bool quantize = t->shape.size() >= 2 && name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0 &&
                          name.find("_norm.weight") == std::string::npos &&
                          name.find("ffn_gate_inp.weight") == std::string::npos;
    if (!quantize) {
      p.types.push_back(t->type);
      continue;
    }
    const Category c = category_of(name);
    const int64_t nx = int64_t(t->shape[0]);
    Type nt = def;
    if (c == Category::kOutput || (tied && c == Category::kTokenEmbd)) {
      if (nx % block_of(nt) != 0) {
        nt = Type::kQ8_0;
      } else if (nt != Type::kQ8_0) {
        nt = Type::kQ6_K;
      }
    } else if (c == Category::kTokenEmbd) {
      // the five ftypes keep the default type for an untied token_embd
    } else if (c == Category::kAttnV || c == Category::kAttnQkv) {
      if (c == Category::kAttnQkv) return unsupported("llama_quantize: fused attn_qkv is not reproduced");
      if (ftype == Ftype::kQ2_K) {
        nt = n_gqa >= 4 ? Type::kQ4_K : Type::kQ3_K;
      } else if ((ftype == Ftype::kQ4_K_M || ftype == Ftype::kQ5_K_M) && use_more_bits(i_attention_wv, n_attention_wv)) {
        nt = Type::kQ6_K;
      }
      if (n_layer == 80 && (nt == Type::kQ3_K || nt == Type::kQ4_K)) {
        return unsupported("llama_quantize: 70B models' attn_v rule is not reproduced");
      }
      ++i_attention_wv;
    } else if (c == Category::kFfnDown) {
      const int i_layer = i_ffn_down, n = n_ffn_down;
      if (ftype == Ftype::kQ2_K) {
        nt = Type::kQ3_K;
      } else if (ftype == Ftype::kQ4_K_M || ftype == Ftype::kQ5_K_M) {
        if (use_more_bits(i_layer, n)) nt = Type::kQ6_K;
      }
      ++i_ffn_down;
    } else if (c == Category::kAttnOutput) {
      if (ftype == Ftype::kQ2_K) nt = Type::kQ3_K;
    }
    p.types.push_back(fallback(nt, nx));
  }
  return p;
}

// Writes what `llama-quantize --allow-requantize <in> <out_path> <ftype>` writes.
inline Status requantize(const gguf::File& in, Ftype ftype, const std::string& out_path) {
  using namespace detail;
  if (in.is_split()) return unsupported(in.path() + ": llama_quantize: split input is not reproduced");
  SLUICE_ASSIGN_OR_RETURN(const Plan p, plan(in, ftype));
  gguf::Writer w;
  for (const auto& kv : in.metadata()) {
    if (kv.key == "general.quantization_version" || kv.key == "general.file_type" || kv.key.rfind("split.", 0) == 0) {
      continue;
    }
    w.add(kv.key, kv.value);
  }
  w.add("general.quantization_version", gguf::Value::u32(2));  // GGML_QNT_VERSION
  w.add("general.file_type", gguf::Value::u32(uint32_t(ftype)));
  for (size_t i = 0; i < p.order.size(); ++i) {
    std::vector<uint64_t> shape = p.order[i]->shape;
    while (shape.size() > 1 && shape.back() == 1) shape.pop_back();  // ggml_n_dims
    SLUICE_RETURN_IF_ERROR(w.add_tensor(p.order[i]->name, p.types[i], shape));
  }
  std::vector<float> f32;
  return w.write(out_path, [&](size_t index, uint64_t offset, uint8_t* dst, uint64_t nbytes) -> Status {
    const gguf::TensorInfo& t = *p.order[index];
    const Type to = p.types[index];
    if (to == t.type) {
      std::memcpy(dst, in.tensor_data(t) + offset, nbytes);
      return Status::ok();
    }
    // Whole rows: dequantize them (ggml-base's to_float is the scalar reference), then quantize.
    const int64_t ne0 = int64_t(t.shape[0]);
    const uint64_t out_row = uint64_t(quant::row_bytes(to, ne0));
    const uint64_t rows = nbytes / out_row, first = offset / out_row;
    f32.resize(size_t(rows * uint64_t(ne0)));
    const quant::Kernels* from = quant::kernels_for(t.type, quant::Isa::kRef);
    if (!from || !from->dequantize_row) return unsupported(t.name + ": cannot dequantize " + quant::type_name(t.type));
    from->dequantize_row(in.tensor_data(t) + first * t.row_bytes(), f32.data(), int64_t(rows) * ne0);
    return quantize_rows(to, f32.data(), dst, int64_t(rows) * ne0);
  });
}

}  // namespace sluice::test::llama_quantize
