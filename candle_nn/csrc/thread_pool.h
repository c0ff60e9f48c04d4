// A small persistent thread pool for the element-wise kernels (MLX 0.32 runs its own CPU
// element-wise ops on one thread). The calling thread (MLX's CPU stream thread) takes part.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace candle_nn {

class ThreadPool {
 public:
  // The process's pool (re-created empty in a forked child: threads do not survive fork()).
  static ThreadPool& instance();

  // Total threads a job uses, the caller included (>= 1). Takes effect for the next job.
  void set_threads(int n);
  int threads() const { return threads_.load(); }

  // Runs fn(task) for every task in [0, n_tasks), spread over the pool; returns when every task
  // is done (not waiting for a worker that is not scheduled: the caller takes its tasks). A job
  // started while another one runs (several MLX CPU streams at once) runs on the caller alone.
  void run(int n_tasks, const std::function<void(int)>& fn);

  ~ThreadPool();

 private:
  ThreadPool();
  void resize_locked(int workers);
  void stop_locked();
  void worker_loop();
  // Takes and runs tasks of job `generation` until none is left; true if it ran any.
  void drain(const std::function<void(int)>& fn, int n_tasks, uint32_t generation);

  std::atomic<int> threads_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  int job_tasks_ = 0;
  // (generation << 32) | next task: a worker that wakes late cannot take a task of a later job.
  std::atomic<uint64_t> next_{0};
  std::atomic<int> done_tasks_{0};
  uint32_t generation_ = 0;
  bool stop_ = false;
};

// Splits [0, n) into at most `max_chunks` contiguous ranges of at least `min_chunk` items
// (multiples of `align`) and runs fn(begin, end) on the pool.
void parallel_for(int64_t n, int64_t min_chunk, int64_t align,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace candle_nn
