// QuantizedGemm's INT8 kernels (quantized_gemm_cutlass.cuh): each tile shape with a float16
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
using Wide = Kernel<int8_t, D, Shape<_128, _256, _128>, Shape<_2, _1, _1>, Cooperative, CooperativeEpilogue>;
template <class D>
using Square = Kernel<int8_t, D, Shape<_128, _128, _128>, Shape<_2, _1, _1>, Cooperative, CooperativeEpilogue>;
template <class D>
using SquareAlongN = Kernel<int8_t, D, Shape<_128, _128, _128>, Shape<_1, _2, _1>, Cooperative, CooperativeEpilogue>;
template <class D>
using Narrow = Kernel<int8_t, D, Shape<_64, _128, _128>, Shape<_1, _1, _1>, Pingpong, PingpongEpilogue>;

constexpr DType kIn = DType::kInt8;
constexpr QuantizedGemmKernel kKernels[] = {
    Wide<cutlass::half_t>::entry("128x256x128 cluster 2x1 cooperative", kIn, DType::kFloat16),
    Square<cutlass::half_t>::entry("128x128x128 cluster 2x1 cooperative", kIn, DType::kFloat16),
    SquareAlongN<cutlass::half_t>::entry("128x128x128 cluster 1x2 cooperative", kIn, DType::kFloat16),
    Narrow<cutlass::half_t>::entry("64x128x128 pingpong", kIn, DType::kFloat16),
    Wide<int8_t>::entry("128x256x128 cluster 2x1 cooperative", kIn, kIn),
    Square<int8_t>::entry("128x128x128 cluster 2x1 cooperative", kIn, kIn),
    SquareAlongN<int8_t>::entry("128x128x128 cluster 1x2 cooperative", kIn, kIn),
    Narrow<int8_t>::entry("64x128x128 pingpong", kIn, kIn),
};

}  // namespace

std::vector<const QuantizedGemmKernel*> int8_quantized_gemm_kernels() {
  std::vector<const QuantizedGemmKernel*> all;
  for (const QuantizedGemmKernel& k : kKernels) all.push_back(&k);
  return all;
}

}  // namespace kiln::cuda
