// The model as decode/ and app/ see it: load a GGUF, run tokens, get logits. Owned by model/;
// decode/ and app/ never touch weights. (Contract shared between folders: extend, don't break.)
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/progress.h"
#include "core/status.h"

namespace sluice::gguf {
class File;
}
namespace sluice::backend {
class Backend;
}

namespace sluice::model {

struct Config;  // hyper-parameters (model/config.h)
struct Weights;
class LayerSource;  // model/weights.h

// Wall-clock time spent in eval, split as the CLI reports it: calls with more than one token are
// prefill, single-token calls are decode.
struct Timings {
  double prefill_seconds = 0;
  int64_t prefill_tokens = 0;
  double decode_seconds = 0;
  int64_t decode_tokens = 0;
};

// Which device runs the layer loop. kAuto: the GPU when there is one and the whole model (weights,
// KV cache, activations) fits in its free memory, else the CPU.
enum class BackendKind { kAuto, kCpu, kCuda };

// Tokens per forward pass (LoadOptions::max_batch): a longer eval is split into passes of at most
// this many tokens, and the activation buffers are sized for it at load.
inline constexpr int kDefaultMaxBatch = 512;
inline constexpr int kMaxMaxBatch = 8192;
// Ok, or an error naming the value when it is outside [1, kMaxMaxBatch].
Status check_max_batch(int max_batch);

struct LoadOptions {
  BackendKind backend = BackendKind::kCpu;
  // kCuda: record the decode step of a resident model once (per 256 positions) as a CUDA graph and
  // replay it for every token (Backend::replay_step; docs/CUDA.md). Off: every kernel is issued
  // from the host (A/B runs, --no-graphs).
  bool cuda_graphs = true;
  // kCuda: kernel kinds left out (backend::CudaOptions::skip_kernels; `sluice bench
  // --skip-kernels`, a diagnostic whose outputs are meaningless). 0 in every real run.
  uint32_t cuda_skip_kernels = 0;
  int n_threads = 0;   // 0: all physical cores
  // CPU backend: repack resident weights into the packed layout of their format where this CPU
  // has a kernel for it (backend::CpuOptions::pack_weights); the CPU streamer repacks its layers
  // the same way, so --ram-budget does not change the numbers.
  bool cpu_pack_weights = true;
  int n_ctx = 0;       // 0: the model's own context length, capped at 4096 (per sequence)
  // Sequences open at once (Model::seq_new; the server's --parallel), sequence 0 included.
  int max_sequences = 1;
  // KV cache pool size in positions, shared by all sequences (rounded up to whole blocks);
  // 0: n_ctx (one full-length sequence).
  int kv_positions = 0;
  // Tokens per forward pass, 1..kMaxMaxBatch (the CLI's --ubatch). A streamed layer is moved once
  // per pass whatever its token count, so longer passes prefill a long prompt of a streamed model
  // with fewer copies; they cost activation memory (~(6 n_embd + n_q + 2 n_ff) x 4 bytes a token).
  int max_batch = kDefaultMaxBatch;
  // Where the layer loop gets its weights (stream/ supplies streaming ones). Called once at load
  // with the opened file, the validated weight views (into the mapping) and the backend that will
  // run the loop (whose slots and copy queue a source may use); empty: the mmapped file itself,
  // copied into the backend's memory first where it has its own.
  std::function<Result<std::unique_ptr<LayerSource>>(const gguf::File&, const Weights&, backend::Backend&)>
      layer_source;
  // Debugging and parity tests: called after every layer with the residual stream of the pass
  // (tokens x n_embd floats, downloaded; slows the pass, and turns graph replay off).
  std::function<void(int layer, std::span<const float> hidden)> on_layer;
  // Optional: (bytes copied so far, bytes to copy) while the resident weights are copied into the
  // backend's memory at load (upload_weights), so the app can draw a progress bar (issue 13).
  core::ProgressFn on_load_progress;
};

class Model {
 public:
  virtual ~Model() = default;
  static Result<std::unique_ptr<Model>> load(const std::string& path, const LoadOptions& opts);
  // Device memory a whole-model load with `opts` needs on a backend with its own memory (what
  // load compares with the GPU's free memory): every weight but the embedding table, the KV pool,
  // activations and scratch. Reads only the file's header. Errors as load's for bad options/files.
  static Result<uint64_t> device_bytes(const std::string& path, const LoadOptions& opts);

  virtual const Config& config() const = 0;
  virtual const char* backend_name() const = 0;  // "cpu", "cuda"
  virtual int n_vocab() const = 0;
  virtual int n_ctx() const = 0;     // KV cache capacity in positions
  virtual int n_past() const = 0;    // positions currently in the KV cache

  // Runs `tokens` at positions [n_past, n_past + tokens.size()), appending to the KV cache
  // (batched prefill when more than one). Writes the logits of the last token to `logits`
  // (n_vocab floats), or of every token when logits.size() == tokens.size() * n_vocab.
  // Error (no state change) if the cache would overflow.
  virtual Status eval(std::span<const int32_t> tokens, std::span<float> logits) = 0;

  // Drops positions >= n from the KV cache (chat edits, perplexity windows).
  virtual void truncate(int n) = 0;

  // Host memory for at least `floats` logits, for eval's and eval_batch's `logits`, that the
  // model's device writes into fastest: pinned on a GPU, so a step's logits arrive by DMA at the
  // bus's rate instead of through the driver's pageable staging (513 KB a token at a 128k
  // vocabulary, 16 MB a 32-sequence pass). Owned by the model and valid while it lives; the model
  // keeps what it handed out and returns the first buffer large enough, so a caller may ask at
  // every generation, and the memory is one caller's at a time (as the model is). The default
  // (test doubles): ordinary memory.
  virtual Result<std::span<float>> logits_buffer(size_t floats) {
    for (std::vector<float>& b : default_logits_) {
      if (b.size() >= floats) return std::span<float>(b).first(floats);
    }
    return std::span<float>(default_logits_.emplace_back(floats));
  }

  // ---- Several sequences in one pass (the server's scheduler, src/serve; docs/SERVING.md) ----
  // The KV cache is a pool of kv_blocks_total() blocks of kv_block_size() positions, shared by
  // every sequence; a sequence holds the blocks its positions fill, taken from the pool as it
  // grows and returned when it is truncated or freed. Sequence 0 always exists: it is the one
  // eval(), truncate() and n_past() use. Each sequence is capped at n_ctx() positions.
  //
  // The defaults below are those of a model with sequence 0 only (test doubles); the layer loop
  // (model/forward.cpp) overrides them all.
  //
  // A new sequence with no positions (its id, >= 1). Error kOutOfMemory when max_sequences() are
  // open.
  virtual Result<int> seq_new() { return out_of_memory("this model runs one sequence only"); }
  // Frees a sequence (id >= 1) and its blocks. Unknown ids are ignored.
  virtual void seq_free(int seq) {}
  virtual int seq_n_past(int seq) const { return seq == 0 ? n_past() : 0; }
  // Drops positions >= n of one sequence (speculative rollback, cancelled requests). Where the
  // KV block that would take the next position is shared with another sequence (seq_share), that
  // block's positions are dropped too: seq_n_past() says how many are kept.
  virtual void seq_truncate(int seq, int n) {
    if (seq == 0) truncate(n);
  }
  // Starts the empty sequence `dst` with the first n positions of `src` without computing or
  // copying them: both hold those KV blocks (a server's requests that share a prompt prefix).
  // n a multiple of kv_block_size(), at most seq_n_past(src). kUnsupported where the model runs
  // one sequence (the default); kInvalidArgument for bad ids, a dst with positions, a bad n.
  virtual Status seq_share(int src, int dst, int n) { return unsupported("this model runs one sequence only"); }
  virtual int max_sequences() const { return 1; }
  // Tokens one pass takes at most (LoadOptions::max_batch): eval splits longer inputs, eval_batch
  // refuses them.
  virtual int max_batch() const { return kDefaultMaxBatch; }
  virtual int kv_block_size() const { return 1; }
  virtual int kv_blocks_total() const { return n_ctx(); }
  virtual int kv_blocks_free() const { return n_ctx() - n_past(); }
  // Blocks a sequence of n positions holds.
  int kv_blocks_for(int n) const { return (n + kv_block_size() - 1) / kv_block_size(); }

  struct SeqTokens {
    int seq = 0;
    std::span<const int32_t> tokens;  // appended at seq_n_past(seq); not empty
    bool all_logits = false;          // logits of every token (else of the last one only)
  };
  // One forward pass over several sequences' tokens (decode tokens of many sequences plus prompt
  // chunks): every weight is read once for the whole batch; attention runs per sequence over its
  // own blocks. `logits` holds, item after item, one n_vocab row per token of an all_logits item
  // and one row for each other item. At most 512 tokens in all; each sequence at most once.
  // Errors, with no state change: kOutOfMemory when the pool has too few free blocks;
  // kInvalidArgument for unknown sequence ids, token ids outside the vocabulary, a sequence past
  // n_ctx, a wrong logits size.
  virtual Status eval_batch(std::span<const SeqTokens> items, std::span<float> logits) {
    if (items.size() != 1 || items[0].seq != 0) return invalid_argument("this model runs one sequence only");
    return eval(items[0].tokens, logits);
  }

  // ---- Layer skip and early exit (speculative self-draft, --skip-layers, --early-exit;
  // docs/SPECULATIVE.md). Lossy: off unless set. ----
  // The layers later passes run: run[l] == false leaves layer l out of every pass (its residual
  // contribution is dropped and its KV rows at the pass's positions are not written; a later pass
  // that runs the layer at those positions overwrites them, which is how a verification pass
  // repairs what a self-draft pass left). Where the weight source can (LayerSource::can_skip) a
  // skipped layer's weights are not fetched either. Empty: every layer (the default).
  // Error (no change): size other than n_layer.
  virtual Status set_layer_mask(std::vector<bool> run) {
    return run.empty() ? Status::ok() : unsupported("this model cannot skip layers");
  }
  virtual std::vector<bool> layer_mask() const { return {}; }
  // Layers whose weights a pass reads where they lie, without a disk read or a PCIe copy: every
  // layer of a resident model, the resident units of a streamed one (what self-draft runs).
  virtual std::vector<bool> resident_layers() const { return {}; }
  // Early exit: a pass of one token stops after layer l >= min_layer once the cosine similarity of
  // that layer's input and output hidden state reaches `threshold` (the later layers' KV rows at
  // that position are not written). threshold <= 0: off (the default).
  virtual Status set_early_exit(float threshold, int min_layer) {
    return threshold <= 0 ? Status::ok() : unsupported("this model has no early exit");
  }
  // Layers run and passes that exited early since load (early-exit and skip reporting).
  struct LayerCounts {
    int64_t passes = 0, layers_run = 0, early_exits = 0;
  };
  virtual LayerCounts layer_counts() const { return {}; }

  // Row-invariant passes: every row of a pass of several tokens gets the bits a one-token pass at
  // its position would give (the CPU backend's attention then sums each row in the one-token order
  // instead of llama.cpp's batched order; its matrix products already give each row the bits of a
  // one-row product). Speculative verification turns it on so that greedy output equals plain
  // decoding bit for bit. Off (the default): prefill sums as llama.cpp does. Not lossy. A model on
  // a backend without the mode (CUDA) stays off (row_invariant() says which).
  virtual void set_row_invariant(bool on) {}
  virtual bool row_invariant() const { return false; }

  // Bytes of weights read per decoded token (for GB/s reporting).
  virtual uint64_t weight_bytes_per_token() const = 0;
  // Bytes the model's backend holds in its own memory: weights, KV cache, activations, streaming
  // slots and scratch (0 on the CPU). Set at load; passes allocate nothing more.
  virtual int64_t device_bytes() const { return 0; }

  // Accumulated eval timings since load or the last reset_timings().
  virtual Timings timings() const { return {}; }
  virtual void reset_timings() {}

 private:
  std::deque<std::vector<float>> default_logits_;  // logits_buffer()'s default (a deque: stable)
};

}  // namespace sluice::model
