// QuantizedGemm's FP8 kernels (quantized_gemm_cutlass.cuh), in a file of their own so that
// the two input types compile in parallel.
#include "cuda/kernels/quantized_gemm_cutlass.cuh"

namespace kiln::cuda {

std::vector<const QuantizedGemmKernel*> fp8_quantized_gemm_kernels() {
  using namespace quantized_gemm;
  return kernels_of<DType::kFloat8E4M3FN, cutlass::float_e4m3_t, CooperativeFp8, PingpongFp8>();
}

}  // namespace kiln::cuda
