#include "model/kv_cache.h"

#include <algorithm>
#include <string>

namespace sluice::model {

void KvBlocks::init(int n_positions, int max_seqs, int n_ctx) {
  n_blocks_ = blocks_for(std::max(n_positions, 1));
  n_ctx_ = n_ctx;
  seqs_.assign(size_t(std::max(max_seqs, 1)), Seq{});
  seqs_[0].open = true;
  free_.clear();
  for (int32_t b = 0; b < n_blocks_; ++b) free_.insert(free_.end(), b);
  refs_.assign(size_t(n_blocks_), 0);
}

Result<int> KvBlocks::open() {
  for (size_t s = 1; s < seqs_.size(); ++s) {
    if (!seqs_[s].open) {
      seqs_[s] = Seq{};
      seqs_[s].open = true;
      return int(s);
    }
  }
  return out_of_memory("all " + std::to_string(seqs_.size()) + " sequences are open");
}

void KvBlocks::close(int seq) {
  if (seq <= 0 || !valid(seq)) return;
  truncate(seq, 0);
  seqs_[size_t(seq)].open = false;
}

int KvBlocks::blocks_needed(int seq, int n) const {
  return std::max(0, blocks_for(n) - int(seqs_[size_t(seq)].blocks.size()));
}

Status KvBlocks::reserve(int seq, int n) {
  SLUICE_CHECK(valid(seq) && n >= 0 && n <= n_ctx_, "kv blocks: bad reserve");
  const int need = blocks_needed(seq, n);
  if (need > n_free()) {
    return out_of_memory("KV cache: " + std::to_string(need) + " more blocks of " + std::to_string(kBlockSize) +
                         " positions needed, " + std::to_string(n_free()) + " of " + std::to_string(n_blocks_) +
                         " free");
  }
  std::vector<int32_t>& blocks = seqs_[size_t(seq)].blocks;
  for (int i = 0; i < need; ++i) {
    const int32_t b = *free_.begin();
    free_.erase(free_.begin());
    refs_[size_t(b)] = 1;
    blocks.push_back(b);
  }
  return Status::ok();
}

void KvBlocks::let_go(int32_t b) {
  if (--refs_[size_t(b)] == 0) free_.insert(b);
}

void KvBlocks::share(int src, int dst, int n) {
  SLUICE_CHECK(valid(src) && valid(dst) && src != dst && n >= 0 && n % kBlockSize == 0 && n <= n_past(src),
               "kv blocks: bad share");
  Seq& d = seqs_[size_t(dst)];
  SLUICE_CHECK(d.n_past == 0 && d.blocks.empty(), "kv blocks: share into a sequence that holds positions");
  const Seq& s = seqs_[size_t(src)];
  for (int i = 0; i < n / kBlockSize; ++i) {
    const int32_t b = s.blocks[size_t(i)];
    ++refs_[size_t(b)];
    d.blocks.push_back(b);
  }
  d.n_past = n;
}

void KvBlocks::set_n_past(int seq, int n) {
  SLUICE_CHECK(valid(seq) && n >= 0 && n <= int(seqs_[size_t(seq)].blocks.size()) * kBlockSize,
               "kv blocks: n_past outside the reserved blocks");
  seqs_[size_t(seq)].n_past = n;
}

void KvBlocks::truncate(int seq, int n) {
  if (!valid(seq)) return;
  Seq& s = seqs_[size_t(seq)];
  s.n_past = std::clamp(n, 0, s.n_past);
  // The next write goes to position n_past: not into a block another sequence holds.
  if (s.n_past % kBlockSize != 0 && refs_[size_t(s.blocks[size_t(s.n_past / kBlockSize)])] > 1) {
    s.n_past -= s.n_past % kBlockSize;
  }
  const size_t keep = size_t(blocks_for(s.n_past));
  while (s.blocks.size() > keep) {
    let_go(s.blocks.back());
    s.blocks.pop_back();
  }
}

bool KvBlocks::rows(int seq, int n, std::vector<int32_t>& out) const {
  const Seq& s = seqs_[size_t(seq)];
  SLUICE_CHECK(n >= 0 && n <= int(s.blocks.size()) * kBlockSize, "kv blocks: rows outside the reserved blocks");
  bool identity = true;
  for (int b = 0; b * kBlockSize < n; ++b) identity &= s.blocks[size_t(b)] == b;
  if (identity) return true;  // nothing to map (every decode step of a lone sequence)
  for (int p = 0; p < n; ++p) out.push_back(s.blocks[size_t(p / kBlockSize)] * kBlockSize + p % kBlockSize);
  return false;
}

Status KvCache::init(backend::Backend& be, int n_layer, int pool_rows, int n_embd_k, int n_embd_v, int64_t map_rows,
                     const std::vector<bool>& layers) {
  be_ = &be;
  k_.clear();
  v_.clear();
  bytes_ = 0;
  for (int l = 0; l < n_layer; ++l) {
    if (!layers.empty() && (size_t(l) >= layers.size() || !layers[size_t(l)])) {
      k_.emplace_back();
      v_.emplace_back();
      continue;
    }
    SLUICE_ASSIGN_OR_RETURN(auto k, be.alloc(backend::DType::kF16, n_embd_k, pool_rows));
    SLUICE_ASSIGN_OR_RETURN(auto v, be.alloc(backend::DType::kF16, n_embd_v, pool_rows));
    k_.push_back(k);
    v_.push_back(v);
    bytes_ += uint64_t(pool_rows) * uint64_t(n_embd_k + n_embd_v) * 2;
  }
  map_ = {};
  if (map_rows > 0) {
    SLUICE_ASSIGN_OR_RETURN(map_, be.alloc(backend::DType::kI32, map_rows, 1));
  }
  return Status::ok();
}

void KvCache::set_rows(std::span<const int32_t> rows) {
  if (rows.empty()) return;
  SLUICE_CHECK(int64_t(rows.size()) <= map_.cols, "kv cache: row map larger than its buffer");
  be_->upload_i32({map_.data, backend::DType::kI32, int64_t(rows.size()), 1, int64_t(rows.size())}, rows.data());
}

backend::Tensor KvCache::view(const backend::Tensor& t, int n, int64_t map_offset) const {
  backend::Tensor v = t;
  if (map_offset < 0) return v;  // positions are pool rows: the whole pool, as before paging
  v.rows = n;
  v.row_map = static_cast<const int32_t*>(map_.data) + map_offset;
  return v;
}

}  // namespace sluice::model
