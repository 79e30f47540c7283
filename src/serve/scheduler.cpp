#include "serve/scheduler.h"

#include <algorithm>
#include <climits>
#include <cmath>

namespace sluice::serve {
namespace {

using Clock = std::chrono::steady_clock;

// Shorter prefixes are not worth a sequence: a request sharing fewer tokens prefills them.
constexpr int kMinCachedTokens = 16;

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

std::optional<Event> Request::next(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void Request::push(Event e) {
  {
    std::lock_guard lk(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

// An admitted request: its sequence, reservation and generation state.
struct Scheduler::Active {
  Active(std::shared_ptr<Request> r, int s, int blocks, const model::Tokenizer& tok, int n_vocab)
      : req(std::move(r)), seq(s), reserved(blocks), sampler(req->params.sampling, n_vocab), detok(tok) {}
  std::shared_ptr<Request> req;
  int seq;
  int reserved;            // KV blocks it holds at its longest (prompt + max_tokens, capped at the context)
  size_t n_prefilled = 0;  // prompt tokens evaluated (or taken from the prompt cache)
  int cached = 0;          // prompt tokens taken from the prompt cache
  int32_t pending = -1;    // sampled, not yet evaluated (>= 0 while generating)
  int n_generated = 0;
  decode::Sampler sampler;
  model::Detokenizer detok;
  std::string held;  // text held back: it may be the start of a stop string
  std::vector<TokenLogprob> logprobs;  // not yet sent
  bool done = false;
};

Scheduler::Scheduler(model::Model& model, const model::Tokenizer& tokenizer, const SchedulerOptions& opts)
    : model_(model), tok_(tokenizer), opts_(opts), sample_pool_(std::max(1, opts.sample_threads)) {
  n_ctx_ = model_.n_ctx();
  n_vocab_ = model_.n_vocab();
  const int max_seq = std::max(1, model_.max_sequences());
  parallel_ = opts_.parallel > 0 ? std::min(opts_.parallel, max_seq) : max_seq;
  multi_ = max_seq > 1;
  const int cap = std::max(1, model_.max_batch());
  opts_.step_tokens = opts_.step_tokens <= 0 ? cap : std::min(opts_.step_tokens, cap);
  opts_.max_queue = std::max(0, opts_.max_queue);
  for (int32_t id = 0; id < n_vocab_; ++id) {
    if (tok_.is_end_of_generation(id)) eog_tokens_.push_back(id);
  }
  m_.parallel = parallel_;
  m_.kv_blocks_total = model_.kv_blocks_total();
  m_.kv_block_size = model_.kv_block_size();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(std::chrono::milliseconds(0)); }

Result<std::shared_ptr<Request>> Scheduler::submit(RequestParams p) {
  if (p.prompt.empty()) return invalid_argument("the prompt is empty after tokenization");
  for (int32_t t : p.prompt) {
    if (t < 0 || t >= n_vocab_) {
      return invalid_argument("prompt token " + std::to_string(t) + " is outside the vocabulary [0, " +
                              std::to_string(n_vocab_) + ")");
    }
  }
  if (int64_t(p.prompt.size()) > n_ctx_) {
    return invalid_argument("the prompt is " + std::to_string(p.prompt.size()) +
                            " tokens, longer than the context (" + std::to_string(n_ctx_) +
                            " tokens); shorten it or start the server with a larger -c");
  }
  if (p.max_tokens == 0 || p.max_tokens < -1) {
    return invalid_argument("max_tokens must be >= 1, got " + std::to_string(p.max_tokens));
  }
  if (Status st = decode::validate(p.sampling); !st.is_ok()) return st;
  if (p.top_logprobs > 20) return invalid_argument("top_logprobs must be in [0, 20]");
  const int64_t positions =
      p.max_tokens < 0 ? n_ctx_ : std::min<int64_t>(n_ctx_, int64_t(p.prompt.size()) + p.max_tokens - 1);
  const int need = model_.kv_blocks_for(int(positions));
  if (need > model_.kv_blocks_total()) {
    return invalid_argument("the request needs " + std::to_string(need) + " KV blocks (prompt " +
                            std::to_string(p.prompt.size()) + " + max_tokens), more than the whole KV pool (" +
                            std::to_string(model_.kv_blocks_total()) + " blocks); lower max_tokens");
  }

  auto req = std::make_shared<Request>(std::move(p));
  {
    std::lock_guard lk(mu_);
    if (shutting_down_.load() || stop_) return unsupported("the server is shutting down");
    // Requests beyond the free slots wait; at most max_queue of them.
    const int free_slots = std::max(0, parallel_ - m_.active);
    if (int(queue_.size()) >= opts_.max_queue + free_slots) {
      return out_of_memory("queue full: " + std::to_string(queue_.size()) + " requests are waiting");
    }
    queue_.push_back(req);
    m_.queued = int(queue_.size());
  }
  cv_.notify_all();
  return req;
}

void Scheduler::shutdown(std::chrono::milliseconds deadline) {
  shutting_down_.store(true);
  const auto until = Clock::now() + deadline;
  while (Clock::now() < until) {
    {
      std::lock_guard lk(mu_);
      if (stop_ || (queue_.empty() && m_.active == 0)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Metrics Scheduler::metrics() const {
  std::lock_guard lk(mu_);
  Metrics m = m_;
  // Generated tokens per second over the steps of the last ~10 s.
  const auto now = Clock::now();
  if (!rate_window_.empty()) {
    const auto& [t0, g0] = rate_window_.front();
    const double dt = std::chrono::duration<double>(now - t0).count();
    if (dt > 0.5 && dt < 30) m.tokens_per_second = double(m.generated_tokens - g0) / dt;
  }
  return m;
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      if (active_.empty()) {
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        gather(lk);
      }
      if (stop_) break;
    }
    admit();
    if (!step()) {
      // Nothing admitted could run (the queue head waits for blocks held by nobody running cannot
      // happen; a cancelled head was dropped): avoid spinning.
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(5));
    }
  }
  // Stopped: cancel what is left.
  for (auto& a : active_) finish(*a, FinishReason::kCancelled);
  active_.clear();
  std::deque<std::shared_ptr<Request>> left;
  {
    std::lock_guard lk(mu_);
    left.swap(queue_);
    m_.queued = 0;
    m_.active = 0;
    m_.requests_cancelled += left.size();
  }
  for (auto& r : left) {
    Event e;
    e.kind = Event::Kind::kDone;
    e.finish = FinishReason::kCancelled;
    e.n_prompt = int(r->params.prompt.size());
    r->push(std::move(e));
  }
}

void Scheduler::gather(std::unique_lock<std::mutex>& lk) {
  if (opts_.admit_window.count() <= 0) return;
  const auto deadline = Clock::now() + opts_.admit_window;
  for (size_t seen = queue_.size(); !stop_ && int(seen) < parallel_;) {
    const auto until = std::min(deadline, Clock::now() + opts_.admit_gap);
    if (!cv_.wait_until(lk, until, [&] { return stop_ || queue_.size() > seen; })) return;  // quiet, or the window ended
    seen = queue_.size();
  }
}

void Scheduler::admit() {
  for (;;) {
    std::shared_ptr<Request> r;
    {
      std::lock_guard lk(mu_);
      if (queue_.empty()) return;
      r = queue_.front();
      if (r->cancelled()) {
        queue_.pop_front();
        m_.queued = int(queue_.size());
        m_.requests_cancelled++;
      } else if (int(active_.size()) >= parallel_) {
        return;
      }
    }
    if (r->cancelled()) {
      Event e;
      e.kind = Event::Kind::kDone;
      e.finish = FinishReason::kCancelled;
      e.n_prompt = int(r->params.prompt.size());
      r->push(std::move(e));
      continue;
    }
    const auto& p = r->params;
    const int64_t positions =
        p.max_tokens < 0 ? n_ctx_ : std::min<int64_t>(n_ctx_, int64_t(p.prompt.size()) + p.max_tokens - 1);
    const int need = model_.kv_blocks_for(int(positions));  // its blocks at its longest

    // The rows of a prompt prefix computed before: a cached prefix taken over, or whole blocks
    // shared from any sequence into a new one.
    Reuse best;
    if (opts_.prompt_cache && p.cache_prompt) best = best_reuse(p.prompt);
    const bool share = best.share_seq >= 0 && best.share_n > best.take_n;
    // Blocks it will take from the pool: all but the reused whole blocks (a prefix taken over
    // keeps at least those). What admitted requests may still take must stay free.
    const int block = std::max(1, model_.kv_block_size());
    const int reused_blocks = (share ? best.share_n : best.take_n) / block;
    if (!make_room(need - reused_blocks, share ? best.share_seq : best.take_seq)) return;  // waits for blocks

    int seq = -1, reuse = 0;
    if (share) {
      seq = fresh_sequence(best.share_seq);
      if (seq >= 0) {
        if (model_.seq_share(best.share_seq, seq, best.share_n).is_ok()) reuse = best.share_n;
      } else if (best.share_use > 0) {
        reuse = take_over(best.share_seq, best.share_use);  // no sequence to share into: take it
        seq = best.share_seq;
      } else {
        return;  // no sequence free yet: wait
      }
    } else if (best.take_seq >= 0) {
      reuse = take_over(best.take_seq, best.take_n);
      seq = best.take_seq;
    }
    if (seq < 0) seq = fresh_sequence(-1);
    if (seq < 0) return;  // no sequence free yet: wait
    {
      std::lock_guard lk(mu_);
      // The head is still r: only this thread pops.
      queue_.pop_front();
      m_.queued = int(queue_.size());
    }
    auto a = std::make_unique<Active>(std::move(r), seq, need, tok_, n_vocab_);
    a->n_prefilled = size_t(reuse);
    a->cached = reuse;
    for (int32_t t : a->req->params.prompt) a->sampler.accept(t);
    active_.push_back(std::move(a));
    std::lock_guard lk(mu_);
    m_.active = int(active_.size());
    m_.prompt_tokens_cached += uint64_t(reuse);
    update_pool_metrics();
  }
}

Scheduler::Reuse Scheduler::best_reuse(const std::vector<int32_t>& prompt) const {
  // The last two prompt tokens are always prefilled: the last one is then computed in a pass of
  // several tokens, as without the cache (a one-token pass may round differently).
  const int cap = int(prompt.size()) - 2;
  const int block = std::max(1, model_.kv_block_size());
  auto common = [&](std::span<const int32_t> t) {
    const size_t m = std::min(t.size(), prompt.size());
    size_t n = 0;
    while (n < m && t[n] == prompt[n]) ++n;
    return std::min(int(n), cap);
  };
  Reuse r;
  auto consider_share = [&](int seq, int use, bool cached) {
    const int n = use / block * block;
    if (multi_ && n >= kMinCachedTokens && n > r.share_n) {
      r.share_seq = seq;
      r.share_n = n;
      r.share_use = cached ? use : 0;
    }
  };
  for (const Cached& c : cached_) {
    const int use = common(c.tokens);
    // Taking a sequence over drops the rest of its prefix: only where at least half of it is used
    // (else its whole blocks are shared, and it stays).
    if (use >= kMinCachedTokens && 2 * size_t(use) >= c.tokens.size() && use > r.take_n) {
      r.take_seq = c.seq;
      r.take_n = use;
    }
    consider_share(c.seq, use, true);
  }
  // Running requests' prompt rows computed so far.
  for (const auto& a : active_) {
    if (a->done) continue;
    const size_t rows = std::min(a->n_prefilled, size_t(model_.seq_n_past(a->seq)));
    consider_share(a->seq, common(std::span<const int32_t>(a->req->params.prompt).first(rows)), false);
  }
  return r;
}

int Scheduler::take_over(int seq, int n) {
  const auto it = std::find_if(cached_.begin(), cached_.end(), [&](const Cached& c) { return c.seq == seq; });
  SLUICE_CHECK(it != cached_.end(), "scheduler: taking over a sequence that holds no cached prefix");
  cached_.erase(it);
  model_.seq_truncate(seq, n);
  return model_.seq_n_past(seq);  // less where the block at n is shared
}

int Scheduler::pending_blocks() const {
  int n = 0;
  for (const auto& a : active_) {
    if (!a->done) n += std::max(0, a->reserved - model_.kv_blocks_for(model_.seq_n_past(a->seq)));
  }
  return n;
}

int Scheduler::cached_blocks(int keep) const {
  int n = 0;
  for (const Cached& c : cached_) {
    if (c.seq != keep) n += model_.kv_blocks_for(int(c.tokens.size()));
  }
  return n;
}

bool Scheduler::make_room(int blocks, int keep) {
  const int pending = pending_blocks();
  // Evicting cannot free more than the cached prefixes hold: then evict nothing and wait.
  if (pending + blocks > model_.kv_blocks_free() + cached_blocks(keep)) return false;
  while (pending + blocks > model_.kv_blocks_free()) {
    const int i = lru_prefix(keep);
    if (i < 0) return false;  // the rest of the cached blocks are shared with running requests
    evict(size_t(i));
  }
  return true;
}

int Scheduler::fresh_sequence(int keep) {
  const bool zero_active = std::any_of(active_.begin(), active_.end(), [](const auto& a) { return a->seq == 0; });
  const auto zero_cached = std::find_if(cached_.begin(), cached_.end(), [](const Cached& c) { return c.seq == 0; });
  const bool zero_free = !zero_active && keep != 0;
  if (zero_free && (zero_cached == cached_.end() || !multi_)) {
    if (zero_cached != cached_.end()) evict(size_t(zero_cached - cached_.begin()));
    model_.seq_truncate(0, 0);
    return 0;
  }
  if (!multi_) return -1;
  for (;;) {
    auto s = model_.seq_new();
    if (s.is_ok()) return *s;
    const int i = lru_prefix(keep);
    if (i < 0) return -1;
    const bool zero = cached_[size_t(i)].seq == 0;
    evict(size_t(i));
    if (zero && zero_free) return 0;  // evict() emptied it
  }
}

int Scheduler::lru_prefix(int keep) const {
  int best = -1;
  for (size_t i = 0; i < cached_.size(); ++i) {
    if (cached_[i].seq == keep) continue;
    if (best < 0 || cached_[i].used < cached_[size_t(best)].used) best = int(i);
  }
  return best;
}

void Scheduler::release_sequence(int seq) {
  if (seq == 0 || !multi_) {
    model_.seq_truncate(seq, 0);
  } else {
    model_.seq_free(seq);
  }
}

void Scheduler::evict(size_t i) {
  release_sequence(cached_[i].seq);
  cached_.erase(cached_.begin() + ptrdiff_t(i));
}

void Scheduler::park(Active& a, int n) {
  model_.seq_truncate(a.seq, n);
  n = model_.seq_n_past(a.seq);  // less where the block at n is shared
  if (n < kMinCachedTokens) return release_sequence(a.seq);
  const std::vector<int32_t>& prompt = a.req->params.prompt;
  std::vector<int32_t> tokens(prompt.begin(), prompt.begin() + n);
  // A prefix another cached one already holds whole is not kept twice.
  for (size_t i = 0; i < cached_.size(); ++i) {
    const std::vector<int32_t>& t = cached_[i].tokens;
    if (t.size() >= tokens.size() && std::equal(tokens.begin(), tokens.end(), t.begin())) {
      cached_[i].used = ++use_clock_;
      return release_sequence(a.seq);
    }
  }
  // Cached prefixes this one holds whole give way to it.
  for (size_t i = cached_.size(); i-- > 0;) {
    const std::vector<int32_t>& t = cached_[i].tokens;
    if (t.size() < tokens.size() && std::equal(t.begin(), t.end(), tokens.begin())) evict(i);
  }
  cached_.push_back({a.seq, std::move(tokens), ++use_clock_});
}

void Scheduler::update_pool_metrics() {
  m_.kv_blocks_reserved = pending_blocks();
  m_.kv_blocks_used = model_.kv_blocks_total() - model_.kv_blocks_free();
  m_.cached_prefixes = int(cached_.size());
  m_.kv_blocks_cached = cached_blocks();
}

bool Scheduler::step() {
  // Requests cancelled by their reader leave before the pass.
  for (auto& a : active_) {
    if (a->req->cancelled()) finish(*a, FinishReason::kCancelled);
  }
  std::erase_if(active_, [](const auto& a) { return a->done; });
  if (active_.empty()) {
    std::lock_guard lk(mu_);
    m_.active = 0;
    update_pool_metrics();
    return false;
  }

  struct Row {
    Active* a;
    int n;         // tokens of this item
    bool prefill;  // a prompt chunk (else a decode token)
  };
  std::vector<model::Model::SeqTokens> items;
  std::vector<Row> rows;
  int budget = opts_.step_tokens;
  for (auto& a : active_) {
    if (a->pending >= 0 && budget > 0) {
      items.push_back({a->seq, std::span<const int32_t>(&a->pending, 1), false});
      rows.push_back({a.get(), 1, false});
      budget--;
    }
  }
  for (auto& a : active_) {
    const auto& prompt = a->req->params.prompt;
    if (a->pending < 0 && a->n_prefilled < prompt.size() && budget > 0) {
      const int n = int(std::min<size_t>(prompt.size() - a->n_prefilled, size_t(budget)));
      items.push_back({a->seq, std::span<const int32_t>(prompt).subspan(a->n_prefilled, size_t(n)), false});
      rows.push_back({a.get(), n, true});
      budget -= n;
    }
  }
  if (items.empty()) return false;

  // One logits row per item, in the model's fastest host memory (pinned on a GPU), taken once
  // for the most items a pass can hold.
  const size_t need = items.size() * size_t(n_vocab_);
  Status st = Status::ok();
  if (logits_.size() < need) {
    auto buf = model_.logits_buffer(std::max(items.size(), size_t(parallel_)) * size_t(n_vocab_));
    if (buf.is_ok()) {
      logits_ = *buf;
    } else {
      st = buf.status();
    }
  }
  const auto t0 = Clock::now();
  if (st.is_ok()) st = model_.eval_batch(items, logits_.first(need));
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!st.is_ok()) {
    // The pass changed nothing: the requests in it fail with the model's message, the others go on.
    for (auto& r : rows) finish(*r.a, FinishReason::kError, "model evaluation failed: " + st.message());
  } else {
    uint64_t prompt_tokens = 0;
    picks_.clear();
    for (size_t i = 0; i < rows.size(); ++i) {
      Active& a = *rows[i].a;
      if (rows[i].prefill) {
        a.n_prefilled += size_t(rows[i].n);
        prompt_tokens += uint64_t(rows[i].n);
        if (a.n_prefilled < a.req->params.prompt.size()) continue;
      } else {
        a.pending = -1;
      }
      Pick pk;
      pk.a = &a;
      pk.logits = std::span<float>(logits_.data() + i * size_t(n_vocab_), size_t(n_vocab_));
      picks_.push_back(std::move(pk));
    }
    // Sampling a 150k vocabulary takes 10-50 us a sequence (a whole-vocabulary sort or logprobs,
    // milliseconds): with 32 sequences a pass, in parallel. Then the tokens go out in row order.
    sample_pool_.parallel_for(int64_t(picks_.size()), 1, [&](int64_t b, int64_t e, int) {
      for (int64_t k = b; k < e; ++k) pick(picks_[size_t(k)], eog_tokens_);
    });
    for (Pick& p : picks_) handle_token(*p.a, p.token, std::move(p.logprob));
    std::lock_guard lk(mu_);
    m_.prompt_tokens += prompt_tokens;
    m_.steps++;
    int ntok = 0;
    for (const auto& r : rows) ntok += r.n;
    m_.batch_tokens += uint64_t(ntok);
    m_.batch_sequences += rows.size();
    m_.last_batch_tokens = ntok;
    m_.last_batch_sequences = int(rows.size());
    m_.busy_seconds += dt;
  }
  std::erase_if(active_, [](const auto& a) { return a->done; });
  std::lock_guard lk(mu_);
  m_.active = int(active_.size());
  update_pool_metrics();
  const auto now = Clock::now();
  rate_window_.emplace_back(now, m_.generated_tokens);
  while (rate_window_.size() > 2 && now - rate_window_[1].first > std::chrono::seconds(10)) rate_window_.pop_front();
  return true;
}

void Scheduler::pick(Pick& pk, const std::vector<int32_t>& eog_tokens) {
  Active& a = *pk.a;
  const auto& p = a.req->params;
  std::span<float> logits = pk.logits;
  if (p.ignore_eos) {
    for (int32_t id : eog_tokens) logits[size_t(id)] = -INFINITY;
  }
  const int32_t tok = a.sampler.sample(logits);
  pk.token = tok;
  if (p.top_logprobs >= 0) {
    const float lse = float(decode::log_sum_exp(logits));
    TokenLogprob lp{tok, logits[size_t(tok)] - lse, {}};
    if (p.top_logprobs > 0) {
      for (const decode::Candidate& c : decode::most_likely(logits, std::min(size_t(p.top_logprobs), logits.size()))) {
        lp.top.push_back({c.id, c.logit - lse});
      }
    }
    pk.logprob = std::move(lp);
  }
}

void Scheduler::handle_token(Active& a, int32_t tok, std::optional<TokenLogprob> logprob) {
  const auto& p = a.req->params;
  a.sampler.accept(tok);
  a.n_generated++;
  {
    std::lock_guard lk(mu_);
    m_.generated_tokens++;
  }
  if (logprob) a.logprobs.push_back(std::move(*logprob));

  if (tok_.is_end_of_generation(tok)) {
    emit_text(a, a.detok.flush(), true);
    if (!a.done) finish(a, FinishReason::kStop);
    return;
  }
  // Control tokens (<|im_start|>, ...) structure the conversation; they are not text.
  if (!tok_.is_control(tok)) emit_text(a, a.detok.push(tok), false);
  if (a.done) return;  // a stop string
  const int max_tokens = p.max_tokens < 0 ? INT_MAX : p.max_tokens;
  // The token would be evaluated at position prompt + n_generated - 1.
  const int64_t next_pos = int64_t(p.prompt.size()) + a.n_generated - 1;
  if (a.n_generated >= max_tokens || next_pos >= n_ctx_) {
    emit_text(a, a.detok.flush(), true);
    if (!a.done) finish(a, FinishReason::kLength);
    return;
  }
  a.pending = tok;
  if (!a.logprobs.empty()) emit_text(a, "", false);  // logprobs of a token whose text is held back
}

void Scheduler::emit_text(Active& a, std::string piece, bool final) {
  a.held += piece;
  const auto& stops = a.req->params.stop;
  size_t out_len = a.held.size();
  bool stopped = false;
  size_t first = std::string::npos;
  for (const auto& s : stops) {
    if (s.empty()) continue;
    const size_t pos = a.held.find(s);
    if (pos != std::string::npos && pos < first) first = pos;
  }
  if (first != std::string::npos) {
    out_len = first;
    stopped = true;
  } else if (!final) {
    // Hold back the longest tail that could still become a stop string.
    size_t keep = 0;
    for (const auto& s : stops) {
      for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), a.held.size()); k > keep; --k) {
        if (a.held.compare(a.held.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
      }
    }
    out_len = a.held.size() - keep;
  }
  if (out_len > 0 || !a.logprobs.empty()) {
    Event e;
    e.kind = Event::Kind::kText;
    e.text = a.held.substr(0, out_len);
    e.logprobs = std::move(a.logprobs);
    a.logprobs.clear();
    a.req->push(std::move(e));
  }
  a.held.erase(0, stopped ? a.held.size() : out_len);
  if (stopped) finish(a, FinishReason::kStop);
}

void Scheduler::finish(Active& a, FinishReason r, const std::string& error) {
  if (a.done) return;
  a.done = true;
  // The prompt rows its prefill computed stay as a cached prefix (not after a failed pass).
  const int keep = std::min(int(a.n_prefilled), model_.seq_n_past(a.seq));
  if (opts_.prompt_cache && r != FinishReason::kError && keep >= kMinCachedTokens) {
    park(a, keep);
  } else {
    release_sequence(a.seq);
  }
  {
    // The metrics change before the client can see its end: a client that reads /metrics after
    // its last event sees its blocks released and its outcome counted.
    std::lock_guard lk(mu_);
    update_pool_metrics();
    switch (r) {
      case FinishReason::kCancelled: m_.requests_cancelled++; break;
      case FinishReason::kError: m_.requests_failed++; break;
      default: m_.requests_finished++; break;
    }
  }
  Event e;
  e.kind = Event::Kind::kDone;
  e.finish = r;
  e.error = error;
  e.n_prompt = int(a.req->params.prompt.size());
  e.n_cached = a.cached;
  e.n_generated = a.n_generated;
  e.logprobs = std::move(a.logprobs);
  a.req->push(std::move(e));
}

}  // namespace sluice::serve
