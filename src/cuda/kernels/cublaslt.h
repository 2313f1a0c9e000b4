// What every cuBLASLt product of the CUDA layers asks cuBLASLt the same way (the float products
// of layers/matmul.cu, attention's products, kernels/fp8_gemm.h's FP8 products).
#pragma once

#include <cublasLt.h>

#include <cstddef>

namespace kiln::cuda {

// cuBLASLt's heuristic candidates for the product `desc` over layouts a, b and d (C laid out as
// D), within `workspace_bytes`: up to `max` of them into `results`, best first. Returns how
// many (0 when cuBLASLt has none). (An array, not a vector: nvcc 13.0 fails on a vector of
// these structs in .cu files.)
int cublaslt_candidates(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                        cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, size_t workspace_bytes, int max,
                        cublasLtMatmulHeuristicResult_t* results);

}  // namespace kiln::cuda
