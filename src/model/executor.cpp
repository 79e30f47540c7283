#include "model/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

#include "model/arch.h"

namespace sluice::model {

using backend::Tensor;

Status Executor::init(backend::Backend& be, const Config& cfg, int pool_rows, int64_t map_rows, int max_batch,
                      const std::vector<bool>& kv_layers, backend::WeightView rope_freqs) {
  be_ = &be;
  cfg_ = &cfg;
  rope_freqs_ = rope_freqs;
  const char* fuse = std::getenv("SLUICE_FUSE_RESIDUAL");  // A/B runs: 0 adds the residual at once
  defer_add_ = !(fuse != nullptr && std::string(fuse) == "0");
  SLUICE_RETURN_IF_ERROR(kv_.init(be, cfg.n_layer, pool_rows, cfg.n_embd_k(), cfg.n_embd_v(), map_rows, kv_layers));
  auto f32 = [&](int64_t cols) { return be.alloc(backend::DType::kF32, cols, max_batch); };
  SLUICE_ASSIGN_OR_RETURN(x_, f32(cfg.n_embd));
  SLUICE_ASSIGN_OR_RETURN(xn_, f32(cfg.n_embd));
  SLUICE_ASSIGN_OR_RETURN(q_, f32(cfg.n_embd_q()));
  SLUICE_ASSIGN_OR_RETURN(k_, f32(cfg.n_embd_k()));
  SLUICE_ASSIGN_OR_RETURN(v_, f32(cfg.n_embd_v()));
  SLUICE_ASSIGN_OR_RETURN(attn_, f32(cfg.n_head * cfg.head_dim_v));
  SLUICE_ASSIGN_OR_RETURN(gate_, f32(cfg.n_ff_max()));
  SLUICE_ASSIGN_OR_RETURN(up_, f32(cfg.n_ff_max()));
  if (cfg.moe()) {
    SLUICE_ASSIGN_OR_RETURN(logits_, f32(cfg.n_expert));
    SLUICE_ASSIGN_OR_RETURN(pred_logits_, f32(cfg.n_expert));
    SLUICE_ASSIGN_OR_RETURN(sgate_, f32(1));
    SLUICE_ASSIGN_OR_RETURN(xg_, f32(cfg.n_embd));
    SLUICE_ASSIGN_OR_RETURN(ey_, f32(cfg.n_embd));
    logits_host_.resize(size_t(max_batch) * size_t(cfg.n_expert));
    pred_host_.resize(size_t(max_batch) * size_t(cfg.n_expert));
    sgate_host_.resize(size_t(max_batch));
    all_rows_.resize(size_t(max_batch));
    for (int i = 0; i < max_batch; ++i) all_rows_[size_t(i)] = i;
  }
  return Status::ok();
}

Status Executor::layer(const LayerWeights& L, int l, int64_t n, std::span<const Segment> segs) {
  SLUICE_CHECK(kv_.has(l), "executor: layer has no KV cache on this executor");
  backend::Backend& be = *be_;
  const Tensor xn = xn_.first_rows(n), q = q_.first_rows(n), k = k_.first_rows(n), v = v_.first_rows(n),
               attn = attn_.first_rows(n);
  // Attention block: x += Wo . attention(rope(norm(Wq xn)), rope(norm(Wk xn)), Wv xn).
  attention_norm(L, n);
  const backend::WeightView qkv_w[] = {L.wq.view(), L.wk.view(), L.wv.view()};
  const Tensor qkv_y[] = {q, k, v};
  // One sequence and nothing between the products and the rotation (no biases, no head norms):
  // the backend may rotate and store in the products' epilogue.
  const bool plain = !L.bq.present() && !L.bk.present() && !L.bv.present() && !L.q_norm.present() &&
                     !L.k_norm.present() && segs.size() == 1;
  if (plain) {
    kv_rows(l, segs);
    const RopePair rp = rope_params(l);
    be.matmul_rope_store_kv(qkv_w, xn, qkv_y, rp.q, rp.k, seq_rows_[0]);
  } else {
    be.matmul_multi(qkv_w, xn, qkv_y);
  }
  attend(L, l, n, segs, /*stored=*/plain);
  be.matmul(L.wo.view(), attn, xn);
  attention_residual(L, n);
  return ffn(L, l, n);
}

// Sliding-window layers (Gemma 3's local layers) rotate with their own RoPE base.
Executor::RopePair Executor::rope_params(int l) const {
  const Config& c = *cfg_;
  const bool swa = c.is_swa(l);
  RopePair p;
  p.q = backend::RopeParams{c.rope_mode,
                            c.n_head,
                            c.head_dim,
                            c.n_rot,
                            swa ? c.rope_freq_base_swa : c.rope_freq_base,
                            swa ? c.rope_freq_scale_swa : c.rope_freq_scale,
                            rope_freqs_};
  p.k = p.q;
  p.k.n_head = c.n_head_kv;
  return p;
}

// Per sequence: its rows rotate at its positions, its K/V go to its blocks (one segment: the whole
// pass, as with one sequence).
void Executor::kv_rows(int l, std::span<const Segment> segs) {
  seq_rows_.clear();
  for (const Segment& s : segs) {
    const int end = s.pos0 + int(s.n);
    seq_rows_.push_back({s.row0, s.n, s.pos0, kv_.k(l, end, s.map), kv_.v(l, end, s.map)});
  }
}

void Executor::attend(const LayerWeights& L, int l, int64_t n, std::span<const Segment> segs, bool stored) {
  backend::Backend& be = *be_;
  const Config& c = *cfg_;
  const Tensor q = q_.first_rows(n), k = k_.first_rows(n), v = v_.first_rows(n), attn = attn_.first_rows(n);
  const float eps = c.rms_eps;
  // Sliding-window layers (Gemma 3's local layers) see the last n_swa positions; global layers see
  // every position.
  const bool swa = c.is_swa(l);
  // read_config sets attn_scale for every architecture; 1/sqrt(head_dim) stands in for a Config
  // made by hand.
  const float scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(float(c.head_dim));
  const backend::AttentionParams ap{c.n_head, c.n_head_kv, c.head_dim, scale, 0, swa ? c.n_swa : 0};
  if (stored) {
    be.attention_seqs(q, attn, ap, seq_rows_);
    return;
  }
  const RopePair rp = rope_params(l);
  if (L.bq.present()) be.add_bias(q, L.bq.view());
  if (L.bk.present()) be.add_bias(k, L.bk.view());
  if (L.bv.present()) be.add_bias(v, L.bv.view());
  if (L.q_norm.present() && L.k_norm.present()) {  // per head: group = head_dim
    be.rms_norm_pair(q, L.q_norm.view(), k, L.k_norm.view(), eps);
  } else {
    if (L.q_norm.present()) be.rms_norm(q, L.q_norm.view(), eps, q);
    if (L.k_norm.present()) be.rms_norm(k, L.k_norm.view(), eps, k);
  }
  // Its queries attend over its own keys.
  kv_rows(l, segs);
  be.rope_store_kv_seqs(q, rp.q, k, rp.k, v, seq_rows_);
  be.attention_seqs(q, attn, ap, seq_rows_);
}

void Executor::attention_norm(const LayerWeights& L, int64_t n) {
  const Tensor x = x_.first_rows(n), xn = xn_.first_rows(n);
  if (pending_add_) {
    be_->add_rms_norm(x, xn, L.attn_norm.view(), cfg_->rms_eps, xn);
    pending_add_ = false;
  } else {
    be_->rms_norm(x, L.attn_norm.view(), cfg_->rms_eps, xn);
  }
}

void Executor::flush(int64_t n) {
  if (!pending_add_) return;
  be_->add(x_.first_rows(n), xn_.first_rows(n));
  pending_add_ = false;
}

void Executor::attention_residual(const LayerWeights& L, int64_t n) {
  const Tensor x = x_.first_rows(n), xn = xn_.first_rows(n);
  const float eps = cfg_->rms_eps;
  if (L.post_attn_norm.present()) {  // gemma3
    be_->norm_add_rms_norm(x, xn, L.post_attn_norm.view(), L.ffn_norm.view(), eps, xn);
  } else {
    be_->add_rms_norm(x, xn, L.ffn_norm.view(), eps, xn);
  }
}

void Executor::activation(const Tensor& gate, const Tensor& up) {
  if (cfg_->ffn_act == FfnActivation::kGeluTanh) {
    be_->geglu(gate, up, gate);
  } else {
    be_->swiglu(gate, up, gate);
  }
}

void Executor::ffn_residual(const LayerWeights& L, int64_t n) {
  SLUICE_CHECK(!pending_add_, "executor: a residual add is already pending");
  if (L.post_ffn_norm.present()) {  // gemma3: the post-FFN norm reads this layer's weights, now
    be_->norm_add(x_.first_rows(n), xn_.first_rows(n), L.post_ffn_norm.view(), cfg_->rms_eps);
  } else if (defer_add_) {
    pending_add_ = true;  // x += xn, done by the next attention norm or flush()
  } else {
    be_->add(x_.first_rows(n), xn_.first_rows(n));
  }
}

Status Executor::ffn(const LayerWeights& L, int l, int64_t n) {
  if (L.moe()) return moe_ffn(L, l, n);
  // Dense feed-forward block: x += W_down . (act(W_gate xn) * (W_up xn)), act = silu (SwiGLU) or
  // tanh-approximated gelu (GeGLU); Gemma 3 norms the block's output before the add.
  backend::Backend& be = *be_;
  const Tensor xn = xn_.first_rows(n), gate = gate_.first_rows(n), up = up_.first_rows(n);
  const backend::WeightView gate_up_w[] = {L.w_gate.view(), L.w_up.view()};
  const Tensor gate_up_y[] = {gate, up};
  be.matmul_multi(gate_up_w, xn, gate_up_y);
  activation(gate, up);
  be.matmul(L.w_down.view(), gate, xn);
  ffn_residual(L, n);
  return Status::ok();
}

// ---- row split ----------------------------------------------------------------------------------

namespace {

// Columns [c0, c0 + nc) of every row of t: a view into the same memory, with t's row stride.
Tensor cols(const Tensor& t, int64_t c0, int64_t nc) {
  SLUICE_CHECK(c0 >= 0 && nc >= 0 && c0 + nc <= t.cols && t.row_map == nullptr, "executor: column range outside tensor");
  return {static_cast<uint8_t*>(t.data) + c0 * backend::dtype_bytes(t.dtype), t.dtype, nc, t.rows, t.stride};
}

// src (on `from`) into dst (on `to`, the same shape) through the host buffer.
void hand(backend::Backend& from, const Tensor& src, backend::Backend& to, const Tensor& dst, std::span<float> buf) {
  if (src.cols == 0 || src.rows == 0) return;
  SLUICE_CHECK(buf.size() >= size_t(src.rows * src.cols), "executor: hand-off buffer too small");
  from.download(src, buf.data());
  to.upload(dst, buf.data());
}

// One matrix of a split product: the main executor's part (its first rows: main.ne1), the host's
// whole matrix, and each side's output tensor (full width: column o is output row o).
struct SplitPart {
  const TensorRef& main;
  const TensorRef& host;
  Tensor y, hy;
  int64_t r() const { return main.ne1; }
  int64_t rows() const { return host.ne1; }
};

constexpr size_t kMaxSplitParts = 3;  // Q, K, V

// The main executor's rows of every part, issued on `be` (asynchronous on a GPU).
void main_rows(backend::Backend& be, std::span<const SplitPart> parts, const Tensor& x) {
  std::array<backend::WeightView, kMaxSplitParts> w;
  std::array<Tensor, kMaxSplitParts> y;
  size_t m = 0;
  for (const SplitPart& p : parts) {
    SLUICE_CHECK(p.r() >= 0 && p.r() <= p.rows() && p.main.ne0 == p.host.ne0, "executor: split part larger than its matrix");
    if (p.r() == 0) continue;
    w[m] = p.main.view();
    y[m++] = cols(p.y, 0, p.r());
  }
  if (m > 0) be.matmul_multi(std::span(w.data(), m), x, std::span(y.data(), m));
}

// The host's rows of every part, computed on `hb` (the CPU: synchronous).
void host_rows(backend::Backend& hb, std::span<const SplitPart> parts, const Tensor& hx) {
  std::array<backend::WeightView, kMaxSplitParts> w;
  std::array<Tensor, kMaxSplitParts> y;
  size_t m = 0;
  for (const SplitPart& p : parts) {
    if (p.r() == p.rows()) continue;
    w[m] = p.host.view().rows(p.r(), p.rows() - p.r());
    y[m++] = cols(p.hy, p.r(), p.rows() - p.r());
  }
  if (m > 0) hb.matmul_multi(std::span(w.data(), m), hx, std::span(y.data(), m));
}

// The host's rows of every part into the main executor's outputs.
void gather(backend::Backend& be, backend::Backend& hb, std::span<const SplitPart> parts, std::span<float> buf) {
  for (const SplitPart& p : parts) {
    hand(hb, cols(p.hy, p.r(), p.rows() - p.r()), be, cols(p.y, p.r(), p.rows() - p.r()), buf);
  }
}

}  // namespace

int64_t Executor::split_buffer_floats(const Config& c) {
  return std::max({int64_t(c.n_embd), int64_t(c.n_embd_q()), int64_t(c.n_embd_k()), int64_t(c.n_embd_v()),
                   int64_t(c.n_head) * c.head_dim_v, int64_t(c.n_ff_max())});
}

backend::ScratchShape Executor::scratch_shape(const Config& c, int max_batch, int kv_positions, int max_sequences) {
  backend::ScratchShape s;
  s.max_tokens = max_batch;
  // Matrix inputs: the residual width (Q/K/V, gate/up, the router, the output head), the attention
  // output (wo) and the FFN width (down, experts' and shared experts').
  s.max_cols = std::max({int64_t(c.n_embd), int64_t(c.n_head) * c.head_dim_v, int64_t(c.n_ff_max())});
  s.n_head = c.n_head;
  s.head_dim = std::max(c.head_dim, c.head_dim_v);
  s.positions = kv_positions;
  s.sequences = max_sequences;
  return s;
}

Status Executor::split_layer(const LayerWeights& L, const LayerWeights& H, Executor& h, int l, int64_t n,
                             std::span<const Segment> segs, std::span<float> buf) {
  if (L.moe() || H.moe()) {
    return internal_error("executor: layer " + std::to_string(l) +
                          " is a mixture of experts; only dense layers are split by rows");
  }
  SLUICE_CHECK(kv_.has(l), "executor: split layer has no KV cache on the main executor");
  SLUICE_CHECK(buf.size() >= size_t(n * split_buffer_floats(*cfg_)), "executor: split hand-off buffer too small");
  backend::Backend& be = *be_;
  backend::Backend& hb = *h.be_;
  const Tensor xn = xn_.first_rows(n), attn = attn_.first_rows(n), gate = gate_.first_rows(n), up = up_.first_rows(n);
  const Tensor hxn = h.xn_.first_rows(n), hattn = h.attn_.first_rows(n), hgate = h.gate_.first_rows(n),
               hup = h.up_.first_rows(n);
  // Attention: the normed rows to the host, Q/K/V rows on both, the host's rows back; the rest of
  // the attention block here.
  attention_norm(L, n);
  hand(be, xn, hb, hxn, buf);
  const SplitPart qkv[] = {{L.wq, H.wq, q_.first_rows(n), h.q_.first_rows(n)},
                           {L.wk, H.wk, k_.first_rows(n), h.k_.first_rows(n)},
                           {L.wv, H.wv, v_.first_rows(n), h.v_.first_rows(n)}};
  main_rows(be, qkv, xn);
  host_rows(hb, qkv, hxn);
  gather(be, hb, qkv, buf);
  attend(L, l, n, segs);
  hand(be, attn, hb, hattn, buf);
  const SplitPart wo[] = {{L.wo, H.wo, xn, hxn}};
  main_rows(be, wo, attn);
  host_rows(hb, wo, hattn);
  gather(be, hb, wo, buf);
  attention_residual(L, n);
  // Feed-forward: gate/up rows and the activation on each side's own rows (elementwise), then
  // both sides get the whole hidden vector (W_down reduces over it); W_down's rows as above.
  hand(be, xn, hb, hxn, buf);
  const SplitPart gu[] = {{L.w_gate, H.w_gate, gate, hgate}, {L.w_up, H.w_up, up, hup}};
  const int64_t r = gu[0].r(), nf = gu[0].rows();
  SLUICE_CHECK(gu[1].r() == r && gu[1].rows() == nf, "executor: gate and up split at different rows");
  main_rows(be, gu, xn);
  if (r > 0) activation(cols(gate, 0, r), cols(up, 0, r));
  host_rows(hb, gu, hxn);
  if (r < nf) h.activation(cols(hgate, r, nf - r), cols(hup, r, nf - r));
  hand(hb, cols(hgate, r, nf - r), be, cols(gate, r, nf - r), buf);
  hand(be, cols(gate, 0, r), hb, cols(hgate, 0, r), buf);
  const SplitPart down[] = {{L.w_down, H.w_down, xn, hxn}};
  main_rows(be, down, gate);
  host_rows(hb, down, hgate);
  gather(be, hb, down, buf);
  ffn_residual(L, n);
  return Status::ok();
}

void Executor::expert(const backend::WeightView& gate_w, const backend::WeightView& up_w,
                      const backend::WeightView& down_w, const Tensor& in, std::span<const int32_t> rows,
                      std::span<const float> weights, int64_t n) {
  backend::Backend& be = *be_;
  const int64_t m = in.rows;
  // The hidden buffers are n_ff_max wide; this expert's may be narrower (same row stride).
  const Tensor g{gate_.data, gate_.dtype, gate_w.ne1, m, gate_.stride};
  const Tensor u{up_.data, up_.dtype, up_w.ne1, m, up_.stride};
  const Tensor y = ey_.first_rows(m);
  const backend::WeightView gate_up_w[] = {gate_w, up_w};
  const Tensor gate_up_y[] = {g, u};
  be.matmul_multi(gate_up_w, in, gate_up_y);
  be.swiglu(g, u, g);
  be.matmul(down_w, g, y);
  be.scatter_add_rows(x_.first_rows(n), y, rows, weights);
}

// Routed experts: the router's logits come to the host (one small download per layer), the host
// chooses each token's experts (model/moe.h), and each chosen expert runs once on the dense batch
// of its tokens, its output added into the residual stream scaled by the router weight.
Status Executor::moe_ffn(const LayerWeights& L, int l, int64_t n) {
  backend::Backend& be = *be_;
  const Config& c = *cfg_;
  const Tensor x = x_.first_rows(n), xn = xn_.first_rows(n), logits = logits_.first_rows(n),
               sgate = sgate_.first_rows(n);
  const bool shared = L.gate_shexp.present();
  if (shared) {
    const backend::WeightView w[] = {L.gate_inp.view(), L.gate_inp_shexp.view()};
    const Tensor y[] = {logits, sgate};
    be.matmul_multi(w, xn, y);
  } else {
    be.matmul(L.gate_inp.view(), xn, logits);
  }
  // Prefetch: the next layer's router on this layer's residual stream, normed as the next layer
  // will norm it (xg_ is free until the experts gather their rows), fetched with this router's
  // logits (one wait for the backend either way).
  const LayerWeights* next = placement_ ? placement_->predictor(l) : nullptr;
  if (next) {
    const Tensor pxn = xg_.first_rows(n), plogits = pred_logits_.first_rows(n);
    be.rms_norm(x, next->ffn_norm.view(), c.rms_eps, pxn);
    be.matmul(next->gate_inp.view(), pxn, plogits);
  }
  const std::span<float> lh(logits_host_.data(), size_t(n) * size_t(c.n_expert));
  be.download(logits, lh.data());
  if (next) {
    const std::span<float> ph(pred_host_.data(), size_t(n) * size_t(c.n_expert));
    be.download(pred_logits_.first_rows(n), ph.data());
    route_experts(ph, int(n), c.n_expert, c.n_expert_used, c.expert_weights_norm, c.expert_weights_scale, pred_);
  }
  route_experts(lh, int(n), c.n_expert, c.n_expert_used, c.expert_weights_norm, c.expert_weights_scale, routing_);
  group_by_expert(routing_, c.n_expert, batches_);
  const std::span<const int32_t> all(all_rows_.data(), size_t(n));
  if (shared) {
    // qwen2moe's shared expert sees every token, scaled by sigmoid(gate_inp_shexp . xn).
    be.download(sgate, sgate_host_.data());
    for (int64_t t = 0; t < n; ++t) sgate_host_[size_t(t)] = 1.0f / (1.0f + std::exp(-sgate_host_[size_t(t)]));
    expert(L.gate_shexp.view(), L.up_shexp.view(), L.down_shexp.view(), xn, all,
           std::span<const float>(sgate_host_.data(), size_t(n)), n);
  }
  // Experts in groups the placement can hold at once (one group without a placement, or with one
  // that holds any layer's experts), each group placed then computed, in ascending expert order.
  const size_t group = std::clamp<size_t>(placement_ ? placement_->max_batches_per_place() : batches_.size(), 1,
                                         std::max<size_t>(batches_.size(), 1));
  sites_.resize(batches_.size());
  double host_s = 0;
  for (size_t g0 = 0; g0 < batches_.size(); g0 += group) {
    const size_t g1 = std::min(batches_.size(), g0 + group);
    if (placement_) {
      const std::span<const ExpertBatch> gb(batches_.data() + g0, g1 - g0);
      SLUICE_RETURN_IF_ERROR(placement_->place(l, int(n), gb, std::span<ExpertPlacement::Site>(sites_.data() + g0, g1 - g0)));
      if (next && g1 == batches_.size()) placement_->predicted(l + 1, pred_);
      // The host's experts read the normed rows: fetch them now, while this backend's queue holds
      // nothing the download would wait for (a GPU has one compute queue).
      if (std::any_of(sites_.begin() + ptrdiff_t(g0), sites_.begin() + ptrdiff_t(g1),
                      [](const ExpertPlacement::Site& s) { return s.host; })) {
        xn_host_.resize(size_t(n * c.n_embd));
        be.download(xn, xn_host_.data());
      }
    }
    host_batches_.clear();
    dev_batches_.clear();
    for (size_t i = g0; i < g1; ++i) {
      if (placement_ && sites_[i].host) {
        host_batches_.push_back(i);
      } else if (n == 1) {
        dev_batches_.push_back(i);
      }
    }
    // Decode: this backend's experts all read the token's one normed row, so they run together.
    experts_decode(L, x, xn);
    for (size_t i = g0; i < g1; ++i) {
      if ((placement_ && sites_[i].host) || n == 1) continue;
      const ExpertBatch& b = batches_[i];
      const int64_t m = int64_t(b.rows.size());
      Tensor in = xn;
      if (m != n) {  // else every token chose this expert: its rows are 0 .. n-1, xn as it is
        in = xg_.first_rows(m);
        be.gather_rows(xn, b.rows, in);
      }
      if (placement_) {
        expert(sites_[i].gate, sites_[i].up, sites_[i].down, in, b.rows, b.weights, n);
      } else {
        expert(L.gate_exps.expert(b.expert), L.up_exps.expert(b.expert), L.down_exps.expert(b.expert), in, b.rows,
               b.weights, n);
      }
    }
    // The host computes its experts while this backend runs the ones just issued.
    if (!host_batches_.empty()) {
      SLUICE_CHECK(host_ != nullptr, "executor: a placement gave the host experts but there is no host executor");
      const auto t0 = std::chrono::steady_clock::now();
      host_->host_experts(*this, n);
      host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  if (placement_) placement_->done(l, host_s);
  return Status::ok();
}

// One token's experts on this backend (dev_batches_), in groups of up to kDecodeGroup: the gate
// and up projections of the group as one matmul_multi (rows k of gate_/up_), one SwiGLU over the
// k rows, the down projections as one matmul_each, the outputs added into the residual row in
// expert order (the sums expert() would make one expert at a time, in one op each).
void Executor::experts_decode(const LayerWeights& L, const Tensor& x, const Tensor& xn) {
  constexpr size_t kDecodeGroup = 8;  // the rows one decode op takes (a GPU's int8 activation)
  backend::Backend& be = *be_;
  const int64_t e = cfg_->n_embd;
  for (size_t c0 = 0; c0 < dev_batches_.size(); c0 += kDecodeGroup) {
    const size_t k = std::min(kDecodeGroup, dev_batches_.size() - c0);
    gu_w_.clear();
    gu_y_.clear();
    down_w_.clear();
    down_x_.clear();
    down_y_.clear();
    scales_.clear();
    int64_t n_ff = -1;
    for (size_t j = 0; j < k; ++j) {
      const size_t i = dev_batches_[c0 + j];
      const ExpertBatch& b = batches_[i];
      const backend::WeightView gw = placement_ ? sites_[i].gate : L.gate_exps.expert(b.expert);
      const backend::WeightView uw = placement_ ? sites_[i].up : L.up_exps.expert(b.expert);
      const backend::WeightView dw = placement_ ? sites_[i].down : L.down_exps.expert(b.expert);
      SLUICE_CHECK(n_ff < 0 || gw.ne1 == n_ff, "executor: experts of one layer differ in width");
      n_ff = gw.ne1;
      gu_w_.push_back(gw);
      gu_w_.push_back(uw);
      down_w_.push_back(dw);
      scales_.push_back(b.weights[0]);
    }
    // Dense [k][n_ff] views of the gate/up buffers ([max_batch][n_ff_max] each), [k][n_embd] of ey_.
    SLUICE_CHECK(int64_t(k) * n_ff <= gate_.rows * gate_.stride && int64_t(k) * e <= ey_.rows * ey_.stride,
                 "executor: decode expert buffers too small");
    const Tensor g{gate_.data, gate_.dtype, n_ff, int64_t(k), n_ff};
    const Tensor u{up_.data, up_.dtype, n_ff, int64_t(k), n_ff};
    const Tensor y{ey_.data, ey_.dtype, e, int64_t(k), e};
    for (size_t j = 0; j < k; ++j) {
      gu_y_.push_back(g.row_range(int64_t(j), 1));
      gu_y_.push_back(u.row_range(int64_t(j), 1));
      down_x_.push_back(g.row_range(int64_t(j), 1));
      down_y_.push_back(y.row_range(int64_t(j), 1));
    }
    be.matmul_multi(gu_w_, xn, gu_y_);
    be.swiglu(g, u, g);
    be.matmul_each(down_w_, down_x_, down_y_);
    be.add_rows_scaled(x, 0, y, scales_);
  }
}

void Executor::host_experts(Executor& main, int64_t n) {
  backend::Backend& be = *be_;
  const int64_t e = cfg_->n_embd;
  SLUICE_CHECK(handoff_.size() >= size_t(n * e), "executor: hand-off buffer too small");
  // The normed rows, which the main executor fetched before issuing its own experts (a GPU has one
  // queue: fetching them now would wait for those experts and serialize the two executors).
  be.upload(xn_.first_rows(n), main.xn_host_.data());
  if (zeros_.size() < size_t(n * e)) zeros_.assign(size_t(n * e), 0.0f);
  const Tensor acc = x_.first_rows(n), xn = xn_.first_rows(n);
  be.upload(acc, zeros_.data());
  for (size_t i : main.host_batches_) {
    const ExpertBatch& b = main.batches_[i];
    const ExpertPlacement::Site& site = main.sites_[i];
    const int64_t m = int64_t(b.rows.size());
    Tensor in = xn;
    if (m != n) {
      in = xg_.first_rows(m);
      be.gather_rows(xn, b.rows, in);
    }
    expert(site.gate, site.up, site.down, in, b.rows, b.weights, n);
  }
  be.download(acc, handoff_.data());
  const Tensor dst = main.ey_.first_rows(n);
  main.be_->upload(dst, handoff_.data());
  main.be_->add(main.x_.first_rows(n), dst);
}

void Executor::move_x(Executor& to, int64_t n, std::span<float> buf) {
  SLUICE_CHECK(buf.size() >= size_t(n * cfg_->n_embd), "executor: hand-off buffer too small");
  flush(n);
  be_->download(x_.first_rows(n), buf.data());  // waits for this executor's last layer
  to.be_->upload(to.x_.first_rows(n), buf.data());
}

void Executor::mirror_kv(Executor& to, int l, int64_t n, std::span<const Segment> segs, std::span<float> buf) {
  SLUICE_CHECK(to.kv_.has(l), "executor: mirror target has no KV cache for the layer");
  const Tensor src[] = {k_.first_rows(n), v_.first_rows(n)};
  const Tensor dst[] = {to.k_.first_rows(n), to.v_.first_rows(n)};
  for (int i = 0; i < 2; ++i) {
    SLUICE_CHECK(buf.size() >= size_t(n * src[i].cols), "executor: hand-off buffer too small");
    be_->download(src[i], buf.data());
    to.be_->upload(dst[i], buf.data());
    for (const Segment& s : segs) {
      const int end = s.pos0 + int(s.n);
      const Tensor cache = i == 0 ? to.kv_.k(l, end, s.map) : to.kv_.v(l, end, s.map);
      to.be_->store_rows(dst[i].row_range(s.row0, s.n), cache, s.pos0);
    }
  }
}

}  // namespace sluice::model
