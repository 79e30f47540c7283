// The attention KV cache, paged: a pool of blocks of kBlockSize positions shared by every sequence
// of the model (the server's concurrent requests; docs/SERVING.md). Per layer, K and V rows of the
// whole pool, F16 (like llama.cpp's default cache type: half the bytes of f32, and the precision
// its greedy outputs are computed with).
//
// KvBlocks is the host-side bookkeeping (which blocks each sequence holds); KvCache is one
// executor's memory for them. A sequence's position p lives in pool row
// block[p / kBlockSize] * kBlockSize + p % kBlockSize. Blocks are taken lowest-numbered first and
// freed from a sequence's end, so a model with one sequence holds blocks 0, 1, 2, ... in order and
// its rows are its positions: the ops then get plain views (no row map), as before paging.
//
// Blocks may be shared: share() starts an empty sequence with another's first whole blocks by
// reference (a server's requests with the same prompt prefix; docs/SERVING.md), and a block goes
// back to the pool when the last sequence holding it lets go. A shared block is never written:
// sequences only write at or past their n_past, sharing gives whole blocks below it, and a
// truncation that would leave a sequence writing into a block another one holds drops that block
// from it as well (truncate() says so).
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace sluice::model {

class KvBlocks {
 public:
  static constexpr int kBlockSize = 16;

  // n_positions of pool (rounded up to whole blocks), up to max_seqs sequences (sequence 0 open),
  // each at most n_ctx positions.
  void init(int n_positions, int max_seqs, int n_ctx);

  int n_blocks() const { return n_blocks_; }
  int n_free() const { return int(free_.size()); }
  int n_ctx() const { return n_ctx_; }
  int max_seqs() const { return int(seqs_.size()); }
  int pool_rows() const { return n_blocks_ * kBlockSize; }
  static int blocks_for(int n) { return (n + kBlockSize - 1) / kBlockSize; }

  bool valid(int seq) const { return seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].open; }
  // A free sequence id (>= 1), opened with no positions; kOutOfMemory when all are open.
  Result<int> open();
  // Closes seq (>= 1) and frees its blocks; unknown or closed ids are ignored.
  void close(int seq);
  int n_past(int seq) const { return valid(seq) ? seqs_[size_t(seq)].n_past : 0; }
  // Blocks that growing seq to n positions would take from the pool.
  int blocks_needed(int seq, int n) const;
  // Makes seq hold blocks for n positions (n_past unchanged). kOutOfMemory (nothing taken) when the
  // pool has too few free blocks. Precondition: valid(seq), n <= n_ctx().
  Status reserve(int seq, int n);
  // n_past = n (n within the reserved blocks).
  void set_n_past(int seq, int n);
  // Drops positions >= n: n_past = min(n_past, n), blocks past it let go. Where the block holding
  // position n_past is shared with another sequence (so the next write would land in it), n_past
  // goes down to that block's start and the block is let go too: n_past(seq) says what is kept.
  void truncate(int seq, int n);
  // Makes dst (open, no positions) hold the first n positions of src by sharing src's blocks: n
  // a multiple of kBlockSize, at most n_past(src). Precondition checks only: the caller validates.
  void share(int src, int dst, int n);
  // Sequences holding block b (0: free).
  int holders(int32_t b) const { return refs_[size_t(b)]; }
  // Whether positions [0, n) of seq are pool rows [0, n) (n <= the reserved positions); if not,
  // their pool rows are appended to `out`.
  bool rows(int seq, int n, std::vector<int32_t>& out) const;

 private:
  struct Seq {
    bool open = false;
    int n_past = 0;
    std::vector<int32_t> blocks;
  };
  int n_blocks_ = 0;
  int n_ctx_ = 0;
  std::vector<Seq> seqs_;
  std::set<int32_t> free_;  // lowest first
  std::vector<int> refs_;   // per block: the sequences holding it

  void let_go(int32_t b);
};

class KvCache {
 public:
  // Allocates {K, V} tensors of [pool_rows, n_embd_k/v cols] on `be` for every layer l < n_layer
  // where layers[l] (empty: all of them); the others have none (has(l) is false). `map_rows`:
  // capacity of the row map uploaded per pass (set_rows).
  Status init(backend::Backend& be, int n_layer, int pool_rows, int n_embd_k, int n_embd_v, int64_t map_rows,
              const std::vector<bool>& layers = {});

  bool has(int layer) const { return layer >= 0 && size_t(layer) < k_.size() && k_[size_t(layer)].data != nullptr; }

  const backend::Tensor& k(int layer) const { return k_[size_t(layer)]; }  // [pool rows, n_head_kv*head_dim] f16
  const backend::Tensor& v(int layer) const { return v_[size_t(layer)]; }  // [pool rows, n_head_kv*head_dim] f16
  // A sequence's view of a layer's cache: its positions [0, n) as rows, through the row map
  // uploaded at `map_offset` (-1: the identity, positions are pool rows).
  backend::Tensor k(int layer, int n, int64_t map_offset) const { return view(k_[size_t(layer)], n, map_offset); }
  backend::Tensor v(int layer, int n, int64_t map_offset) const { return view(v_[size_t(layer)], n, map_offset); }
  // Uploads this pass's row maps (every segment's, concatenated) to the backend.
  void set_rows(std::span<const int32_t> rows);
  int64_t map_capacity() const { return map_.cols; }
  uint64_t bytes() const { return bytes_; }

 private:
  backend::Tensor view(const backend::Tensor& t, int n, int64_t map_offset) const;

  backend::Backend* be_ = nullptr;
  std::vector<backend::Tensor> k_, v_;
  backend::Tensor map_;  // I32 [map_rows]
  uint64_t bytes_ = 0;
};

}  // namespace sluice::model
