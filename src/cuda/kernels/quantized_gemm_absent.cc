// QuantizedGemm's kernel lists in a build without them (CMakeLists.txt: CUTLASS's headers not
// found, or no sm_90 among the CUDA architectures): empty.
#include "cuda/kernels/quantized_gemm_candidates.h"

namespace kiln::cuda {

std::vector<const QuantizedGemmKernel*> int8_quantized_gemm_kernels() { return {}; }
std::vector<const QuantizedGemmKernel*> fp8_quantized_gemm_kernels() { return {}; }

}  // namespace kiln::cuda
