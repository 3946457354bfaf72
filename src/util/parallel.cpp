#include "util/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace hyserve {
namespace {

thread_local bool t_in_worker = false;

// A fixed pool; one job at a time (parallel_for calls are serialized by job_mu_).
class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int num_tasks, const std::function<void(int)>& task) {
    std::lock_guard<std::mutex> job_lock(job_mu_);
    {
      std::lock_guard<std::mutex> lk(mu_);
      task_ = &task;
      num_tasks_ = num_tasks;
      next_ = 0;
      pending_ = num_tasks;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    drain();
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Takes tasks until none is left. Called by workers and the caller.
  void drain() {
    for (;;) {
      int i;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (task_ == nullptr || next_ >= num_tasks_) return;
        i = next_++;
      }
      std::exception_ptr err;
      const bool was_worker = t_in_worker;
      t_in_worker = true;
      try {
        (*task_)(i);
      } catch (...) {
        err = std::current_exception();
      }
      t_in_worker = was_worker;
      std::lock_guard<std::mutex> lk(mu_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  void work() {
    t_in_worker = true;
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || (generation_ != seen && task_ != nullptr); });
        if (stop_) return;
        seen = generation_;
      }
      drain();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex job_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  int num_tasks_ = 0;
  int next_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

int configured_threads() {
  if (const char* env = std::getenv("HYSERVE_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

Pool& pool() {
  static Pool p(configured_threads() - 1);
  return p;
}

}  // namespace

int num_cpu_threads() {
  return pool().size();
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  const int threads = t_in_worker ? 1 : num_cpu_threads();
  const int64_t max_tasks = std::max<int64_t>(1, n / min_chunk);
  const int num_tasks = static_cast<int>(std::min<int64_t>(threads, max_tasks));
  if (num_tasks <= 1) {
    fn(0, n);
    return;
  }
  const int64_t per = (n + num_tasks - 1) / num_tasks;
  pool().run(num_tasks, [&](int i) {
    const int64_t b = i * per;
    const int64_t e = std::min(n, b + per);
    if (b < e) fn(b, e);
  });
}

}  // namespace hyserve
