// The attention KV cache: per layer, K and V rows for every position in [0, n_ctx), F16 (like
// llama.cpp's default cache type: half the bytes of f32, and the precision its greedy outputs
// are computed with). Rows [0, n_past) are valid.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace sluice::model {

class KvCache {
 public:
  // Allocates {K, V} tensors of [n_ctx rows, n_embd_k/v cols] on `be` for every layer l < n_layer
  // where layers[l] (empty: all of them); the others have none (has(l) is false).
  Status init(backend::Backend& be, int n_layer, int n_ctx, int n_embd_k, int n_embd_v,
              const std::vector<bool>& layers = {});

  bool has(int layer) const { return layer >= 0 && size_t(layer) < k_.size() && k_[size_t(layer)].data != nullptr; }

  const backend::Tensor& k(int layer) const { return k_[size_t(layer)]; }  // [n_ctx, n_head_kv*head_dim] f16
  const backend::Tensor& v(int layer) const { return v_[size_t(layer)]; }  // [n_ctx, n_head_kv*head_dim] f16
  int n_ctx() const { return n_ctx_; }
  int n_past() const { return n_past_; }
  void set_n_past(int n) { n_past_ = n; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::vector<backend::Tensor> k_, v_;
  int n_ctx_ = 0;
  int n_past_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace sluice::model
