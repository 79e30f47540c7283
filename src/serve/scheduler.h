// Continuous batching for `sluice serve` (docs/SERVING.md). One scheduler thread owns the model;
// HTTP threads submit requests through a thread-safe inbox and read each request's events from its
// own channel.
//
// Every step the scheduler builds one Model::eval_batch: one decode token for every request that
// is generating, then prompt chunks of the requests still prefilling (in arrival order) up to the
// step's token budget. Requests join at the next step after admission and leave at the token that
// ends them (end of generation, stop string, max_tokens, context full, cancellation), freeing their
// sequence and KV blocks at once.
//
// Admission is by KV blocks: a request is admitted only where the pool can give it every block
// its prompt plus max_tokens (capped at the context) will need beyond those it starts with, next
// to what the admitted requests may still take, so a running request never runs out of cache. A
// request that does not fit waits in the queue; one that could never fit (more blocks than the
// whole pool) is refused at submit() with a message saying so.
//
// Prompt cache: a finished request's sequence keeps the KV rows of its prompt (the part its
// prefill computed; the generated tokens' rows are dropped) as a cached prefix. A later request
// whose prompt starts with the same tokens reuses those rows and prefills only the rest (at least
// its last two tokens, so the last one is computed in a prefill pass as it would be without the
// cache): it takes the cached sequence over, or, where that would cut a longer prefix short or the
// rows are in a running request's sequence, starts a sequence of its own holding the same whole KV
// blocks (Model::seq_share). Cached prefixes hold KV blocks and sequence ids that no request
// reserved; admission evicts them, least recently used first, whenever a request needs either.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "core/threadpool.h"
#include "decode/sampler.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace sluice::serve {

struct RequestParams {
  std::vector<int32_t> prompt;  // not empty
  int max_tokens = -1;          // -1: until end of generation or the context is full
  decode::SamplerParams sampling;
  std::vector<std::string> stop;  // stop strings (not part of the output)
  int top_logprobs = -1;          // -1: no logprobs; 0..20: the chosen token's logprob + that many alternatives
  bool ignore_eos = false;        // never sample end-of-generation tokens (benchmarks; llama-server's field)
  bool cache_prompt = true;       // may start from a cached prefix (llama-server's field; false: prefill it all)
};

struct TopLogprob {
  int32_t id;
  float logprob;
};
// The log-probability of one generated token under the model (log-softmax of the raw logits,
// before any sampling filter), and the most likely alternatives.
struct TokenLogprob {
  int32_t id;
  float logprob;
  std::vector<TopLogprob> top;
};

enum class FinishReason { kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

// What the scheduler sends a request's reader. kText carries new text (may be empty when only
// logprobs are new) and the logprobs of the tokens sampled since the last event; kDone is last.
struct Event {
  enum class Kind { kText, kDone } kind = Kind::kText;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  // kDone only:
  FinishReason finish = FinishReason::kStop;
  std::string error;  // kError: what went wrong
  int n_prompt = 0;
  int n_cached = 0;  // prompt tokens taken from the prompt cache (not evaluated)
  int n_generated = 0;
};

// One request as both sides see it. The reader calls next(); cancel() may come from any thread.
class Request {
 public:
  explicit Request(RequestParams p) : params(std::move(p)) {}
  const RequestParams params;

  // Waits up to `timeout` for the next event; nullopt on timeout.
  std::optional<Event> next(std::chrono::milliseconds timeout);
  // Asks the scheduler to stop this request at its next step (client gone); its KV blocks are
  // freed then and a kDone(kCancelled) event follows.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // Scheduler side.
  void push(Event e);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  int max_queue = 64;     // requests waiting for admission beyond which submit() refuses (HTTP 503)
  // Tokens per eval_batch (decode tokens + prompt chunks); 0: the model's cap (Model::max_batch,
  // --ubatch), which also bounds any other value.
  int step_tokens = 0;
  bool prompt_cache = true;  // keep finished prompts' KV rows for later requests that start the same way
  // Requests sent together (a client's burst) share their first pass: from idle, the first request
  // waits while others keep arriving less than admit_gap apart, at most admit_window in all (or
  // until every slot has one). Each pass of a streamed model takes a copy of its layers, so a
  // prompt that misses the first pass waits a whole pass for the next. 0: no wait.
  std::chrono::milliseconds admit_window{20};
  std::chrono::milliseconds admit_gap{2};
  int parallel = 0;       // requests generating at once; 0 or more than the model's max_sequences(): that
  // Threads that sample a pass's sequences (and their logprobs) in parallel: each picks from its
  // own vocabulary-sized row with its own generator, so the tokens do not depend on the count.
  int sample_threads = 1;
};

// A snapshot for /metrics.
struct Metrics {
  uint64_t requests_finished = 0;
  uint64_t requests_cancelled = 0;
  uint64_t requests_failed = 0;
  uint64_t prompt_tokens = 0;     // prompt tokens evaluated
  uint64_t prompt_tokens_cached = 0;  // prompt tokens taken from the prompt cache instead
  int cached_prefixes = 0;        // sequences holding a cached prefix (no request)
  int kv_blocks_cached = 0;       // their KV blocks (a block two of them share counts twice)
  uint64_t generated_tokens = 0;  // tokens sampled
  uint64_t steps = 0;             // eval_batch calls
  uint64_t batch_tokens = 0;      // tokens over all steps (batch_tokens / steps: mean batch size)
  uint64_t batch_sequences = 0;   // sequences over all steps
  int last_batch_tokens = 0;
  int last_batch_sequences = 0;
  int queued = 0;   // waiting for admission
  int active = 0;   // admitted (prefilling or generating)
  int parallel = 0; // slots
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;      // the model's pool
  int kv_blocks_reserved = 0;  // still to be taken by admitted requests (pending_blocks)
  int kv_block_size = 0;
  double busy_seconds = 0;     // wall time inside steps
  double tokens_per_second = 0;  // generated tokens per second over the last few seconds
};

class Scheduler {
 public:
  // `model` and `tokenizer` must outlive the scheduler; the scheduler thread is their only user.
  Scheduler(model::Model& model, const model::Tokenizer& tokenizer, const SchedulerOptions& opts);
  ~Scheduler();  // shutdown(0)
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Errors: kInvalidArgument (empty prompt, a token outside the vocabulary, a
  // prompt longer than the context, a request larger than the KV pool, bad sampling parameters);
  // kOutOfMemory with "queue full" when max_queue requests are waiting; kUnsupported while
  // shutting down.
  Result<std::shared_ptr<Request>> submit(RequestParams params);

  // Stops accepting, lets queued and running requests finish for up to `deadline`, cancels what is
  // left (their readers get kDone(kCancelled)), and stops the thread. Idempotent.
  void shutdown(std::chrono::milliseconds deadline);
  bool shutting_down() const { return shutting_down_.load(); }

  Metrics metrics() const;
  int n_ctx() const { return n_ctx_; }
  int parallel() const { return parallel_; }

 private:
  struct Active;
  // A finished request's prompt prefix kept in its sequence's KV rows (the prompt cache).
  struct Cached {
    int seq;
    std::vector<int32_t> tokens;  // the sequence's positions
    uint64_t used;                // last use, for least-recently-used eviction
  };
  void loop();
  bool step();  // one batch; false when there was nothing to do
  // From idle: waits (mu_ held through lk) for the rest of a burst (SchedulerOptions::admit_window).
  void gather(std::unique_lock<std::mutex>& lk);
  void admit();
  void finish(Active& a, FinishReason r, const std::string& error = {});
  // Where a new request's prompt prefix can come from: the cached prefix to take over (its
  // sequence, -1: none) and how many positions that reuses; the sequence (cached or running) whose
  // whole blocks to share (-1: none), how many positions those hold, and where it is a cached
  // prefix how many positions taking it over would reuse instead (0: a running request's).
  struct Reuse {
    int take_seq = -1, take_n = 0;
    int share_seq = -1, share_n = 0, share_use = 0;
  };
  Reuse best_reuse(const std::vector<int32_t>& prompt) const;
  // Takes cached prefix `seq` over for a request: out of the cache, truncated to n positions.
  // Returns the positions kept (fewer where the block at n is shared).
  int take_over(int seq, int n);
  // KV blocks admitted requests may still take from the pool (each its blocks at its longest
  // less those it holds): the pool must keep that many free.
  int pending_blocks() const;
  // Evicts cached prefixes (least recently used first, never `keep`'s) until a request taking
  // `blocks` more fits beside pending_blocks(); false (evicting nothing where evicting all could
  // not do it) when it does not fit.
  bool make_room(int blocks, int keep);
  // A sequence with no positions for a new request, other than `keep`: 0 when free, else a new
  // one (cached prefixes other than keep's evicted for it when none is left); -1: none yet.
  int fresh_sequence(int keep);
  // Drops cached prefix i: its sequence is released.
  void evict(size_t i);
  // A sequence no request or cached prefix keeps: freed (sequence 0, or a one-sequence model's,
  // is emptied instead).
  void release_sequence(int seq);
  // KV blocks the cached prefixes hold, but `keep`'s (a block two of them share counts twice).
  int cached_blocks(int keep = -1) const;
  // The index of the least recently used cached prefix not on sequence `keep`; -1 when none.
  int lru_prefix(int keep = -1) const;
  // Keeps the first n prompt tokens of a finished request's sequence as a cached prefix.
  void park(Active& a, int n);
  // The KV pool's gauges: blocks still to take, in use, held by cached prefixes (under mu_).
  void update_pool_metrics();
  // A pass's row for one request, picked on a sampling thread: the token and its logprob entry.
  struct Pick {
    Active* a = nullptr;
    std::span<float> logits;
    int32_t token = -1;
    std::optional<TokenLogprob> logprob;
  };
  static void pick(Pick& p, const std::vector<int32_t>& eog_tokens);
  void handle_token(Active& a, int32_t tok, std::optional<TokenLogprob> logprob);
  void emit_text(Active& a, std::string piece, bool final);

  model::Model& model_;
  const model::Tokenizer& tok_;
  SchedulerOptions opts_;
  int n_ctx_ = 0;
  int n_vocab_ = 0;
  int parallel_ = 1;
  bool multi_ = false;  // the model runs several sequences (seq_new works)

  // Shared with submitting threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  bool stop_ = false;
  std::atomic<bool> shutting_down_{false};
  Metrics m_;  // under mu_

  // Scheduler thread only.
  std::vector<std::unique_ptr<Active>> active_;
  std::vector<Cached> cached_;  // the prompt cache
  uint64_t use_clock_ = 0;
  std::span<float> logits_;  // Model::logits_buffer(): a pass's rows, one per item
  std::vector<Pick> picks_;
  core::ThreadPool sample_pool_;
  std::vector<int32_t> eog_tokens_;  // masked for ignore_eos requests
  std::deque<std::pair<std::chrono::steady_clock::time_point, uint64_t>> rate_window_;

  std::thread thread_;
};

}  // namespace sluice::serve
