// System shared memory for the native gRPC front: the Open Inference Protocol's shared-memory
// extension, with the rules of kiln serve's Python registry (python/kiln/shared_memory.py): a
// client registers a region (offset, byte size) of a POSIX shared-memory object of /dev/shm
// under a name, then names the region in an input's or an output's parameters, and the server
// reads the input there in place, or writes the output there.
//
// A key is one name (a leading '/' allowed, nothing else), the object a regular file (no link
// followed) at least offset + byte_size long, and every read or write stays inside its region.
// A region unregistered while requests still use it stays mapped until they finish.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln::serve {

// A request or status call that names a region nobody registered (gRPC's NOT_FOUND).
class RegionNotFound : public Error {
 public:
  explicit RegionNotFound(std::string message) : Error(ErrorKind::kInvalidArgument, std::move(message)) {}
};

// One mapped shared-memory object. With a GPU to pin for, the mapping is also page-locked, so a
// context copies inputs from it straight to the device.
class MappedObject {
 public:
  MappedObject(void* address, size_t bytes) : address_(address), bytes_(bytes) {}
  ~MappedObject();
  MappedObject(const MappedObject&) = delete;
  MappedObject& operator=(const MappedObject&) = delete;
  unsigned char* data() const { return static_cast<unsigned char*>(address_); }
  size_t size() const { return bytes_; }
  std::shared_ptr<void> pinned;  // what keeps the mapping page-locked (a PinnedHostMemory), if anything

 private:
  void* address_;
  size_t bytes_;
};

struct RegionStatus {
  std::string name;
  std::string key;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// Where a tensor lies in a region: `bytes` at `data`, kept mapped by `object`.
struct RegionSpan {
  std::shared_ptr<MappedObject> object;
  unsigned char* data = nullptr;
  uint64_t bytes = 0;
};

class SharedMemoryRegions {
 public:
  // pin_gpu >= 0: pin each mapped object for that GPU (served unpinned, with a warning on stderr,
  // when the driver refuses).
  explicit SharedMemoryRegions(int pin_gpu = -1) : pin_gpu_(pin_gpu) {}

  // Throws kiln::Error (kInvalidArgument) naming the region and the reason.
  void register_region(const std::string& name, const std::string& key, uint64_t offset, uint64_t byte_size);
  // One region (none registered under the name is not an error), or every one for "".
  void unregister(const std::string& name);
  // Every region, or the one named (RegionNotFound when it is not registered).
  std::vector<RegionStatus> status(const std::string& name) const;
  // The span a tensor's parameters name: the region, and byte_size bytes from offset within it.
  // `what` names the tensor in errors (RegionNotFound for an unknown region, else kInvalidArgument).
  RegionSpan span(const std::string& region, uint64_t offset, uint64_t byte_size, const std::string& what) const;

 private:
  struct Region {
    RegionStatus status;
    std::shared_ptr<MappedObject> object;
  };
  int pin_gpu_;
  mutable std::mutex mutex_;
  std::map<std::string, Region> regions_;
};

}  // namespace kiln::serve
