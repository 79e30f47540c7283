// A persistent worker pool for the CPU backend. Decode launches ~10 ops per layer per token, each
// a few microseconds of work, so dispatch must cost far less than that: workers are created once,
// spin briefly on a generation counter after each job (the next op usually follows within
// microseconds) and only then sleep on a futex-backed atomic wait. No allocation per job.
//
// Work is handed out in chunks through an atomic counter, and the caller does not wait for
// workers that have not joined a job by the time every chunk is taken: on a machine shared with
// other processes a descheduled worker would otherwise stall every op for a scheduler timeslice.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace sluice::core {

class ThreadPool {
 public:
  // n_threads counts the calling thread: n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    workers_.reserve(size_t(n_threads_ - 1));
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    stop_.store(true, std::memory_order_seq_cst);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    generation_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return n_threads_; }

  // Splits [0, n) into chunks of `grain` and calls fn(begin, end, ith) for each, on the caller
  // (ith 0) and the workers (ith 1..size()-1) that arrive while chunks remain. Returns when every
  // chunk is done. Not reentrant: fn must not call parallel_for.
  template <typename F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    const int64_t n_chunks = (n + grain - 1) / grain;
    if (n_chunks == 1 || n_threads_ == 1) {
      fn(int64_t{0}, n, 0);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    struct Job {
      Fn* fn;
      int64_t n, grain, n_chunks;
    } job{&fn, n, grain, n_chunks};
    next_chunk_.store(0, std::memory_order_relaxed);
    job_ctx_ = &job;
    job_fn_ = [](void* ctx, std::atomic<int64_t>& next, int ith) {
      const Job& j = *static_cast<const Job*>(ctx);
      for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < j.n_chunks;
           c = next.fetch_add(1, std::memory_order_relaxed)) {
        (*j.fn)(c * j.grain, std::min(j.n, (c + 1) * j.grain), ith);
      }
    };
    const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
    open_gen_.store(gen, std::memory_order_seq_cst);  // publishes job_ctx_/job_fn_
    // seq_cst on both sides of the sleeper handshake (a store-load pattern): either we see the
    // worker's sleeper count, or the worker sees the new generation before it blocks.
    generation_.store(gen, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
    job_fn_(job_ctx_, next_chunk_, 0);
    // Every chunk is taken: close the job, then wait only for workers inside it.
    open_gen_.store(0, std::memory_order_seq_cst);
    for (int spin = 0; active_.load(std::memory_order_seq_cst) != 0; ++spin) {
      if (spin > kSpinIterations) std::this_thread::yield();
    }
  }

 private:
  static constexpr int kSpinIterations = 20000;

  void worker_loop(int ith) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t gen = generation_.load(std::memory_order_acquire);
      for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        gen = generation_.load(std::memory_order_acquire);
      }
      if (gen == seen) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        generation_.wait(seen, std::memory_order_seq_cst);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        continue;
      }
      seen = gen;
      if (stop_.load(std::memory_order_seq_cst)) return;
      // Join only while the job is open; the caller waits for active_ to drain after closing,
      // so the job's context stays alive for every worker that got in.
      active_.fetch_add(1, std::memory_order_seq_cst);
      if (open_gen_.load(std::memory_order_seq_cst) == gen) job_fn_(job_ctx_, next_chunk_, ith);
      active_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  const int n_threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> open_gen_{0};  // generation of the job workers may join; 0: none
  std::atomic<int> active_{0};         // workers inside (or checking) a job
  std::atomic<int> sleepers_{0};
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<bool> stop_{false};
  void* job_ctx_ = nullptr;
  void (*job_fn_)(void*, std::atomic<int64_t>&, int) = nullptr;
};

}  // namespace sluice::core
