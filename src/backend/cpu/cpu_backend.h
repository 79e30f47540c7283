// The CPU backend: every op of backend.h on a persistent thread pool, matrix products through the
// quant/ kernel tables. Internal to backend/cpu (model code sees only backend.h).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/threadpool.h"

namespace sluice::backend::cpu {

// 64-byte aligned heap block (cache-line aligned rows for the SIMD kernels). Grow-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) { reserve(bytes); }
  // Ensures capacity >= bytes; returns false on allocation failure. Contents are not kept.
  bool reserve(size_t bytes) {
    if (bytes <= size_) return true;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) return false;
    ptr_.reset(static_cast<uint8_t*>(p));
    size_ = rounded;
    return true;
  }
  uint8_t* data() const { return ptr_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> ptr_;
  size_t size_ = 0;
};

// Whether this CPU runs the AVX2/FMA/F16C attention path (checked once per backend).
bool cpu_has_f16c_fma();

class CpuBackend final : public Backend {
 public:
  CpuBackend(int n_threads, bool simd, bool tile_kernels = true, bool pack_weights = true);
  const char* name() const override { return "cpu"; }
  int n_threads() const { return pool_.size(); }

  Result<Tensor> alloc(DType dtype, int64_t cols, int64_t rows) override;
  void upload(const Tensor& dst, const float* src) override;
  void upload_i32(const Tensor& dst, const int32_t* src) override;
  void download(const Tensor& src, float* dst) override;
  void sync() override {}  // every op completes before it returns
  // Host memory is the backend's memory: a weight is returned as it is, or repacked into the
  // packed layout of its format (CpuOptions::pack_weights) in a buffer the backend owns.
  Result<WeightView> upload_weight(const WeightView& host) override;
  // The packed layout (0 bytes where pack_weights is off, the format or this CPU has none, or the
  // shape does not divide into groups); repacking runs on the pool, groups split across threads.
  int64_t repacked_bytes(const WeightView& w) const override;
  WeightView repack_weight(const WeightView& w, void* dst) override;

  // Streaming: slots and staging are host memory (4 KiB aligned, for O_DIRECT reads); a copy is
  // a memcpy done before copy_to_slot returns, so every mark has passed when it is handed out.
  Result<void*> alloc_slot(int64_t bytes) override { return alloc_host(bytes); }
  Result<void*> alloc_staging(int64_t bytes) override { return alloc_host(bytes); }
  Mark copy_to_slot(void* dst, const void* src, int64_t bytes, Mark after) override;
  void compute_wait(Mark) override {}
  Mark compute_mark() override { return ++marks_; }
  void host_wait(Mark) override {}

  bool set_row_invariant(bool on) override {
    row_invariant_ = on;
    return true;
  }
  void get_rows(const WeightView& table, std::span<const int32_t> ids, const Tensor& dst) override;
  void matmul(const WeightView& w, const Tensor& x, const Tensor& y) override;
  void matmul_multi(std::span<const WeightView> ws, const Tensor& x, std::span<const Tensor> ys) override;
  void matmul_each(std::span<const WeightView> ws, std::span<const Tensor> xs, std::span<const Tensor> ys) override;
  void rms_norm(const Tensor& x, const WeightView& w, float eps, const Tensor& dst) override;
  void add_bias(const Tensor& y, const WeightView& b) override;
  void add(const Tensor& dst, const Tensor& src) override;
  void swiglu(const Tensor& gate, const Tensor& up, const Tensor& dst) override;
  void geglu(const Tensor& gate, const Tensor& up, const Tensor& dst) override;
  void scale(const Tensor& x, float s) override;
  void gather_rows(const Tensor& src, std::span<const int32_t> rows, const Tensor& dst) override;
  void scatter_add_rows(const Tensor& dst, const Tensor& src, std::span<const int32_t> rows,
                        std::span<const float> scale) override;
  void rope(const Tensor& x, const RopeParams& p, int pos0) override;
  void store_rows(const Tensor& src, const Tensor& cache, int64_t pos0) override;
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                 const AttentionParams& p) override;

 private:
  // Runs fn(begin, end, ith) over [0, n) rows: inline on the caller when the whole job is below
  // `inline_work` units (dispatch would cost more than the work), else on the pool.
  template <typename F>
  void for_rows(int64_t n, int64_t grain, int64_t work, F&& fn);
  // dst = act(gate) * up row by row (SwiGLU, GeGLU): shape checks named after `op`, then
  // row(g, u, d, cols) for every row.
  template <typename Row>
  void gated(const Tensor& gate, const Tensor& up, const Tensor& dst, const char* op, Row&& row);

  core::ThreadPool pool_;
  const bool simd_f16_;  // attention's AVX2/F16C path (else the portable one)
  const bool tile_kernels_;  // matmul's vec_dot_tile path for batches (CpuOptions::tile_kernels)
  const bool pack_weights_;  // upload_weight repacks (CpuOptions::pack_weights)
  bool row_invariant_ = false;  // set_row_invariant: batches computed row by row as one-token calls
  std::vector<AlignedBuffer> buffers_;  // every Tensor allocated, alive until destruction
  // matmul, matmul_multi, matmul_each: one dispatch over the output rows of every weight; xs holds
  // one input shared by all weights, or one per weight.
  void matmul_job(std::span<const WeightView> ws, std::span<const Tensor> xs, std::span<const Tensor> ys);
  // Weights per matmul job (a decode step's 8 experts' gate and up projections are 16).
  static constexpr size_t kMaxParts = 32;
  // Quantized activations for a matmul job: every distinct input in every activation format it
  // meets (grow-only).
  AlignedBuffer act_q_;
  std::vector<AlignedBuffer> scratch_;  // per-thread attention scratch (grow-only)

  Result<void*> alloc_host(int64_t bytes);
  struct FreeHost {
    void operator()(void* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<void, FreeHost>> host_blocks_;  // slots and staging
  Mark marks_ = 0;
};

// Below this many elements of work an op runs on the calling thread: waking the pool costs a
// few microseconds, more than e.g. a 576-element norm.
inline constexpr int64_t kInlineWork = 16384;

template <typename F>
void CpuBackend::for_rows(int64_t n, int64_t grain, int64_t work, F&& fn) {
  if (work < kInlineWork || pool_.size() == 1) {
    fn(int64_t{0}, n, 0);
    return;
  }
  pool_.parallel_for(n, grain, fn);
}

}  // namespace sluice::backend::cpu
