#include "cuda/runtime/check.h"

#include <string>

namespace kiln::cuda {

namespace {
std::string where(const char* call, const char* file, int line) {
  std::string f = file;
  size_t pos = f.rfind("/src/");
  if (pos != std::string::npos) f = f.substr(pos + 1);
  return std::string(call) + " (" + f + ":" + std::to_string(line) + ")";
}
}  // namespace

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  // A failed call also sets the runtime's last error; clear it, or the next unrelated
  // cudaGetLastError() check (after a kernel launch) would report this failure again.
  // Sticky errors (a faulted context) stay: every later call reports them anyway.
  (void)cudaGetLastError();
  Error e(ErrorKind::kDevice, std::string("CUDA error ") + cudaGetErrorName(status) + ": " +
                                  cudaGetErrorString(status) + " in " + where(call, file, line));
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver)
    e.hint("this machine has no usable NVIDIA GPU or driver; build a CPU engine instead (--device cpu)");
  throw e;
}

void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  // An execution failure is a CUDA error underneath: name it too (and clear it).
  const cudaError_t cuda = cudaGetLastError();
  const std::string underneath =
      cuda == cudaSuccess ? "" : std::string(" (CUDA: ") + cudaGetErrorName(cuda) + ": " + cudaGetErrorString(cuda) + ")";
  throw Error(ErrorKind::kDevice, std::string("cuDNN error ") + cudnnGetErrorString(status) + underneath + " in " +
                                      where(call, file, line));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(ErrorKind::kDevice, std::string("cuBLAS error ") + std::to_string(static_cast<int>(status)) +
                                      " in " + where(call, file, line));
}

}  // namespace kiln::cuda
