// Matrix products y = x W^T for weights in any quant format. Activations are quantized once per
// call to the weight format's vec_dot_type (Q8_0, Q8_1, Q8_K, F16, ...), exactly the pairing of
// llama.cpp's CPU backend, then every output element is one quant vec_dot.
//
// Decode (one row of x) is bound by reading W once: output rows are split into chunks handed
// out dynamically across threads. Prefill (many rows) reuses each chunk of weight rows (in L2)
// across a tile of tokens whose activations stay in L1, so W is streamed from memory once per
// chunk and the activations from L2 once per chunk and tile rather than once per weight row;
// where the format has a multi-column kernel (vec_dot_cols) of the same ISA as its vec_dot, each
// weight block is also decoded once per tile instead of once per token. Where it has a
// register-blocked tile kernel (vec_dot_tile) of that ISA, the whole chunk x token tile is one
// call: the kernel keeps several rows x several tokens of accumulators in registers and writes
// y in place.
// matmul_multi runs several weights over one input (Q/K/V, gate/up) as one job: fewer
// dispatches per layer, and small matrices (K, V) no longer leave threads idle on their own.
// matmul_each does the same for weights with inputs of their own (a decode step's experts: the
// down projections of all of a token's experts are one dispatch, not one each).
// Weights repacked at upload (WeightView::packed, quant::Kernels::vec_dot_packed) go through the
// format's packed kernel for both decode and prefill: chunks are whole groups of packed_rows rows,
// and the kernel walks token tiles itself.
// Row-invariant mode (Backend::set_row_invariant): a batch runs the one-token kernels (vec_dot,
// or the packed kernel one token at a time) on each row of a chunk while the chunk's weight rows
// are in cache, so every row has the bits of a one-token call.
#include <algorithm>
#include <string>

#include "backend/cpu/cpu_backend.h"

namespace sluice::backend::cpu {
namespace {

// Output rows per work chunk in the batched path (16 rows of a 4096-wide Q4_K matrix are 37 KiB:
// they stay in L2 while a token tile streams past).
constexpr int64_t kRowBlock = 16;
// Tokens per tile: the column count of one vec_dot_cols register block (8 for the AVX-512 and
// AVX2 legacy kernels, two blocks of 4 for the AVX2 K-quant ones). The tile loop is outside the
// row loop, so the tile's activations (8 x 2.3 KiB of Q8_K for 2048 wide) stay in L1 while the
// chunk's rows pass over them, and the chunk's rows (in L2) are what is re-read per tile. With a
// 32-token tile each row's vec_dot_cols walked 4 groups of 8 columns, pulling the whole 32-row
// activation tile through L1 once per weight row.
constexpr int64_t kTokenTile = 8;

struct Part {
  const quant::Kernels* wk;
  const uint8_t* w;
  int64_t w_row;
  const uint8_t* act;  // x in the weight's vec_dot_type, row t at act + t * a_stride
  int64_t a_stride;
  int64_t n_tok;  // rows of x
  int64_t k;      // columns of x (the weight's row length)
  float* y;
  int64_t y_stride;
  int64_t first_chunk;  // chunks of all parts are numbered consecutively
  int64_t n_out;
  bool cols;  // use wk->vec_dot_cols for token tiles
  bool tile;  // use wk->vec_dot_tile for chunk x token tiles (preferred over cols)
  bool per_row;  // row-invariant mode over several rows: one-token kernels on every row
  bool packed;  // w is in the packed layout: wk->vec_dot_packed over whole groups
  int64_t group_bytes;  // packed: bytes per group of wk->packed_rows rows
};

// The format's packed kernel runs on this CPU at the ISA of its vec_dot or above (AMX tiles).
bool packable(const quant::Kernels& wk) {
  return wk.vec_dot_packed != nullptr && wk.vec_dot_packed_isa >= wk.vec_dot_isa && wk.packed_rows > 0;
}

void check_shapes(const WeightView& w, const Tensor& x, const Tensor& y) {
  SLUICE_CHECK(x.dtype == DType::kF32 && y.dtype == DType::kF32, "matmul: f32 activations expected");
  SLUICE_CHECK(x.cols == w.ne0 && y.cols == w.ne1 && x.rows == y.rows,
               "matmul: shapes x[" + std::to_string(x.rows) + "," + std::to_string(x.cols) + "] W[" +
                   std::to_string(w.ne0) + "," + std::to_string(w.ne1) + "] y[" + std::to_string(y.rows) + "," +
                   std::to_string(y.cols) + "]");
  SLUICE_CHECK(quant::kernels(w.type).vec_dot != nullptr,
               std::string("matmul: no vec_dot for ") + quant::type_name(w.type));
  SLUICE_CHECK(!w.packed || packable(quant::kernels(w.type)),
               std::string("matmul: a packed ") + quant::type_name(w.type) + " weight without a packed kernel");
}

}  // namespace

int64_t CpuBackend::repacked_bytes(const WeightView& w) const {
  if (!pack_weights_ || w.packed || w.ne0 <= 0 || w.ne1 <= 0) return 0;
  const quant::Kernels& wk = quant::kernels(w.type);
  if (!packable(wk) || w.ne1 % wk.packed_rows != 0 || w.ne0 % quant::traits(w.type).block_elems != 0) return 0;
  return w.ne1 / wk.packed_rows * wk.packed_bytes(w.ne0);
}

WeightView CpuBackend::repack_weight(const WeightView& w, void* dst) {
  SLUICE_CHECK(repacked_bytes(w) > 0 && !w.empty() && dst != nullptr,
               "repack_weight: the weight has no packed layout (check repacked_bytes first)");
  const quant::Kernels& wk = quant::kernels(w.type);
  const int64_t n_groups = w.ne1 / wk.packed_rows;
  const int64_t gb = wk.packed_bytes(w.ne0);
  const auto* src = static_cast<const uint8_t*>(w.data);
  const int64_t rb = w.row_bytes();
  auto* out = static_cast<uint8_t*>(dst);
  pool_.parallel_for(n_groups, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t g = b; g < e; ++g) wk.pack_rows(src + g * wk.packed_rows * rb, rb, out + g * gb, w.ne0);
  });
  WeightView v = w;
  v.data = dst;
  v.packed = true;
  return v;
}

Result<WeightView> CpuBackend::upload_weight(const WeightView& host) {
  const int64_t bytes = host.empty() ? 0 : repacked_bytes(host);
  if (bytes == 0) return host;
  AlignedBuffer buf;
  if (!buf.reserve(size_t(bytes))) {
    return out_of_memory("cpu backend: cannot allocate " + std::to_string(bytes) +
                         " bytes to repack a weight (SLUICE_CPU_PACK=0 runs from the file mapping)");
  }
  const WeightView v = repack_weight(host, buf.data());
  buffers_.push_back(std::move(buf));
  return v;
}

void CpuBackend::matmul(const WeightView& w, const Tensor& x, const Tensor& y) {
  matmul_job(std::span(&w, 1), std::span(&x, 1), std::span(&y, 1));
}

void CpuBackend::matmul_multi(std::span<const WeightView> ws, const Tensor& x, std::span<const Tensor> ys) {
  matmul_job(ws, std::span(&x, 1), ys);
}

void CpuBackend::matmul_each(std::span<const WeightView> ws, std::span<const Tensor> xs, std::span<const Tensor> ys) {
  SLUICE_CHECK(ws.size() == xs.size(), "matmul_each: weights and inputs differ in count");
  matmul_job(ws, xs, ys);
}

void CpuBackend::matmul_job(std::span<const WeightView> ws, std::span<const Tensor> xs, std::span<const Tensor> ys) {
  SLUICE_CHECK(ws.size() == ys.size() && !ws.empty() && (xs.size() == 1 || xs.size() == ws.size()),
               "matmul: bad part count");
  if (ws.size() > kMaxParts) {
    // More weights than one job holds: jobs of kMaxParts, each part computed exactly as alone
    // (an activation quantizes to the same bytes every time).
    for (size_t i = 0; i < ws.size(); i += kMaxParts) {
      const size_t m = std::min(kMaxParts, ws.size() - i);
      matmul_job(ws.subspan(i, m), xs.size() == 1 ? xs : xs.subspan(i, m), ys.subspan(i, m));
    }
    return;
  }
  const auto x_of = [&](size_t i) -> const Tensor& { return xs.size() == 1 ? xs[0] : xs[i]; };

  // Each distinct input is quantized once per activation format it meets, into one buffer.
  struct Act {
    const void* data;
    int64_t rows, cols, stride;
    quant::Type type;
    int64_t offset;  // into act_q_ (quantized formats)
    int64_t row_bytes;
  };
  Act acts[kMaxParts];
  size_t act_of[kMaxParts];
  size_t n_acts = 0;
  int64_t act_bytes = 0, total_out = 0, work = 0;
  bool all_gemv = true;
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor& x = x_of(i);
    check_shapes(ws[i], x, ys[i]);
    const quant::Type at = quant::kernels(ws[i].type).vec_dot_type;
    size_t d = 0;
    while (d < n_acts && !(acts[d].data == x.data && acts[d].rows == x.rows && acts[d].cols == x.cols &&
                           acts[d].stride == x.stride && acts[d].type == at))
      ++d;
    if (d == n_acts) {
      Act& a = acts[n_acts++];
      a = {x.data, x.rows, x.cols, x.stride, at, act_bytes, x.stride * 4};
      if (at != quant::Type::kF32) {
        a.row_bytes = quant::row_bytes(at, x.cols);
        act_bytes += (x.rows * a.row_bytes + 63) / 64 * 64;
      }
    }
    act_of[i] = d;
    all_gemv = all_gemv && x.rows == 1;
    total_out += ws[i].ne1;
    work += ws[i].ne1 * x.cols * x.rows;
  }
  SLUICE_CHECK(act_q_.reserve(size_t(std::max<int64_t>(act_bytes, 64))), "matmul: out of memory for activations");
  for (size_t d = 0; d < n_acts; ++d) {
    const Act& a = acts[d];
    if (a.type == quant::Type::kF32) continue;
    uint8_t* q = act_q_.data() + a.offset;
    const quant::Kernels& ak = quant::kernels(a.type);
    for_rows(a.rows, 1, a.rows * a.cols, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t)
        ak.quantize_row(static_cast<const float*>(a.data) + t * a.stride, q + t * a.row_bytes, a.cols);
    });
  }

  // Decode: enough chunks (8 per thread) that a descheduled thread does not hold up the op.
  int64_t grain = all_gemv ? std::max<int64_t>(4, total_out / (8 * pool_.size())) : kRowBlock;
  // Packed parts are split in whole groups (every packed format groups kRowBlock rows).
  for (const WeightView& w : ws)
    if (w.packed) {
      SLUICE_CHECK(quant::kernels(w.type).packed_rows == kRowBlock, "matmul: packed group is not kRowBlock rows");
      grain = (grain + kRowBlock - 1) / kRowBlock * kRowBlock;
    }
  Part parts[kMaxParts];
  int64_t n_chunks = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const WeightView& w = ws[i];
    const Act& a = acts[act_of[i]];
    const quant::Kernels& wk = quant::kernels(w.type);
    const bool per_row = row_invariant_ && a.rows > 1;  // one-token kernels on every row of the batch
    // A lower-ISA fallback (e.g. the reference loop) would be slower than vec_dot itself.
    const bool cols = !per_row && wk.vec_dot_cols != nullptr && wk.vec_dot_cols_isa == wk.vec_dot_isa;
    // Tiles only for batches: a single token (decode) gains nothing from a rows x tokens register
    // block and would pay its setup per chunk.
    const bool tile =
        !per_row && tile_kernels_ && a.rows > 1 && wk.vec_dot_tile != nullptr && wk.vec_dot_tile_isa == wk.vec_dot_isa;
    const uint8_t* act = a.type == quant::Type::kF32 ? static_cast<const uint8_t*>(a.data) : act_q_.data() + a.offset;
    parts[i] = {&wk,     static_cast<const uint8_t*>(w.data), w.row_bytes(), act,      a.row_bytes,
                a.rows,  a.cols,  static_cast<float*>(ys[i].data), ys[i].stride, n_chunks, w.ne1,
                cols,    tile,    per_row, w.packed, w.packed ? wk.packed_bytes(a.cols) : 0};
    n_chunks += (w.ne1 + grain - 1) / grain;
  }

  const size_t n_parts = ws.size();
  for_rows(n_chunks, 1, work, [&](int64_t cb, int64_t ce, int) {
    for (int64_t c = cb; c < ce; ++c) {
      size_t pi = 0;
      while (pi + 1 < n_parts && parts[pi + 1].first_chunk <= c) ++pi;
      const Part& p = parts[pi];
      const int64_t k = p.k, n_tok = p.n_tok;
      const int64_t b = (c - p.first_chunk) * grain, e = std::min(p.n_out, b + grain);
      if (p.packed) {  // b and e are multiples of the group size (grain is, and so is n_out)
        const int64_t g0 = b / kRowBlock;
        if (p.per_row) {
          for (int64_t t = 0; t < n_tok; ++t)
            p.wk->vec_dot_packed(k, p.w + g0 * p.group_bytes, int((e - b) / kRowBlock), p.act + t * p.a_stride,
                                 p.a_stride, 1, p.y + t * p.y_stride + b, p.y_stride);
          continue;
        }
        p.wk->vec_dot_packed(k, p.w + g0 * p.group_bytes, int((e - b) / kRowBlock), p.act, p.a_stride, int(n_tok),
                             p.y + b, p.y_stride);
        continue;
      }
      if (n_tok == 1) {
        for (int64_t o = b; o < e; ++o) p.wk->vec_dot(k, p.w + o * p.w_row, p.act, p.y + o);
        continue;
      }
      float tile[kTokenTile];
      for (int64_t t0 = 0; t0 < n_tok; t0 += kTokenTile) {
        const int64_t t1 = std::min(n_tok, t0 + kTokenTile);
        if (p.tile) {
          p.wk->vec_dot_tile(k, p.w + b * p.w_row, p.w_row, int(e - b), p.act + t0 * p.a_stride, p.a_stride,
                             int(t1 - t0), p.y + t0 * p.y_stride + b, p.y_stride);
          continue;
        }
        for (int64_t o = b; o < e; ++o) {
          const uint8_t* wr = p.w + o * p.w_row;
          if (p.cols) {
            p.wk->vec_dot_cols(k, wr, p.act + t0 * p.a_stride, p.a_stride, int(t1 - t0), tile);
            for (int64_t t = t0; t < t1; ++t) p.y[t * p.y_stride + o] = tile[t - t0];
          } else {
            for (int64_t t = t0; t < t1; ++t) p.wk->vec_dot(k, wr, p.act + t * p.a_stride, p.y + t * p.y_stride + o);
          }
        }
      }
    }
  });
}

}  // namespace sluice::backend::cpu
