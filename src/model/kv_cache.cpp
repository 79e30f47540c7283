#include "model/kv_cache.h"

namespace sluice::model {

Status KvCache::init(backend::Backend& be, int n_layer, int n_ctx, int n_embd_k, int n_embd_v,
                     const std::vector<bool>& layers) {
  k_.clear();
  v_.clear();
  bytes_ = 0;
  for (int l = 0; l < n_layer; ++l) {
    if (!layers.empty() && (size_t(l) >= layers.size() || !layers[size_t(l)])) {
      k_.emplace_back();
      v_.emplace_back();
      continue;
    }
    SLUICE_ASSIGN_OR_RETURN(auto k, be.alloc(backend::DType::kF16, n_embd_k, n_ctx));
    SLUICE_ASSIGN_OR_RETURN(auto v, be.alloc(backend::DType::kF16, n_embd_v, n_ctx));
    k_.push_back(k);
    v_.push_back(v);
    bytes_ += uint64_t(n_ctx) * uint64_t(n_embd_k + n_embd_v) * 2;
  }
  n_ctx_ = n_ctx;
  n_past_ = 0;
  return Status::ok();
}

}  // namespace sluice::model
