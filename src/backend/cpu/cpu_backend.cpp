// CPU backend: buffers, elementwise ops, norms, RoPE, cache stores. Matrix products are in
// matmul.cpp, attention in attention.cpp.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "quant/half.h"

#include "backend/cpu/exp_avx512.h"

// GCC 12's AVX-512 headers give some intrinsics a don't-care operand made from a
// self-initialised variable, and -Wuninitialized then flags every caller; it is never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // clang has no such group and would warn about the pragma
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace sluice::backend {

namespace {

// Physical cores (distinct package/core id pairs in sysfs): matrix products saturate a core's
// SIMD units, so a second hyper-thread per core adds contention, not throughput. Falls back to
// the logical count where sysfs is unavailable.
int physical_cores() {
  const unsigned logical = std::max(1u, std::thread::hardware_concurrency());
  std::set<std::pair<long, long>> cores;
  for (unsigned c = 0; c < logical; ++c) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    std::ifstream pkg(dir + "physical_package_id"), core(dir + "core_id");
    long p = -1, k = -1;
    if (!(pkg >> p) || !(core >> k)) return int(logical);
    cores.insert({p, k});
  }
  return cores.empty() ? int(logical) : int(cores.size());
}

}  // namespace

int cpu_threads(int n) { return n > 0 ? n : physical_cores(); }

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& opts) {
  const int n = cpu_threads(opts.n_threads);
  const char* tile_env = std::getenv("SLUICE_CPU_TILE");
  const bool tile = opts.tile_kernels && !(tile_env && std::string_view(tile_env) == "0");
  const char* pack_env = std::getenv("SLUICE_CPU_PACK");
  const bool pack = opts.pack_weights && !(pack_env && std::string_view(pack_env) == "0");
  return std::make_unique<cpu::CpuBackend>(n, opts.simd, tile, pack);
}

namespace cpu {
namespace {

float* row_f32(const Tensor& t, int64_t r) { return static_cast<float*>(t.data) + r * t.stride; }
uint16_t* row_f16(const Tensor& t, int64_t r) { return static_cast<uint16_t*>(t.data) + r * t.stride; }

void check_f32(const Tensor& t, const char* what) {
  SLUICE_CHECK(t.dtype == DType::kF32 && t.data != nullptr, std::string(what) + " must be an f32 tensor");
}
void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  SLUICE_CHECK(a.rows == b.rows && a.cols == b.cols, std::string(op) + ": shape mismatch");
}

#if defined(__x86_64__)
// SwiGLU g * sigmoid(g) * u, 16 lanes at a time, as llama.cpp's AVX-512 build computes it:
// silu(g) = g / (1 + exp(-g)) with its exp approximation (exp_avx512.h), then times u. Returns
// the elements done (a multiple of 16); the caller finishes the tail with the scalar formula,
// as llama.cpp does (libm expf).
__attribute__((target("avx512f,avx512dq"))) int64_t swiglu_avx512(const float* g, const float* u, float* d,
                                                                   int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    const __m512 silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_storeu_ps(d + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
  }
  return i;
}
// GeGLU 8 lanes at a time: gelu_tanh(g) = 0.5 g (1 + tanh(y)) = g / (1 + e^(-2y)) with
// y = sqrt(2/pi) (g + 0.044715 g^3): the same function, written with one exponential (no
// cancellation near y = 0, where 1 + tanh(y) ~ 1). e^t as exp_avx512 computes it (k = round(t /
// ln 2), r = t - k ln 2 in two steps, the same degree-5 polynomial, ~1.5 ulp), with 2^k built in
// the exponent bits; t is clamped to [-87, 88], where e^t is still a normal float and the result
// has saturated (g / (1 + e^88) = -0 for g < 0, g / (1 + e^-87) = g). Returns the elements done
// (a multiple of 8); the caller finishes the tail with backend::gelu_tanh.
__attribute__((target("avx2,fma"))) int64_t geglu_avx2(const float* g, const float* u, float* d, int64_t n) {
  int64_t i = 0;
  const __m256 c1 = _mm256_set1_ps(-2.0f * 0.7978845608028654f), c3 = _mm256_set1_ps(0.044715f);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(c3, x), x, _mm256_set1_ps(1.0f));  // 1 + 0.044715 x^2
    __m256 t = _mm256_mul_ps(_mm256_mul_ps(c1, x), inner);                                 // -2y
    t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 shifter = _mm256_set1_ps(0x1.8p23f);
    const __m256 k = _mm256_sub_ps(_mm256_fmadd_ps(t, _mm256_set1_ps(0x1.715476p+0f), shifter), shifter);
    const __m256 r =
        _mm256_fnmadd_ps(k, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(k, _mm256_set1_ps(0x1.62e4p-1f), t));
    const __m256 r2 = _mm256_mul_ps(r, r);
    const __m256 hi = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), r, _mm256_set1_ps(0x1.573e2ep-5f)),
                                      r2, _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), r, _mm256_set1_ps(0x1.fffdb6p-2f)));
    const __m256 poly = _mm256_fmadd_ps(hi, r2, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), r, _mm256_set1_ps(1.0f)));
    // 2^k for integer k in [-126, 127]: the biased exponent k + 127 in bits 23..30.
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    const __m256 ex = _mm256_mul_ps(poly, _mm256_castsi256_ps(e));
    const __m256 gelu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), ex));
    _mm256_storeu_ps(d + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(u + i)));
  }
  return i;
}
#endif

}  // namespace

CpuBackend::CpuBackend(int n_threads, bool simd, bool tile_kernels, bool pack_weights)
    : pool_(n_threads),
      simd_f16_(simd && cpu_has_f16c_fma()),
      tile_kernels_(tile_kernels),
      pack_weights_(pack_weights),
      scratch_(size_t(std::max(1, n_threads))) {}

Result<Tensor> CpuBackend::alloc(DType dtype, int64_t cols, int64_t rows) {
  SLUICE_CHECK(cols > 0 && rows > 0, "alloc: empty tensor");
  const size_t elem = size_t(dtype_bytes(dtype));
  AlignedBuffer buf;
  const size_t bytes = size_t(cols) * size_t(rows) * elem;
  if (!buf.reserve(bytes)) {
    return out_of_memory("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
  }
  std::memset(buf.data(), 0, bytes);
  Tensor t{buf.data(), dtype, cols, rows, cols};
  buffers_.push_back(std::move(buf));
  return t;
}

void CpuBackend::upload(const Tensor& dst, const float* src) {
  for (int64_t r = 0; r < dst.rows; ++r) {
    if (dst.dtype == DType::kF32) {
      std::memcpy(row_f32(dst, r), src + r * dst.cols, size_t(dst.cols) * 4);
    } else {
      for (int64_t c = 0; c < dst.cols; ++c) row_f16(dst, r)[c] = quant::fp32_to_fp16(src[r * dst.cols + c]);
    }
  }
}

void CpuBackend::upload_i32(const Tensor& dst, const int32_t* src) {
  SLUICE_CHECK(dst.dtype == DType::kI32 && dst.stride == dst.cols, "upload_i32: dense i32 tensor expected");
  std::memcpy(dst.data, src, size_t(dst.rows * dst.cols) * 4);
}

Result<void*> CpuBackend::alloc_host(int64_t bytes) {
  const size_t rounded = (size_t(std::max<int64_t>(bytes, 1)) + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded);
  if (!p) return out_of_memory("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes for weights");
  host_blocks_.emplace_back(p);
  return p;
}

Backend::Mark CpuBackend::copy_to_slot(void* dst, const void* src, int64_t bytes, Mark) {
  std::memcpy(dst, src, size_t(bytes));
  return ++marks_;
}

void CpuBackend::download(const Tensor& src, float* dst) {
  for (int64_t r = 0; r < src.rows; ++r) {
    if (src.dtype == DType::kF32) {
      std::memcpy(dst + r * src.cols, row_f32(src, r), size_t(src.cols) * 4);
    } else {
      for (int64_t c = 0; c < src.cols; ++c) dst[r * src.cols + c] = quant::fp16_to_fp32(row_f16(src, r)[c]);
    }
  }
}

void CpuBackend::get_rows(const WeightView& table, std::span<const int32_t> ids, const Tensor& dst) {
  check_f32(dst, "get_rows dst");
  SLUICE_CHECK(int64_t(ids.size()) == dst.rows && table.ne0 == dst.cols, "get_rows: shape mismatch");
  const auto& k = quant::kernels(table.type);
  SLUICE_CHECK(k.dequantize_row != nullptr, "get_rows: format has no dequantize");
  const int64_t rb = table.row_bytes();
  for_rows(dst.rows, 1, dst.rows * dst.cols, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t id = ids[size_t(t)];
      SLUICE_CHECK(id >= 0 && id < table.ne1, "get_rows: id out of range");
      k.dequantize_row(static_cast<const uint8_t*>(table.data) + id * rb, row_f32(dst, t), table.ne0);
    }
  });
}

void CpuBackend::rms_norm(const Tensor& x, const WeightView& w, float eps, const Tensor& dst) {
  check_f32(x, "rms_norm x");
  check_f32(dst, "rms_norm dst");
  check_same_shape(x, dst, "rms_norm");
  SLUICE_CHECK(w.type == quant::Type::kF32 && w.ne0 > 0 && x.cols % w.ne0 == 0, "rms_norm: bad weight");
  const int64_t group = w.ne0;
  const float* wd = static_cast<const float*>(w.data);
  for_rows(x.rows, 1, x.rows * x.cols, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      const float* xr = row_f32(x, t);
      float* yr = row_f32(dst, t);
      for (int64_t g0 = 0; g0 < x.cols; g0 += group) {
        // Squares in f32, accumulated in double, in order: the rounding llama.cpp's CPU norm has.
        // A last-bit difference here flips roundings in the next activation quantization, which
        // the large-activation layers of real models amplify into visible logit differences.
        double sum = 0;
        for (int64_t i = 0; i < group; ++i) sum += double(xr[g0 + i] * xr[g0 + i]);
        const float mean = float(sum / double(group));
        const float scale = 1.0f / std::sqrt(mean + eps);
        for (int64_t i = 0; i < group; ++i) yr[g0 + i] = (xr[g0 + i] * scale) * wd[i];
      }
    }
  });
}

void CpuBackend::add_bias(const Tensor& y, const WeightView& b) {
  check_f32(y, "add_bias y");
  SLUICE_CHECK(b.type == quant::Type::kF32 && b.ne0 == y.cols, "add_bias: bias length != cols");
  const float* bd = static_cast<const float*>(b.data);
  for_rows(y.rows, 1, y.rows * y.cols, [&](int64_t s, int64_t e, int) {
    for (int64_t t = s; t < e; ++t) {
      float* yr = row_f32(y, t);
      for (int64_t i = 0; i < y.cols; ++i) yr[i] += bd[i];
    }
  });
}

void CpuBackend::add(const Tensor& dst, const Tensor& src) {
  check_f32(dst, "add dst");
  check_f32(src, "add src");
  check_same_shape(dst, src, "add");
  for_rows(dst.rows, 1, dst.rows * dst.cols, [&](int64_t s, int64_t e, int) {
    for (int64_t t = s; t < e; ++t) {
      float* d = row_f32(dst, t);
      const float* a = row_f32(src, t);
      for (int64_t i = 0; i < dst.cols; ++i) d[i] += a[i];
    }
  });
}

void CpuBackend::gather_rows(const Tensor& src, std::span<const int32_t> rows, const Tensor& dst) {
  check_f32(src, "gather_rows src");
  check_f32(dst, "gather_rows dst");
  SLUICE_CHECK(src.cols == dst.cols && dst.rows == int64_t(rows.size()), "gather_rows: shape mismatch");
  for_rows(dst.rows, 1, dst.rows * dst.cols, [&](int64_t s, int64_t e, int) {
    for (int64_t i = s; i < e; ++i) {
      const int32_t r = rows[size_t(i)];
      SLUICE_CHECK(r >= 0 && r < src.rows, "gather_rows: row outside the source");
      std::memcpy(row_f32(dst, i), row_f32(src, r), size_t(dst.cols) * sizeof(float));
    }
  });
}

void CpuBackend::scatter_add_rows(const Tensor& dst, const Tensor& src, std::span<const int32_t> rows,
                                  std::span<const float> scale) {
  check_f32(src, "scatter_add_rows src");
  check_f32(dst, "scatter_add_rows dst");
  SLUICE_CHECK(src.cols == dst.cols && src.rows == int64_t(rows.size()) && rows.size() == scale.size(),
               "scatter_add_rows: shape mismatch");
  // Rows are distinct, so threads never write the same destination row.
  for_rows(src.rows, 1, src.rows * src.cols, [&](int64_t s, int64_t e, int) {
    for (int64_t i = s; i < e; ++i) {
      const int32_t r = rows[size_t(i)];
      SLUICE_CHECK(r >= 0 && r < dst.rows, "scatter_add_rows: row outside the destination");
      float* d = row_f32(dst, r);
      const float* a = row_f32(src, i);
      const float w = scale[size_t(i)];
      for (int64_t c = 0; c < dst.cols; ++c) d[c] += w * a[c];
    }
  });
}

template <typename Row>
void CpuBackend::gated(const Tensor& gate, const Tensor& up, const Tensor& dst, const char* op, Row&& row) {
  const std::string o(op);
  check_f32(gate, (o + " gate").c_str());
  check_f32(up, (o + " up").c_str());
  check_f32(dst, (o + " dst").c_str());
  check_same_shape(gate, up, op);
  check_same_shape(gate, dst, op);
  for_rows(dst.rows, 1, dst.rows * dst.cols, [&](int64_t s, int64_t e, int) {
    for (int64_t t = s; t < e; ++t) row(row_f32(gate, t), row_f32(up, t), row_f32(dst, t), dst.cols);
  });
}

void CpuBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& dst) {
#if defined(__x86_64__)
  const bool avx512 = cpu_has_avx512_exp();
#endif
  gated(gate, up, dst, "swiglu", [&](const float* g, const float* u, float* d, int64_t n) {
    int64_t i = 0;
#if defined(__x86_64__)
    if (avx512) i = swiglu_avx512(g, u, d, n);
#endif
    for (; i < n; ++i) d[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  });
}

// GeGLU in f32: the AVX2 path (geglu_avx2, ~2 ulp of the formula) where the backend's SIMD paths
// are on, else libm's tanhf (backend::gelu_tanh, the definition; tests compare the two). Not
// llama.cpp's CPU path, which looks gelu up in a table of f16 inputs and outputs (both rounded to
// 11 bits); its CUDA path computes the formula in f32 as here. A decode row (a few thousand
// elements) runs inline: waking the pool would cost more than the vectorized row.
void CpuBackend::geglu(const Tensor& gate, const Tensor& up, const Tensor& dst) {
  gated(gate, up, dst, "geglu", [&](const float* g, const float* u, float* d, int64_t n) {
    int64_t i = 0;
#if defined(__x86_64__)
    if (simd_f16_) i = geglu_avx2(g, u, d, n);
#endif
    for (; i < n; ++i) d[i] = gelu_tanh(g[i]) * u[i];
  });
}

void CpuBackend::scale(const Tensor& x, float s) {
  check_f32(x, "scale x");
  for_rows(x.rows, 1, x.rows * x.cols, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      float* r = row_f32(x, t);
      for (int64_t i = 0; i < x.cols; ++i) r[i] *= s;
    }
  });
}

void CpuBackend::rope(const Tensor& x, const RopeParams& p, int pos0) {
  check_f32(x, "rope x");
  SLUICE_CHECK(p.n_head * p.head_dim == x.cols, "rope: n_head * head_dim != cols");
  SLUICE_CHECK(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= p.head_dim && p.n_rot <= 2048, "rope: bad n_rot");
  const float* ff = nullptr;
  if (!p.freq_factors.empty()) {
    SLUICE_CHECK(p.freq_factors.type == quant::Type::kF32 && p.freq_factors.ne0 == p.n_rot / 2,
                 "rope: freq factors must be f32 [n_rot/2]");
    ff = static_cast<const float*>(p.freq_factors.data);
  }
  const int half = p.n_rot / 2;
  // theta_i = pos * base^(-2i/n_rot) (/ factor_i) * freq_scale. The power is built by repeated
  // multiplication in f32, the recurrence llama.cpp uses, so angles agree to the last bit.
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));
  for_rows(x.rows, 1, x.rows * x.cols, [&](int64_t s, int64_t e, int) {
    float cs[1024], sn[1024];
    for (int64_t t = s; t < e; ++t) {
      float theta = float(pos0 + t);
      for (int i = 0; i < half; ++i) {
        const float th = p.freq_scale * (ff ? theta / ff[i] : theta);
        cs[i] = std::cos(th);
        sn[i] = std::sin(th);
        theta *= theta_scale;
      }
      float* xr = row_f32(x, t);
      for (int h = 0; h < p.n_head; ++h) {
        float* v = xr + int64_t(h) * p.head_dim;
        for (int i = 0; i < half; ++i) {
          const int i0 = p.mode == RopeMode::kNormal ? 2 * i : i;
          const int i1 = p.mode == RopeMode::kNormal ? 2 * i + 1 : i + half;
          const float a = v[i0], b = v[i1];
          v[i0] = std::fma(a, cs[i], -(b * sn[i]));
          v[i1] = std::fma(a, sn[i], b * cs[i]);
        }
      }
    }
  });
}

void CpuBackend::store_rows(const Tensor& src, const Tensor& cache, int64_t pos0) {
  check_f32(src, "store_rows src");
  SLUICE_CHECK(src.cols == cache.cols && pos0 >= 0 && pos0 + src.rows <= cache.rows, "store_rows: out of range");
  const auto& f16 = quant::kernels(quant::Type::kF16);
  for (int64_t t = 0; t < src.rows; ++t) {
    const int64_t r = cache.row_map ? int64_t(cache.row_map[pos0 + t]) : pos0 + t;  // paged cache
    if (cache.dtype == DType::kF32) {
      std::memcpy(row_f32(cache, r), row_f32(src, t), size_t(src.cols) * 4);
    } else {
      f16.quantize_row(row_f32(src, t), row_f16(cache, r), src.cols);
    }
  }
}

}  // namespace cpu
}  // namespace sluice::backend
