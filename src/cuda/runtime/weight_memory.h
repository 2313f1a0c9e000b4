// The device memory an engine keeps its weights in (one region for every plan and context).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace kiln::cuda {

// Device memory the engine owns for weights. Uploads are content-addressed: the plans of one
// engine (one per input shape) upload the same weights, and each distinct content is stored once.
//
// The weights lie end to end in one reserved range of device addresses that is backed with
// physical pages (the device's allocation granularity, 2 MiB) as it fills, through the driver's
// virtual memory management: the memory held is the weights rounded up to one page, however their
// sizes fall. (With separate allocations, each weight a little over a page would cost a page more:
// ResNet-50's 51 MB of fp16 weights held 58 MiB.) Where the driver lacks virtual memory management,
// weights go into blocks of whole pages instead, each upload into the first with room.
class WeightMemory {
 public:
  WeightMemory() = default;
  WeightMemory(const WeightMemory&) = delete;
  WeightMemory& operator=(const WeightMemory&) = delete;
  ~WeightMemory();
  // A device copy of `bytes` bytes at `host` (256-byte aligned), or the earlier copy of the same
  // contents. Throws kiln::Error (kDevice) when the device has no memory for it.
  const void* upload(const void* host, size_t bytes);
  size_t bytes() const { return used_; }
  // The device memory the weights take, in whole pages: what they cost.
  size_t held_bytes() const { return held_; }

 private:
  // Room for `size` more bytes: a device address, backed and accessible.
  void* allocate(size_t size);
  void* allocate_in_range(size_t size);  // nullptr: no range, or it is full
  void* allocate_in_blocks(size_t size);

  // The reserved range (virtual memory management): [base, base + reserved), backed up to mapped.
  struct Range {
    uintptr_t base = 0;
    size_t reserved = 0, mapped = 0, used = 0, granularity = 0;
    int device = 0;
    std::vector<std::pair<uintptr_t, size_t>> mappings;  // (offset, bytes) of each backing
    std::vector<unsigned long long> handles;             // the physical allocation of each
  };
  Range range_;
  bool range_tried_ = false;
  // Blocks of whole pages (without virtual memory management, or once the range is full).
  struct Block {
    char* base = nullptr;
    size_t size = 0, used = 0;
  };
  std::vector<Block> blocks_;
  size_t used_ = 0, held_ = 0;
  std::map<std::pair<size_t, uint64_t>, const void*> uploaded_;  // (bytes, content hash) -> device
};

}  // namespace kiln::cuda
