// A persistent worker pool for the CPU backend. Decode launches ~10 ops per layer per token, each
// a few microseconds of work, so dispatch must cost far less than that: workers are created once,
// spin briefly on a generation counter after each job (the next op usually follows within
// microseconds) and only then sleep on a futex-backed atomic wait. No allocation per job.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/status.h"

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
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return n_threads_; }

  // Runs fn(ith, nth) on every thread (ith = 0 is the caller) and returns when all are done.
  // Not reentrant: fn must not call run() again.
  template <typename F>
  void run(F&& fn) {
    if (n_threads_ == 1) {
      fn(0, 1);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    job_ctx_ = const_cast<void*>(static_cast<const void*>(&fn));
    job_fn_ = [](void* ctx, int ith, int nth) { (*static_cast<Fn*>(ctx))(ith, nth); };
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    // seq_cst on both sides of the sleeper handshake (a store-load pattern): either we see the
    // worker's sleeper count, or the worker sees the new generation before it blocks.
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
    fn(0, n_threads_);
    // Workers finish within microseconds of the caller on balanced work; spin, then yield.
    for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
      if (spin > kSpinIterations) std::this_thread::yield();
    }
  }

  // Dynamic load balancing: splits [0, n) into chunks of `grain` handed out through an atomic
  // counter, so a thread slowed by a neighbour's build or an interrupt takes fewer chunks.
  // fn(begin, end, ith).
  template <typename F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    const int64_t n_chunks = (n + grain - 1) / grain;
    if (n_chunks == 1 || n_threads_ == 1) {
      fn(int64_t{0}, n, 0);
      return;
    }
    std::atomic<int64_t> next{0};
    run([&](int ith, int) {
      for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < n_chunks;
           c = next.fetch_add(1, std::memory_order_relaxed)) {
        fn(c * grain, std::min(n, (c + 1) * grain), ith);
      }
    });
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
        // Re-checks the generation after announcing: the caller notifies only when it sees a
        // sleeper.
        generation_.wait(seen, std::memory_order_seq_cst);
        sleepers_.fetch_sub(1, std::memory_order_acq_rel);
        continue;
      }
      seen = gen;
      if (stop_.load(std::memory_order_relaxed)) return;
      job_fn_(job_ctx_, ith, n_threads_);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  const int n_threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  void* job_ctx_ = nullptr;
  void (*job_fn_)(void*, int, int) = nullptr;
};

}  // namespace sluice::core
