// QuantizedGemm's FP8 kernels (quantized_gemm_cutlass.cuh): each tile shape with a float16
// and an 8-bit Y. The layer times every one that takes the product.
#include "cuda/kernels/quantized_gemm_cutlass.cuh"

namespace kiln::cuda {

namespace {

using namespace quantized_gemm;
using cute::_1;
using cute::_2;
using cute::_64;
using cute::_128;
using cute::_256;
using cute::Shape;

template <class D>
using Wide = Kernel<cutlass::float_e4m3_t, D, Shape<_128, _256, _128>, Shape<_2, _1, _1>, CooperativeFp8, CooperativeEpilogue>;
template <class D>
using Square = Kernel<cutlass::float_e4m3_t, D, Shape<_128, _128, _128>, Shape<_2, _1, _1>, CooperativeFp8, CooperativeEpilogue>;
template <class D>
using SquareAlongN = Kernel<cutlass::float_e4m3_t, D, Shape<_128, _128, _128>, Shape<_1, _2, _1>, CooperativeFp8, CooperativeEpilogue>;
template <class D>
using Narrow = Kernel<cutlass::float_e4m3_t, D, Shape<_64, _128, _128>, Shape<_1, _1, _1>, PingpongFp8, PingpongEpilogue>;

constexpr DType kIn = DType::kFloat8E4M3FN;
constexpr QuantizedGemmKernel kKernels[] = {
    Wide<cutlass::half_t>::entry("128x256x128 cluster 2x1 cooperative", kIn, DType::kFloat16),
    Square<cutlass::half_t>::entry("128x128x128 cluster 2x1 cooperative", kIn, DType::kFloat16),
    SquareAlongN<cutlass::half_t>::entry("128x128x128 cluster 1x2 cooperative", kIn, DType::kFloat16),
    Narrow<cutlass::half_t>::entry("64x128x128 pingpong", kIn, DType::kFloat16),
    Wide<cutlass::float_e4m3_t>::entry("128x256x128 cluster 2x1 cooperative", kIn, kIn),
    Square<cutlass::float_e4m3_t>::entry("128x128x128 cluster 2x1 cooperative", kIn, kIn),
    SquareAlongN<cutlass::float_e4m3_t>::entry("128x128x128 cluster 1x2 cooperative", kIn, kIn),
    Narrow<cutlass::float_e4m3_t>::entry("64x128x128 pingpong", kIn, kIn),
};

}  // namespace

std::vector<const QuantizedGemmKernel*> fp8_quantized_gemm_kernels() {
  std::vector<const QuantizedGemmKernel*> all;
  for (const QuantizedGemmKernel& k : kKernels) all.push_back(&k);
  return all;
}

}  // namespace kiln::cuda
