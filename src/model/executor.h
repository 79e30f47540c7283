// An executor of the layer loop: one backend with its own activation buffers and KV cache, able to
// run any layer whose weights it is handed. The loop has one executor on the model's backend and,
// for hybrid execution (stream/'s device pipeline with CPU-computed layers), a second on the host
// CPU backend: each layer of a pass runs on the executor its LayerSource names, and the residual
// stream moves between them (n_tokens x n_embd floats) only where consecutive layers change
// executor. Layers that may run on either keep their KV cache on both executors, and every pass
// writes its new K/V rows to both, so the choice can change from pass to pass (prefill on the GPU,
// decode on the CPU) without ever reading a stale cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/moe.h"
#include "model/weights.h"

namespace sluice::model {

// One sequence's rows of a forward pass: a pass runs the tokens of one or more sequences (the
// server's batches), each at its own positions and over its own KV blocks.
struct Segment {
  int64_t row0 = 0;  // its first activation row in the pass
  int64_t n = 0;     // its tokens
  int pos0 = 0;      // the position of its first token
  int64_t map = -1;  // offset of its row map in the pass's (KvCache::set_rows); -1: rows are positions
};

class Executor {
 public:
  // Activations of max_batch rows; a KV cache of pool_rows rows (model/kv_cache.h) for the layers
  // where kv_layers[l] (empty: every layer), with room for map_rows entries of row maps per pass.
  Status init(backend::Backend& be, const Config& cfg, int pool_rows, int64_t map_rows, int max_batch,
              const std::vector<bool>& kv_layers, backend::WeightView rope_freqs);

  backend::Backend& backend() const { return *be_; }
  KvCache& kv() { return kv_; }
  const KvCache& kv() const { return kv_; }
  bool has_kv(int layer) const { return kv_.has(layer); }

  // Activation views of the first n rows. x(n) is whole only after flush(n) (below).
  backend::Tensor x(int64_t n) const { return x_.first_rows(n); }
  backend::Tensor xn(int64_t n) const { return xn_.first_rows(n); }

  // A dense layer without a post-FFN norm leaves its last residual add pending (its FFN output
  // waits in xn) so that the next layer's attention norm does the add in the same op
  // (Backend::add_rms_norm: one launch fewer per layer on a GPU). flush(n) does the pending add
  // (if any); the layer loop calls it before x is read or moved anywhere else (hidden-state hooks,
  // hand-offs between executors, the output head) and at the end of every pass.
  // SLUICE_FUSE_RESIDUAL=0 (read at init; A/B runs) adds at once instead.
  void flush(int64_t n);
  // A new pass: a residual add left pending by a pass that ended early (an error) is dropped.
  void begin_pass() { pending_add_ = false; }

  // x += attention block + feed-forward block of `L` for the pass's n tokens, the sequences'
  // segments covering rows [0, n) in order. Each segment's K/V rows are stored into this
  // executor's cache (has_kv(layer) must hold) and its queries attend over its own positions.
  // Errors come only from an expert placement.
  Status layer(const LayerWeights& L, int layer, int64_t n, std::span<const Segment> segs);

  // The same layer, its matrices split by output rows between this executor and `host` (row
  // split, LayerSource::split_host): this one computes rows [0, r) of each matrix from `L` (each
  // matrix cut to its r rows, TensorRef::ne1), `host` rows [r, N) from `H` (whole matrices), both
  // at once (this backend's ops are issued first, then the host computes, then they exchange the
  // parts through `buf`, pinned memory of n * split_buffer_floats() floats). Only output rows are
  // split, never the reduction, so every element is the dot product of the unsplit layer. The
  // residual stream, norms, RoPE, the KV cache and attention stay here (has_kv(layer)); `host`
  // needs no cache for it. Dense layers only (a mixture of experts is an error).
  Status split_layer(const LayerWeights& L, const LayerWeights& H, Executor& host, int layer, int64_t n,
                     std::span<const Segment> segs, std::span<float> buf);
  // Floats per token the hand-off buffer of split_layer needs (the widest split output).
  static int64_t split_buffer_floats(const Config& cfg);
  // The largest pass of a model with this config, as the backend's scratch sees it (its matrices'
  // widest input, attention's heads): what Backend::reserve_scratch allocates at load and memory
  // plans count (backend::cuda_scratch_bytes).
  static backend::ScratchShape scratch_shape(const Config& c, int max_batch, int kv_positions, int max_sequences);

  // Mixture of experts: routed experts run where `placement` says, those it gives the host on
  // `host` (another executor, which needs no KV cache for it); `buf` carries activations between
  // them (as for move_x). nullptr placement: every expert runs here.
  void set_experts(ExpertPlacement* placement, Executor* host, std::span<float> buf) {
    placement_ = placement;
    host_ = host;
    handoff_ = buf;
  }

  // The residual stream of the last n rows computed here, copied into `to`'s x through the host
  // buffer `buf` (n * max(n_embd, n_embd_k, n_embd_v) floats at least). Pinned memory there: a
  // pageable upload is staged through the copy engine, which streaming keeps busy with whole layers.
  void move_x(Executor& to, int64_t n, std::span<float> buf);
  // The K/V rows layer() just produced (post-RoPE), stored at each segment's positions in `to`'s
  // cache of the same layer: both executors' caches stay identical in content (each backend's own f32->f16
  // store, the same rounding).
  void mirror_kv(Executor& to, int layer, int64_t n, std::span<const Segment> segs, std::span<float> buf);

 private:
  // The attention block's middle on q/k/v (biases, Q/K norms, RoPE, K/V stored into this
  // executor's cache, attention into attn_). stored: RoPE and the store were done with the
  // products (Backend::matmul_rope_store_kv, seq_rows_ from kv_rows); only the attention is left.
  void attend(const LayerWeights& L, int layer, int64_t n, std::span<const Segment> segs, bool stored = false);
  // The RoPE parameters of layer `layer`'s queries and keys.
  struct RopePair {
    backend::RopeParams q, k;
  };
  RopePair rope_params(int layer) const;
  // seq_rows_ = each segment's rows, position and cache views of layer `layer`.
  void kv_rows(int layer, std::span<const Segment> segs);
  // x += xn (the attention output, post-normed where the layer has it); xn = ffn_norm(x).
  void attention_residual(const LayerWeights& L, int64_t n);
  // The FFN's activation on gate/up rows: gate = act(gate) * up.
  void activation(const backend::Tensor& gate, const backend::Tensor& up);
  // x += xn (the FFN output, post-normed where the layer has it).
  void ffn_residual(const LayerWeights& L, int64_t n);
  // x += the FFN block of `L` on the normed input xn (dense SwiGLU, or the routed experts).
  Status ffn(const LayerWeights& L, int layer, int64_t n);
  Status moe_ffn(const LayerWeights& L, int layer, int64_t n);
  // Decode (one token): the experts in dev_batches_ on this backend, several per op.
  void experts_decode(const LayerWeights& L, const backend::Tensor& x, const backend::Tensor& xn);
  // The host's share of a placed MoE layer: its experts on the normed rows in handoff_, summed
  // into this (host) executor's x, then added into `main`'s x.
  void host_experts(Executor& main, int64_t n);
  // x[rows] += weights * W_down . (silu(W_gate in) * (W_up in)) for one expert's batch `in` (the
  // pass has n rows).
  void expert(const backend::WeightView& gate, const backend::WeightView& up, const backend::WeightView& down,
              const backend::Tensor& in, std::span<const int32_t> rows, std::span<const float> weights, int64_t n);

  // xn = rms_norm(x) with L's attention norm, the pending residual add (flush) in the same op.
  void attention_norm(const LayerWeights& L, int64_t n);

  backend::Backend* be_ = nullptr;
  const Config* cfg_ = nullptr;
  bool pending_add_ = false;  // x += xn still to do (flush)
  bool defer_add_ = true;     // leave the residual add pending (SLUICE_FUSE_RESIDUAL=0: never)
  backend::WeightView rope_freqs_;  // in this backend's memory
  KvCache kv_;
  // Activations, [max_batch rows, width] each.
  backend::Tensor x_;     // residual stream       [n_embd]
  backend::Tensor xn_;    // normed / projected    [n_embd]
  backend::Tensor q_;     // queries               [n_head * head_dim]
  backend::Tensor k_;     // keys                  [n_head_kv * head_dim]
  backend::Tensor v_;     // values                [n_head_kv * head_dim]
  backend::Tensor attn_;  // attention output      [n_head * head_dim_v]
  backend::Tensor gate_;  // ffn gate, then swiglu [n_ff_max]
  backend::Tensor up_;    // ffn up                [n_ff_max]
  std::vector<backend::SeqRows> seq_rows_;  // layer(): the pass's sequences, their cache views
  // Mixture of experts (Config::moe()).
  backend::Tensor logits_;  // router logits          [n_expert]
  backend::Tensor pred_logits_;  // the next layer's router on this layer's state [n_expert] (prefetch)
  backend::Tensor sgate_;   // shared expert's gate   [1]
  backend::Tensor xg_;      // one expert's rows      [n_embd]
  backend::Tensor ey_;      // one expert's output    [n_embd]
  std::vector<float> logits_host_, sgate_host_, pred_host_;
  MoeRouting routing_, pred_;
  std::vector<ExpertBatch> batches_;
  std::vector<int32_t> all_rows_;
  ExpertPlacement* placement_ = nullptr;
  Executor* host_ = nullptr;
  std::span<float> handoff_;
  std::vector<ExpertPlacement::Site> sites_;
  std::vector<size_t> host_batches_;  // indices into batches_ of the host's experts
  std::vector<size_t> dev_batches_;   // decode: indices into batches_ of this backend's experts
  std::vector<backend::WeightView> gu_w_, down_w_;  // experts_decode's op arguments
  std::vector<backend::Tensor> gu_y_, down_x_, down_y_;
  std::vector<float> scales_;
  std::vector<float> zeros_;
  std::vector<float> xn_host_;  // the normed rows the host's experts read
};

}  // namespace sluice::model
