#include "cuda/kernels/bitwise_difference.h"

#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "kiln/error.h"

namespace kiln::cuda {

namespace {

// Each warp sums its threads' counts by shuffles and adds them once; the first
// difference is the minimum index any thread saw.
template <typename Word>
__global__ void bitwise_difference_kernel(const Word* __restrict__ a, const Word* __restrict__ b, int64_t n,
                                          unsigned long long* counters) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned long long count = 0, first = ~0ull;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (a[i] != b[i]) {
      ++count;
      if (static_cast<unsigned long long>(i) < first) first = static_cast<unsigned long long>(i);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    count += __shfl_down_sync(0xffffffffu, count, offset);
    const unsigned long long other = __shfl_down_sync(0xffffffffu, first, offset);
    first = other < first ? other : first;
  }
  if ((threadIdx.x & 31) == 0 && count > 0) {
    atomicAdd(&counters[0], count);
    atomicMin(&counters[1], first);
  }
}

}  // namespace

BitwiseDifference bitwise_difference(const void* reference, const void* candidate, int64_t elements, int element_bytes,
                                     void* scratch, cudaStream_t stream) {
  if (element_bytes != 2 && element_bytes != 4)
    throw Error(ErrorKind::kInternal, "bitwise_difference compares 2- or 4-byte elements, not " + std::to_string(element_bytes));
  BitwiseDifference d;
  if (elements <= 0) return d;
  auto* counters = static_cast<unsigned long long*>(scratch);
  const unsigned long long initial[2] = {0, ~0ull};
  KILN_CUDA_CHECK(cudaMemcpyAsync(counters, initial, sizeof initial, cudaMemcpyHostToDevice, stream));
  const unsigned blocks = capped_blocks(std::min<int64_t>((elements + 255) / 256, 4096));
  if (element_bytes == 2)
    bitwise_difference_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint16_t*>(reference),
                                                           static_cast<const uint16_t*>(candidate), elements, counters);
  else
    bitwise_difference_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint32_t*>(reference),
                                                           static_cast<const uint32_t*>(candidate), elements, counters);
  KILN_CUDA_CHECK(cudaGetLastError());
  unsigned long long result[2] = {0, 0};
  KILN_CUDA_CHECK(cudaMemcpyAsync(result, counters, sizeof result, cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  d.count = static_cast<int64_t>(result[0]);
  if (d.count == 0) return d;
  d.first = static_cast<int64_t>(result[1]);
  const size_t at = static_cast<size_t>(d.first) * static_cast<size_t>(element_bytes);
  KILN_CUDA_CHECK(cudaMemcpyAsync(&d.want, static_cast<const char*>(reference) + at, element_bytes, cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaMemcpyAsync(&d.got, static_cast<const char*>(candidate) + at, element_bytes, cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

}  // namespace kiln::cuda
