// Page-locked host buffers for the inputs a request carries in its message, for a front serving
// GPU models. The front copies such an input into one of them on the thread that decoded the
// request (gRPC's threads, many at once); the engine run then copies it to the device directly.
// Without them every request's bytes are copied into the context's transfer buffer on the one
// thread that runs the batch, one request after another: with 256 one-image ResNet-50 requests in
// flight a run took 11.1 ms for 59 rows, and 1.65 ms for 14 with them (docs/serving.md, "A C++
// load generator, and inputs in the message page-locked").
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

namespace kiln::serve {

class PinnedInputs {
 public:
  // What locks a buffer's memory: an object that keeps it locked while it lives. Throws when the
  // memory cannot be locked.
  using Lock = std::function<std::shared_ptr<void>(void* memory, size_t bytes)>;
  // kiln::PinnedHostMemory: page-locked for every GPU (registered while `gpu` is current).
  static Lock for_gpu(int gpu);

  // At most `max_bytes` of buffers in all, each locked by `lock` when made.
  PinnedInputs(size_t max_bytes, Lock lock);
  PinnedInputs(const PinnedInputs&) = delete;
  PinnedInputs& operator=(const PinnedInputs&) = delete;

  // A buffer of at least `bytes` (64-byte aligned), given back for reuse when the last holder lets
  // go. Buffers of other sizes that nobody holds make room when the pool's bytes are spent. Null
  // when they cannot (the buffers are held), or the driver does not lock more memory: the caller
  // then uses the bytes where they lie.
  std::shared_ptr<unsigned char[]> take(size_t bytes);
  // The bytes of the buffers made so far (each kept for reuse).
  size_t held_bytes() const;

  // The size a buffer for `bytes` has: a power of two, at least kSmallest.
  static size_t size_class(size_t bytes);
  static constexpr size_t kSmallest = size_t{64} << 10;

 private:
  struct Buffers;  // shared with the buffers handed out, which outlive the pool if they must
  std::shared_ptr<Buffers> buffers_;
};

}  // namespace kiln::serve
