// The CPU engine's thread pool (src/cpu/parallel.h): every index runs once, exceptions reach the
// caller, loops inside loops and loops started on several threads at once finish, the thread
// count can change between loops, the work really spreads over the pool's threads, and with two
// threads each runs one end of a loop.
#include "cpu/parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kiln::cpu {
namespace {

// Restores the thread count a test changed.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : threads_(thread_count()) {}
  ~ThreadCountGuard() { set_thread_count(threads_); }

 private:
  int threads_;
};

TEST(Parallel, EveryIndexRunsOnceForAnyLengthAndChunk) {
  ThreadCountGuard guard;
  for (int threads : {1, 2, 4}) {
    set_thread_count(threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 4099})
      for (int64_t chunk : {0, 1, 5, 4096}) {
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        parallel_for(n, [&](int64_t begin, int64_t end) {
          ASSERT_LE(0, begin);
          ASSERT_LE(begin, end);
          ASSERT_LE(end, n);
          for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
        }, true, chunk);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << "index " << i << " of " << n << ", chunk " << chunk
                                                            << ", " << threads << " threads";
      }
  }
}

TEST(Parallel, TheFirstExceptionReachesTheCallerAndThePoolGoesOn) {
  ThreadCountGuard guard;
  set_thread_count(4);
  std::atomic<int> ran{0};
  EXPECT_THROW(parallel_for_each(100, true, [&](int64_t i) {
                 ran.fetch_add(1);
                 if (i == 37) throw std::runtime_error("index 37");
               }, 1),
               std::runtime_error);
  EXPECT_GE(ran.load(), 1);
  std::atomic<int64_t> sum{0};
  parallel_for_each(1000, true, [&](int64_t i) { sum.fetch_add(i); });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

TEST(Parallel, ALoopInsideALoopRunsOnItsThread) {
  ThreadCountGuard guard;
  set_thread_count(3);
  std::atomic<int64_t> sum{0};
  parallel_for_each(20, true, [&](int64_t i) {
    const std::thread::id outer = std::this_thread::get_id();
    parallel_for_each(50, true, [&](int64_t j) {
      EXPECT_EQ(std::this_thread::get_id(), outer);
      sum.fetch_add(i * 50 + j);
    });
  }, 1);
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

TEST(Parallel, LoopsStartedOnSeveralThreadsAtOnceAllFinish) {
  ThreadCountGuard guard;
  set_thread_count(2);
  constexpr int kCallers = 6, kLoops = 200;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int l = 0; l < kLoops; ++l) {
        std::atomic<int64_t> sum{0};
        parallel_for_each(257, true, [&](int64_t i) { sum.fetch_add(i + c); });
        sums[static_cast<size_t>(c)] += sum.load();
      }
    });
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(sums[static_cast<size_t>(c)], kLoops * (256 * 257 / 2 + 257 * c));
}

TEST(Parallel, WorkSpreadsOverThePoolsThreadsAndTheCountCanChange) {
  ThreadCountGuard guard;
  auto threads_used = [] {
    std::mutex m;
    std::set<std::thread::id> ids;
    // Chunks long enough that a worker woken from sleep surely claims some.
    parallel_for_each(16, true, [&](int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    }, 1);
    return ids;
  };
  set_thread_count(2);
  EXPECT_EQ(thread_count(), 2);
  EXPECT_EQ(threads_used().size(), 2u);
  set_thread_count(1);
  EXPECT_EQ(thread_count(), 1);
  const std::set<std::thread::id> alone = threads_used();
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(*alone.begin(), std::this_thread::get_id());
  set_thread_count(0);
  EXPECT_GE(thread_count(), 1);
}

// With two threads the caller runs the loop's first chunks and the worker its last: each thread's
// chunks are one run, the caller's from index 0, so consecutive layers split their outputs alike
// and each core reads what it wrote. Whatever the timing: with a slow worker the caller's run is
// just longer.
TEST(Parallel, TheCallerRunsTheFrontAndTheWorkerTheBack) {
  ThreadCountGuard guard;
  set_thread_count(2);
  for (int round = 0; round < 20; ++round) {
    std::mutex m;
    std::vector<std::pair<int64_t, std::thread::id>> ran;
    parallel_for_each(16, true, [&](int64_t i) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      std::lock_guard<std::mutex> lock(m);
      ran.push_back({i, std::this_thread::get_id()});
    }, 1);
    ASSERT_EQ(ran.size(), 16u);
    std::sort(ran.begin(), ran.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    EXPECT_EQ(ran.front().second, std::this_thread::get_id());
    int switches = 0;
    for (size_t i = 1; i < ran.size(); ++i) switches += ran[i].second != ran[i - 1].second;
    EXPECT_LE(switches, 1) << "round " << round;
  }
}

TEST(Parallel, AnUnparallelLoopRunsAsOneRangeOnTheCaller) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  parallel_for(1000, [&](int64_t begin, int64_t end) { ranges.push_back({begin, end}); }, false);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], std::make_pair(int64_t{0}, int64_t{1000}));
}

}  // namespace
}  // namespace kiln::cpu
