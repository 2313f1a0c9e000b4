// std::vector whose elements start on a cache line (64 bytes). The CPU kernels load 64 bytes at a
// time from packed weights and buffers; from malloc's 16-byte alignment three of four such loads
// span two lines, and whether a large buffer lands on a line's start depended on what was
// allocated before it (a buffer past malloc's mmap threshold begins 16 bytes into its page), so
// the same engine ran faster or slower from one process or build to the next
// (docs/design/cpu-gemm.md, "Buffers on cache lines").
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace kiln::cpu {

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::size_t kAlignment = 64;

  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}  // NOLINT: allocators convert implicitly

  T* allocate(std::size_t n) {
    if (n > (static_cast<std::size_t>(-1) - kAlignment) / sizeof(T)) throw std::bad_alloc();
    const std::size_t bytes = (n * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, bytes == 0 ? kAlignment : bytes);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }

  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const CacheLineAllocator<U>&) const noexcept { return false; }
};

template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace kiln::cpu
