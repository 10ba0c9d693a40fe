// The worker pool behind run_on_threads: workers wait on a generation counter; a call bumps it,
// the first n - 1 workers run the job, and the caller waits for them. The pool is created on
// first use and never destroyed (workers blocked in a wait are harmless at exit).
#include "meshtrain/core/thread_pool.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace meshtrain {
namespace {

class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  int workers() const { return int(threads_.size()); }

  void run(const std::function<void()>& job, int helpers) {
    std::lock_guard<std::mutex> turn(turn_);
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = &job, helpers_ = helpers, pending_ = helpers, error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      job();
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void()>* job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        wake_.wait(lk, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= helpers_) continue;
        job = job_;
      }
      std::exception_ptr err;
      try {
        (*job)();
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex turn_, mu_;
  std::condition_variable wake_, done_;
  const std::function<void()>* job_ = nullptr;
  int helpers_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool* p = new Pool(std::max(0, int(std::thread::hardware_concurrency()) - 1));
  return *p;
}

}  // namespace

void run_on_threads(const std::function<void()>& job, int threads) {
  const int helpers = std::min(std::max(threads, 1) - 1, threads > 1 ? pool().workers() : 0);
  if (helpers == 0) return job();
  pool().run(job, helpers);
}

}  // namespace meshtrain
