// ThreadPool: workers wait on a generation counter; range i of a job goes to worker i.
#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace ds {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

static void run_range(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int64_t chunk, int index) {
  int64_t begin = index * chunk, end = std::min(n, begin + chunk);
  if (begin < end) fn(begin, end);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n, chunk;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= n_ranges_) continue;
      job = job_;
      n = job_n_;
      chunk = job_chunk_;
    }
    run_range(*job, n, chunk, index);
    std::lock_guard<std::mutex> lock(mutex_);
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int64_t ranges = std::min<int64_t>(n_threads(), (n + min_chunk - 1) / min_chunk);
  if (ranges <= 1) {
    fn(0, n);
    return;
  }
  int64_t chunk = (n + ranges - 1) / ranges;
  ranges = (n + chunk - 1) / chunk;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    n_ranges_ = static_cast<int>(ranges);
    pending_ = static_cast<int>(ranges) - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  run_range(fn, n, chunk, 0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    const char* env = std::getenv("DS_THREADS");  // env: DS_THREADS
    return env ? std::atoi(env) : 0;
  }());
  return pool;
}

}  // namespace ds
