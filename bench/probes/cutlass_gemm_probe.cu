// How fast are INT8 and FP8 products with the whole epilogue fused, on a transformer's shapes?
// Times, per product of BERT-base (batch 32, sequence 128), BERT-large (batch 8, sequence 384)
// and ViT-B/16 (batch 128, 197 tokens), each path's best candidate:
//   fp16 cuBLASLt      Y = X W^T + bias (+ Z)                       (what kiln's fp16 engine runs)
//   fp8 cuBLASLt       outer-vector scales, bias, fp16 Y            (kiln's cuBLASLt FP8 tactic)
//   int8 / fp8 CUTLASS Y = beta Z + act(alpha[n] acc + bias[n]) * out_scale, Y float16, or int8 /
//                      E4M3 for the first feed-forward product (GELU, quantized for the second)
//   int8 CUTLASS plain CUTLASS's own epilogue, Y = 0.001 acc in float16: the main loop's speed
//   int8 CUTLASS int8 tanhGELU
//                      the first feed-forward product with erf GELU in its tanh form on the
//                      hardware tanh (tanh.approx.f32), checked against erf GELU
// The CUTLASS kernels are Hopper's warp-specialized TMA/WGMMA GEMMs from CUTLASS's collective
// builders with that epilogue as an epilogue visitor tree; several tile shapes are timed.
// Each CUTLASS result is checked against a double-precision reference on sampled outputs.
//   int8 kiln          the engine's own INT8 kernels (src/cuda/kernels/quantized_gemm_cutlass.cuh,
//                      the layer's epilogue tree), each one, on this probe's X and on an X of
//                      zeros (what `kiln build` times a layer's int8 input on), beside this
//                      probe's own fused kernels: they tell the engine's kernels' code from the
//                      engine's data and buffers (docs/design/int8.md).
// Build, from the repository's root (CUTLASS headers from PyPI's nvidia-cutlass wheel,
// cutlass_library/source):
//   nvcc -O3 -DNDEBUG -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//     -I$CUTLASS/include -I$CUTLASS/tools/util/include -Iinclude -Isrc bench/probes/cutlass_gemm_probe.cu \
//     src/cuda/kernels/quantized_gemm_int8.cu -lcublasLt -o cutlass_gemm_probe
// Prints one line per (shape, path): best time, TFLOPS (or TOPS), candidate, max error.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "cuda/kernels/quantized_gemm_candidates.h"

#define CUDA_OK(x)                                                                            \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__);                       \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define LT_OK(x)                                                                              \
  do {                                                                                        \
    cublasStatus_t s_ = (x);                                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                        \
      std::printf("cuBLASLt status %d at %d\n", static_cast<int>(s_), __LINE__);              \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

using namespace cute;

// ---------------------------------------------------------------------------------------------
// The epilogue: act(z) * out_scale with the activation picked at run time (one kernel serves
// every activation; the switch is uniform across the warp).
// kActGeluTanhFast: erf GELU computed in its tanh form on the hardware tanh (tanh.approx.f32), a
// few instructions a value against erff's ~36, checked against erf GELU.
enum ActKind : int { kActNone = 0, kActRelu = 1, kActGeluErf = 2, kActGeluTanh = 3, kActGeluTanhFast = 4 };

struct ActScaleArguments {
  int kind = kActNone;
  float out_scale = 1.f;
};

// Sm90Compute looks for Arguments on the scalar form, and calls the array form.
template <class T>
struct ActScale {
  using Arguments = ActScaleArguments;
};

template <int N>
struct ActScale<cutlass::Array<float, N>> {
  using Arguments = ActScaleArguments;
  // The activation is picked once per fragment: a choice per value makes the compiler evaluate
  // every activation for every value.
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& z, Arguments const& a) const {
    cutlass::Array<float, N> y;
    if (a.kind == kActGeluErf) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) y[i] = 0.5f * z[i] * (1.f + erff(z[i] * 0.70710678118654752f)) * a.out_scale;
    } else if (a.kind == kActGeluTanhFast) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) {
        const float u = 0.7978845608028654f * (z[i] + 0.044715f * z[i] * z[i] * z[i]);
        float t;
        asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
        y[i] = 0.5f * z[i] * (1.f + t) * a.out_scale;
      }
    } else if (a.kind == kActRelu) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) y[i] = fmaxf(z[i], 0.f) * a.out_scale;
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) y[i] = z[i] * a.out_scale;
    }
    return y;
  }
};

template <class TileShape, class ElementD>
using FusedEpilogue = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float,
                                           cutlass::FloatRoundStyle::round_to_nearest>,  // beta Z + ...
    cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>,                               // beta
    cutlass::epilogue::fusion::Sm90SrcFetch<cutlass::half_t>,                            // Z
    cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<ActScale, float, float, cutlass::FloatRoundStyle::round_to_nearest>,
        cutlass::epilogue::fusion::Sm90EVT<
            cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, float, float,
                                                   cutlass::FloatRoundStyle::round_to_nearest>,  // alpha acc + bias
            cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>,  // alpha[n]
            cutlass::epilogue::fusion::Sm90AccFetch,
            cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>>>>;  // bias[n]

struct GemmCall {
  int m, n, k;
  const void* x;       // [M, K] row-major
  const void* w;       // [N, K] row-major
  const float* alpha;  // [N]
  const float* bias;   // [N]
  const void* z;       // [M, N] float16 or null
  void* y;             // [M, N]
  int act;
  float out_scale;
};

// The main loop of both probe kernels, leaving shared memory for an epilogue of EpilogueBytes.
template <class ElementAB, class TileShape, class ClusterShape, class KernelSchedule, int EpilogueBytes>
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cutlass::layout::RowMajor, 16 / sizeof(ElementAB),
    ElementAB, cutlass::layout::ColumnMajor, 16 / sizeof(ElementAB),
    std::conditional_t<std::is_same_v<ElementAB, int8_t>, int32_t, float>, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<EpilogueBytes>, KernelSchedule>::CollectiveOp;

// A GEMM of these collectives, and its arguments: the product's operands and strides, with the
// epilogue's own arguments left for the caller.
template <class ElementAB, class ElementC, class ElementD, class CollectiveMainloop, class CollectiveEpilogue>
struct ProbeGemm {
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const GemmCall& c) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideC = typename Gemm::GemmKernel::StrideC;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    return {cutlass::gemm::GemmUniversalMode::kGemm,
            {c.m, c.n, c.k, 1},
            {static_cast<const ElementAB*>(c.x), cutlass::make_cute_packed_stride(StrideA{}, make_shape(c.m, c.k, 1)),
             static_cast<const ElementAB*>(c.w), cutlass::make_cute_packed_stride(StrideB{}, make_shape(c.n, c.k, 1))},
            {{},
             static_cast<const ElementC*>(c.z),
             cutlass::make_cute_packed_stride(StrideC{}, make_shape(c.m, c.n, 1)),
             static_cast<ElementD*>(c.y),
             cutlass::make_cute_packed_stride(StrideD{}, make_shape(c.m, c.n, 1))}};
  }

  // Returns false when CUTLASS cannot run this shape.
  static bool launch(const typename Gemm::Arguments& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
    if (Gemm::get_workspace_size(args) > workspace_bytes) return false;
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return false;
    return gemm.run(stream) == cutlass::Status::kSuccess;
  }
};

template <class ElementAB, class ElementD, class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule>
struct CutlassGemm {
  using ElementC = cutlass::half_t;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, cutlass::layout::RowMajor,
      16 / sizeof(ElementC), ElementD, cutlass::layout::RowMajor, 16 / sizeof(ElementD), EpilogueSchedule,
      FusedEpilogue<TileShape, ElementD>>::CollectiveOp;
  using Probe = ProbeGemm<ElementAB, ElementC, ElementD,
                          Mainloop<ElementAB, TileShape, ClusterShape, KernelSchedule,
                                   static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
                          CollectiveEpilogue>;

  static bool run(const GemmCall& c, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    auto args = Probe::arguments(c);
    // beta Z + act(alpha[n] acc + bias[n]) * out_scale
    args.epilogue.thread = {{{c.z ? 1.f : 0.f}},
                            {},
                            {{{c.alpha, 0.f, {}}, {}, {c.bias, 0.f, {}}, {}}, {c.act, c.out_scale}},
                            {}};
    return Probe::launch(args, workspace, workspace_bytes, stream);
  }
};

// CUTLASS's plain epilogue (D = 0.001 acc, float16, no C): the main loop's own speed.
template <class ElementAB, class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule>
struct PlainGemm {
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor, 8,
      cutlass::half_t, cutlass::layout::RowMajor, 8, EpilogueSchedule>::CollectiveOp;
  using Probe = ProbeGemm<ElementAB, void, cutlass::half_t,
                          Mainloop<ElementAB, TileShape, ClusterShape, KernelSchedule,
                                   static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
                          CollectiveEpilogue>;

  static bool run(const GemmCall& c, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    auto args = Probe::arguments(c);
    args.epilogue.thread.alpha = 0.001f;
    args.epilogue.thread.beta = 0.f;
    return Probe::launch(args, workspace, workspace_bytes, stream);
  }
};

using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingEpi = cutlass::epilogue::TmaWarpSpecialized;

struct Candidate {
  const char* name;
  std::function<bool(const GemmCall&, void*, size_t, cudaStream_t)> run;
};

using CoopFp8 = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
using PingFp8 = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;

template <class AB, class D>
std::vector<Candidate> cutlass_candidates() {
  using C = std::conditional_t<std::is_same_v<AB, int8_t>, Coop, CoopFp8>;
  using P = std::conditional_t<std::is_same_v<AB, int8_t>, Ping, PingFp8>;
  return {
      {"128x128x128 c1x2 coop", CutlassGemm<AB, D, Shape<_128, _128, _128>, Shape<_1, _2, _1>, C, CoopEpi>::run},
      {"128x256x128 c2x1 coop", CutlassGemm<AB, D, Shape<_128, _256, _128>, Shape<_2, _1, _1>, C, CoopEpi>::run},
      {"64x128x128 c1x1 ping", CutlassGemm<AB, D, Shape<_64, _128, _128>, Shape<_1, _1, _1>, P, PingEpi>::run},
  };
}

template <class AB>
std::vector<Candidate> plain_candidates() {
  using C = std::conditional_t<std::is_same_v<AB, int8_t>, Coop, CoopFp8>;
  return {
      {"plain 128x128x128 c1x2 coop", PlainGemm<AB, Shape<_128, _128, _128>, Shape<_1, _2, _1>, C, CoopEpi>::run},
      {"plain 128x256x128 c2x1 coop", PlainGemm<AB, Shape<_128, _256, _128>, Shape<_2, _1, _1>, C, CoopEpi>::run},
  };
}

// ---------------------------------------------------------------------------------------------

float time_ms(const std::function<bool()>& run, cudaStream_t stream, int reps = 50) {
  for (int i = 0; i < 5; ++i)
    if (!run()) return -1.f;
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  CUDA_OK(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; ++i) run();
  CUDA_OK(cudaEventRecord(b, stream));
  CUDA_OK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
  if (cudaGetLastError() != cudaSuccess) return -1.f;
  return ms / reps;
}

struct Shape3 {
  const char* model;
  const char* name;
  int m, n, k;
  bool residual;
  int act;
};

double gelu_erf(double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); }

int main() {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s, cuBLASLt %zu\n", prop.name, cublasLtGetVersion());
  const std::vector<Shape3> products = {
      {"bert_base_b32", "qkv 768->2304", 4096, 2304, 768, false, kActNone},
      {"bert_base_b32", "attn_out 768->768 +Z", 4096, 768, 768, true, kActNone},
      {"bert_base_b32", "ffn1 768->3072 gelu", 4096, 3072, 768, false, kActGeluErf},
      {"bert_base_b32", "ffn2 3072->768 +Z", 4096, 768, 3072, true, kActNone},
      {"bert_large_b8", "qkv 1024->3072", 3072, 3072, 1024, false, kActNone},
      {"bert_large_b8", "attn_out 1024->1024 +Z", 3072, 1024, 1024, true, kActNone},
      {"bert_large_b8", "ffn1 1024->4096 gelu", 3072, 4096, 1024, false, kActGeluErf},
      {"bert_large_b8", "ffn2 4096->1024 +Z", 3072, 1024, 4096, true, kActNone},
      {"vit_b16_b128", "qkv 768->2304", 25216, 2304, 768, false, kActNone},
      {"vit_b16_b128", "attn_out 768->768 +Z", 25216, 768, 768, true, kActNone},
      {"vit_b16_b128", "ffn1 768->3072 gelu", 25216, 3072, 768, false, kActGeluErf},
      {"vit_b16_b128", "ffn2 3072->768 +Z", 25216, 768, 3072, true, kActNone},
  };
  size_t max_mk = 0, max_nk = 0, max_mn = 0;
  for (const auto& p : products) {
    max_mk = std::max(max_mk, size_t(p.m) * p.k);
    max_nk = std::max(max_nk, size_t(p.n) * p.k);
    max_mn = std::max(max_mn, size_t(p.m) * p.n);
  }
  // Host data: int8 values, and the same values as float16 / E4M3 (small integers are exact in
  // both), so every path multiplies the same numbers.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> q(-8, 8);
  std::vector<int8_t> hx(max_mk), hw(max_nk);
  for (auto& v : hx) v = static_cast<int8_t>(q(rng));
  for (auto& v : hw) v = static_cast<int8_t>(q(rng));
  std::vector<__half> hx16(max_mk), hw16(max_nk), hz(max_mn);
  std::vector<__nv_fp8_e4m3> hx8(max_mk), hw8(max_nk);
  for (size_t i = 0; i < max_mk; ++i) hx16[i] = __float2half(hx[i]), hx8[i] = __nv_fp8_e4m3(float(hx[i]));
  for (size_t i = 0; i < max_nk; ++i) hw16[i] = __float2half(hw[i]), hw8[i] = __nv_fp8_e4m3(float(hw[i]));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& v : hz) v = __float2half(u(rng));
  const int max_n = 4096;
  std::vector<float> halpha(max_n), hbias(max_n);
  for (int i = 0; i < max_n; ++i) halpha[i] = 0.001f * (1.f + 0.5f * u(rng)), hbias[i] = 0.1f * u(rng);
  std::vector<__half> hbias16(max_n);
  for (int i = 0; i < max_n; ++i) hbias16[i] = __float2half(hbias[i]);

  void *dx, *dw, *dx16, *dw16, *dx8, *dw8, *dz, *dy, *dws, *dbias16;
  float *dalpha, *dbias, *dones, *dtok;
  CUDA_OK(cudaMalloc(&dx, max_mk));
  CUDA_OK(cudaMalloc(&dw, max_nk));
  CUDA_OK(cudaMalloc(&dx16, max_mk * 2));
  CUDA_OK(cudaMalloc(&dw16, max_nk * 2));
  CUDA_OK(cudaMalloc(&dx8, max_mk));
  CUDA_OK(cudaMalloc(&dw8, max_nk));
  CUDA_OK(cudaMalloc(&dz, max_mn * 2));
  CUDA_OK(cudaMalloc(&dy, max_mn * 2));
  const size_t ws_bytes = size_t{64} << 20;
  CUDA_OK(cudaMalloc(&dws, ws_bytes));
  CUDA_OK(cudaMalloc(&dalpha, max_n * 4));
  CUDA_OK(cudaMalloc(&dbias, max_n * 4));
  CUDA_OK(cudaMalloc(&dbias16, max_n * 2));
  CUDA_OK(cudaMalloc(&dones, max_n * 4));
  CUDA_OK(cudaMalloc(&dtok, 32768 * 4));
  CUDA_OK(cudaMemcpy(dx, hx.data(), max_mk, cudaMemcpyHostToDevice));
  void* dx_zero;
  CUDA_OK(cudaMalloc(&dx_zero, max_mk));
  CUDA_OK(cudaMemset(dx_zero, 0, max_mk));
  CUDA_OK(cudaMemcpy(dw, hw.data(), max_nk, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dx16, hx16.data(), max_mk * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw16, hw16.data(), max_nk * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dx8, hx8.data(), max_mk, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw8, hw8.data(), max_nk, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dz, hz.data(), max_mn * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dalpha, halpha.data(), max_n * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dbias, hbias.data(), max_n * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dbias16, hbias16.data(), max_n * 2, cudaMemcpyHostToDevice));
  {
    std::vector<float> ones(32768, 1.f);
    CUDA_OK(cudaMemcpy(dones, ones.data(), max_n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dtok, ones.data(), 32768 * 4, cudaMemcpyHostToDevice));
  }
  cublasLtHandle_t lt;
  LT_OK(cublasLtCreate(&lt));

  // cuBLASLt: D [N, M] col-major = W^T(op T) [N, K] x X^T [K, M], so D read row-major is Y [M, N].
  auto lt_best = [&](const Shape3& p, bool fp8, const char** what) -> float {
    cublasLtMatmulDesc_t desc;
    LT_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
    const cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16F;
    if (fp8) {
      const int8_t fast = 1;
      LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
      const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof(outer)));
      LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof(outer)));
      LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dalpha, sizeof(dalpha)));
      LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dtok, sizeof(dtok)));
    }
    const cublasLtEpilogue_t epi = p.act == kActGeluErf ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const int32_t bias_type = CUDA_R_16F;
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias16, sizeof(dbias16)));
    cublasLtMatrixLayout_t la, lb, ld;
    LT_OK(cublasLtMatrixLayoutCreate(&la, ab, p.k, p.n, p.k));
    LT_OK(cublasLtMatrixLayoutCreate(&lb, ab, p.k, p.m, p.k));
    LT_OK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16F, p.n, p.m, p.n));
    cublasLtMatmulPreference_t pref;
    LT_OK(cublasLtMatmulPreferenceCreate(&pref));
    LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t res[8];
    int count = 0;
    cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, res, &count);
    float best = -1.f;
    static char label[64];
    const float alpha = 1.f, beta = p.residual ? 1.f : 0.f;
    for (int i = 0; i < count; ++i) {
      const float ms = time_ms(
          [&] {
            return cublasLtMatmul(lt, desc, &alpha, fp8 ? dw8 : dw16, la, fp8 ? dx8 : dx16, lb, &beta, dz, ld, dy, ld,
                                  &res[i].algo, dws, ws_bytes, stream) == CUBLAS_STATUS_SUCCESS;
          },
          stream);
      if (ms > 0 && (best < 0 || ms < best)) best = ms, std::snprintf(label, sizeof label, "heuristic #%d of %d", i, count);
    }
    *what = label;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    return best;
  };

  auto report = [](const Shape3& p, const char* path, float ms, const char* what, double err) {
    const double flops = 2.0 * p.m * p.n * p.k;
    if (ms < 0) {
      std::printf("%-14s %-24s %-22s unsupported\n", p.model, p.name, path);
      return;
    }
    std::printf("%-14s %-24s %-22s %8.4f ms %7.0f T/s  %-26s", p.model, p.name, path, ms, flops / ms / 1e9, what);
    if (err >= 0) std::printf(" max_err %.3g", err);
    std::printf("\n");
  };

  // A CUTLASS path: best candidate's time; the output of the last candidate that ran is
  // checked on sampled entries against a double-precision reference.
  auto cutlass_best = [&](const Shape3& p, std::vector<Candidate> cands, bool fp8, bool quantized_out,
                          const char** what, double* err) -> float {
    const float out_scale = quantized_out ? 1.f / 0.05f : 1.f;
    GemmCall c{p.m, p.n, p.k, fp8 ? dx8 : dx, fp8 ? dw8 : dw, dalpha, dbias, p.residual ? dz : nullptr, dy, p.act, out_scale};
    float best = -1.f;
    static char label[64];
    *err = -1;
    for (const auto& cand : cands) {
      CUDA_OK(cudaMemsetAsync(dy, 0, size_t(p.m) * p.n * 2, stream));
      const float ms = time_ms([&] { return cand.run(c, dws, ws_bytes, stream); }, stream);
      if (ms < 0) continue;
      if (best < 0 || ms < best) best = ms, std::snprintf(label, sizeof label, "%s", cand.name);
      // Check this candidate's output.
      const size_t out_bytes = quantized_out ? 1 : 2;
      std::vector<uint8_t> hy(size_t(p.m) * p.n * out_bytes);
      CUDA_OK(cudaMemcpy(hy.data(), dy, hy.size(), cudaMemcpyDeviceToHost));
      double worst = 0;
      std::mt19937 pick(11);
      for (int s = 0; s < 2000; ++s) {
        const int i = pick() % p.m, j = pick() % p.n;
        double acc = 0;
        for (int kk = 0; kk < p.k; ++kk) acc += double(hx[size_t(i) * p.k + kk]) * hw[size_t(j) * p.k + kk];
        double v = halpha[j] * acc + hbias[j];
        if (p.act == kActGeluErf || p.act == kActGeluTanhFast) v = gelu_erf(v);
        v *= out_scale;
        if (p.residual) v += __half2float(hz[size_t(i) * p.n + j]);
        double got;
        if (!quantized_out) {
          __half h;
          std::memcpy(&h, &hy[(size_t(i) * p.n + j) * 2], 2);
          got = __half2float(h);
        } else if (fp8) {
          __nv_fp8_e4m3 e;
          std::memcpy(&e, &hy[size_t(i) * p.n + j], 1);
          got = float(e);
          v = std::min(448.0, std::max(-448.0, v));
        } else {
          got = static_cast<int8_t>(hy[size_t(i) * p.n + j]);
          v = std::min(127.0, std::max(-128.0, std::nearbyint(v)));
        }
        worst = std::max(worst, std::fabs(got - v) / std::max(1.0, std::fabs(v)));
      }
      *err = std::max(*err, worst);
    }
    *what = label;
    return best;
  };

  // The engine's own kernels, each one, on X (the probe's data, or zeros): int8 output for the GELU
  // product (as the engine writes the next product's input), float16 otherwise.
  auto kiln_kernels = [&](const Shape3& p) {
    const bool int8_out = p.act == kActGeluErf;
    kiln::cuda::QuantizedGemmProblem q;
    q.m = p.m, q.n = p.n, q.k = p.k;
    q.w = dw, q.alpha = dalpha, q.bias = dbias, q.z = p.residual ? dz : nullptr, q.y = dy;
    q.act.kind = int8_out ? kiln::ir::ActivationKind::kGelu : kiln::ir::ActivationKind::kNone;
    q.out_scale = int8_out ? 1.f / 0.05f : 1.f;
    for (const kiln::cuda::QuantizedGemmKernel* k : kiln::cuda::int8_quantized_gemm_kernels()) {
      if (k->output != (int8_out ? kiln::DType::kInt8 : kiln::DType::kFloat16) || !k->supports(q)) continue;
      CUDA_OK(k->prepare());
      for (const auto& [x, data] : {std::pair<const void*, const char*>{dx, "X random"}, {dx_zero, "X zeros"}}) {
        q.x = x;
        const float ms = time_ms([&] { return k->run(q, dws, stream) == cudaSuccess; }, stream);
        char path[64];
        std::snprintf(path, sizeof path, "int8 kiln, %s", data);
        report(p, path, ms, k->name, -1);
      }
    }
  };

  for (const auto& p : products) {
    const char* what = "";
    double err = -1;
    report(p, "fp16 cuBLASLt", lt_best(p, false, &what), what, -1);
    report(p, "fp8 cuBLASLt outer-vec", lt_best(p, true, &what), what, -1);
    float ms = cutlass_best(p, cutlass_candidates<int8_t, cutlass::half_t>(), false, false, &what, &err);
    report(p, "int8 CUTLASS fp16 out", ms, what, err);
    ms = cutlass_best(p, cutlass_candidates<cutlass::float_e4m3_t, cutlass::half_t>(), true, false, &what, &err);
    report(p, "fp8 CUTLASS fp16 out", ms, what, err);
    {  // the main loop alone (no check: its epilogue is CUTLASS's D = 0.001 acc)
      float best = -1.f;
      const char* label = "";
      for (const auto& cand : plain_candidates<int8_t>()) {
        GemmCall c{p.m, p.n, p.k, dx, dw, dalpha, dbias, nullptr, dy, kActNone, 1.f};
        const float t = time_ms([&] { return cand.run(c, dws, ws_bytes, stream); }, stream);
        if (t > 0 && (best < 0 || t < best)) best = t, label = cand.name;
      }
      report(p, "int8 CUTLASS plain", best, label, -1);
    }
    if (p.act == kActGeluErf) {
      ms = cutlass_best(p, cutlass_candidates<int8_t, int8_t>(), false, true, &what, &err);
      report(p, "int8 CUTLASS int8 out", ms, what, err);
      ms = cutlass_best(p, cutlass_candidates<cutlass::float_e4m3_t, cutlass::float_e4m3_t>(), true, true, &what, &err);
      report(p, "fp8 CUTLASS e4m3 out", ms, what, err);
      Shape3 fast = p;  // the same product, GELU in its tanh form on the hardware tanh
      fast.act = kActGeluTanhFast;
      ms = cutlass_best(fast, cutlass_candidates<int8_t, int8_t>(), false, true, &what, &err);
      report(p, "int8 CUTLASS int8 tanhGELU", ms, what, err);
    }
    kiln_kernels(p);
    std::fflush(stdout);
  }
  return 0;
}
