#include "serve/shared_memory_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "kiln/error.h"
#include "kiln/kiln.h"

namespace kiln::serve {

namespace {

Error refused(const std::string& message) { return Error(ErrorKind::kInvalidArgument, message); }

// A key names one object of /dev/shm: letters, digits, '.', '_' and '-', after an optional '/'.
bool is_object_name(const std::string& key) {
  const std::string name = !key.empty() && key[0] == '/' ? key.substr(1) : key;
  if (name.empty() || name == "." || name == "..") return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  return true;
}

}  // namespace

MappedObject::~MappedObject() {
  pinned.reset();  // unpinned before it is unmapped
  munmap(address_, bytes_);
}

void SharedMemoryRegions::register_region(const std::string& name, const std::string& key, uint64_t offset,
                                          uint64_t byte_size) {
  if (name.empty()) throw refused("a shared-memory region needs a name");
  if (!is_object_name(key))
    throw refused("region '" + name + "': key '" + key +
                  "' is not the name of a shared-memory object (letters, digits, '.', '_' and '-', after an "
                  "optional '/')");
  if (byte_size == 0) throw refused("region '" + name + "': byte_size must be more than 0");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (regions_.count(name)) throw refused("shared-memory region '" + name + "' is already registered");
  }
  const std::string path = "/dev/shm/" + (key[0] == '/' ? key.substr(1) : key);
  const int fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    throw refused("region '" + name + "': cannot open shared-memory object " + key + ": " + std::strerror(errno));
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    throw refused("region '" + name + "': " + key + " is not a shared-memory object");
  }
  const uint64_t object_bytes = static_cast<uint64_t>(info.st_size);
  // (offset + byte_size compared without the sum, which could wrap)
  if (offset > object_bytes || byte_size > object_bytes - offset) {
    close(fd);
    throw refused("region '" + name + "': offset " + std::to_string(offset) + " + byte_size " +
                  std::to_string(byte_size) + " is past the end of " + key + " (" + std::to_string(object_bytes) +
                  " bytes)");
  }
  void* address = mmap(nullptr, object_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  close(fd);
  if (address == MAP_FAILED)
    throw refused("region '" + name + "': cannot map " + key + ": " + std::strerror(map_errno));
  auto object = std::make_shared<MappedObject>(address, object_bytes);
  if (pin_gpu_ >= 0) {
    try {
      object->pinned = std::make_shared<PinnedHostMemory>(address, object_bytes, pin_gpu_);
    } catch (const Error& e) {
      std::fprintf(stderr, "kiln serve: shared-memory region '%s' is not pinned for the GPU (%s): its inputs are "
                           "copied by the CPU first\n", name.c_str(), e.what());
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (regions_.count(name)) throw refused("shared-memory region '" + name + "' is already registered");
  regions_[name] = Region{RegionStatus{name, key, offset, byte_size}, std::move(object)};
}

void SharedMemoryRegions::unregister(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (name.empty())
    regions_.clear();
  else
    regions_.erase(name);
  // A mapping stays until the last request using it lets go of its span.
}

std::vector<RegionStatus> SharedMemoryRegions::status(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<RegionStatus> out;
  if (name.empty()) {
    for (const auto& [_, region] : regions_) out.push_back(region.status);
    return out;
  }
  auto it = regions_.find(name);
  if (it == regions_.end()) throw RegionNotFound("no shared-memory region '" + name + "' is registered");
  out.push_back(it->second.status);
  return out;
}

RegionSpan SharedMemoryRegions::span(const std::string& region, uint64_t offset, uint64_t byte_size,
                                     const std::string& what) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(region);
  if (it == regions_.end()) throw RegionNotFound(what + ": no shared-memory region '" + region + "' is registered");
  const Region& r = it->second;
  if (offset > r.status.byte_size || byte_size > r.status.byte_size - offset)
    throw refused(what + ": offset " + std::to_string(offset) + " + byte size " + std::to_string(byte_size) +
                  " is past the end of region '" + region + "' (" + std::to_string(r.status.byte_size) + " bytes)");
  return RegionSpan{r.object, r.object->data() + r.status.offset + offset, byte_size};
}

}  // namespace kiln::serve
