// Return-code checks for the CUDA runtime, cuDNN and cuBLASLt. Every call into them goes
// through one of these: a failure becomes a kiln::Error (kDevice) that names the call, the
// library's own message and where in kiln it happened.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "kiln/error.h"

namespace kiln::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(call)                                                              \
  do {                                                                                     \
    cudaError_t kiln_status_ = (call);                                                     \
    if (kiln_status_ != cudaSuccess)                                                       \
      ::kiln::cuda::throw_cuda_error(kiln_status_, #call, __FILE__, __LINE__);             \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next sync.
#define KILN_CUDA_CHECK_LAUNCH() KILN_CUDA_CHECK(cudaGetLastError())

#define KILN_CUDNN_CHECK(call)                                                             \
  do {                                                                                     \
    cudnnStatus_t kiln_status_ = (call);                                                   \
    if (kiln_status_ != CUDNN_STATUS_SUCCESS)                                              \
      ::kiln::cuda::throw_cudnn_error(kiln_status_, #call, __FILE__, __LINE__);            \
  } while (0)

#define KILN_CUBLAS_CHECK(call)                                                            \
  do {                                                                                     \
    cublasStatus_t kiln_status_ = (call);                                                  \
    if (kiln_status_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::kiln::cuda::throw_cublas_error(kiln_status_, #call, __FILE__, __LINE__);           \
  } while (0)
