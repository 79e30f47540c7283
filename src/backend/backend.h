// The narrow interface between model/ (the layer loop) and the devices that execute it. Model code
// sees only this header: it hands the backend weight views and activation tensors, never device
// pointers it dereferences itself.
//
// Weights arrive as WeightView {type, shape, data}: the pointer may be the mmapped file, a staging
// slot that stream/ has just filled, or device memory; the backend neither knows nor cares.
// Activations and caches live in Tensors the backend allocated (host memory on CPU, device memory
// on CUDA); model code moves data in and out only through upload/download.
//
// Ops are issued in order and may run asynchronously; download() and sync() are the only points
// where the host waits for them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "core/status.h"
#include "quant/quant.h"

namespace sluice::backend {

// A row-major 2-D weight: ne1 rows of ne0 elements in one quant format (ne0 first, as in GGUF).
// 1-D weights (norms, biases, rope factors) have ne1 == 1.
struct WeightView {
  quant::Type type = quant::Type::kF32;
  int64_t ne0 = 0;              // elements per row (the input dimension of a matmul)
  int64_t ne1 = 1;              // rows (the output dimension of a matmul)
  const void* data = nullptr;   // ne1 * row_bytes() bytes
  // The backend's row-interleaved layout (quant::Kernels::pack_rows; ne1 / packed_rows groups of
  // packed_bytes(ne0)), made by the CPU backend's upload_weight. Only matmul reads packed views.
  bool packed = false;
  // The CUDA backend's grouped Q6_K / Q8_0 layout (backend/cuda/layout.h: each run of 8 blocks
  // of a row stored field by field, same size, rows row_bytes() apart), made by its
  // upload_weight. Only the CUDA backend's kernels read grouped views.
  bool grouped = false;
  int64_t row_bytes() const { return quant::row_bytes(type, ne0); }
  bool empty() const { return data == nullptr; }
  // Rows [first, first + n) as a matrix of their own (one expert of a stacked expert tensor). A
  // packed view is cut at whole groups: first and n must be multiples of the format's packed_rows.
  WeightView rows(int64_t first, int64_t n) const {
    SLUICE_CHECK(first >= 0 && n >= 0 && first + n <= ne1, "weight rows outside the matrix");
    int64_t offset = first * row_bytes();
    if (packed) {
      const quant::Kernels& k = quant::kernels(type);
      SLUICE_CHECK(k.packed_rows > 0 && first % k.packed_rows == 0 && n % k.packed_rows == 0,
                   "packed weight cut inside a row group");
      offset = first / k.packed_rows * k.packed_bytes(ne0);
    }
    return {type, ne0, n, static_cast<const uint8_t*>(data) + offset, packed, grouped};
  }
};

enum class DType { kF32, kF16, kI32 };  // kI32: index tensors (KV row maps)
inline int64_t dtype_bytes(DType t) { return t == DType::kF16 ? 2 : 4; }

// A backend-owned 2-D buffer: `rows` rows of `cols` elements, row starts `stride` elements apart.
// For activations a row is one token. `data` is opaque to model code (device memory on GPUs).
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t cols = 0;
  int64_t rows = 0;
  int64_t stride = 0;  // elements between consecutive row starts (>= cols)
  // A paged KV cache (model/kv_cache.h): logical row r of this view is physical row row_map[r] of
  // `data`. The map is an I32 tensor's memory on the same backend, with `rows` entries. Only the
  // KV ops read such views (store_rows, rope_store_kv, attention); nullptr: row r is row r.
  const int32_t* row_map = nullptr;

  // Rows [first, first + n) as a view into the same memory.
  Tensor row_range(int64_t first, int64_t n) const {
    SLUICE_CHECK(first >= 0 && n >= 0 && first + n <= rows, "row range outside tensor");
    SLUICE_CHECK(row_map == nullptr, "row range of a paged tensor");
    return {static_cast<uint8_t*>(data) + first * stride * dtype_bytes(dtype), dtype, cols, n, stride};
  }
  // The first `n` rows (a batch smaller than the allocation).
  Tensor first_rows(int64_t n) const { return row_range(0, n); }
};

// GELU with the tanh approximation, in f32: the definition every backend's geglu is tested
// against (GPT-2's and Gemma's activation; llama.cpp's ggml_gelu).
inline float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoef = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoef * x * x)));
}

enum class RopeMode {
  kNormal,  // rotates adjacent pairs (x[2i], x[2i+1]): Llama, Mistral
  kNeox,    // rotates halves (x[i], x[i + n_rot/2]): Qwen2, Qwen3
};

struct RopeParams {
  RopeMode mode = RopeMode::kNormal;
  int n_head = 0;           // heads in each row of x (row = n_head * head_dim)
  int head_dim = 0;
  int n_rot = 0;            // leading dims of each head that rotate (even, <= head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;  // linear position scaling: 1 / rope.scaling.factor
  // Optional per-frequency divisors (Llama 3.1 rope_freqs.weight): F32, ne0 == n_rot / 2.
  WeightView freq_factors;
};

struct AttentionParams {
  int n_head = 0;     // query heads; q rows are n_head * head_dim
  int n_head_kv = 0;  // key/value heads (GQA: n_head % n_head_kv == 0); cache rows n_head_kv*head_dim
  int head_dim = 0;
  float scale = 1.0f; // applied to q.k before the softmax (1/sqrt(head_dim))
  int pos0 = 0;       // position of the first query row; query t sees cache rows [0, pos0 + t]
  // Sliding-window attention (Gemma 3's local layers): query t (position p = pos0 + t) sees only
  // the `window` most recent positions (p - window, p]. 0: no window (every earlier position).
  int window = 0;
  // The first cache row query t attends to.
  int first_key(int t) const { return window > 0 ? std::max(0, pos0 + t - window + 1) : 0; }
};

// One sequence's share of a pass over several sequences (model/executor.h Segment): rows
// [row0, row0 + n) of the pass's q/k/v/attention-output tensors, at positions [pos0, pos0 + n),
// and that sequence's cache views (positions [0, pos0 + n) as rows, paged through their row_map).
struct SeqRows {
  int64_t row0 = 0;
  int64_t n = 0;
  int pos0 = 0;
  Tensor k_cache, v_cache;
};

// The largest pass of a model, as a backend's scratch sees it: the int8 and f16 conversions of its
// activations, the prefill GEMM's dequantized weight chunk, and the attention and small-batch
// (mmq) workspaces.
struct ScratchShape {
  int64_t max_tokens = 0;  // rows of the largest pass (LoadOptions::max_batch)
  int64_t max_cols = 0;    // columns of the widest matrix a pass multiplies
  int n_head = 0;          // query heads
  int head_dim = 0;        // the larger of the key and value head sizes
  int positions = 0;       // KV cache rows attention reads (the pool's)
  int sequences = 1;       // sequences one pass may hold (decode rows of many sequences attend at once)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // Buffers. Memory stays valid until the backend is destroyed. kOutOfMemory on failure.
  virtual Result<Tensor> alloc(DType dtype, int64_t cols, int64_t rows) = 0;
  // Host <-> tensor copies of all rows of `t` (f32 on the host side; rows*cols floats). upload is
  // ordered with the ops issued before and after it, and `src` may be reused once it returns (the
  // host need not wait for the transfer); download returns with the rows in `dst`.
  virtual void upload(const Tensor& dst, const float* src) = 0;
  // Host -> an I32 tensor (rows*cols ints, dst.stride == dst.cols), ordered with the ops issued
  // before and after it; `src` may be reused once it returns.
  virtual void upload_i32(const Tensor& dst, const int32_t* src) = 0;
  virtual void download(const Tensor& src, float* dst) = 0;
  // Waits for every op issued so far.
  virtual void sync() = 0;

  // Weights. A backend whose ops read host memory (the CPU) takes views into the file mapping as
  // they are; one with its own memory (a GPU) copies a weight in once and returns a view of the
  // copy, valid until the backend is destroyed.
  virtual bool reads_host_weights() const { return true; }
  virtual Result<WeightView> upload_weight(const WeightView& host) { return host; }
  // The backend's own layout of a matrix, where it computes on one (the CPU's packed layout,
  // CpuOptions::pack_weights): repacked_bytes() is its size (0: the backend reads `w` as it is;
  // w.data is not read), and repack_weight() writes it into `dst` (that many bytes, 64-byte
  // aligned) and returns the view of it. upload_weight is these two plus memory; the CPU streamer
  // calls them itself for layers it holds in its own buffers (docs/STREAMING.md). Rows [a, b) of
  // a matrix, a and b multiples of the format's quant::Kernels::packed_rows, repack to bytes
  // [a, b) / packed_rows * repacked_bytes(packed_rows rows) of the whole matrix's layout.
  virtual int64_t repacked_bytes(const WeightView& w) const { return 0; }
  virtual WeightView repack_weight(const WeightView& w, void* dst) {
    SLUICE_CHECK(false, std::string("repack_weight: the ") + name() + " backend has no layout of its own");
    return w;
  }
  // Bytes of the backend's own memory still free (-1: host memory, no separate limit).
  virtual int64_t free_memory() const { return -1; }
  // Bytes of its own memory the backend has allocated so far (weights, buffers, slots, scratch; 0
  // for host memory).
  virtual int64_t allocated_bytes() const { return 0; }
  // Allocates now the scratch every pass of a model of this shape can ask for (cuda_scratch_bytes
  // on the CUDA backend; nothing on the CPU's), so that no pass allocates: memory plans count it.
  virtual Status reserve_scratch(const ScratchShape& shape) { return Status::ok(); }

  // Streaming weights into the backend's memory (stream/ drives it; docs/STREAMING.md). Layers
  // are copied into slots while other layers compute. Copies run on their own queue and are
  // ordered against compute only through marks, so the host never waits on the hot path.
  // A Mark names a point in a queue; 0 is a mark that has always passed.
  using Mark = uint64_t;
  // Backend memory for one slot (VRAM on a GPU, host memory on the CPU).
  virtual Result<void*> alloc_slot(int64_t bytes) = 0;
  // Host memory the backend copies from fastest (pinned on a GPU); disk reads land here.
  virtual Result<void*> alloc_staging(int64_t bytes) = 0;
  // Enqueues dst <- src (bytes; dst in a slot, src in staging or other host memory) on the copy
  // queue, to start once compute mark `after` has passed. Returns the mark of the copy's end.
  virtual Mark copy_to_slot(void* dst, const void* src, int64_t bytes, Mark after) = 0;
  // Compute ops issued from now on start after mark `m` (a copy) has passed.
  virtual void compute_wait(Mark m) = 0;
  // A mark that passes once every compute op issued so far is done.
  virtual Mark compute_mark() = 0;
  // Blocks the host until mark `m` has passed (before overwriting staging a copy still reads).
  virtual void host_wait(Mark m) = 0;
  // Seconds between two passed marks of any queue (stats: copy time, compute time); -1 where the
  // backend does not time its queues.
  virtual double seconds_between(Mark from, Mark to) { return -1; }

  // A step: the ops issued between begin_step() and end_step() may be recorded and replayed as one
  // unit (a CUDA graph); ops inside a step must not be followed by download() or sync() before
  // end_step(). `key` names the step's sequence of ops: equal keys mean the same ops on the same
  // tensors and weights, only the position differs (decode over resident weights); `pos` is that
  // position, and every op of the step that takes a position gets this one. replay_step(key, pos)
  // runs a recorded step with this key at `pos` and returns true (the caller issues nothing of the
  // step, and reads its outputs as usual); false: nothing recorded for it, issue the step
  // (begin_step .. end_step), which records it where the backend can.
  virtual bool replay_step(uint64_t key, int pos) { return false; }
  virtual void begin_step(uint64_t key, int pos) {}
  virtual void end_step() {}

  // dst[t] = dequantize(table row ids[t]); table [n_embd, n_vocab]; dst rows == ids.size().
  // The table is always in host memory (the file mapping), even for backends with their own
  // memory: only the looked-up rows move. Precondition: every id in [0, table.ne1) (callers
  // validate token ids from users).
  virtual void get_rows(const WeightView& table, std::span<const int32_t> ids, const Tensor& dst) = 0;

  // Row-invariant mode (Model::set_row_invariant; speculative verification): while on, every op
  // over several rows gives each row the bits a one-row call would (the CPU backend's matrix
  // products run the one-token kernels per row, its attention sums each query row in the
  // one-token order instead of llama.cpp's batched order). Off by default. The CUDA backend picks
  // its kernels by row count and has no such mode (its passes differ from one-token passes by
  // rounding). Returns whether the backend has the mode.
  virtual bool set_row_invariant(bool on) { return false; }

  // y = x W^T: y[t][o] = sum_i W[o][i] * x[t][i]. W [ne0 = x.cols, ne1 = y.cols] in any format
  // with a vec_dot; the backend quantizes x to the format's vec_dot_type (as llama.cpp's CPU
  // backend does). One row of x is a gemv; many rows take the batched (prefill) path.
  virtual void matmul(const WeightView& w, const Tensor& x, const Tensor& y) = 0;

  // ys[i] = x ws[i]^T for several weights sharing the input (Q/K/V, gate/up): one dispatch, and x
  // quantized once per activation format. Same results as separate matmul calls.
  virtual void matmul_multi(std::span<const WeightView> ws, const Tensor& x, std::span<const Tensor> ys) {
    SLUICE_CHECK(ws.size() == ys.size(), "matmul_multi: weights and outputs differ in count");
    for (size_t i = 0; i < ws.size(); ++i) matmul(ws[i], x, ys[i]);
  }

  // The decode step's Q, K and V products followed by the rope and KV store of one sequence:
  // matmul_multi({wq, wk, wv}, x, {q, k, v}); rope_store_kv(q, rq, k, rk, v, s.k_cache, s.v_cache,
  // s.pos0) on rows [s.row0, s.row0 + s.n) = all of x's rows. A GPU backend may do the rotation and
  // the store in the products' epilogue (one launch fewer, no re-read of q, k and v), with the
  // same results.
  virtual void matmul_rope_store_kv(std::span<const WeightView, 3> wqkv, const Tensor& x,
                                    std::span<const Tensor, 3> qkv, const RopeParams& rq, const RopeParams& rk,
                                    const SeqRows& s) {
    matmul_multi(wqkv, x, qkv);
    rope_store_kv(qkv[0].row_range(s.row0, s.n), rq, qkv[1].row_range(s.row0, s.n), rk, qkv[2].row_range(s.row0, s.n),
                  s.k_cache, s.v_cache, s.pos0);
  }

  // ys[i] = xs[i] ws[i]^T, every weight with its own input (the experts of a mixture-of-experts
  // layer, each on its own hidden rows): one dispatch where the backend can. Same results as
  // separate matmul calls.
  virtual void matmul_each(std::span<const WeightView> ws, std::span<const Tensor> xs, std::span<const Tensor> ys) {
    SLUICE_CHECK(ws.size() == xs.size() && ws.size() == ys.size(), "matmul_each: weights, inputs and outputs differ in count");
    for (size_t i = 0; i < ws.size(); ++i) matmul(ws[i], xs[i], ys[i]);
  }

  // dst = x / rms(x) * w, over groups of w.ne0 consecutive elements of each row (the whole row for
  // a layer norm, each head for Q/K norms). w is F32. dst may alias x.
  virtual void rms_norm(const Tensor& x, const WeightView& w, float eps, const Tensor& dst) = 0;

  // Fused decode ops: each gives exactly the results of the calls it replaces (the CPU backend
  // runs those calls; a GPU saves launches, a decode layer being launch-bound there).
  // x += src, then dst = rms_norm(x, w, eps) over whole rows (w.ne0 == x.cols). dst may alias src.
  virtual void add_rms_norm(const Tensor& x, const Tensor& src, const WeightView& w, float eps, const Tensor& dst) {
    add(x, src);
    rms_norm(x, w, eps, dst);
  }
  // rms_norm(a, wa, eps, a); rms_norm(b, wb, eps, b): the Q and K head norms (QK-norm).
  virtual void rms_norm_pair(const Tensor& a, const WeightView& wa, const Tensor& b, const WeightView& wb, float eps) {
    rms_norm(a, wa, eps, a);
    rms_norm(b, wb, eps, b);
  }
  // rms_norm(src, w_src, eps, src); add_rms_norm(x, src, w, eps, dst): a block output's own norm,
  // the residual add and the next block's norm (Gemma 3's post-attention norm). src is scratch
  // (its content afterwards is unspecified); dst may alias src.
  virtual void norm_add_rms_norm(const Tensor& x, const Tensor& src, const WeightView& w_src, const WeightView& w,
                                 float eps, const Tensor& dst) {
    rms_norm(src, w_src, eps, src);
    add_rms_norm(x, src, w, eps, dst);
  }
  // rms_norm(src, w_src, eps, src); add(x, src) (Gemma 3's post-FFN norm and residual add). src is
  // scratch.
  virtual void norm_add(const Tensor& x, const Tensor& src, const WeightView& w_src, float eps) {
    rms_norm(src, w_src, eps, src);
    add(x, src);
  }
  // rope(q, rq, pos0); rope(k, rk, pos0); store_rows(k, k_cache, pos0); store_rows(v, v_cache, pos0).
  virtual void rope_store_kv(const Tensor& q, const RopeParams& rq, const Tensor& k, const RopeParams& rk,
                             const Tensor& v, const Tensor& k_cache, const Tensor& v_cache, int pos0) {
    rope(q, rq, pos0);
    rope(k, rk, pos0);
    store_rows(k, k_cache, pos0);
    store_rows(v, v_cache, pos0);
  }

  // y[t] += b for every row; b is F32 with ne0 == y.cols.
  virtual void add_bias(const Tensor& y, const WeightView& b) = 0;
  // dst += src, elementwise (residual connections).
  virtual void add(const Tensor& dst, const Tensor& src) = 0;
  // Mixture of experts: the rows routed to one expert are gathered into a dense batch, and the
  // expert's output is scattered back, scaled by the router's weight. Row lists come from the
  // host (routing is decided there) and hold at most 512 entries.
  // dst[i] = src[rows[i]]; dst.rows == rows.size(), rows[i] in [0, src.rows).
  virtual void gather_rows(const Tensor& src, std::span<const int32_t> rows, const Tensor& dst) = 0;
  // dst[rows[i]] += scale[i] * src[i]; src.rows == rows.size() == scale.size(); rows distinct.
  virtual void scatter_add_rows(const Tensor& dst, const Tensor& src, std::span<const int32_t> rows,
                                std::span<const float> scale) = 0;

  // dst[row] += scale[i] * src[i] for i = 0, 1, ... in turn (a token's experts added into its
  // residual row): the results of scatter_add_rows of each src row in turn, in one op.
  virtual void add_rows_scaled(const Tensor& dst, int32_t row, const Tensor& src, std::span<const float> scale) {
    SLUICE_CHECK(src.rows == int64_t(scale.size()), "add_rows_scaled: scales and rows differ in count");
    for (int64_t i = 0; i < src.rows; ++i) {
      const int32_t r[] = {row};
      scatter_add_rows(dst, src.row_range(i, 1), r, scale.subspan(size_t(i), 1));
    }
  }

  // dst = silu(gate) * up, elementwise. dst may alias gate or up.
  virtual void swiglu(const Tensor& gate, const Tensor& up, const Tensor& dst) = 0;
  // dst = gelu(gate) * up, elementwise, with GELU's tanh approximation
  // gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Gemma's GeGLU). dst may alias gate or up.
  virtual void geglu(const Tensor& gate, const Tensor& up, const Tensor& dst) = 0;
  // x *= s, elementwise (Gemma's embedding scaling by sqrt(n_embd)).
  virtual void scale(const Tensor& x, float s) = 0;

  // Rotates x in place; row t is at position pos0 + t.
  virtual void rope(const Tensor& x, const RopeParams& p, int pos0) = 0;

  // cache rows [pos0, pos0 + src.rows) = src (converted to the cache's dtype); through the cache
  // view's row_map where it has one (also in rope_store_kv and attention).
  virtual void store_rows(const Tensor& src, const Tensor& cache, int64_t pos0) = 0;

  // Causal multi-head attention of q (rows = tokens) over the caches (rows = positions):
  // out[t][h] = softmax(scale * q[t][h] . K[a..pos0+t][h/g]) V[a..pos0+t][h/g],  g = n_head/n_head_kv,
  // a = p.first_key(t) (0 without a sliding window).
  virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const Tensor& out, const AttentionParams& p) = 0;

  // Several sequences in one pass: the ops above over each sequence's rows, its positions and its
  // cache, with the same results as one call per sequence (the default). A GPU backend does all
  // the sequences in a few launches: per-sequence launches would dominate a batched decode pass.
  // rope_store_kv(q, k, v rows of s, ..., s.k_cache, s.v_cache, s.pos0) for every s.
  virtual void rope_store_kv_seqs(const Tensor& q, const RopeParams& rq, const Tensor& k, const RopeParams& rk,
                                  const Tensor& v, std::span<const SeqRows> seqs) {
    for (const SeqRows& s : seqs) {
      rope_store_kv(q.row_range(s.row0, s.n), rq, k.row_range(s.row0, s.n), rk, v.row_range(s.row0, s.n), s.k_cache,
                    s.v_cache, s.pos0);
    }
  }
  // attention(q rows of s, s.k_cache, s.v_cache, out rows of s, p with pos0 = s.pos0) for every s.
  virtual void attention_seqs(const Tensor& q, const Tensor& out, const AttentionParams& p,
                              std::span<const SeqRows> seqs) {
    for (const SeqRows& s : seqs) {
      AttentionParams ps = p;
      ps.pos0 = s.pos0;
      attention(q.row_range(s.row0, s.n), s.k_cache, s.v_cache, out.row_range(s.row0, s.n), ps);
    }
  }
};

struct CpuOptions {
  int n_threads = 0;  // 0: physical cores
  bool simd = true;   // false: the backend's own ops take their portable paths (tests compare both)
  // Prefill matmuls use the register-blocked vec_dot_tile kernels where a format has one. The
  // environment variable SLUICE_CPU_TILE=0 turns them off at backend creation (A/B benchmarks).
  bool tile_kernels = true;
  // upload_weight repacks matrices whose format has a packed layout on this CPU
  // (quant::Kernels::vec_dot_packed) into that layout, in memory the backend owns; the CPU
  // streamer repacks its RAM-resident and disk-streamed layers with the same function
  // (repack_weight), so a run gives the same numbers wherever its layers live. The packed kernels
  // sum in another order than the row-by-row ones: off, every layer runs the row-by-row kernels.
  // SLUICE_CPU_PACK=0 turns it off at backend creation.
  bool pack_weights = true;
};
// The CPU backend (backend/cpu).
std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& opts);
// The threads a CPU backend of CpuOptions::n_threads = n runs: n, or for n <= 0 the physical cores.
int cpu_threads(int n);

// Kernel kinds a diagnostic run may leave out (CudaOptions::skip_kernels, `sluice bench
// --skip-kernels`): what each costs in the context of a whole token is the time it saves. The
// outputs of such a run are meaningless.
enum CudaKernelKind : uint32_t {
  kCudaNorm = 1u << 0,       // RMSNorm + int8 activation (attention input)
  kCudaAddNorm = 1u << 1,    // residual add + RMSNorm + int8 activation (FFN input)
  kCudaRope = 1u << 2,       // RoPE + KV store
  kCudaAttention = 1u << 3,  // attention (decode splits and combine, prefill)
  kCudaGlu = 1u << 4,        // SwiGLU / GeGLU + int8 activation
  kCudaGemv = 1u << 5,       // every GEMV launch
};
struct CudaOptions {
  int device = 0;
  bool graphs = true;  // record decode steps as CUDA graphs and replay them (see Backend::replay_step)
  uint32_t skip_kernels = 0;  // CudaKernelKind bits: launches left out (diagnostic; 0 in every real run)
};
// The CUDA backend (backend/cuda), in builds with CUDA (SLUICE_HAVE_CUDA). Error: no device, or
// the device cannot be used.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaOptions& opts);
// Number of usable CUDA devices (0 in builds without CUDA or on machines without a GPU).
int cuda_device_count();
// Device bytes of the scratch the CUDA backend reserves for `shape` (Backend::reserve_scratch):
// what memory plans count for it. Sized for device 0 where there is one (its SM count bounds the
// small-batch partial sums), else for the largest GPUs; builds without CUDA answer 512 MiB.
uint64_t cuda_scratch_bytes(const ScratchShape& shape);
// Device-to-device copy bandwidth of `device` in bytes/s, counting bytes read plus bytes written
// (the roofline a weight-reading kernel is compared with), measured now: median of several copies
// of a buffer much larger than L2. Error without CUDA or a device.
Result<double> cuda_copy_bandwidth(int device);
// Host-to-device bandwidth from pinned host memory in bytes/s (the streaming tier's bound),
// measured now. Error without CUDA or a device.
Result<double> cuda_h2d_bandwidth(int device);
// The same copies (about `bytes` in all, from pinned memory) while `during` runs on the calling
// thread: the H2D bytes/s when the CPU reads DRAM at the same time (hybrid execution's planner),
// over the copies done by the time `during` returns (all of them if fewer than two were). Waits
// for both. Error without CUDA or a device.
Result<double> cuda_h2d_bandwidth_during(int device, uint64_t bytes, const std::function<void()>& during);

}  // namespace sluice::backend
