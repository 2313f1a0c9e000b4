// The kernels behind QuantizedGemm (quantized_gemm.h), as the layer's code sees them: one
// entry per compiled CUTLASS kernel, without CUTLASS's headers. quantized_gemm_int8.cu and
// quantized_gemm_fp8.cu define the lists (quantized_gemm_cutlass.cuh instantiates them);
// quantized_gemm_absent.cc defines them empty in a build without CUTLASS or without sm_90a.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "ir/activation.h"
#include "kiln/types.h"

namespace kiln::cuda {

// One product's operands and epilogue constants (quantized_gemm.h has the definition).
struct QuantizedGemmProblem {
  int m = 0, n = 0, k = 0;
  const void* x = nullptr;      // [M, K]
  const void* w = nullptr;      // [N, K]
  const float* alpha = nullptr; // [N]
  const float* bias = nullptr;  // [N], or null
  const void* z = nullptr;      // float16 [M, N], or null
  void* y = nullptr;            // [M, N]
  ir::Activation act;
  float out_scale = 1.f;
};

struct QuantizedGemmKernel {
  const char* name;  // tile shape, cluster and schedule
  DType input;       // X's and W's type
  DType output;      // Y's type
  // Whether the kernel takes this problem's sizes and alignments.
  bool (*supports)(const QuantizedGemmProblem& problem);
  size_t (*workspace_bytes)(const QuantizedGemmProblem& problem);
  // Raises the kernel's shared-memory limit on the current device; once, before any run.
  cudaError_t (*prepare)();
  cudaError_t (*run)(const QuantizedGemmProblem& problem, void* workspace, cudaStream_t stream);
};

// Empty in a build without the kernels (quantized_gemm_unsupported() says why).
std::vector<const QuantizedGemmKernel*> int8_quantized_gemm_kernels();
std::vector<const QuantizedGemmKernel*> fp8_quantized_gemm_kernels();

}  // namespace kiln::cuda
