// The model's weights as views into the mmapped GGUF file: name -> {type, shape, pointer}. Every
// tensor the architecture needs is checked at load for presence, format and shape, so the layer
// loop never sees a malformed weight.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/moe.h"

namespace sluice::gguf {
class File;
}

namespace sluice::model {

struct TensorRef {
  std::string name;               // GGUF tensor name, for messages
  quant::Type type = quant::Type::kF32;
  int64_t ne0 = 0;                // innermost (contiguous) dimension
  int64_t ne1 = 1;
  int64_t ne2 = 1;                // experts, for stacked expert tensors (each a [ne0, ne1] matrix)
  const void* data = nullptr;     // into the file mapping; nullptr when absent (optional tensor)
  uint64_t nbytes = 0;
  bool packed = false;            // data is in the backend's packed layout (backend::WeightView)
  bool grouped = false;           // data is in the CUDA backend's grouped Q6_K / Q8_0 layout (backend::WeightView)

  bool present() const { return data != nullptr; }
  // The whole tensor as one matrix (stacked experts: ne1 * ne2 rows, expert after expert).
  backend::WeightView view() const { return {type, ne0, ne1 * ne2, data, packed, grouped}; }
  // Expert e of a stacked expert tensor.
  backend::WeightView expert(int64_t e) const { return view().rows(e * ne1, ne1); }
  uint64_t expert_bytes() const { return nbytes / uint64_t(ne2); }
  // Points this tensor at the backend's copy returned by Backend::upload_weight (its memory, and
  // possibly a layout of its own).
  void adopt(const backend::WeightView& uploaded) {
    data = uploaded.data;
    packed = uploaded.packed;
    grouped = uploaded.grouped;
  }
};

struct LayerWeights {
  TensorRef attn_norm;  // [n_embd]                         f32
  TensorRef wq;         // [n_embd, n_head * head_dim]
  TensorRef wk;         // [n_embd, n_head_kv * head_dim]
  TensorRef wv;         // [n_embd, n_head_kv * head_dim]
  TensorRef wo;         // [n_head * head_dim, n_embd]
  TensorRef bq;         // [n_head * head_dim]               f32, optional
  TensorRef bk;         // [n_head_kv * head_dim]            f32, optional
  TensorRef bv;         // [n_head_kv * head_dim]            f32, optional
  TensorRef q_norm;     // [head_dim]                        f32, optional (qwen3)
  TensorRef k_norm;     // [head_dim]                        f32, optional (qwen3)
  TensorRef ffn_norm;   // [n_embd]                          f32
  TensorRef w_gate;     // [n_embd, n_ff]
  TensorRef w_up;       // [n_embd, n_ff]
  TensorRef w_down;     // [n_ff, n_embd]
  // Mixture of experts (Config::moe()) in place of w_gate/w_up/w_down.
  TensorRef gate_inp;       // [n_embd, n_expert]                router
  TensorRef gate_exps;      // [n_embd, n_ff_exp, n_expert]
  TensorRef up_exps;        // [n_embd, n_ff_exp, n_expert]
  TensorRef down_exps;      // [n_ff_exp, n_embd, n_expert]
  TensorRef gate_inp_shexp; // [n_embd, 1]                       shared expert's gate (qwen2moe)
  TensorRef gate_shexp;     // [n_embd, n_ff_shexp]
  TensorRef up_shexp;       // [n_embd, n_ff_shexp]
  TensorRef down_shexp;     // [n_ff_shexp, n_embd]
  // Gemma 3: RMSNorm of the attention block's and the FFN block's output before the residual add.
  TensorRef post_attn_norm; // [n_embd]                          f32, optional
  TensorRef post_ffn_norm;  // [n_embd]                          f32, optional

  static constexpr size_t kTensors = 24;
  // Every tensor of the layer (absent ones included), for code that treats them alike: uploads,
  // streaming copies, byte counts.
  std::array<TensorRef*, kTensors> tensors();
  std::array<const TensorRef*, kTensors> tensors() const;
  bool moe() const { return gate_inp.present(); }
  // Bytes of the routed experts (the stacked tensors), the part a token reads only in part.
  uint64_t expert_bytes() const { return gate_exps.nbytes + up_exps.nbytes + down_exps.nbytes; }
};

// The fields behind LayerWeights::tensors(), as member pointers (for code holding several views
// of one layer).
using LayerTensorField = TensorRef LayerWeights::*;
inline constexpr LayerTensorField kLayerTensorFields[LayerWeights::kTensors] = {
    &LayerWeights::attn_norm, &LayerWeights::wq,        &LayerWeights::wk,         &LayerWeights::wv,
    &LayerWeights::wo,        &LayerWeights::bq,        &LayerWeights::bk,         &LayerWeights::bv,
    &LayerWeights::q_norm,    &LayerWeights::k_norm,    &LayerWeights::ffn_norm,   &LayerWeights::w_gate,
    &LayerWeights::w_up,      &LayerWeights::w_down,    &LayerWeights::gate_inp,   &LayerWeights::gate_exps,
    &LayerWeights::up_exps,   &LayerWeights::down_exps, &LayerWeights::gate_inp_shexp, &LayerWeights::gate_shexp,
    &LayerWeights::up_shexp,  &LayerWeights::down_shexp, &LayerWeights::post_attn_norm,
    &LayerWeights::post_ffn_norm};

inline std::array<TensorRef*, LayerWeights::kTensors> LayerWeights::tensors() {
  std::array<TensorRef*, kTensors> t{};
  for (size_t i = 0; i < kTensors; ++i) t[i] = &(this->*kLayerTensorFields[i]);
  return t;
}
inline std::array<const TensorRef*, LayerWeights::kTensors> LayerWeights::tensors() const {
  std::array<const TensorRef*, kTensors> t{};
  for (size_t i = 0; i < kTensors; ++i) t[i] = &(this->*kLayerTensorFields[i]);
  return t;
}

// Bytes of `be`'s own layout of t (Backend::repacked_bytes), 0 where it computes on t as it lies.
// Stacked experts keep the file's layout where a row group of that layout would straddle two
// experts (TensorRef::expert cuts at expert boundaries).
int64_t repacked_bytes(const backend::Backend& be, const TensorRef& t);

struct Weights {
  TensorRef token_embd;   // [n_embd, n_vocab]
  TensorRef output_norm;  // [n_embd]                        f32
  TensorRef output;       // [n_embd, n_vocab]; token_embd when the file has no output.weight (tied)
  TensorRef rope_freqs;   // [n_rot / 2]                     f32, optional (Llama 3.1 frequency factors)
  std::vector<LayerWeights> layers;  // n_layer
  int n_expert = 0, n_expert_used = 0;  // mixture of experts (Config)

  // Bytes read from weights per decoded token: every layer matrix and vector (of the routed
  // experts, the n_expert_used of n_expert a token picks), the output matrix and one row of
  // token_embd.
  uint64_t bytes_per_token() const;
  // One layer's share of bytes_per_token (its routed experts: the n_expert_used of a token).
  uint64_t layer_bytes_per_token(size_t layer) const;
  // Bytes of every weight (the file's tensors; token_embd whole).
  uint64_t bytes_total() const;
};

// Where the layer loop gets its weights. The loop asks for layer l's weights right before computing
// it and hands them back right after, so a source may keep them anywhere: the default source
// returns views into the mmapped file, a streaming source (stream/) returns a RAM slot it has just
// filled from disk and refills that slot once it is released. The loop cannot tell which.
// Contract: each pass calls begin_pass once, then acquire(l)/release(l) for l = 0 .. n_layer-1 in
// order; a layer's pointers are valid from acquire until release (the backend must be done with
// them: callers sync a backend whose ops may still be running). Errors (I/O, model file changed)
// mean the weights are unusable: the pass must stop and report, never compute.
class LayerSource {
 public:
  virtual ~LayerSource() = default;
  // Embeddings, output head, final norm, rope factors (layers empty); valid for the source's life.
  virtual const Weights& globals() const = 0;
  // Once per forward pass of n_tokens tokens, before the first acquire.
  virtual Status begin_pass(int n_tokens) = 0;
  virtual Result<const LayerWeights*> acquire(int layer) = 0;
  virtual void release(int layer) = 0;
  // True where the host may overwrite a layer's memory right after release(): the loop then waits
  // for the backend before releasing. False for resident weights and for sources that order reuse
  // on the device themselves (Backend marks).
  virtual bool release_needs_sync() const { return true; }
  // True where acquire() returns the same pointers every pass (resident weights): a decode pass is
  // then a replayable step (Backend::begin_step).
  virtual bool weights_fixed() const { return false; }
  // A pass of a source with weights_fixed() ran as a replayed step: between begin_pass and the
  // next one nothing was acquired or released; the layers with run[l] ran (run empty: all).
  // Sources that count the bytes a pass reads count them here.
  virtual void pass_replayed(const std::vector<bool>& run) {}

  // Layer skip (Model::set_layer_mask): whether a pass may leave out the layers with run[l] ==
  // false, calling neither acquire nor release for them. A source that fetches ahead in layer
  // order can leave out layers it keeps resident, or every layer it streams (its ring then waits
  // for the next full pass unchanged); false: the loop acquires and releases a skipped layer
  // without computing it (fetched, not run), keeping the order.
  virtual bool can_skip(const std::vector<bool>& run) const { return false; }
  // Whether `layer`'s weights are read where they lie (no disk read, no copy to the device).
  virtual bool resident(int layer) const { return false; }

  // Hybrid execution: a second executor, the host CPU, computing some layers where their weights
  // lie in host memory while the main backend's copy queue streams others (model/executor.h).
  struct HostExecutor {
    backend::Backend* backend = nullptr;  // nullptr: every layer runs on the model's backend
    backend::WeightView rope_freqs;       // the rope factors in host memory (optional tensor)
  };
  virtual HostExecutor host_executor() { return {}; }
  // Layers the host executor may compute in some pass (the model keeps their KV cache on both).
  virtual bool host_capable(int layer) const { return false; }
  // Whether `layer` runs on the host executor in the current pass (decided by begin_pass); its
  // acquire() then returns views the host executor can read.
  virtual bool on_host(int layer) const { return false; }
  // Row-split execution (Executor::split_layer): layers whose matrices the two executors may
  // split by output rows in some pass (the model creates the host executor for them; their KV
  // cache stays on the main executor, which runs their attention).
  virtual bool split_capable(int layer) const { return false; }
  // Where `layer` runs split in the current pass (decided by begin_pass): the host executor's
  // weights of it, every matrix whole in host memory. acquire() then returns the main executor's
  // part: each split matrix (Q, K, V, O, gate, up, down) cut to its first rows (TensorRef::ne1),
  // the host computing the rest. nullptr: not split in this pass.
  virtual const LayerWeights* split_host(int layer) const { return nullptr; }
  // Mixture of experts: where each pass's routed experts run (nullptr: with their layer, from the
  // acquired layer's stacked tensors). With a placement, acquire() need not return the stacked
  // expert tensors, and the host executor computes the experts the placement gives it.
  virtual ExpertPlacement* experts() { return nullptr; }
};

// Resolves and validates every tensor of `arch` in `file` against `cfg`. Errors name the tensor
// and give expected and actual shape or type.
Result<Weights> load_weights(const gguf::File& file, const ArchSpec& arch, const Config& cfg);

}  // namespace sluice::model
