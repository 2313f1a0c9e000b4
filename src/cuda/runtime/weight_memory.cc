// WeightMemory: the weights in one growing range of device addresses (weight_memory.h says why).
// The driver's virtual memory calls are reached through the runtime's entry-point query, so
// kiln links no libcuda of its own (the driver's is whatever the machine has).
#include "cuda/runtime/weight_memory.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/runtime/check.h"
#include "kiln/error.h"

namespace kiln::cuda {

namespace {

// The virtual memory management calls of the driver API, or none where the driver or the device
// lacks them.
struct DriverMemoryCalls {
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) free_range = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuDeviceGet) device = nullptr;
  decltype(&cuDeviceGetAttribute) attribute = nullptr;
  bool complete() const {
    return granularity && reserve && free_range && create && release && map && unmap && set_access && device && attribute;
  }
};

const DriverMemoryCalls& driver_memory_calls() {
  static const DriverMemoryCalls calls = [] {
    DriverMemoryCalls c;
    auto find = [](const char* symbol, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found{};
      // 12000: the calls as CUDA 12 declared them (unchanged since 10.2).
      if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found) == cudaSuccess &&
          found == cudaDriverEntryPointSuccess)
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      else
        (void)cudaGetLastError();
    };
    find("cuMemGetAllocationGranularity", c.granularity);
    find("cuMemAddressReserve", c.reserve);
    find("cuMemAddressFree", c.free_range);
    find("cuMemCreate", c.create);
    find("cuMemRelease", c.release);
    find("cuMemMap", c.map);
    find("cuMemUnmap", c.unmap);
    find("cuMemSetAccess", c.set_access);
    find("cuDeviceGet", c.device);
    find("cuDeviceGetAttribute", c.attribute);
    return c;
  }();
  return calls;
}

void check_driver(CUresult status, const char* call, size_t bytes) {
  if (status == CUDA_SUCCESS) return;
  const std::string what = std::string(call) + " for " + std::to_string(bytes) + " bytes of weights failed: CUDA driver error " +
                           std::to_string(static_cast<int>(status));
  if (status == CUDA_ERROR_OUT_OF_MEMORY)
    throw Error(ErrorKind::kDevice, "out of device memory: " + what)
        .hint("free GPU memory (other engines, other processes), or build with a smaller precision");
  throw Error(ErrorKind::kDevice, what);
}

CUmemAllocationProp device_allocation(int device) {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// A 64-bit hash of a weight's bytes (FNV-1a over 8-byte words, then the tail), to find uploads
// of the same content; equal sizes and hashes are taken as equal contents.
uint64_t content_hash(const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
    h ^= h >> 29;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

WeightMemory::~WeightMemory() {
  const DriverMemoryCalls& driver = driver_memory_calls();
  if (range_.base) {
    for (const auto& [offset, bytes] : range_.mappings) driver.unmap(static_cast<CUdeviceptr>(range_.base + offset), bytes);
    for (unsigned long long handle : range_.handles) driver.release(static_cast<CUmemGenericAllocationHandle>(handle));
    driver.free_range(static_cast<CUdeviceptr>(range_.base), range_.reserved);
  }
  for (const Block& b : blocks_) cudaFree(b.base);
}

const void* WeightMemory::upload(const void* host, size_t bytes) {
  const auto key = std::make_pair(bytes, bytes ? content_hash(host, bytes) : 0);
  if (auto it = uploaded_.find(key); it != uploaded_.end()) return it->second;
  constexpr size_t kAlign = 256;
  const size_t size = round_up(std::max<size_t>(bytes, 1), kAlign);
  void* dst = allocate(size);
  if (bytes) KILN_CUDA_CHECK(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
  used_ += size;
  uploaded_[key] = dst;
  return dst;
}

void* WeightMemory::allocate(size_t size) {
  if (void* p = allocate_in_range(size)) return p;
  return allocate_in_blocks(size);
}

void* WeightMemory::allocate_in_range(size_t size) {
  const DriverMemoryCalls& driver = driver_memory_calls();
  if (!range_tried_) {
    range_tried_ = true;
    int device = 0, supported = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    CUdevice handle = 0;
    if (!driver.complete() || driver.device(&handle, device) != CUDA_SUCCESS ||
        driver.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, handle) != CUDA_SUCCESS ||
        !supported)
      return nullptr;
    const CUmemAllocationProp prop = device_allocation(device);
    size_t granularity = 0;
    if (driver.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || granularity == 0)
      return nullptr;
    // Addresses for as much as the device holds: reserving addresses costs no memory.
    size_t free = 0, total = 0;
    KILN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    CUdeviceptr base = 0;
    const size_t reserved = round_up(total, granularity);
    if (driver.reserve(&base, reserved, 0, 0, 0) != CUDA_SUCCESS) return nullptr;
    range_.base = static_cast<uintptr_t>(base);
    range_.reserved = reserved;
    range_.granularity = granularity;
    range_.device = device;
  }
  if (!range_.base || size > range_.reserved - range_.used) return nullptr;
  const size_t end = range_.used + size;
  if (end > range_.mapped) {
    // Back the addresses up to `end` with one more physical allocation of whole pages.
    const size_t grow = round_up(end - range_.mapped, range_.granularity);
    const CUmemAllocationProp prop = device_allocation(range_.device);
    CUmemGenericAllocationHandle handle = 0;
    check_driver(driver.create(&handle, grow, &prop, 0), "cuMemCreate", grow);
    const CUdeviceptr at = static_cast<CUdeviceptr>(range_.base + range_.mapped);
    const CUresult mapped = driver.map(at, grow, 0, handle, 0);
    if (mapped != CUDA_SUCCESS) {
      driver.release(handle);
      check_driver(mapped, "cuMemMap", grow);
    }
    CUmemAccessDesc access;
    std::memset(&access, 0, sizeof(access));
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const CUresult accessible = driver.set_access(at, grow, &access, 1);
    if (accessible != CUDA_SUCCESS) {
      driver.unmap(at, grow);
      driver.release(handle);
      check_driver(accessible, "cuMemSetAccess", grow);
    }
    range_.mappings.emplace_back(range_.mapped, grow);
    range_.handles.push_back(static_cast<unsigned long long>(handle));
    range_.mapped += grow;
    held_ += grow;
  }
  void* p = reinterpret_cast<void*>(range_.base + range_.used);
  range_.used = end;
  return p;
}

void* WeightMemory::allocate_in_blocks(size_t size) {
  constexpr size_t kPage = size_t{2} << 20;
  auto block = std::find_if(blocks_.begin(), blocks_.end(), [&](const Block& b) { return b.size - b.used >= size; });
  if (block == blocks_.end()) {
    Block b;
    b.size = round_up(size, kPage);
    KILN_CUDA_CHECK(cudaMalloc(&b.base, b.size));
    blocks_.push_back(b);
    held_ += b.size;
    block = blocks_.end() - 1;
  }
  void* p = block->base + block->used;
  block->used += size;
  return p;
}

}  // namespace kiln::cuda
