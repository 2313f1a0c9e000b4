// Where two device buffers differ bit for bit, counted on the device. A build checks each
// candidate kernel of a layer against its reference kernel this way: copying both outputs to
// the host and comparing them there took tens of milliseconds a candidate for outputs of
// hundreds of megabytes, and a build checks hundreds of candidates.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

struct BitwiseDifference {
  int64_t count = 0;   // elements that differ
  int64_t first = -1;  // the first of them (-1: none)
  uint32_t want = 0, got = 0;  // its bits in `reference` and in `candidate`
};

// Bytes of device memory bitwise_difference needs for its counters.
inline constexpr size_t kBitwiseDifferenceScratch = 16;

// Compares `elements` elements of `element_bytes` (2 or 4) bytes each, on `stream`, and waits
// for the answer. `scratch`: kBitwiseDifferenceScratch bytes of device memory, 8-byte aligned.
BitwiseDifference bitwise_difference(const void* reference, const void* candidate, int64_t elements, int element_bytes,
                                     void* scratch, cudaStream_t stream);

}  // namespace kiln::cuda
