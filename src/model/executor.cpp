#include "model/executor.h"

#include <cmath>

namespace sluice::model {

using backend::Tensor;

Status Executor::init(backend::Backend& be, const Config& cfg, int n_ctx, int max_batch,
                      const std::vector<bool>& kv_layers, backend::WeightView rope_freqs) {
  be_ = &be;
  cfg_ = &cfg;
  rope_freqs_ = rope_freqs;
  SLUICE_RETURN_IF_ERROR(kv_.init(be, cfg.n_layer, n_ctx, cfg.n_embd_k(), cfg.n_embd_v(), kv_layers));
  auto f32 = [&](int64_t cols) { return be.alloc(backend::DType::kF32, cols, max_batch); };
  SLUICE_ASSIGN_OR_RETURN(x_, f32(cfg.n_embd));
  SLUICE_ASSIGN_OR_RETURN(xn_, f32(cfg.n_embd));
  SLUICE_ASSIGN_OR_RETURN(q_, f32(cfg.n_embd_q()));
  SLUICE_ASSIGN_OR_RETURN(k_, f32(cfg.n_embd_k()));
  SLUICE_ASSIGN_OR_RETURN(v_, f32(cfg.n_embd_v()));
  SLUICE_ASSIGN_OR_RETURN(attn_, f32(cfg.n_head * cfg.head_dim_v));
  SLUICE_ASSIGN_OR_RETURN(gate_, f32(cfg.n_ff));
  SLUICE_ASSIGN_OR_RETURN(up_, f32(cfg.n_ff));
  return Status::ok();
}

void Executor::layer(const LayerWeights& L, int l, int64_t n, int pos0) {
  SLUICE_CHECK(kv_.has(l), "executor: layer has no KV cache on this executor");
  backend::Backend& be = *be_;
  const Config& c = *cfg_;
  const Tensor x = x_.first_rows(n), xn = xn_.first_rows(n), q = q_.first_rows(n), k = k_.first_rows(n),
               v = v_.first_rows(n), attn = attn_.first_rows(n), gate = gate_.first_rows(n), up = up_.first_rows(n);
  const float eps = c.rms_eps;
  backend::RopeParams rq{c.rope_mode, c.n_head, c.head_dim, c.n_rot, c.rope_freq_base, c.rope_freq_scale, rope_freqs_};
  backend::RopeParams rk = rq;
  rk.n_head = c.n_head_kv;
  const backend::AttentionParams ap{c.n_head, c.n_head_kv, c.head_dim, 1.0f / std::sqrt(float(c.head_dim)), pos0};

  // Attention block: x += Wo . attention(rope(norm(Wq xn)), rope(norm(Wk xn)), Wv xn).
  be.rms_norm(x, L.attn_norm.view(), eps, xn);
  const backend::WeightView qkv_w[] = {L.wq.view(), L.wk.view(), L.wv.view()};
  const Tensor qkv_y[] = {q, k, v};
  be.matmul_multi(qkv_w, xn, qkv_y);
  if (L.bq.present()) be.add_bias(q, L.bq.view());
  if (L.bk.present()) be.add_bias(k, L.bk.view());
  if (L.bv.present()) be.add_bias(v, L.bv.view());
  if (L.q_norm.present()) be.rms_norm(q, L.q_norm.view(), eps, q);  // per head: group = head_dim
  if (L.k_norm.present()) be.rms_norm(k, L.k_norm.view(), eps, k);
  be.rope(q, rq, pos0);
  be.rope(k, rk, pos0);
  be.store_rows(k, kv_.k(l), pos0);
  be.store_rows(v, kv_.v(l), pos0);
  be.attention(q, kv_.k(l), kv_.v(l), attn, ap);
  be.matmul(L.wo.view(), attn, xn);
  be.add(x, xn);
  // Feed-forward block: x += W_down . (silu(W_gate xn) * (W_up xn)).
  be.rms_norm(x, L.ffn_norm.view(), eps, xn);
  const backend::WeightView gate_up_w[] = {L.w_gate.view(), L.w_up.view()};
  const Tensor gate_up_y[] = {gate, up};
  be.matmul_multi(gate_up_w, xn, gate_up_y);
  be.swiglu(gate, up, gate);
  be.matmul(L.w_down.view(), gate, xn);
  be.add(x, xn);
}

void Executor::move_x(Executor& to, int64_t n, std::span<float> buf) {
  SLUICE_CHECK(buf.size() >= size_t(n * cfg_->n_embd), "executor: hand-off buffer too small");
  be_->download(x_.first_rows(n), buf.data());  // waits for this executor's last layer
  to.be_->upload(to.x_.first_rows(n), buf.data());
}

void Executor::mirror_kv(Executor& to, int l, int64_t n, int pos0, std::span<float> buf) {
  SLUICE_CHECK(to.kv_.has(l), "executor: mirror target has no KV cache for the layer");
  const Tensor src[] = {k_.first_rows(n), v_.first_rows(n)};
  const Tensor dst[] = {to.k_.first_rows(n), to.v_.first_rows(n)};
  const Tensor cache[] = {to.kv_.k(l), to.kv_.v(l)};
  for (int i = 0; i < 2; ++i) {
    SLUICE_CHECK(buf.size() >= size_t(n * src[i].cols), "executor: hand-off buffer too small");
    be_->download(src[i], buf.data());
    to.be_->upload(dst[i], buf.data());
    to.be_->store_rows(dst[i], cache[i], pos0);
  }
}

}  // namespace sluice::model
