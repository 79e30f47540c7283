// The CUDA backend: backend.h's ops on one GPU, all enqueued on one stream.
//
//   matmul, 1..8 tokens  -> gemv (gemv.h): weights read once at memory bandwidth, int8 activations
//   matmul, more tokens  -> the weight dequantized to f16 in row chunks (ops.h), then a cuBLAS
//                           GEMM on tensor cores with f32 accumulation and output
//   attention            -> attention.h (flash-decoding / flash-style prefill over the F16 cache)
//   everything else      -> ops.h
//
// Weights are copied in once (upload_weight) except the embedding table, whose rows get_rows
// dequantizes on the host into pinned staging: only n_embd floats per token cross the bus.
// Decode steps (begin_step/end_step) are recorded with stream capture and replayed as a CUDA graph;
// the graph of the previous token is updated in place when only kernel arguments changed
// (positions), so a token costs one graph launch instead of hundreds of kernel launches.
//
// Failures of the device inside an op (the ops return void by contract) abort with file:line
// through SLUICE_CUDA_CHECK: they mean a lost device or a bug, never bad user input, which model/
// validates before any op is issued.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv.h"
#include "backend/cuda/layout.h"
#include "backend/cuda/mmq.h"
#include "backend/cuda/ops.h"
#include "quant/quant.h"

namespace sluice::backend {
namespace cuda {
namespace {

// cuBLAS is opened when a CUDA backend is created (dlopen), not linked: loading and relocating
// it (with cuBLASLt) costs about 200 MiB of resident memory, which the CPU runs of a CUDA-enabled
// build should not pay. Only the entry points used here are looked up; types and enums come from
// the header. The library stays loaded for the rest of the process (no dlclose).
class CublasApi {
 public:
  Status load() {
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = ::dlerror();
      return unsupported("cannot load " + soname + ", which the CUDA backend needs: " + (why ? why : "?"));
    }
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      ok = ok && fn != nullptr;
    };
    sym(create, "cublasCreate_v2");
    sym(destroy, "cublasDestroy_v2");
    sym(set_stream, "cublasSetStream_v2");
    sym(gemm_ex, "cublasGemmEx");
    sym(status_string, "cublasGetStatusString");
    if (!ok) return unsupported(soname + " lacks an entry point the CUDA backend needs (cuBLAS too old?)");
    return Status::ok();
  }

  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // The exported cublasGemmEx (the header adds an inline overload taking cudaDataType compute).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

#define SLUICE_CUBLAS_CHECK(api, call)                                                            \
  do {                                                                                            \
    const cublasStatus_t _cb = (call);                                                            \
    if (_cb != CUBLAS_STATUS_SUCCESS)                                                             \
      ::sluice::check_failed(__FILE__, __LINE__, #call, (api).status_string(_cb));                \
  } while (0)

// An op's Status that is not ok here is a bug in the caller's shapes (model/ validated the data).
void must(const Status& st, const char* op) {
  if (!st.is_ok()) ::sluice::check_failed(__FILE__, __LINE__, op, st.message());
}

// Target bytes of one dequantized f16 weight chunk of the prefill GEMM: large enough that the GEMM
// keeps every SM busy, small enough to stay a minor share of a consumer GPU's memory.
constexpr int64_t kGemmChunkBytes = int64_t(64) << 20;

// The scratch buffers a pass of `shape` can grow (each to the most any of its calls asks), for the
// GPU `dev` (sm_count 0: any GPU).
struct ScratchSizes {
  int64_t q8 = 0;            // int8 activations: norms, SwiGLU, attention combine, GEMV and mmq (<= 32 rows)
  int64_t x_f16 = 0;         // the prefill GEMM's f16 activation
  int64_t w_f16 = 0;         // its dequantized weight chunk
  int64_t attn = 0;          // decode attention's split workspace
  int64_t mmq_partials = 0;  // mmq's column splits
  int64_t mmq_counter_bytes = 0;
};

ScratchSizes scratch_sizes(const ScratchShape& s, const DeviceInfo& dev) {
  ScratchSizes z;
  if (s.max_tokens <= 0 || s.max_cols <= 0) return z;
  z.q8 = q8_activation_bytes(s.max_cols, int(std::min<int64_t>(s.max_tokens, kMaxMmqTokens)));
  if (s.n_head > 0 && s.head_dim > 0 && s.positions > 0) {
    // One sequence's decode rows (attention_workspace_bytes caps them), or one decode row of each
    // of up to kMaxAttentionSeqRows sequences per launch.
    const int rows = int(std::min<int64_t>(s.max_tokens, kMaxAttentionSeqRows));
    z.attn = attention_workspace_bytes(rows, s.n_head, s.head_dim, s.positions);
    if (s.sequences > 1) {
      const int seq_rows = int(std::min<int64_t>(rows, s.sequences));
      z.attn = std::max(z.attn, attention_seq_workspace_bytes(seq_rows, s.n_head, s.head_dim, s.positions));
    }
  }
  if (s.max_tokens >= kMmqFromTokens) {  // from 3 rows a product may take mmq or the dequantize + GEMM path
    z.x_f16 = s.max_cols * s.max_tokens * 2;
    z.w_f16 = std::max(kGemmChunkBytes, 64 * s.max_cols * 2);  // gemm_all's chunk of >= 64 rows
    const MmqScratch m = mmq_scratch_bound(dev);
    z.mmq_partials = m.partial_bytes;
    z.mmq_counter_bytes = m.counters_n * int64_t(sizeof(int));
  }
  return z;
}

// A device buffer that only grows. Buffers it outgrows are kept until the backend is destroyed:
// ops already enqueued (or recorded in a graph) may still read them.
struct Scratch {
  void* ptr = nullptr;
  int64_t bytes = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const DeviceInfo& dev, bool graphs, uint32_t skip_kernels)
      : dev_(dev), graphs_(graphs), skip_kernels_(skip_kernels) {}

  Status init() {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaSetDevice(dev_.device));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staging_free_, cudaEventDisableTiming));
    SLUICE_RETURN_IF_ERROR(blas_.load());
    if (blas_.create(&cublas_) != CUBLAS_STATUS_SUCCESS) return internal_error("cuBLAS could not be initialized");
    if (blas_.set_stream(cublas_, stream_) != CUBLAS_STATUS_SUCCESS) return internal_error("cublasSetStream failed");
    // Tensor-core math with f32 accumulation (CUBLAS_COMPUTE_32F below); default pointer mode.
    // SLUICE_CUDA_MMQ (A/B runs): 0 = products of more than kMaxGemvTokens tokens take the
    // dequantize + cuBLAS path; N = mmq from N tokens (default kMmqFromTokens).
    if (const char* mmq_env = std::getenv("SLUICE_CUDA_MMQ")) {
      const int n = std::atoi(mmq_env);
      mmq_from_ = n <= 0 ? kMaxMmqTokens + 1 : n;
    }
    // SLUICE_CUDA_QKV_ROPE=0 (A/B runs): matmul_rope_store_kv takes the two steps.
    const char* qkv_rope_env = std::getenv("SLUICE_CUDA_QKV_ROPE");
    qkv_rope_ = !(qkv_rope_env != nullptr && std::string(qkv_rope_env) == "0");
    return Status::ok();
  }

  ~CudaBackend() override {
    // Destruction must not throw or abort: errors here are ignored (the process is ending or the
    // model is being dropped; the driver reclaims everything at exit).
    if (stream_) cudaStreamSynchronize(stream_);
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    for (UploadBuffer& b : uploads_) {
      if (b.done) cudaEventDestroy(b.done);
      if (b.host) cudaFreeHost(b.host);
    }
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    for (void* p : host_allocs_) cudaFreeHost(p);
    if (exec_) cudaGraphExecDestroy(exec_);
    if (cublas_) blas_.destroy(cublas_);
    for (void* p : device_allocs_) cudaFree(p);
    if (staging_) cudaFreeHost(staging_);
    if (staging_free_) cudaEventDestroy(staging_free_);
    if (pos_copied_) cudaEventDestroy(pos_copied_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  bool reads_host_weights() const override { return false; }

  int64_t free_memory() const override {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return int64_t(free);
  }

  int64_t allocated_bytes() const override { return allocated_; }

  Status reserve_scratch(const ScratchShape& shape) override {
    const ScratchSizes z = scratch_sizes(shape, dev_);
    if (graphs_) SLUICE_RETURN_IF_ERROR(init_step_pos());  // read by recorded steps
    for (auto [s, bytes] : {std::pair{&q8_, z.q8}, std::pair{&x_f16_, z.x_f16}, std::pair{&w_f16_, z.w_f16},
                            std::pair{&attn_ws_, z.attn}, std::pair{&mmq_partials_, z.mmq_partials}}) {
      SLUICE_RETURN_IF_ERROR(resize(*s, bytes, bytes));
    }
    return zeroed_counters(z.mmq_counter_bytes, z.mmq_counter_bytes);
  }

  // Q6_K and Q8_0 matrices of whole 8-block groups are stored grouped (layout.h): their decode
  // GEMV then loads 16-byte words straight from global memory. The copy and the regrouping are ordered on
  // the compute stream (a plain cudaMemcpy from pageable memory may return before its DMA has
  // landed, and the compute stream does not wait for the legacy stream), and the upload returns
  // once both are done.
  Result<WeightView> upload_weight(const WeightView& host) override {
    const int64_t bytes = host.row_bytes() * host.ne1;
    SLUICE_ASSIGN_OR_RETURN(void* p, device_alloc(bytes));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(p, host.data, size_t(bytes), cudaMemcpyHostToDevice, stream_));
    WeightView v = host;
    v.data = p;
    if (!host.packed && !host.grouped && groupable(host.type, host.ne0) && groups_enabled()) {
      const Status st = group_weight_blocks(host.type, p, host.ne1, host.ne0, stream_);
      if (!st.is_ok()) return st;
      v.grouped = true;
    }
    SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return v;
  }

  Result<Tensor> alloc(DType dtype, int64_t cols, int64_t rows) override {
    SLUICE_CHECK(cols > 0 && rows > 0, "alloc: empty tensor");
    const int64_t bytes = cols * rows * dtype_bytes(dtype);
    SLUICE_ASSIGN_OR_RETURN(void* p, device_alloc(bytes));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(p, 0, size_t(bytes)));
    return Tensor{p, dtype, cols, rows, cols};
  }

  void upload(const Tensor& dst, const float* src) override {
    invalidate_q8();
    SLUICE_CHECK(!capturing_, "upload inside a recorded step");
    SLUICE_CHECK(dst.dtype == DType::kF32, "upload: f32 tensors only");
    const size_t row = size_t(dst.cols) * 4, bytes = row * size_t(dst.rows);
    UploadBuffer* b = bytes <= kUploadBytes ? next_upload_buffer() : nullptr;
    if (b == nullptr) {
      // Large (prefill hand-offs) or no pinned ring: from the caller's pageable memory, waiting
      // for the transfer (the caller may reuse `src` at once).
      SLUICE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, size_t(dst.stride) * 4, src, row, row, size_t(dst.rows),
                                          cudaMemcpyHostToDevice, stream_));
      SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    // Through a pinned buffer of the ring, without waiting for the transfer: in a hybrid token
    // the copy engine is busy with slot copies, and a CPU layer's KV mirror and hand-offs would
    // otherwise wait behind them (measured on the H200 host, 70B Q4_K_M at 32 GiB: the CPU's
    // layers ran at 59-69 GB/s in a token, 80-99 without those waits).
    std::memcpy(b->host, src, bytes);
    SLUICE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, size_t(dst.stride) * 4, b->host, row, row, size_t(dst.rows),
                                        cudaMemcpyHostToDevice, stream_));
    SLUICE_CUDA_CHECK(cudaEventRecord(b->done, stream_));
  }

  void upload_i32(const Tensor& dst, const int32_t* src) override {
    SLUICE_CHECK(dst.dtype == DType::kI32 && dst.stride == dst.cols, "upload_i32: dense i32 tensor expected");
    // From pageable memory: the copy is staged by the driver before the call returns, ordered on
    // the compute stream with the ops around it.
    SLUICE_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, size_t(dst.rows * dst.cols) * 4, cudaMemcpyHostToDevice, stream_));
  }

  void download(const Tensor& src, float* dst) override {
    SLUICE_CHECK(src.dtype == DType::kF32, "download: f32 tensors only");
    SLUICE_CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(src.cols) * 4, src.data, size_t(src.stride) * 4,
                                        size_t(src.cols) * 4, size_t(src.rows), cudaMemcpyDeviceToHost, stream_));
    SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void sync() override { SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // ---- streaming: a copy stream next to the compute stream, marks are events -----------------

  Result<void*> alloc_slot(int64_t bytes) override { return device_alloc(bytes); }

  Result<void*> alloc_staging(int64_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, size_t(std::max<int64_t>(bytes, 1)), cudaHostAllocDefault);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return out_of_memory("cuda backend: cannot pin " + std::to_string(bytes) + " bytes of host memory (" +
                           cudaGetErrorString(e) + ")");
    }
    host_allocs_.push_back(p);
    return p;
  }

  Mark copy_to_slot(void* dst, const void* src, int64_t bytes, Mark after) override {
    SLUICE_CHECK(!capturing_, "copy_to_slot inside a step");
    ensure_copy_stream();
    if (after != 0) wait_mark(copy_stream_, after);
    // In chunks, so a small transfer of the compute stream (an upload) that shares the copy
    // engine waits for one chunk (~0.6 ms at 50 GB/s), not for a whole layer.
    constexpr int64_t kChunk = int64_t(32) << 20;
    int64_t off = 0;
    do {
      const int64_t len = std::min(kChunk, bytes - off);
      SLUICE_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, size_t(len),
                                        cudaMemcpyHostToDevice, copy_stream_));
      off += len;
    } while (off < bytes);
    return record_mark(copy_stream_);
  }

  void compute_wait(Mark m) override {
    if (m != 0) wait_mark(stream_, m);
  }

  Mark compute_mark() override { return record_mark(stream_); }

  void host_wait(Mark m) override {
    if (m == 0 || m + kMarkRing <= next_mark_) return;  // long passed: its event was reused
    SLUICE_CUDA_CHECK(cudaEventSynchronize(marks_[m % kMarkRing]));
  }

  double seconds_between(Mark from, Mark to) override {
    if (from == 0 || to == 0 || from + kMarkRing <= next_mark_ || to + kMarkRing <= next_mark_) return -1;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, marks_[from % kMarkRing], marks_[to % kMarkRing]) != cudaSuccess) {
      (void)cudaGetLastError();  // not recorded yet or not completed
      return -1;
    }
    return double(ms) * 1e-3;
  }

  // ---- replayed decode steps (graphs_) --------------------------------------------------------
  // A step is recorded once per (caller's key, position bucket) and replayed for every later
  // token with that key: the ops that depend on the position (rope, KV store, attention) read it
  // from pos_dev_, which a copy from pinned memory sets before each launch, and the attention's
  // key splits are planned for the bucket's last position, so the recorded kernels stay valid for
  // every position of the bucket.
  static constexpr int kStepBucket = 256;  // positions per recorded attention plan

  bool replay_step(uint64_t key, int pos) override {
    if (!graphs_ || !exec_ || exec_key_ != step_key(key, pos)) return false;
    set_step_pos(pos);
    SLUICE_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    ++graph_launches_;
    return true;
  }

  void begin_step(uint64_t key, int pos) override {
    if (!graphs_) return;
    SLUICE_CHECK(!capturing_, "begin_step: a step is already open");
    set_step_pos(pos);
    SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    // Relaxed: a scratch buffer may grow (cudaMalloc) while the first step is recorded.
    SLUICE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    step_pos_ = pos;
    pending_key_ = step_key(key, pos);
  }

  void end_step() override {
    if (!graphs_) return;
    SLUICE_CHECK(capturing_, "end_step without begin_step");
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    SLUICE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    bool updated = false;
    if (exec_) {
      cudaGraphExecUpdateResultInfo info{};
      updated = cudaGraphExecUpdate(exec_, graph, &info) == cudaSuccess;
      if (!updated) {
        (void)cudaGetLastError();  // a topology change (new shapes): instantiate afresh
        SLUICE_CUDA_CHECK(cudaGraphExecDestroy(exec_));
        exec_ = nullptr;
      }
    }
    if (!exec_) SLUICE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph, 0));
    SLUICE_CUDA_CHECK(cudaGraphDestroy(graph));
    exec_key_ = pending_key_;
    SLUICE_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    ++graph_launches_;
  }

  void get_rows(const WeightView& table, std::span<const int32_t> ids, const Tensor& dst) override {
    invalidate_q8();
    SLUICE_CHECK(dst.dtype == DType::kF32 && dst.cols == table.ne0 && dst.rows == int64_t(ids.size()),
                 "get_rows: shape mismatch");
    const int64_t n = int64_t(ids.size());
    const int64_t bytes = n * table.ne0 * 4;
    if (bytes > staging_bytes_) {
      // Inside a step the stream is idle (begin_step waited) and cannot be synchronized.
      if (!capturing_) SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      if (staging_) SLUICE_CUDA_CHECK(cudaFreeHost(staging_));
      staging_ = nullptr;
      SLUICE_CUDA_CHECK(cudaHostAlloc(&staging_, size_t(bytes), cudaHostAllocDefault));
      staging_bytes_ = bytes;
    }
    // The previous copy out of staging must be done before the host overwrites it. Inside a step
    // the stream is idle (begin_step waited), and events cannot be waited on while recording.
    if (!capturing_) SLUICE_CUDA_CHECK(cudaEventSynchronize(staging_free_));
    const quant::Kernels& k = quant::kernels(table.type);
    const int64_t rb = table.row_bytes();
    float* out = static_cast<float*>(staging_);
    for (int64_t t = 0; t < n; ++t) {
      k.dequantize_row(static_cast<const uint8_t*>(table.data) + int64_t(ids[size_t(t)]) * rb, out + t * table.ne0,
                       table.ne0);
    }
    SLUICE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, size_t(dst.stride) * 4, staging_, size_t(table.ne0) * 4,
                                        size_t(table.ne0) * 4, size_t(n), cudaMemcpyHostToDevice, stream_));
    if (!capturing_) SLUICE_CUDA_CHECK(cudaEventRecord(staging_free_, stream_));
  }

  void matmul(const WeightView& w, const Tensor& x, const Tensor& y) override {
    const WeightView ws[] = {w};
    const Tensor ys[] = {y};
    matmul_multi(ws, x, ys);
  }

  void matmul_multi(std::span<const WeightView> ws, const Tensor& x, std::span<const Tensor> ys) override {
    SLUICE_CHECK(ws.size() == ys.size(), "matmul_multi: weights and outputs differ in count");
    SLUICE_CHECK(x.dtype == DType::kF32, "matmul: x must be f32");
    for (size_t i = 0; i < ws.size(); ++i) {
      SLUICE_CHECK(ws[i].ne0 == x.cols && ws[i].ne1 == ys[i].cols && ys[i].rows == x.rows &&
                       ys[i].dtype == DType::kF32,
                   "matmul: shape mismatch");
    }
    if (x.rows >= mmq_from_ && mmq_all(ws, x, ys)) {
      // done
    } else if (x.rows <= kMaxGemvTokens) {
      gemv_all(ws, x, ys);
    } else {
      gemm_all(ws, x, ys);
    }
    for (const Tensor& y : ys) {
      if (y.data == q8_of_) invalidate_q8();
    }
  }

  void rms_norm(const Tensor& x, const WeightView& w, float eps, const Tensor& dst) override {
    SLUICE_CHECK(w.type == quant::Type::kF32 && w.ne0 > 0 && x.cols % w.ne0 == 0 && dst.cols == x.cols &&
                     dst.rows == x.rows,
                 "rms_norm: shape mismatch");
    invalidate_q8();
    const float* wf = static_cast<const float*>(w.data);
    if (x.rows <= kMaxMmqTokens && w.ne0 == x.cols && x.cols % 32 == 0 && dst.stride == dst.cols) {
      // Decode: the norm's output feeds matrix products only; make their int8 activation here.
      const Q8Activation q8 = q8_view(x.cols, int(x.rows));
      if (!skips(kCudaNorm)) {
        must(rms_norm_q8(f32(x), x.stride, f32(dst), dst.stride, x.rows, x.cols, wf, eps, q8, stream_), "rms_norm_q8");
      }
      set_q8(dst);
      return;
    }
    must(cuda::rms_norm(f32(x), x.stride, f32(dst), dst.stride, x.rows, x.cols, wf, w.ne0, eps, stream_),
         "rms_norm");
  }

  void add_rms_norm(const Tensor& x, const Tensor& src, const WeightView& w, float eps, const Tensor& dst) override {
    SLUICE_CHECK(src.cols == x.cols && src.rows == x.rows && w.type == quant::Type::kF32 && w.ne0 == x.cols &&
                     dst.cols == x.cols && dst.rows == x.rows,
                 "add_rms_norm: shape mismatch");
    if (!(x.rows <= kMaxMmqTokens && x.cols % 32 == 0 && dst.stride == dst.cols)) {
      Backend::add_rms_norm(x, src, w, eps, dst);
      return;
    }
    invalidate_q8();
    const Q8Activation q8 = q8_view(x.cols, int(x.rows));
    if (!skips(kCudaAddNorm)) {
      must(add_rms_norm_q8(f32(x), x.stride, f32(src), src.stride, f32(dst), dst.stride, x.rows, x.cols,
                           static_cast<const float*>(w.data), eps, q8, stream_),
           "add_rms_norm_q8");
    }
    set_q8(dst);
  }

  // Gemma 3's post-attention norm, residual add and FFN norm in one launch on the decode path
  // (where rms_norm and add_rms_norm take their int8 kernels); elsewhere the two calls.
  void norm_add_rms_norm(const Tensor& x, const Tensor& src, const WeightView& w_src, const WeightView& w, float eps,
                         const Tensor& dst) override {
    SLUICE_CHECK(src.cols == x.cols && src.rows == x.rows && w.type == quant::Type::kF32 && w.ne0 == x.cols &&
                     w_src.type == quant::Type::kF32 && dst.cols == x.cols && dst.rows == x.rows,
                 "norm_add_rms_norm: shape mismatch");
    if (!(w_src.ne0 == x.cols && x.rows <= kMaxMmqTokens && x.cols % 32 == 0 && dst.stride == dst.cols &&
          src.stride == src.cols)) {
      Backend::norm_add_rms_norm(x, src, w_src, w, eps, dst);
      return;
    }
    invalidate_q8();
    const Q8Activation q8 = q8_view(x.cols, int(x.rows));
    must(add_rms_norm_q8(f32(x), x.stride, f32(src), src.stride, f32(dst), dst.stride, x.rows, x.cols,
                         static_cast<const float*>(w.data), eps, q8, stream_, static_cast<const float*>(w_src.data)),
         "add_rms_norm_q8 (normed src)");
    set_q8(dst);
  }

  // Gemma 3's post-FFN norm and residual add in one launch, where rms_norm takes its int8 kernel.
  void norm_add(const Tensor& x, const Tensor& src, const WeightView& w_src, float eps) override {
    SLUICE_CHECK(src.cols == x.cols && src.rows == x.rows && w_src.type == quant::Type::kF32, "norm_add: shape mismatch");
    if (!(w_src.ne0 == x.cols && x.rows <= kMaxMmqTokens && x.cols % 32 == 0 && src.stride == src.cols)) {
      Backend::norm_add(x, src, w_src, eps);
      return;
    }
    invalidate_q8();
    must(cuda::norm_add(f32(x), x.stride, f32(src), src.stride, x.rows, x.cols, static_cast<const float*>(w_src.data),
                        eps, stream_),
         "norm_add");
  }

  // The Q and K head norms in one launch.
  void rms_norm_pair(const Tensor& a, const WeightView& wa, const Tensor& b, const WeightView& wb, float eps) override {
    SLUICE_CHECK(wa.type == quant::Type::kF32 && wb.type == quant::Type::kF32 && a.rows == b.rows,
                 "rms_norm_pair: shape mismatch");
    if (!(wa.ne0 > 0 && wb.ne0 > 0 && wa.ne0 <= 1024 && wb.ne0 <= 1024 && a.cols % wa.ne0 == 0 &&
          b.cols % wb.ne0 == 0)) {
      Backend::rms_norm_pair(a, wa, b, wb, eps);
      return;
    }
    invalidate_q8();
    must(cuda::rms_norm_pair(f32(a), a.stride, a.cols, static_cast<const float*>(wa.data), wa.ne0, f32(b), b.stride,
                             b.cols, static_cast<const float*>(wb.data), wb.ne0, a.rows, eps, stream_),
         "rms_norm_pair");
  }

  void rope_store_kv(const Tensor& q, const RopeParams& rq, const Tensor& k, const RopeParams& rk, const Tensor& v,
                     const Tensor& k_cache, const Tensor& v_cache, int pos0) override {
    if (!same_rope(rq, rk)) {
      Backend::rope_store_kv(q, rq, k, rk, v, k_cache, v_cache, pos0);
      return;
    }
    SLUICE_CHECK(int64_t(rq.n_head) * rq.head_dim == q.cols && int64_t(rk.n_head) * rk.head_dim == k.cols &&
                     k.rows == q.rows && v.rows == q.rows,
                 "rope_store_kv: shape mismatch");
    SLUICE_CHECK(k.dtype == DType::kF32 && v.dtype == DType::kF32 && k_cache.dtype == DType::kF16 &&
                     v_cache.dtype == DType::kF16 && k.cols == k_cache.cols && v.cols == v_cache.cols && pos0 >= 0 &&
                     pos0 + k.rows <= k_cache.rows && pos0 + v.rows <= v_cache.rows &&
                     k_cache.row_map == v_cache.row_map,
                 "rope_store_kv: out of range");
    invalidate_q8();
    if (!skips(kCudaRope)) {
      must(cuda::rope_store_kv(f32(q), q.stride, f32(k), k.stride, rk.n_head, f32(v), v.stride, v.cols, q.rows,
                               rope_args(rq), k_cache.data, k_cache.stride, v_cache.data, v_cache.stride, pos0,
                               stream_, step_pos_for(pos0), k_cache.row_map),
           "rope_store_kv");
    }
  }

  // The Q, K and V products with the rotation and the KV store in the direct GEMV's epilogue
  // (gemv.h, GemvRopeStore), where every product of the call takes it: 1 or 2 rows on the GEMV
  // path, the adjacent-pair rotation, dense rows, f16 caches. Otherwise (or when a diagnostic run
  // skips GEMVs or rope) the two steps; both give the same bits.
  void matmul_rope_store_kv(std::span<const WeightView, 3> w, const Tensor& x, std::span<const Tensor, 3> y,
                            const RopeParams& rq, const RopeParams& rk, const SeqRows& s) override {
    GemvRopeStore rs;
    if (!rope_epilogue_fits(w, x, y, rq, rk, s, rs)) {
      Backend::matmul_rope_store_kv(w, x, y, rq, rk, s);
      return;
    }
    const Q8Activation xq = q8_activation_of(x);
    auto matrix = [&](size_t j) { return GemvMatrix{w[j].data, w[j].ne1, f32(x), xq, f32(y[j])}; };
    // The call's launches (one per weight format: at most 3), each with its matrices' epilogue
    // kinds and caches (found by output), all checked before any is made.
    GemvGroupArgs groups[3];
    GemvRopeStore epi[3];
    int n = 0;
    bool takes = true;
    const std::span<const WeightView> ws(w.data(), w.size());
    format_groups(ws, int(x.rows), [](size_t) { return true; }, matrix, [&](const GemvGroupArgs& g) {
      GemvRopeStore& r = epi[n] = rs;
      for (int i = 0; i < g.n; ++i) {
        const int j = g.m[i].y == f32(y[0]) ? 0 : g.m[i].y == f32(y[1]) ? 1 : 2;
        r.kind[i] = j == 0 ? GemvRopeStore::kQ : j == 1 ? GemvRopeStore::kK : GemvRopeStore::kV;
        r.cache[i] = j == 0 ? nullptr : j == 1 ? s.k_cache.data : s.v_cache.data;
        r.cache_stride[i] = j == 0 ? 0 : j == 1 ? s.k_cache.stride : s.v_cache.stride;
      }
      GemvGroupArgs& c = groups[n++] = g;
      c.rope = &r;
      c.check_only = true;
      takes = takes && gemv_group(dev_, c, stream_).is_ok();
      c.check_only = false;
    });
    if (!takes) {
      Backend::matmul_rope_store_kv(w, x, y, rq, rk, s);
      return;
    }
    invalidate_q8();
    for (int i = 0; i < n; ++i) must(gemv_group(dev_, groups[i], stream_), "gemv (rope and KV store)");
  }
  // The shapes and switches matmul_rope_store_kv's fused path needs; rs gets the rotation and the
  // call's positions.
  bool rope_epilogue_fits(std::span<const WeightView, 3> w, const Tensor& x, std::span<const Tensor, 3> y,
                          const RopeParams& rq, const RopeParams& rk, const SeqRows& s, GemvRopeStore& rs) const {
    if (!qkv_rope_ || skips(kCudaGemv) || skips(kCudaRope) || !same_rope(rq, rk)) return false;
    if (x.dtype != DType::kF32 || x.rows < 1 || x.rows > 2 || x.rows >= mmq_from_ || !dense_rows(x) || x.cols % 32 != 0) {
      return false;
    }
    for (size_t i = 0; i < 3; ++i) {
      if (!gemv_needs_q8(w[i].type) || w[i].ne0 != x.cols || w[i].ne1 != y[i].cols || y[i].rows != x.rows ||
          y[i].dtype != DType::kF32 || !dense_rows(y[i])) {
        return false;
      }
    }
    const Tensor& kc = s.k_cache;
    const Tensor& vc = s.v_cache;
    if (s.row0 != 0 || s.n != x.rows || s.pos0 < 0 || kc.dtype != DType::kF16 || vc.dtype != DType::kF16 ||
        kc.cols != y[1].cols || vc.cols != y[2].cols || s.pos0 + s.n > kc.rows || s.pos0 + s.n > vc.rows ||
        kc.row_map != vc.row_map || int64_t(rq.n_head) * rq.head_dim != y[0].cols ||
        int64_t(rk.n_head) * rk.head_dim != y[1].cols) {
      return false;
    }
    if (!rope_store_epilogue(rope_args(rq), rs).is_ok()) return false;
    rs.pos0 = s.pos0;
    rs.pos_dev = step_pos_for(s.pos0);
    rs.row_map = kc.row_map;
    return true;
  }

  // Every sequence's rows in launches of up to kMaxRopeSeqs sequences (they share the layer's cache
  // pool). One sequence: rope_store_kv (a recorded decode step reads its position from the device).
  void rope_store_kv_seqs(const Tensor& q, const RopeParams& rq, const Tensor& k, const RopeParams& rk, const Tensor& v,
                          std::span<const SeqRows> seqs) override {
    if (seqs.size() <= 1 || !same_rope(rq, rk) || !one_pool(seqs)) {
      Backend::rope_store_kv_seqs(q, rq, k, rk, v, seqs);
      return;
    }
    const Tensor& kc = seqs[0].k_cache;
    const Tensor& vc = seqs[0].v_cache;
    SLUICE_CHECK(int64_t(rq.n_head) * rq.head_dim == q.cols && int64_t(rk.n_head) * rk.head_dim == k.cols &&
                     k.rows == q.rows && v.rows == q.rows,
                 "rope_store_kv_seqs: shape mismatch");
    SLUICE_CHECK(k.dtype == DType::kF32 && v.dtype == DType::kF32 && kc.dtype == DType::kF16 &&
                     vc.dtype == DType::kF16 && k.cols == kc.cols && v.cols == vc.cols,
                 "rope_store_kv_seqs: types or columns differ");
    invalidate_q8();
    std::vector<cuda::RopeSeq> chunk;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const SeqRows& sq = seqs[i];
      SLUICE_CHECK(sq.n >= 0 && sq.row0 >= 0 && sq.row0 + sq.n <= q.rows && sq.pos0 >= 0 &&
                       sq.pos0 + sq.n <= sq.k_cache.rows && sq.pos0 + sq.n <= sq.v_cache.rows,
                   "rope_store_kv_seqs: out of range");
      chunk.push_back({sq.row0, int(sq.n), sq.pos0, sq.k_cache.row_map});
      if (chunk.size() == size_t(cuda::kMaxRopeSeqs) || i + 1 == seqs.size()) {
        must(cuda::rope_store_kv_seqs(f32(q), q.stride, f32(k), k.stride, rk.n_head, f32(v), v.stride, v.cols,
                                      rope_args(rq), kc.data, kc.stride, vc.data, vc.stride, chunk, stream_),
             "rope_store_kv_seqs");
        chunk.clear();
      }
    }
  }

  void add_bias(const Tensor& y, const WeightView& b) override {
    SLUICE_CHECK(b.type == quant::Type::kF32 && b.ne0 == y.cols, "add_bias: shape mismatch");
    invalidate_q8();
    must(cuda::add_bias(f32(y), y.stride, y.rows, y.cols, static_cast<const float*>(b.data), stream_), "add_bias");
  }

  void add(const Tensor& dst, const Tensor& src) override {
    SLUICE_CHECK(dst.cols == src.cols && dst.rows == src.rows, "add: shape mismatch");
    invalidate_q8();
    must(cuda::add(f32(dst), dst.stride, f32(src), src.stride, dst.rows, dst.cols, stream_), "add");
  }

  void gather_rows(const Tensor& src, std::span<const int32_t> rows, const Tensor& dst) override {
    SLUICE_CHECK(src.cols == dst.cols && dst.rows == int64_t(rows.size()), "gather_rows: shape mismatch");
    invalidate_q8_if_overlaps(dst);
    must(cuda::gather_rows(f32(src), src.stride, src.rows, f32(dst), dst.stride, rows.data(), dst.rows, dst.cols,
                           stream_),
         "gather_rows");
  }

  void scatter_add_rows(const Tensor& dst, const Tensor& src, std::span<const int32_t> rows,
                        std::span<const float> scale) override {
    SLUICE_CHECK(src.cols == dst.cols && src.rows == int64_t(rows.size()) && rows.size() == scale.size(),
                 "scatter_add_rows: shape mismatch");
    invalidate_q8_if_overlaps(dst);
    must(cuda::scatter_add_rows(f32(dst), dst.stride, dst.rows, f32(src), src.stride, rows.data(), scale.data(),
                                src.rows, src.cols, stream_),
         "scatter_add_rows");
  }

  void add_rows_scaled(const Tensor& dst, int32_t row, const Tensor& src, std::span<const float> scale) override {
    SLUICE_CHECK(src.cols == dst.cols && src.rows == int64_t(scale.size()) && row >= 0 && row < dst.rows,
                 "add_rows_scaled: shape mismatch");
    const Tensor d = dst.row_range(row, 1);
    invalidate_q8_if_overlaps(d);
    must(cuda::add_rows_scaled(f32(d), f32(src), src.stride, scale.data(), src.rows, src.cols, stream_),
         "add_rows_scaled");
  }

  // Each weight on its own input. Decode of a mixture of experts: the inputs are rows of the one
  // tensor whose int8 activation the SwiGLU op just made, so every down projection of the layer's
  // experts reads its row of that activation, in one launch per weight format.
  void matmul_each(std::span<const WeightView> ws, std::span<const Tensor> xs, std::span<const Tensor> ys) override {
    SLUICE_CHECK(ws.size() == xs.size() && ws.size() == ys.size(), "matmul_each: weights, inputs and outputs differ in count");
    bool grouped = q8_of_ != nullptr && q8_stride_ == q8_cols_;
    for (size_t i = 0; grouped && i < ws.size(); ++i) {
      const int64_t off = static_cast<const float*>(xs[i].data) - static_cast<const float*>(q8_of_);
      grouped = xs[i].rows == 1 && xs[i].cols == q8_cols_ && xs[i].dtype == DType::kF32 && off >= 0 &&
                off % q8_cols_ == 0 && off / q8_cols_ < q8_rows_ && gemv_needs_q8(ws[i].type) &&
                ws[i].ne0 == xs[i].cols && ws[i].ne1 == ys[i].cols && ys[i].rows == 1 && ys[i].dtype == DType::kF32;
    }
    if (!grouped) {
      Backend::matmul_each(ws, xs, ys);
      return;
    }
    const Q8Activation all = q8_activation_view(q8_.ptr, q8_cols_, int(q8_rows_));
    gemv_grouped(ws, 1, [](size_t) { return true; }, [&](size_t j) {
      const int64_t r = (static_cast<const float*>(xs[j].data) - static_cast<const float*>(q8_of_)) / q8_cols_;
      Q8Activation row;
      row.q = all.q + r * q8_cols_;
      row.ds = all.ds + r * (q8_cols_ / 32);
      row.cols = q8_cols_;
      row.tokens = 1;
      return GemvMatrix{ws[j].data, ws[j].ne1, f32(xs[j]), row, f32(ys[j])};
    });
    for (const Tensor& y : ys) invalidate_q8_if_overlaps(y);
  }

  void swiglu(const Tensor& gate, const Tensor& up, const Tensor& dst) override { gated(gate, up, dst, false); }
  void geglu(const Tensor& gate, const Tensor& up, const Tensor& dst) override { gated(gate, up, dst, true); }

  // dst = act(gate) * up, act = silu (SwiGLU) or gelu_tanh (GeGLU).
  void gated(const Tensor& gate, const Tensor& up, const Tensor& dst, bool gelu) {
    const char* name = gelu ? "geglu" : "swiglu";
    SLUICE_CHECK(gate.cols == up.cols && gate.cols == dst.cols && gate.rows == up.rows && gate.rows == dst.rows,
                 std::string(name) + ": shape mismatch");
    invalidate_q8();
    if (dst.rows <= kMaxMmqTokens && dst.cols % 32 == 0 && dst.stride == dst.cols) {
      // Decode: the product feeds the down projection; make its int8 activation here.
      const Q8Activation q8 = q8_view(dst.cols, int(dst.rows));
      if (!skips(kCudaGlu)) {
        must((gelu ? geglu_q8 : swiglu_q8)(f32(gate), gate.stride, f32(up), up.stride, f32(dst), dst.stride, dst.rows,
                                           dst.cols, q8, stream_),
             gelu ? "geglu_q8" : "swiglu_q8");
      }
      set_q8(dst);
      return;
    }
    must((gelu ? cuda::geglu : cuda::swiglu)(f32(gate), gate.stride, f32(up), up.stride, f32(dst), dst.stride, dst.rows,
                                             dst.cols, stream_),
         name);
  }

  void scale(const Tensor& x, float s) override {
    invalidate_q8_if_overlaps(x);
    must(cuda::scale(f32(x), x.stride, x.rows, x.cols, s, stream_), "scale");
  }

  void rope(const Tensor& x, const RopeParams& p, int pos0) override {
    SLUICE_CHECK(int64_t(p.n_head) * p.head_dim == x.cols, "rope: n_head * head_dim != cols");
    invalidate_q8();
    must(cuda::rope(f32(x), x.stride, x.rows, rope_args(p), pos0, stream_, step_pos_for(pos0)), "rope");
  }

  void store_rows(const Tensor& src, const Tensor& cache, int64_t pos0) override {
    SLUICE_CHECK(src.dtype == DType::kF32 && cache.dtype == DType::kF16 && src.cols == cache.cols && pos0 >= 0 &&
                     pos0 + src.rows <= cache.rows,
                 "store_rows: out of range");
    must(store_rows_f16(f32(src), src.stride, src.rows, src.cols, cache.data, cache.stride, pos0, stream_,
                        step_pos_for(pos0), cache.row_map),
         "store_rows");
  }

  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                 const AttentionParams& p) override {
    SLUICE_CHECK(k_cache.dtype == DType::kF16 && v_cache.dtype == DType::kF16, "attention: caches must be f16");
    invalidate_q8();
    SLUICE_CHECK(p.pos0 + q.rows <= k_cache.rows, "attention: positions beyond the cache");
    SLUICE_CHECK(k_cache.row_map == v_cache.row_map, "attention: k and v caches differ in paging");
    AttentionArgs a = attention_args(q, k_cache, v_cache, out, p);
    a.n_tokens = int(q.rows);
    a.pos0 = p.pos0;
    a.row_map = k_cache.row_map;
    // Decode plans its key splits for the end of the position bucket (capped by the cache), in
    // and out of recorded steps alike, so both give the same results.
    a.plan_ctx = int(std::min<int64_t>((int64_t(p.pos0) + q.rows + kStepBucket - 1) / kStepBucket * kStepBucket,
                                       k_cache.rows));
    a.pos_dev = step_pos_for(p.pos0);
    const int64_t need = attention_workspace_bytes(a.n_tokens, p.n_head, p.head_dim, int(k_cache.rows));
    void* ws = grow(attn_ws_, need);
    // Decode: the combine pass also writes the output's int8 activation for the output projection.
    const bool q8 = attention_writes_q8(a) && out.stride == out.cols;
    if (q8) {
      const Q8Activation xq = q8_view(out.cols, int(out.rows));
      a.out_q = xq.q;
      a.out_ds = xq.ds;
    }
    if (!skips(kCudaAttention)) must(cuda::attention(a, ws, attn_ws_.bytes, dev_.sm_count, stream_), "attention");
    if (q8) set_q8(out);
  }

  // The decode rows (one token) of every sequence in launches of up to kMaxAttentionSeqRows
  // sequences, each row over its own sequence's keys; longer rows (prompt chunks) one call each.
  void attention_seqs(const Tensor& q, const Tensor& out, const AttentionParams& p,
                      std::span<const SeqRows> seqs) override {
    if (seqs.size() <= 1 || !one_pool(seqs)) {
      Backend::attention_seqs(q, out, p, seqs);
      return;
    }
    const Tensor& kc = seqs[0].k_cache;
    const Tensor& vc = seqs[0].v_cache;
    SLUICE_CHECK(kc.dtype == DType::kF16 && vc.dtype == DType::kF16, "attention: caches must be f16");
    invalidate_q8();
    std::vector<AttentionSeqRow>& rows = seq_rows_;
    rows.clear();
    for (const SeqRows& sq : seqs) {
      SLUICE_CHECK(sq.n >= 0 && sq.row0 >= 0 && sq.row0 + sq.n <= q.rows && sq.row0 + sq.n <= out.rows &&
                       sq.pos0 >= 0 && sq.pos0 + sq.n <= sq.k_cache.rows,
                   "attention_seqs: out of range");
      if (sq.n == 1) {
        rows.push_back({sq.row0, sq.pos0, sq.k_cache.row_map});
      } else if (sq.n > 1) {
        Backend::attention_seqs(q, out, p, {&sq, 1});
      }
    }
    // Every row a decode row, rows 0, 1, ... in one launch: the combine also writes the output's
    // int8 activation for the output projection.
    bool dense = rows.size() == size_t(out.rows) && rows.size() <= size_t(kMaxAttentionSeqRows) &&
                 out.stride == out.cols;
    for (size_t t = 0; t < rows.size() && dense; ++t) dense = rows[t].row == int64_t(t);
    for (size_t t0 = 0; t0 < rows.size(); t0 += size_t(kMaxAttentionSeqRows)) {
      const int n = int(std::min(rows.size() - t0, size_t(kMaxAttentionSeqRows)));
      AttentionArgs a = attention_args(q, kc, vc, out, p);
      a.n_tokens = n;
      a.seq_rows = rows.data() + t0;
      int positions = 1;
      for (int t = 0; t < n; ++t) positions = std::max(positions, a.seq_rows[t].pos + 1);
      void* ws = grow(attn_ws_, attention_seq_workspace_bytes(n, p.n_head, p.head_dim, positions));
      if (dense) {
        const Q8Activation xq = q8_view(out.cols, int(out.rows));
        a.out_q = xq.q;
        a.out_ds = xq.ds;
      }
      if (!skips(kCudaAttention)) must(cuda::attention(a, ws, attn_ws_.bytes, dev_.sm_count, stream_), "attention_seqs");
    }
    if (dense) set_q8(out);
  }

 private:
  static float* f32(const Tensor& t) { return static_cast<float*>(t.data); }
  // The tensors and head shape of an attention call (rows, positions and paging: the caller's).
  static AttentionArgs attention_args(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                                      const AttentionParams& p) {
    AttentionArgs a;
    a.q = f32(q);
    a.q_stride = q.stride;
    a.k_cache = k_cache.data;
    a.k_stride = k_cache.stride;
    a.v_cache = v_cache.data;
    a.v_stride = v_cache.stride;
    a.out = f32(out);
    a.out_stride = out.stride;
    a.n_head = p.n_head;
    a.n_head_kv = p.n_head_kv;
    a.head_dim = p.head_dim;
    a.scale = p.scale;
    a.window = p.window;
    return a;
  }
  static bool same_rope(const RopeParams& rq, const RopeParams& rk) {
    return rq.mode == rk.mode && rq.head_dim == rk.head_dim && rq.n_rot == rk.n_rot && rq.freq_base == rk.freq_base &&
           rq.freq_scale == rk.freq_scale && rq.freq_factors.data == rk.freq_factors.data;
  }
  // The sequences' caches are views of one K and one V tensor (a layer's pool), K and V paged alike.
  static bool one_pool(std::span<const SeqRows> seqs) {
    for (const SeqRows& sq : seqs) {
      if (sq.k_cache.data != seqs[0].k_cache.data || sq.v_cache.data != seqs[0].v_cache.data ||
          sq.k_cache.stride != seqs[0].k_cache.stride || sq.v_cache.stride != seqs[0].v_cache.stride ||
          sq.k_cache.row_map != sq.v_cache.row_map) {
        return false;
      }
    }
    return true;
  }

  static uint64_t step_key(uint64_t key, int pos) {
    return key * 0x9E3779B97F4A7C15ull ^ uint64_t(pos / kStepBucket);
  }
  // Positions read by a recorded step: copied from pinned memory on the compute stream, ordered
  // before the step's kernels. The host waits for the previous copy before rewriting the value.
  void set_step_pos(int pos) {
    must(init_step_pos(), "step position");
    SLUICE_CUDA_CHECK(cudaEventSynchronize(pos_copied_));
    *pos_host_ = pos;
    SLUICE_CUDA_CHECK(cudaMemcpyAsync(pos_dev_, pos_host_, sizeof(int), cudaMemcpyHostToDevice, stream_));
    SLUICE_CUDA_CHECK(cudaEventRecord(pos_copied_, stream_));
  }
  // The device position for an op at host position pos0 inside a recorded step (else nullptr).
  const int* step_pos_for(int64_t pos0) const {
    if (!capturing_) return nullptr;
    SLUICE_CHECK(pos0 == step_pos_, "a recorded step's ops must use the step's position");
    return static_cast<const int*>(pos_dev_);
  }
  // Rows `cols` apart (one row is dense whatever its stride).
  static bool dense_rows(const Tensor& t) { return t.rows == 1 || t.stride == t.cols; }
  static RopeArgs rope_args(const RopeParams& p) {
    RopeArgs a;
    a.neox = p.mode == RopeMode::kNeox;
    a.n_head = p.n_head;
    a.head_dim = p.head_dim;
    a.n_rot = p.n_rot;
    a.freq_base = p.freq_base;
    a.freq_scale = p.freq_scale;
    a.freq_factors = p.freq_factors.empty() ? nullptr : static_cast<const float*>(p.freq_factors.data);
    return a;
  }

  // Marks are events in a ring, recycled after kMarkRing newer marks: a pipeline looks a few
  // layers back at most, so a recycled mark is one that passed long ago.
  static constexpr uint64_t kMarkRing = 1024;

  void ensure_copy_stream() {
    if (copy_stream_) return;
    SLUICE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    marks_.resize(kMarkRing);
    for (auto& e : marks_) SLUICE_CUDA_CHECK(cudaEventCreate(&e));  // timed: seconds_between
  }

  Mark record_mark(cudaStream_t s) {
    ensure_copy_stream();
    const Mark m = next_mark_++;
    SLUICE_CUDA_CHECK(cudaEventRecord(marks_[m % kMarkRing], s));
    return m;
  }

  void wait_mark(cudaStream_t s, Mark m) {
    if (m + kMarkRing <= next_mark_) return;
    SLUICE_CUDA_CHECK(cudaStreamWaitEvent(s, marks_[m % kMarkRing], 0));
  }

  // The step position's device int, its pinned source and their event (once).
  Status init_step_pos() {
    if (pos_dev_) return Status::ok();
    SLUICE_ASSIGN_OR_RETURN(pos_dev_, device_alloc(sizeof(int)));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&pos_host_), sizeof(int), cudaHostAllocDefault));
    host_allocs_.push_back(pos_host_);
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&pos_copied_, cudaEventDisableTiming));
    return Status::ok();
  }

  Result<void*> device_alloc(int64_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, size_t(std::max<int64_t>(bytes, 1)));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return out_of_memory("cuda backend: cannot allocate " + std::to_string(bytes) + " bytes of GPU memory (" +
                           cudaGetErrorString(e) + ")");
    }
    device_allocs_.push_back(p);
    allocated_ += std::max<int64_t>(bytes, 1);
    return p;
  }

  // The int8 activation in q8_ and the tensor it was made from: the fused decode ops (norm, swiglu)
  // and the first matmul of a tensor make it, later matmuls of the same tensor reuse it. Every
  // op that writes a tensor invalidates it (the ops know nothing of which tensor they overwrite
  // beyond their own outputs, so the simple rule: any op but a matmul).
  Q8Activation q8_view(int64_t cols, int rows) {
    return q8_activation_view(grow(q8_, q8_activation_bytes(cols, rows)), cols, rows);
  }
  void set_q8(const Tensor& t) {
    q8_of_ = t.data;
    q8_rows_ = t.rows;
    q8_cols_ = t.cols;
    q8_stride_ = t.stride;
  }
  void invalidate_q8() { q8_of_ = nullptr; }
  // Invalidates only when `written` shares memory with the tensor the int8 activation was made
  // from (the row ops of mixtures of experts write the residual and scratch rows, never the normed
  // input the next expert's GEMVs read again).
  void invalidate_q8_if_overlaps(const Tensor& written) {
    if (!q8_of_ || written.rows == 0) return;
    const auto* a0 = static_cast<const uint8_t*>(written.data);
    const auto* a1 = a0 + ((written.rows - 1) * written.stride + written.cols) * 4;
    const auto* b0 = static_cast<const uint8_t*>(q8_of_);
    const auto* b1 = b0 + ((q8_rows_ - 1) * q8_stride_ + q8_cols_) * 4;
    if (a0 < b1 && b0 < a1) invalidate_q8();
  }
  bool q8_valid_for(const Tensor& t) const {
    return q8_of_ != nullptr && q8_of_ == t.data && q8_rows_ == t.rows && q8_cols_ == t.cols;
  }

  // Scratch of at least `bytes`, grown (never shrunk) as calls need; see Scratch.
  void* grow(Scratch& s, int64_t bytes) {
    must(resize(s, bytes, std::max<int64_t>(bytes, s.bytes + s.bytes / 2)), "scratch");
    return s.ptr;
  }
  // `s` at least `bytes` long: a new buffer of `want` (>= bytes) where it is shorter.
  Status resize(Scratch& s, int64_t bytes, int64_t want) {
    if (bytes <= s.bytes) return Status::ok();
    SLUICE_ASSIGN_OR_RETURN(s.ptr, device_alloc(want));
    s.bytes = want;
    return Status::ok();
  }

  // The GEMVs of the weights `eligible(i)` accepts, those of one format together (kMaxGemvMatrices
  // per launch), matrix(i) describing each; no allocation on this per-token path.
  template <class Eligible, class Matrix>
  void gemv_grouped(std::span<const WeightView> ws, int tokens, Eligible&& eligible, Matrix&& matrix) {
    format_groups(ws, tokens, eligible, matrix, [&](const GemvGroupArgs& g) {
      if (!skips(kCudaGemv)) must(gemv_group(dev_, g, stream_), "gemv");
    });
  }
  static bool same_layout(const WeightView& a, const WeightView& b) { return a.type == b.type && a.grouped == b.grouped; }
  // Calls launch(g) for the weights `eligible(i)` accepts, those of one format together
  // (kMaxGemvMatrices per call), matrix(i) describing each.
  template <class Eligible, class Matrix, class Launch>
  void format_groups(std::span<const WeightView> ws, int tokens, Eligible&& eligible, Matrix&& matrix, Launch&& launch) {
    for (size_t i = 0; i < ws.size(); ++i) {
      if (!eligible(i)) continue;
      bool first = true;  // the format's first eligible weight launches all of that format
      for (size_t j = 0; j < i && first; ++j) first = !(eligible(j) && same_layout(ws[j], ws[i]));
      if (!first) continue;
      GemvGroupArgs g;
      g.type = ws[i].type;
      g.grouped = ws[i].grouped;
      g.cols = ws[i].ne0;
      g.tokens = tokens;
      for (size_t j = i; j < ws.size(); ++j) {
        if (!eligible(j) || !same_layout(ws[j], ws[i])) continue;
        if (g.n == kMaxGemvMatrices) {
          launch(g);
          g.n = 0;
        }
        g.m[g.n++] = matrix(j);
      }
      launch(g);
    }
  }

  // x.rows in [mmq_from_, kMaxMmqTokens]: int8 tensor-core products on the quantized weights
  // (mmq.h) where every weight's format has a kernel and the rows are dense; false (nothing
  // done) otherwise, and the caller takes the dequantize + cuBLAS path.
  bool mmq_all(std::span<const WeightView> ws, const Tensor& x, std::span<const Tensor> ys) {
    if (x.rows > kMaxMmqTokens || !dense_rows(x) || x.cols % 32 != 0) return false;
    for (size_t i = 0; i < ws.size(); ++i) {
      if (!mmq_supported(ws[i].type, ws[i].ne0) || !dense_rows(ys[i]) ||
          reinterpret_cast<uintptr_t>(ws[i].data) % 16 != 0) {
        return false;
      }
    }
    const Q8Activation xq = q8_activation_of(x);
    format_groups(ws, int(x.rows), [](size_t) { return true; },
                  [&](size_t j) { return GemvMatrix{ws[j].data, ws[j].ne1, f32(x), xq, f32(ys[j])}; },
                  [&](const GemvGroupArgs& g) {
                    MmqScratch s = mmq_scratch_needed(dev_, g);
                    if (s.partial_bytes > 0) s.partials = grow(mmq_partials_, s.partial_bytes);
                    if (s.counters_n > 0) s.counters = mmq_counters(s.counters_n);
                    must(mmq(dev_, g, s, stream_), "mmq");
                  });
    return true;
  }
  // The int8 activation of dense x: the one the op that wrote x made, else quantized now.
  Q8Activation q8_activation_of(const Tensor& x) {
    if (q8_valid_for(x)) return q8_activation_view(q8_.ptr, x.cols, int(x.rows));
    const Q8Activation xq = q8_view(x.cols, int(x.rows));
    must(quantize_activation_q8(f32(x), xq, stream_), "quantize_activation_q8");
    set_q8(x);
    return xq;
  }
  // At least n arrival counters for mmq's column splits, zero (every launch leaves them zero).
  int* mmq_counters(int64_t n) {
    const int64_t bytes = n * int64_t(sizeof(int));
    must(zeroed_counters(bytes, std::max<int64_t>(bytes, mmq_counters_.bytes + mmq_counters_.bytes / 2)), "mmq counters");
    return static_cast<int*>(mmq_counters_.ptr);
  }
  // mmq_counters_ at least `bytes` long (a new buffer of `want` where it is shorter), all zero.
  Status zeroed_counters(int64_t bytes, int64_t want) {
    if (bytes <= mmq_counters_.bytes) return Status::ok();
    SLUICE_RETURN_IF_ERROR(resize(mmq_counters_, bytes, want));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(mmq_counters_.ptr, 0, size_t(mmq_counters_.bytes), stream_));
    return Status::ok();
  }

  void gemv_all(std::span<const WeightView> ws, const Tensor& x, std::span<const Tensor> ys) {
    // The gemv reads tokens `cols` apart; model/ tensors are dense, row views keep that.
    const bool dense = dense_rows(x);
    bool need_q8 = false;
    for (const WeightView& w : ws) need_q8 |= gemv_needs_q8(w.type);
    Q8Activation xq;
    if (need_q8 && dense) {
      SLUICE_CHECK(x.cols % 32 == 0, "matmul: quantized weights need cols % 32 == 0");
      xq = q8_activation_of(x);
    }
    // Matrices of one format with dense outputs go out as one launch (Q/K/V, gate/up).
    for (const WeightView& w : ws) SLUICE_CHECK(gemv_supported(w.type), "matmul: no CUDA kernel for this weight format");
    auto grouped = [&](size_t i) { return dense && dense_rows(ys[i]); };
    gemv_grouped(ws, int(x.rows), grouped,
                 [&](size_t j) { return GemvMatrix{ws[j].data, ws[j].ne1, f32(x), xq, f32(ys[j])}; });
    for (size_t i = 0; i < ws.size(); ++i) {
      if (grouped(i)) continue;
      const WeightView& w = ws[i];
      const Tensor& y = ys[i];
      // Strided rows (not produced by model/ today): one token at a time.
      for (int64_t t = 0; t < x.rows; ++t) {
        const Tensor xt = x.row_range(t, 1), yt = y.row_range(t, 1);
        GemvArgs a;
        a.type = w.type;
        a.grouped = w.grouped;
        a.w = w.data;
        a.rows = w.ne1;
        a.cols = w.ne0;
        a.tokens = 1;
        a.x = f32(xt);
        if (gemv_needs_q8(w.type)) {
          invalidate_q8();
          a.xq = q8_view(x.cols, 1);
          must(quantize_activation_q8(f32(xt), a.xq, stream_), "quantize_activation_q8");
        }
        a.y = f32(yt);
        if (!skips(kCudaGemv)) must(gemv(dev_, a, stream_), "gemv");
      }
    }
  }

  // y = x W^T for many tokens: W dequantized to f16 a chunk of rows at a time, x converted to f16
  // once, cuBLAS multiplies on tensor cores with f32 accumulation into y.
  //   column-major view: W chunk is k x m (lda = k), X is k x n (ldb = k), Y is m x n (ldc = stride)
  void gemm_all(std::span<const WeightView> ws, const Tensor& x, std::span<const Tensor> ys) {
    const int64_t k = x.cols, n = x.rows;
    void* xh = grow(x_f16_, k * n * 2);
    must(f32_to_f16(f32(x), x.stride, xh, k, n, k, stream_), "f32_to_f16");
    const float alpha = 1.0f, beta = 0.0f;
    for (size_t i = 0; i < ws.size(); ++i) {
      const WeightView& w = ws[i];
      SLUICE_CHECK(dequantize_supported(w.type), "matmul: no CUDA dequantizer for this weight format");
      const int64_t m = w.ne1;
      const int64_t chunk = std::clamp<int64_t>(kGemmChunkBytes / (2 * k) / 64 * 64, 64, m);
      void* wh = grow(w_f16_, chunk * k * 2);
      const int64_t rb = w.row_bytes();
      for (int64_t r0 = 0; r0 < m; r0 += chunk) {
        const int64_t rows = std::min(chunk, m - r0);
        must(dequantize_to_f16(w.type, static_cast<const uint8_t*>(w.data) + r0 * rb, rows, k, wh, stream_, w.grouped),
             "dequantize_to_f16");
        SLUICE_CUBLAS_CHECK(blas_, blas_.gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n), int(k), &alpha, wh,
                                         CUDA_R_16F, int(k), xh, CUDA_R_16F, int(k), &beta, f32(ys[i]) + r0,
                                         CUDA_R_32F, int(ys[i].stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
    }
  }

  // CudaOptions::skip_kernels (a diagnostic run): whether launches of kind k are left out.
  bool skips(uint32_t k) const { return (skip_kernels_ & k) != 0; }

  DeviceInfo dev_;
  bool graphs_ = false;
  uint32_t skip_kernels_ = 0;
  int mmq_from_ = kMmqFromTokens;  // fewest tokens that take mmq
  bool qkv_rope_ = true;           // matmul_rope_store_kv: the GEMV's rope-and-store epilogue
  cudaStream_t stream_ = nullptr;
  CublasApi blas_;
  cublasHandle_t cublas_ = nullptr;
  std::vector<void*> device_allocs_;  // every cudaMalloc, freed at destruction
  int64_t allocated_ = 0;             // their bytes
  Scratch q8_, x_f16_, w_f16_, attn_ws_, mmq_partials_, mmq_counters_;
  std::vector<AttentionSeqRow> seq_rows_;  // attention_seqs: the decode rows of a pass
  const void* q8_of_ = nullptr;  // see q8_view
  int64_t q8_rows_ = 0, q8_cols_ = 0, q8_stride_ = 0;
  void* staging_ = nullptr;  // pinned host rows for get_rows
  int64_t staging_bytes_ = 0;
  cudaEvent_t staging_free_ = nullptr;
  bool capturing_ = false;
  cudaGraphExec_t exec_ = nullptr;
  int64_t graph_launches_ = 0;
  uint64_t exec_key_ = 0, pending_key_ = 0;  // the recorded step's key (step_key)
  int step_pos_ = 0;                         // the position of the step being recorded
  void* pos_dev_ = nullptr;                  // device int: the replayed step's position
  int* pos_host_ = nullptr;                  // pinned source of its copy
  cudaEvent_t pos_copied_ = nullptr;
  // Streaming.
  cudaStream_t copy_stream_ = nullptr;
  std::vector<cudaEvent_t> marks_;  // ring of kMarkRing events
  Mark next_mark_ = 1;              // 0 is the always-passed mark
  std::vector<void*> host_allocs_;  // pinned staging, freed at destruction
  // upload()'s ring of pinned buffers, each reused once the transfer out of it has run (allocated
  // at the first upload; empty with uploads_failed_ when pinning failed: uploads then wait).
  struct UploadBuffer {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
  };
  static constexpr size_t kUploadBuffers = 16, kUploadBytes = size_t(1) << 20;
  std::vector<UploadBuffer> uploads_;
  size_t upload_next_ = 0;
  bool uploads_failed_ = false;
  UploadBuffer* next_upload_buffer() {
    if (uploads_.empty() && !uploads_failed_) {
      uploads_.resize(kUploadBuffers);
      for (UploadBuffer& b : uploads_) {
        if (cudaHostAlloc(&b.host, kUploadBytes, cudaHostAllocDefault) != cudaSuccess ||
            cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming) != cudaSuccess) {
          (void)cudaGetLastError();
          uploads_failed_ = true;
        }
      }
    }
    if (uploads_failed_) return nullptr;
    UploadBuffer& b = uploads_[upload_next_++ % kUploadBuffers];
    SLUICE_CUDA_CHECK(cudaEventSynchronize(b.done));  // its last transfer has run (never recorded: at once)
    return &b;
  }
};

}  // namespace
}  // namespace cuda

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

uint64_t cuda_scratch_bytes(const ScratchShape& shape) {
  cuda::DeviceInfo dev;  // sm_count 0: sized for any GPU
  if (cuda_device_count() > 0) {
    if (auto d = cuda::query_device(0); d.is_ok()) dev = *d;
  }
  const cuda::ScratchSizes z = cuda::scratch_sizes(shape, dev);
  // cudaMalloc rounds large buffers up to 2 MiB pages.
  constexpr uint64_t kPage = uint64_t(2) << 20;
  uint64_t total = 0;
  for (const int64_t b : {z.q8, z.x_f16, z.w_f16, z.attn, z.mmq_partials, z.mmq_counter_bytes}) {
    if (b > 0) total += (uint64_t(b) + kPage - 1) / kPage * kPage;
  }
  return total;
}

namespace {

// Everything a bandwidth measurement allocates, released on every path out.
struct ProbeResources {
  void* dev_a = nullptr;
  void* dev_b = nullptr;
  void* host = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<cudaEvent_t> marks;
  ~ProbeResources() {
    if (stream) cudaStreamSynchronize(stream);
    for (cudaEvent_t e : marks) cudaEventDestroy(e);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
    if (host) cudaFreeHost(host);
    cudaFree(dev_a);
    cudaFree(dev_b);
    // A failed probe (e.g. out of memory under a VRAM budget) must not leave its error for the
    // next launch check of the model's kernels to report.
    (void)cudaGetLastError();
  }
};

// Median bytes/s of `reps` timed runs of `op` (which moves `bytes`), after one warm-up.
template <class Op>
Result<double> time_median(ProbeResources& r, double bytes, int reps, Op op) {
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.start));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.stop));
  std::vector<double> rates;
  for (int i = 0; i <= reps; ++i) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.start, r.stream));
    SLUICE_CUDA_RETURN_IF_ERROR(op());
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.stop, r.stream));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(r.stop));
    float ms = 0;
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, r.start, r.stop));
    if (i > 0) rates.push_back(bytes / (double(ms) * 1e-3));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

Result<double> cuda_copy_bandwidth(int device) {
  if (device < 0 || device >= cuda_device_count()) return unsupported("no CUDA device " + std::to_string(device));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  const size_t bytes = size_t(1) << 30;  // 1 GiB each way: far beyond any L2
  ProbeResources r;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMalloc(&r.dev_a, bytes));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMalloc(&r.dev_b, bytes));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&r.stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemset(r.dev_a, 1, bytes));
  return time_median(r, 2.0 * double(bytes), 9,
                     [&] { return cudaMemcpyAsync(r.dev_b, r.dev_a, bytes, cudaMemcpyDeviceToDevice, r.stream); });
}

Result<double> cuda_h2d_bandwidth(int device) {
  if (device < 0 || device >= cuda_device_count()) return unsupported("no CUDA device " + std::to_string(device));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  const size_t bytes = size_t(256) << 20;
  ProbeResources r;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&r.host, bytes, cudaHostAllocDefault));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMalloc(&r.dev_a, bytes));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&r.stream));
  std::memset(r.host, 1, bytes);
  return time_median(r, double(bytes), 7,
                     [&] { return cudaMemcpyAsync(r.dev_a, r.host, bytes, cudaMemcpyHostToDevice, r.stream); });
}

Result<double> cuda_h2d_bandwidth_during(int device, uint64_t bytes, const std::function<void()>& during) {
  if (device < 0 || device >= cuda_device_count()) return unsupported("no CUDA device " + std::to_string(device));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  const size_t chunk = size_t(64) << 20;
  const int n = int(std::max<uint64_t>(1, (bytes + chunk - 1) / chunk));
  // The copies read a source larger than any last-level cache, chunk after chunk, as a token's
  // copies read every streamed layer once; one 64 MiB chunk copied over and over could be served
  // from a large last-level cache and leave DRAM to the CPU.
  const int n_src = std::min(n, 8);  // 512 MiB
  ProbeResources r;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&r.host, chunk * size_t(n_src), cudaHostAllocDefault));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMalloc(&r.dev_a, chunk));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&r.stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.start));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.stop));
  r.marks.assign(size_t(n), nullptr);
  for (cudaEvent_t& e : r.marks) SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  std::memset(r.host, 1, chunk * size_t(n_src));
  // Warm the path, then queue every copy before the host work starts: the copy engine runs
  // them back to back while `during` reads DRAM, each chunk followed by its mark.
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.dev_a, r.host, chunk, cudaMemcpyHostToDevice, r.stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.start, r.stream));
  for (int i = 0; i < n; ++i) {
    const char* src = static_cast<const char*>(r.host) + size_t(i % n_src) * chunk;
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.dev_a, src, chunk, cudaMemcpyHostToDevice, r.stream));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.marks[size_t(i)], r.stream));
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.stop, r.stream));
  during();
  // The rate while `during` ran: over the chunks done by the time it returned (the copies are
  // sized to outlast it; the rest then runs against an idle DRAM and is not counted).
  int done = 0;
  while (done < n) {
    const cudaError_t q = cudaEventQuery(r.marks[size_t(done)]);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();
      break;
    }
    SLUICE_CUDA_RETURN_IF_ERROR(q);
    ++done;
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(r.stop));
  float ms = 0;
  if (done >= 2) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, r.start, r.marks[size_t(done - 1)]));
    return double(chunk) * done / (double(ms) * 1e-3);
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, r.start, r.stop));  // `during` was shorter than two chunks
  return double(chunk) * n / (double(ms) * 1e-3);
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaOptions& opts) {
  const int n = cuda_device_count();
  if (n == 0) return unsupported("no CUDA device found");
  if (opts.device < 0 || opts.device >= n) {
    return invalid_argument("CUDA device " + std::to_string(opts.device) + " does not exist (" + std::to_string(n) +
                            " found)");
  }
  SLUICE_ASSIGN_OR_RETURN(cuda::DeviceInfo dev, cuda::query_device(opts.device));
  auto be = std::make_unique<cuda::CudaBackend>(dev, opts.graphs, opts.skip_kernels);
  SLUICE_RETURN_IF_ERROR(be->init());
  return std::unique_ptr<Backend>(std::move(be));
}

}  // namespace sluice::backend
