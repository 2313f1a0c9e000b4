// The native gRPC front's page-locked input buffers (src/serve/pinned_inputs.h): sizes by powers
// of two, each buffer locked once and reused once let go, never more than the pool's bytes,
// buffers of another size nobody holds evicted to make room, a driver that refuses asked once,
// buffers that outlive the pool still locked until let go, and no buffer held twice by threads
// taking and giving back at once. The lock is a stand-in that counts: the GPU's own
// (kiln::PinnedHostMemory) runs in tests/gpu/test_gpu_serve.py.
#include "serve/pinned_inputs.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kiln::serve {
namespace {

// A lock that counts the buffers it locked and those still locked.
struct CountingLock {
  std::shared_ptr<std::atomic<int>> locks = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> locked = std::make_shared<std::atomic<int>>(0);
  PinnedInputs::Lock lock() const {
    return [locks = locks, locked = locked](void* memory, size_t bytes) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(memory) % 4096, 0u);
      EXPECT_EQ(bytes % 4096, 0u);
      *locks += 1;
      *locked += 1;
      return std::shared_ptr<void>(memory, [locked](void*) { *locked -= 1; });
    };
  }
};

TEST(PinnedInputs, SizesArePowersOfTwoFromTheSmallest) {
  EXPECT_EQ(PinnedInputs::size_class(1), PinnedInputs::kSmallest);
  EXPECT_EQ(PinnedInputs::size_class(PinnedInputs::kSmallest), PinnedInputs::kSmallest);
  EXPECT_EQ(PinnedInputs::size_class(PinnedInputs::kSmallest + 1), 2 * PinnedInputs::kSmallest);
  EXPECT_EQ(PinnedInputs::size_class(3 * 224 * 224 * 4), size_t{1} << 20);  // one float32 image
  EXPECT_EQ(PinnedInputs::size_class(SIZE_MAX), 0u);                        // no such buffer
}

TEST(PinnedInputs, ABufferLetGoIsReusedWithoutLockingAgain) {
  CountingLock counting;
  PinnedInputs pool(size_t{16} << 20, counting.lock());
  auto a = pool.take(1000);
  auto b = pool.take(1000);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a.get(), b.get());
  EXPECT_EQ(*counting.locks, 2);
  unsigned char* first = a.get();
  a.reset();
  auto c = pool.take(PinnedInputs::kSmallest);  // the same size: the buffer let go
  EXPECT_EQ(c.get(), first);
  EXPECT_EQ(*counting.locks, 2);
  auto d = pool.take(PinnedInputs::kSmallest + 1);  // the next size: a new one
  ASSERT_TRUE(d);
  EXPECT_EQ(*counting.locks, 3);
  EXPECT_EQ(pool.held_bytes(), 4 * PinnedInputs::kSmallest);
}

TEST(PinnedInputs, NeverMoreThanThePoolsBytes) {
  CountingLock counting;
  PinnedInputs pool(4 * PinnedInputs::kSmallest, counting.lock());
  auto a = pool.take(PinnedInputs::kSmallest + 1);
  auto b = pool.take(PinnedInputs::kSmallest + 1);
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(pool.take(1));                             // all four used
  EXPECT_FALSE(pool.take(8 * PinnedInputs::kSmallest));  // larger than the pool
  b.reset();
  auto again = pool.take(PinnedInputs::kSmallest + 1);  // the one let go
  EXPECT_TRUE(again);
  EXPECT_FALSE(pool.take(1));  // the smallest size has none made, and no room to make one
  EXPECT_EQ(*counting.locks, 2);
}

TEST(PinnedInputs, BuffersOfAnotherSizeNobodyHoldsMakeRoom) {
  CountingLock counting;
  PinnedInputs pool(4 * PinnedInputs::kSmallest, counting.lock());
  auto a = pool.take(PinnedInputs::kSmallest + 1);
  auto b = pool.take(PinnedInputs::kSmallest + 1);  // the pool's bytes, all in two buffers
  a.reset();
  b.reset();
  auto c = pool.take(1);  // one of them goes
  ASSERT_TRUE(c);
  EXPECT_EQ(*counting.locks, 3);
  EXPECT_EQ(*counting.locked, 2);
  EXPECT_EQ(pool.held_bytes(), 3 * PinnedInputs::kSmallest);
  auto d = pool.take(1);  // room without evicting
  auto e = pool.take(PinnedInputs::kSmallest + 1);  // the one left, reused
  ASSERT_TRUE(d && e);
  EXPECT_EQ(*counting.locks, 4);
  EXPECT_FALSE(pool.take(1));  // every buffer held: nothing to evict
  EXPECT_EQ(*counting.locked, 3);
  EXPECT_EQ(pool.held_bytes(), 4 * PinnedInputs::kSmallest);
}

TEST(PinnedInputs, ADriverThatRefusesIsAskedOnce) {
  int asked = 0;
  PinnedInputs pool(size_t{16} << 20, [&asked](void*, size_t) -> std::shared_ptr<void> {
    asked += 1;
    throw std::runtime_error("no memory the driver locks");
  });
  EXPECT_FALSE(pool.take(1000));
  EXPECT_FALSE(pool.take(1000));
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(pool.held_bytes(), 0u);
}

TEST(PinnedInputs, ABufferOutlivesThePoolLockedUntilLetGo) {
  CountingLock counting;
  std::shared_ptr<unsigned char[]> kept;
  {
    PinnedInputs pool(size_t{16} << 20, counting.lock());
    kept = pool.take(100);
    auto other = pool.take(100);
  }
  EXPECT_EQ(*counting.locked, 2);  // the one let go is the pool's until the last buffer goes
  std::memset(kept.get(), 7, 100);
  kept.reset();
  EXPECT_EQ(*counting.locked, 0);
}

TEST(PinnedInputs, ThreadsNeverHoldOneBufferAtOnce) {
  CountingLock counting;
  PinnedInputs pool(size_t{64} << 20, counting.lock());
  std::atomic<int> clashes{0}, taken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        auto buffer = pool.take(static_cast<size_t>(1000 + (i % 3) * 100000));
        if (!buffer) continue;
        taken += 1;
        std::memset(buffer.get(), t, 64);
        std::this_thread::yield();
        for (int k = 0; k < 64; ++k) clashes += buffer[k] != static_cast<unsigned char>(t) ? 1 : 0;
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(clashes, 0);
  EXPECT_EQ(taken, 8 * 2000);  // 64 MiB holds what 8 threads hold at once
  EXPECT_LE(pool.held_bytes(), size_t{64} << 20);
  EXPECT_LE(*counting.locks, 8 * 3);  // three sizes, at most one buffer per thread at once
}

}  // namespace
}  // namespace kiln::serve
