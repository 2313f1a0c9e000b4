// The activation arena: every kArena buffer gets an offset in one allocation, so that two
// buffers share memory only when their lifetimes (first producing layer .. last reading
// layer) do not overlap. Greedy by size, largest first, each at the lowest offset that fits
// among the already placed buffers it overlaps in time (the "greedy by size" planner of
// TFLite's arena, which lands within a few percent of the best for CNNs).
#include <algorithm>
#include <numeric>

#include "cuda/runtime/memory_plan.h"

namespace kiln::cuda {

namespace {
constexpr size_t kAlignment = 256;  // cuDNN and vectorized kernels want aligned buffers
size_t align_up(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }
}  // namespace

size_t plan_arena(std::vector<Buffer>& buffers) {
  std::vector<int> order;
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].kind == BufferKind::kArena) order.push_back(static_cast<int>(i));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return buffers[a].spec.bytes() > buffers[b].spec.bytes();
  });
  struct Placed { size_t begin, end; int first, last; };
  std::vector<Placed> placed;
  size_t total = 0;
  for (int id : order) {
    Buffer& b = buffers[id];
    const size_t size = align_up(std::max<size_t>(b.spec.bytes(), 1));
    // Intervals of memory taken by buffers alive at the same time, by offset.
    std::vector<std::pair<size_t, size_t>> taken;
    for (const Placed& p : placed)
      if (!(p.last < b.first_use || b.last_use < p.first)) taken.push_back({p.begin, p.end});
    std::sort(taken.begin(), taken.end());
    size_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (offset + size <= begin) break;
      offset = std::max(offset, end);
    }
    b.offset = offset;
    placed.push_back({offset, offset + size, b.first_use, b.last_use});
    total = std::max(total, offset + size);
  }
  return total;
}

}  // namespace kiln::cuda
