// Helpers for GPU tests: device presence (skip without one), RAII device buffers, and weights made
// of random quantized blocks with their exact float values from quant's scalar reference.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/gemv.h"
#include "core/status.h"
#include "quant/quant.h"
#include "quant/ref.h"
#include "test_util.h"

namespace sluice::test::gpu {

// Aborts with file:line: in tests a failing CUDA call is a broken environment or a bug.
#define GPU_CHECK(call)                                                                              \
  do {                                                                                               \
    const cudaError_t _e = (call);                                                                   \
    if (_e != cudaSuccess) ::sluice::check_failed(__FILE__, __LINE__, #call, cudaGetErrorString(_e)); \
  } while (0)

#define SLUICE_SKIP_WITHOUT_GPU()                                              \
  do {                                                                         \
    int _n = 0;                                                                \
    if (cudaGetDeviceCount(&_n) != cudaSuccess || _n == 0) {                   \
      (void)cudaGetLastError();                                                \
      GTEST_SKIP() << "no CUDA device";                                        \
    }                                                                          \
  } while (0)

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { GPU_CHECK(cudaMalloc(&p_, bytes == 0 ? 1 : bytes)); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  template <class T = void>
  T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  void upload(const void* src, size_t n) { GPU_CHECK(cudaMemcpy(p_, src, n, cudaMemcpyHostToDevice)); }
  void download(void* dst, size_t n) const { GPU_CHECK(cudaMemcpy(dst, p_, n, cudaMemcpyDeviceToHost)); }
  // 0xFF bytes: NaN as f32, so an output element the kernel never writes fails every check.
  void poison() { GPU_CHECK(cudaMemset(p_, 0xFF, bytes_)); }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

struct FormatRef {
  quant::Type type;
  const char* name;
  int block_elems;
  int block_bytes;
  void (*quantize)(const float*, void*, int64_t);
  void (*dequantize)(const void*, float*, int64_t);
};

// Every weight format of quant/ with its scalar reference (the specification).
inline const std::vector<FormatRef>& weight_formats() {
  namespace r = quant::ref;
  using T = quant::Type;
  static const std::vector<FormatRef> kFormats = {  // immutable
      {T::kF32, "f32", 1, 4, r::quantize_row_f32, r::dequantize_row_f32},
      {T::kF16, "f16", 1, 2, r::quantize_row_f16, r::dequantize_row_f16},
      {T::kBF16, "bf16", 1, 2, r::quantize_row_bf16, r::dequantize_row_bf16},
      {T::kQ4_0, "q4_0", 32, 18, r::quantize_row_q4_0, r::dequantize_row_q4_0},
      {T::kQ4_1, "q4_1", 32, 20, r::quantize_row_q4_1, r::dequantize_row_q4_1},
      {T::kQ5_0, "q5_0", 32, 22, r::quantize_row_q5_0, r::dequantize_row_q5_0},
      {T::kQ5_1, "q5_1", 32, 24, r::quantize_row_q5_1, r::dequantize_row_q5_1},
      {T::kQ8_0, "q8_0", 32, 34, r::quantize_row_q8_0, r::dequantize_row_q8_0},
      {T::kQ2_K, "q2_k", 256, 84, r::quantize_row_q2_k, r::dequantize_row_q2_k},
      {T::kQ3_K, "q3_k", 256, 110, r::quantize_row_q3_k, r::dequantize_row_q3_k},
      {T::kQ4_K, "q4_k", 256, 144, r::quantize_row_q4_k, r::dequantize_row_q4_k},
      {T::kQ5_K, "q5_k", 256, 176, r::quantize_row_q5_k, r::dequantize_row_q5_k},
      {T::kQ6_K, "q6_k", 256, 210, r::quantize_row_q6_k, r::dequantize_row_q6_k},
  };
  return kFormats;
}

// A rows x cols weight matrix in format f and its exact float values. Quantizing tens of millions
// of elements with the scalar reference would take minutes, so a pool of random blocks (up to
// 4096, each quantized from fresh normal data) is quantized once and every block of the matrix is
// a random pick from it: rows differ from each other, so a wrong row or block index shows.
struct QuantMatrix {
  std::vector<uint8_t> bytes;  // [rows][row_bytes]
  std::vector<float> values;   // [rows][cols], dequantized by the reference
  int64_t row_bytes = 0;
};

inline QuantMatrix make_matrix(const FormatRef& f, int64_t rows, int64_t cols, uint64_t salt) {
  // Float formats: a "block" for pooling purposes is 32 elements.
  const int64_t pool_elems = f.block_elems == 1 ? 32 : f.block_elems;
  const int64_t pool_bytes = pool_elems / f.block_elems * f.block_bytes;
  const int64_t per_row = cols / pool_elems;
  const int64_t units = rows * per_row;
  const int64_t pool_n = std::min<int64_t>(units, 4096);
  const std::vector<float> src = random_floats(size_t(pool_n * pool_elems), 1.0f, salt);
  std::vector<uint8_t> pool(size_t(pool_n * pool_bytes));
  std::vector<float> pool_vals(size_t(pool_n * pool_elems));
  for (int64_t i = 0; i < pool_n; ++i) {
    f.quantize(src.data() + i * pool_elems, pool.data() + i * pool_bytes, pool_elems);
    f.dequantize(pool.data() + i * pool_bytes, pool_vals.data() + i * pool_elems, pool_elems);
  }
  QuantMatrix m;
  m.row_bytes = per_row * pool_bytes;
  m.bytes.resize(size_t(rows * m.row_bytes));
  m.values.resize(size_t(rows * cols));
  std::mt19937_64 rng(test_seed() ^ (salt * 0xD1B54A32D192ED03ull));
  for (int64_t u = 0; u < units; ++u) {
    const int64_t k = units == pool_n ? u : int64_t(rng() % uint64_t(pool_n));
    std::memcpy(m.bytes.data() + u * pool_bytes, pool.data() + k * pool_bytes, size_t(pool_bytes));
    std::memcpy(m.values.data() + u * pool_elems, pool_vals.data() + k * pool_elems, size_t(pool_elems) * 4);
  }
  return m;
}

// y[t][r] = sum_c W[r][c] * x[t][c] in double.
inline std::vector<double> ref_gemv(const std::vector<float>& w, const std::vector<float>& x, int64_t rows, int64_t cols,
                                    int tokens) {
  std::vector<double> y(size_t(rows * tokens));
  for (int t = 0; t < tokens; ++t) {
    const float* xt = x.data() + t * cols;
    for (int64_t r = 0; r < rows; ++r) {
      const float* wr = w.data() + r * cols;
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += double(wr[c]) * double(xt[c]);
      y[size_t(t * rows + r)] = s;
    }
  }
  return y;
}

inline double normalized_error_d(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace sluice::test::gpu
