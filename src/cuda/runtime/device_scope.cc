#include "cuda/runtime/device_scope.h"

#include <cuda_runtime.h>

#include <string>

#include "cuda/runtime/check.h"

namespace kiln::cuda {

void check_gpu_index(int gpu) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess && status != cudaErrorNoDevice) throw_cuda_error(status, "cudaGetDeviceCount", __FILE__, __LINE__);
  if (gpu >= 0 && gpu < count) return;
  const std::string seen = count == 0 ? "this process sees no GPU"
                           : count == 1 ? "this process sees one GPU, 0"
                                        : "this process sees " + std::to_string(count) + " GPUs, 0 to " + std::to_string(count - 1);
  throw Error(ErrorKind::kInvalidArgument, "GPU " + std::to_string(gpu) + " does not exist: " + seen)
      .hint("GPUs are numbered as CUDA numbers those CUDA_VISIBLE_DEVICES leaves visible; nvidia-smi lists them");
}

DeviceScope::DeviceScope(int gpu, bool checked) {
  int current = 0;
  if (!checked) {
    if (cudaGetDevice(&current) == cudaSuccess && current != gpu && cudaSetDevice(gpu) == cudaSuccess) previous_ = current;
    return;
  }
  KILN_CUDA_CHECK(cudaGetDevice(&current));
  if (current == gpu) return;
  check_gpu_index(gpu);
  KILN_CUDA_CHECK(cudaSetDevice(gpu));
  previous_ = current;
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) cudaSetDevice(previous_);  // a destructor throws nothing; the device existed
}

}  // namespace kiln::cuda
