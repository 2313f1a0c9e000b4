// QuantizedGemm's INT8 kernels (quantized_gemm_cutlass.cuh), in a file of their own so that
// the two input types compile in parallel.
#include "cuda/kernels/quantized_gemm_cutlass.cuh"

namespace kiln::cuda {

std::vector<const QuantizedGemmKernel*> int8_quantized_gemm_kernels() {
  using namespace quantized_gemm;
  return kernels_of<DType::kInt8, int8_t, Cooperative, Pingpong>();
}

}  // namespace kiln::cuda
