// QuantizedGemm's kernels (quantized_gemm.h): CUTLASS's Hopper GEMM from its collective
// builders, X [M, K] row-major (K-major) times W [N, K] (K-major, CUTLASS's column-major B),
// Y [M, N] row-major, with the epilogue as an epilogue visitor tree:
//   Y = ActScale(homogeneous_multiply_add(beta, Z, FusedMultiplyAdd(alpha[n], acc, bias[n])))
// beta is 1 with a residual and 0 without; CUTLASS skips loading Z when beta is 0. alpha and bias
// are row vectors broadcast over the tokens (one value per output channel). ActScale applies
// kiln's activation (ir::Activation::apply, the CPU reference's definition; GELU in its tanh
// form on the hardware tanh, gelu_on_hardware_tanh) and out_scale,
// and the store converts to Y's type (float16, or int8 / E4M3 rounded to nearest even and
// saturated).
// Included by quantized_gemm_int8.cu and quantized_gemm_fp8.cu, compiled for sm_90a only.
#pragma once

#include "cuda/kernels/quantized_gemm_candidates.h"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

namespace kiln::cuda::quantized_gemm {

struct ActScaleArguments {
  ir::Activation act;
  float out_scale = 1.f;
};

// Sm90Compute reads Arguments from the scalar form and calls the fragment form.
template <class T>
struct ActScale {
  using Arguments = ActScaleArguments;
};

// The activations ActScale has no loop of its own for, out of line.
__noinline__ __device__ inline float apply_uncommon(float x, ir::Activation act) { return act.apply(x); }

// GELU, erf's and tanh's alike, in the tanh form on the hardware tanh (tanh.approx.f32): a few
// instructions a value where erff takes about 36 (it computes both of its ranges), which made
// the erf-GELU product cost more than its matrix product (docs/design/int8.md, "GELU on the
// hardware tanh"). The tanh form is at most 4.7e-4 from erf's and tanh.approx.f32 about 2^-11
// relative from tanhf, both well under an int8 or E4M3 step; the fp16 engine runs erf GELU in
// cuBLASLt's tanh-form epilogue for the same reason.
CUTLASS_DEVICE float gelu_on_hardware_tanh(float x) {
  const float u = 0.7978845608028654f * __fmaf_rn(0.044715f * x, x * x, x);
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
  return 0.5f * x * (1.f + t);
}

template <int N>
struct ActScale<cutlass::Array<float, N>> {
  using Arguments = ActScaleArguments;
  // The activation is picked once per fragment, outside the loop over its values: with the
  // choice inside, the compiler evaluates every activation's math for every value and selects
  // one, which made the epilogue cost more than the product. The common kinds get a loop each
  // with the kind a constant; the others share one.
  template <ir::ActivationKind kKind>
  CUTLASS_DEVICE static void apply_each(cutlass::Array<float, N>& y, cutlass::Array<float, N> const& v,
                                        ir::Activation act, float out_scale) {
    act.kind = kKind;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = act.apply(v[i]) * out_scale;
  }
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& v, Arguments const& a) const {
    cutlass::Array<float, N> y;
    switch (a.act.kind) {
      case ir::ActivationKind::kNone: apply_each<ir::ActivationKind::kNone>(y, v, a.act, a.out_scale); break;
      case ir::ActivationKind::kRelu: apply_each<ir::ActivationKind::kRelu>(y, v, a.act, a.out_scale); break;
      case ir::ActivationKind::kGelu:
      case ir::ActivationKind::kGeluTanh:
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) y[i] = gelu_on_hardware_tanh(v[i]) * a.out_scale;
        break;
      default:
        // Unrolled as the others: a loop indexing the fragments at run time would put them on
        // the stack, in local memory, for every kind (a 128-256 byte stack frame; products
        // 20-65% slower). Each value calls one function compiled once: with every activation's
        // math inlined for every value, a kernel is five times the size of one with the common
        // kinds alone (docs/design/int8.md).
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) y[i] = apply_uncommon(v[i], a.act) * a.out_scale;
    }
    return y;
  }
};

// alpha * acc + bias as one rounding, as the CPU reference computes it (fma); CUTLASS's
// multiply_add leaves the contraction to the compiler.
template <class T>
struct FusedMultiplyAdd {};

template <int N>
struct FusedMultiplyAdd<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& a, cutlass::Array<float, N> const& b,
                                                     cutlass::Array<float, N> const& c) const {
    cutlass::Array<float, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = __fmaf_rn(a[i], b[i], c[i]);
    return y;
  }
};

template <class TileShape, class ElementD>
using Epilogue = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<ActScale, ElementD, float, cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90EVT<  // beta Z + (alpha acc + bias)
        cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, float, float,
                                               cutlass::FloatRoundStyle::round_to_nearest>,
        cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>,
        cutlass::epilogue::fusion::Sm90SrcFetch<cutlass::half_t>,
        cutlass::epilogue::fusion::Sm90EVT<  // alpha acc + bias
            cutlass::epilogue::fusion::Sm90Compute<FusedMultiplyAdd, float, float, cutlass::FloatRoundStyle::round_to_nearest>,
            cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, cute::Stride<cute::_0, cute::_1, int64_t>>,
            cutlass::epilogue::fusion::Sm90AccFetch,
            cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, cute::Stride<cute::_0, cute::_1, int64_t>>>>>;

template <class ElementAB, class ElementD, class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule>
struct Kernel {
  using ElementC = cutlass::half_t;
  using Accumulator = std::conditional_t<std::is_same_v<ElementAB, int8_t>, int32_t, float>;
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, cutlass::layout::RowMajor,
      16 / sizeof(ElementC), ElementD, cutlass::layout::RowMajor, 16 / sizeof(ElementD), EpilogueSchedule,
      Epilogue<TileShape, ElementD>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cutlass::layout::RowMajor, kAlignAB, ElementAB,
      cutlass::layout::ColumnMajor, kAlignAB, Accumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static typename Gemm::Arguments arguments(const QuantizedGemmProblem& p) {
    using StrideA = typename GemmKernel::StrideA;
    using StrideB = typename GemmKernel::StrideB;
    using StrideC = typename GemmKernel::StrideC;
    using StrideD = typename GemmKernel::StrideD;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {p.m, p.n, p.k, 1},
        {static_cast<const ElementAB*>(p.x), cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(p.m, p.k, 1)),
         static_cast<const ElementAB*>(p.w), cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(p.n, p.k, 1))},
        {{},
         static_cast<const ElementC*>(p.z),
         cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(p.m, p.n, 1)),
         static_cast<ElementD*>(p.y),
         cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(p.m, p.n, 1))}};
    args.epilogue.thread = {
        {                                                 // beta Z + (alpha acc + bias)
         {{p.z ? 1.f : 0.f}},                             //   beta
         {},                                              //   Z
         {{p.alpha, 0.f, {}}, {}, {p.bias, 0.f, {}}, {}}, //   alpha acc + bias (a null bias reads as 0)
         {}},
        {p.act, p.out_scale}};                            // ActScale
    return args;
  }

  static bool supports(const QuantizedGemmProblem& p) {
    typename Gemm::Arguments args = arguments(p);
    return Gemm::can_implement(args) == cutlass::Status::kSuccess;
  }
  static size_t workspace_bytes(const QuantizedGemmProblem& p) { return Gemm::get_workspace_size(arguments(p)); }
  static cudaError_t prepare() {
    const int smem = static_cast<int>(GemmKernel::SharedStorageSize);
    if (smem < (48 << 10)) return cudaSuccess;
    return cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }
  // The kernel's parameters (TMA descriptors included) are made on the host for each run, from
  // this run's pointers; nothing is shared between runs, so contexts may run concurrently.
  static cudaError_t run(const QuantizedGemmProblem& p, void* workspace, cudaStream_t stream) {
    typename Gemm::Arguments args = arguments(p);
    if (GemmKernel::initialize_workspace(args, workspace, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(args, workspace);
    if (Gemm::run(params, stream) != cutlass::Status::kSuccess) {
      const cudaError_t e = cudaGetLastError();
      return e == cudaSuccess ? cudaErrorLaunchFailure : e;
    }
    return cudaSuccess;
  }

  static constexpr QuantizedGemmKernel entry(const char* name, DType input, DType output) {
    return {name, input, output, &supports, &workspace_bytes, &prepare, &run};
  }
};

using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CooperativeEpilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingpongEpilogue = cutlass::epilogue::TmaWarpSpecialized;
// FP8 products accumulate in the tensor cores' native precision without CUTLASS's periodic
// promotion, as cuBLASLt's do with CUBLASLT_MATMUL_DESC_FAST_ACCUM (fp8_gemm.h).
using CooperativeFp8 = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
using PingpongFp8 = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;

// The kernels of one input type: each tile shape with a float16 and an 8-bit Y (Element8, the
// input's type). The layer times every one that takes the product.
template <DType kInput, class Element8, class CooperativeSchedule, class PingpongSchedule>
std::vector<const QuantizedGemmKernel*> kernels_of() {
  constexpr DType input = kInput;
  using cute::_1, cute::_2, cute::_64, cute::_128, cute::_256, cute::Shape;
  using Half = cutlass::half_t;
  using Wide = Shape<_128, _256, _128>;
  using Square = Shape<_128, _128, _128>;
  using Narrow = Shape<_64, _128, _128>;
  using AlongM = Shape<_2, _1, _1>;
  using AlongN = Shape<_1, _2, _1>;
  using One = Shape<_1, _1, _1>;
  using C = CooperativeSchedule;
  using CE = CooperativeEpilogue;
  using P = PingpongSchedule;
  using PE = PingpongEpilogue;
  // The cooperative kernels split one tile between the two math warp groups, which then run its
  // epilogue together; the ping-pong kernel gives each warp group a tile of its own and overlaps
  // one's epilogue with the other's products. Wider ping-pong tiles (128x128, 64x256, cluster
  // 2x1) lost to these on every BERT-base product, the erf-GELU one included
  // (docs/design/int8.md, "CUTLASS's products with the epilogue fused").
  static constexpr QuantizedGemmKernel kKernels[] = {
      Kernel<Element8, Half, Wide, AlongM, C, CE>::entry("128x256x128 cluster 2x1 cooperative", input, DType::kFloat16),
      Kernel<Element8, Half, Square, AlongM, C, CE>::entry("128x128x128 cluster 2x1 cooperative", input, DType::kFloat16),
      Kernel<Element8, Half, Square, AlongN, C, CE>::entry("128x128x128 cluster 1x2 cooperative", input, DType::kFloat16),
      Kernel<Element8, Half, Narrow, One, P, PE>::entry("64x128x128 pingpong", input, DType::kFloat16),
      Kernel<Element8, Element8, Wide, AlongM, C, CE>::entry("128x256x128 cluster 2x1 cooperative", input, input),
      Kernel<Element8, Element8, Square, AlongM, C, CE>::entry("128x128x128 cluster 2x1 cooperative", input, input),
      Kernel<Element8, Element8, Square, AlongN, C, CE>::entry("128x128x128 cluster 1x2 cooperative", input, input),
      Kernel<Element8, Element8, Narrow, One, P, PE>::entry("64x128x128 pingpong", input, input),
  };
  std::vector<const QuantizedGemmKernel*> all;
  for (const QuantizedGemmKernel& k : kKernels) all.push_back(&k);
  return all;
}

}  // namespace kiln::cuda::quantized_gemm
