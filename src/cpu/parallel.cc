// The CPU engine's thread pool (parallel.h says what it promises).
//
// One pool per process, made on first use and never destroyed (threads still running at exit
// must not find it gone). A loop is a Job on the caller's stack: the caller publishes it under
// the pool's mutex, claims chunks itself, waits for the chunks others claimed, then unpublishes
// it and waits until no worker still holds it, so no worker touches a finished Job.
#include "cpu/parallel.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#ifndef KILN_CPU_SPIN_ROUNDS
#define KILN_CPU_SPIN_ROUNDS 2000
#endif

namespace kiln::cpu {

namespace {

// How long an idle worker watches for the next loop before it sleeps, in pause instructions
// (a build option: KILN_CPU_SPIN_ROUNDS; about 10 to 100 microseconds on x86).
constexpr int kSpinRounds = KILN_CPU_SPIN_ROUNDS;

void pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Waits until done() holds: a short spin, then yielding the core to whoever needs it.
template <class Done>
void wait_until(Done done) {
  for (int i = 0; i < kSpinRounds; ++i) {
    if (done()) return;
    pause();
  }
  while (!done()) std::this_thread::yield();
}

int cpus_available() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// Whether this thread is running a range of a parallel loop (a loop inside runs serially).
thread_local bool t_in_loop = false;

struct Job {
  const RangeBody* body = nullptr;
  int64_t n = 0, chunk = 1, chunks = 0;
  // The chunks not claimed yet, [front, back): the calling thread claims from the front, the
  // workers from the back, so with two threads each runs one end of the loop. Consecutive
  // layers split their outputs the same way (rows, pixels), so what a core wrote it mostly reads
  // again from its own L2: claimed in turn from one counter, a layer's inputs came from the
  // other core's cache about half the time, and a 14x14 depthwise layer, which does little
  // arithmetic per byte, ran no faster on two threads than on one (docs/design/cpu-gemm.md, "Each
  // thread one end of a loop"). Packed front | back << 32; loops of 2^31 chunks or more claim
  // from the front only.
  std::atomic<uint64_t> ends{0};
  std::atomic<int64_t> finished{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;

  void set_chunks(int64_t count) {
    chunks = count;
    ends.store(static_cast<uint64_t>(std::min<int64_t>(count, int64_t{1} << 31)) << 32, std::memory_order_relaxed);
  }

  // The next chunk from the front or the back; false when none is left.
  bool claim(bool from_back, int64_t& c) {
    uint64_t e = ends.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t front = static_cast<int64_t>(e & 0xFFFFFFFFu), back = static_cast<int64_t>(e >> 32);
      if (front >= back) {
        if (chunks < (int64_t{1} << 31)) return false;
        // Past 2^31 chunks: the rest from a plain counter above the packed range.
        c = overflow.fetch_add(1, std::memory_order_relaxed);
        return c < chunks;
      }
      const bool back_end = from_back && chunks < (int64_t{1} << 31);
      const uint64_t claimed = back_end ? (static_cast<uint64_t>(back - 1) << 32) | static_cast<uint64_t>(front)
                                        : (static_cast<uint64_t>(back) << 32) | static_cast<uint64_t>(front + 1);
      if (ends.compare_exchange_weak(e, claimed, std::memory_order_relaxed)) {
        c = back_end ? back - 1 : front;
        return true;
      }
    }
  }
  std::atomic<int64_t> overflow{int64_t{1} << 31};

  // Claims and runs chunks until none is left.
  void work(bool from_back) {
    const bool was_in_loop = t_in_loop;
    t_in_loop = true;
    int64_t c = 0;
    while (claim(from_back, c)) {
      if (!failed.load(std::memory_order_relaxed)) {
        try {
          (*body)(c * chunk, std::min(n, (c + 1) * chunk));
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
          failed.store(true, std::memory_order_relaxed);
        }
      }
      finished.fetch_add(1, std::memory_order_release);
    }
    t_in_loop = was_in_loop;
  }
};

class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool(cpus_available());
    return *pool;
  }

  int threads() {
    std::lock_guard<std::mutex> lock(mutex_);
    return threads_;
  }

  void resize(int threads) {
    std::lock_guard<std::mutex> one_loop(loop_mutex_);
    stop_workers();
    start_workers(threads > 0 ? threads : cpus_available());
  }

  void run(int64_t n, const RangeBody& body, int64_t chunk) {
    std::unique_lock<std::mutex> one_loop(loop_mutex_, std::try_to_lock);
    // (A child of fork() has no workers: the caller runs every chunk.)
    if (!one_loop.owns_lock() || threads_ == 1 || getpid() != owner_) {
      body(0, n);
      return;
    }
    Job job;
    job.body = &body;
    job.n = n;
    job.chunk = chunk > 0 ? chunk : std::max<int64_t>(1, (n + 4 * threads_ - 1) / (4 * threads_));
    job.set_chunks((n + job.chunk - 1) / job.chunk);
    bool sleepers;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      published_.store(++generation_, std::memory_order_release);
      sleepers = sleeping_ > 0;
    }
    if (sleepers) wake_.notify_all();
    job.work(/*from_back=*/false);
    wait_until([&] { return job.finished.load(std::memory_order_acquire) == job.chunks; });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = nullptr;
    }
    wait_until([&] { return holders_.load(std::memory_order_acquire) == 0; });
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  explicit Pool(int threads) { start_workers(threads); }

  void start_workers(int threads) {
    uint64_t generation;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads_ = threads;
      stop_ = false;
      generation = generation_;
    }
    owner_ = getpid();
    // (A worker takes part in every loop published after this point, even one published
    // before the thread first runs.)
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, generation] { work(generation); });
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  void work(uint64_t seen) {
    for (;;) {
      for (int i = 0; i < kSpinRounds && published_.load(std::memory_order_acquire) == seen; ++i) pause();
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ++sleeping_;
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        --sleeping_;
        if (stop_) return;
        seen = generation_;
        job = job_;
        if (job) holders_.fetch_add(1, std::memory_order_relaxed);
      }
      if (job) {
        job->work(/*from_back=*/true);
        holders_.fetch_sub(1, std::memory_order_release);
      }
    }
  }

  std::mutex loop_mutex_;  // held by the loop running on the pool
  std::mutex mutex_;       // guards the fields below, but for the atomics
  std::condition_variable wake_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> published_{0};  // generation_, for workers to watch without the mutex
  std::atomic<int> holders_{0};         // workers holding job_
  int sleeping_ = 0;
  bool stop_ = false;
  int threads_ = 1;
  pid_t owner_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace

void parallel_for(int64_t n, const RangeBody& body, bool parallel, int64_t chunk) {
  if (n <= 0) return;
  if (!parallel || n == 1 || t_in_loop) {
    body(0, n);
    return;
  }
  Pool::instance().run(n, body, chunk);
}

int thread_count() { return Pool::instance().threads(); }

void set_thread_count(int threads) { Pool::instance().resize(threads); }

}  // namespace kiln::cpu
