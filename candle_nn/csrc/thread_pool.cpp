#include "thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>

namespace candle_nn {

namespace {
ThreadPool* g_pool = nullptr;
std::once_flag g_once;

int default_threads() {
  // candle_nn's own setting arrives through set_threads (Python reads its config).
  for (const char* var : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(var)) {
      int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}
}  // namespace

ThreadPool& ThreadPool::instance() {
  std::call_once(g_once, [] {
    g_pool = new ThreadPool();  // never destroyed: workers may outlive static destructors
    // After fork() only the forking thread exists in the child: start over with a fresh pool.
    pthread_atfork(nullptr, nullptr, [] { g_pool = new ThreadPool(); });
  });
  return *g_pool;
}

ThreadPool::ThreadPool() : threads_(default_threads()) {}

ThreadPool::~ThreadPool() {
  std::unique_lock<std::mutex> lock(m_);
  stop_locked();
}

void ThreadPool::set_threads(int n) { threads_.store(std::max(1, n)); }

void ThreadPool::stop_locked() {
  stop_ = true;
  wake_.notify_all();
  std::vector<std::thread> old;
  old.swap(workers_);
  m_.unlock();
  for (auto& t : old) t.join();
  m_.lock();
  stop_ = false;
}

void ThreadPool::resize_locked(int workers) {
  if (static_cast<int>(workers_.size()) == workers) return;
  stop_locked();
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

void ThreadPool::drain(const std::function<void(int)>& fn, int n_tasks, uint32_t generation) {
  uint64_t v = next_.load();
  for (;;) {
    if (static_cast<uint32_t>(v >> 32) != generation || static_cast<int>(v & 0xffffffffu) >= n_tasks)
      return;
    if (!next_.compare_exchange_weak(v, v + 1)) continue;
    fn(static_cast<int>(v & 0xffffffffu));
    if (done_tasks_.fetch_add(1) + 1 == n_tasks) {
      std::lock_guard<std::mutex> lock(m_);
      done_.notify_all();
    }
    v = next_.load();
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* job = job_;
    int n = job_tasks_;
    if (job == nullptr) continue;  // woke after the job was finished
    lock.unlock();
    drain(*job, n, seen);
    lock.lock();
  }
}

void ThreadPool::run(int n_tasks, const std::function<void(int)>& fn) {
  int threads = std::min(threads_.load(), n_tasks);
  std::unique_lock<std::mutex> guard(run_mutex_, std::try_to_lock);
  if (threads <= 1 || !guard.owns_lock()) {
    for (int t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  std::unique_lock<std::mutex> lock(m_);
  resize_locked(threads_.load() - 1);
  uint32_t generation = ++generation_;
  job_ = &fn;
  job_tasks_ = n_tasks;
  done_tasks_.store(0);
  next_.store(static_cast<uint64_t>(generation) << 32);
  wake_.notify_all();
  lock.unlock();
  drain(fn, n_tasks, generation);
  lock.lock();
  done_.wait(lock, [&] { return done_tasks_.load() == n_tasks; });
  job_ = nullptr;
}

void parallel_for(int64_t n, int64_t min_chunk, int64_t align,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  auto& pool = ThreadPool::instance();
  int64_t threads = pool.threads();
  // A few chunks per thread, so a thread slowed by another process does not hold up the job.
  int64_t chunks = std::min<int64_t>(threads * 4, (n + min_chunk - 1) / min_chunk);
  if (threads <= 1 || chunks <= 1) {
    fn(0, n);
    return;
  }
  int64_t size = (n + chunks - 1) / chunks;
  size = (size + align - 1) / align * align;
  chunks = (n + size - 1) / size;
  pool.run(static_cast<int>(chunks), [&](int c) {
    int64_t begin = c * size;
    fn(begin, std::min(n, begin + size));
  });
}

}  // namespace candle_nn
