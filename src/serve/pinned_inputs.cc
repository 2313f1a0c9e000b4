#include "serve/pinned_inputs.h"

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::serve {

namespace {

// One buffer: its memory, and what locks it (let go before the memory is freed: members go in
// reverse order).
struct Block {
  std::unique_ptr<unsigned char, decltype(&std::free)> memory{nullptr, &std::free};
  std::shared_ptr<void> locked;
};

constexpr size_t kAlignment = 4096;  // whole pages, which the driver locks

}  // namespace

struct PinnedInputs::Buffers {
  size_t max_bytes;
  Lock lock;
  std::mutex mutex;
  size_t made = 0;              // bytes of the buffers made, or being made
  bool driver_refused = false;  // once the driver locks no more, no more tries
  std::map<unsigned char*, std::unique_ptr<Block>> blocks;  // by their memory
  std::map<size_t, std::vector<unsigned char*>> free;       // size -> buffers not held
  std::map<size_t, size_t> count;                            // size -> buffers made

  // With the lock held: buffers of other sizes not held, largest first, taken out of the pool
  // until `size` more fits (none when even all of them would not make the room). The caller
  // destroys them after letting go of the lock (unlocking takes milliseconds).
  std::vector<std::unique_ptr<Block>> evict_for(size_t size) {
    size_t unheld = 0;
    for (const auto& [bytes, list] : free) unheld += bytes * list.size();
    std::vector<std::unique_ptr<Block>> evicted;
    if (made + size - unheld > max_bytes) return evicted;
    for (auto it = free.rbegin(); it != free.rend() && made + size > max_bytes; ++it) {
      while (!it->second.empty() && made + size > max_bytes) {
        auto block = blocks.find(it->second.back());
        it->second.pop_back();
        made -= it->first;
        count[it->first] -= 1;
        evicted.push_back(std::move(block->second));
        blocks.erase(block);
      }
    }
    return evicted;
  }
};

PinnedInputs::Lock PinnedInputs::for_gpu(int gpu) {
  return [gpu](void* memory, size_t bytes) { return std::make_shared<PinnedHostMemory>(memory, bytes, gpu); };
}

PinnedInputs::PinnedInputs(size_t max_bytes, Lock lock) : buffers_(std::make_shared<Buffers>()) {
  buffers_->max_bytes = max_bytes;
  buffers_->lock = std::move(lock);
}

size_t PinnedInputs::size_class(size_t bytes) {
  size_t size = kSmallest;
  while (size < bytes) {
    if (size > SIZE_MAX / 2) return 0;  // no such buffer
    size *= 2;
  }
  return size;
}

size_t PinnedInputs::held_bytes() const {
  std::lock_guard<std::mutex> lock(buffers_->mutex);
  return buffers_->made;
}

std::shared_ptr<unsigned char[]> PinnedInputs::take(size_t bytes) {
  Buffers& b = *buffers_;
  const size_t size = size_class(bytes);
  if (size == 0 || size > b.max_bytes) return nullptr;
  unsigned char* memory = nullptr;
  std::vector<std::unique_ptr<Block>> evicted;  // (destroyed outside the lock)
  {
    std::lock_guard<std::mutex> lock(b.mutex);
    std::vector<unsigned char*>& unheld = b.free[size];
    if (!unheld.empty()) {
      memory = unheld.back();
      unheld.pop_back();
    } else if (b.driver_refused) {
      return nullptr;
    } else {
      // Room made from buffers of other sizes nobody holds: the sizes requests come in change.
      if (b.made + size > b.max_bytes) evicted = b.evict_for(size);
      if (b.made + size > b.max_bytes) return nullptr;
      b.made += size;  // reserved while it is made, outside the lock (locking takes milliseconds)
    }
  }
  evicted.clear();
  if (!memory) {
    auto block = std::make_unique<Block>();
    block->memory.reset(static_cast<unsigned char*>(std::aligned_alloc(kAlignment, size)));
    bool locked = false;
    if (block->memory) {
      try {
        block->locked = b.lock(block->memory.get(), size);
        locked = true;
      } catch (const std::exception&) {
        // (no GPU, or no more memory the driver locks: the inputs stay where they lie)
      }
    }
    std::lock_guard<std::mutex> lock(b.mutex);
    if (!locked) {
      b.made -= size;
      b.driver_refused = b.driver_refused || block->memory != nullptr;
      return nullptr;
    }
    memory = block->memory.get();
    b.blocks.emplace(memory, std::move(block));
    // Room for every buffer of its size to come back: giving one back then allocates nothing.
    b.free[size].reserve(++b.count[size]);
  }
  std::shared_ptr<Buffers> owner = buffers_;
  return std::shared_ptr<unsigned char[]>(memory, [owner, size](unsigned char* buffer) {
    std::lock_guard<std::mutex> lock(owner->mutex);
    owner->free[size].push_back(buffer);
  });
}

}  // namespace kiln::serve
