// An INT8 or FP8 matrix product with its whole epilogue in one kernel, on CUTLASS's Hopper
// GEMMs (TMA loads, warp-specialized WGMMA; sm_90a): kiln::QConv's 1x1 convolutions of stride 1
// (a transformer's projections, which gemm_as_conv writes as such) as one GEMM over the tokens,
//   Y[M, N] = act(alpha[n] * (X[M, K] W[N, K]^T) + bias[n] + Z[M, N]) * out_scale
// X and W int8 or float8e4m3fn (NHWC rows and KRSC filters), Z float16, Y float16 or the
// input's 8-bit type (rounded to nearest even and saturated). With alpha = x_scale * w_scales
// and out_scale = 1 / y_scale this is QConv's definition (src/ops/quantized_conv.cc), so the
// per-channel scales, the bias, the residual, any activation and the requantization for the
// next quantized product all happen before the tile leaves the registers: no float16 product
// is written and read again, as cuBLASLt's FP8 path must (fp8_gemm.h), and INT8 products get
// the tensor cores' WGMMA rate, which kiln's own INT8 kernel (int8_conv.h) does not reach.
//
// The kernels come from CUTLASS's collective builders (PyPI's nvidia-cutlass, header-only;
// requirements/build-headers.lock), compiled for sm_90a only: on another GPU, or in a build
// without CUTLASS's headers, quantized_gemm_unsupported() says so and the layer times its
// other tactics. Several tile shapes are compiled; the layer times them as tactics.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cuda/kernels/quantized_gemm_candidates.h"
#include "cuda/runtime/layer.h"
#include "ir/activation.h"

namespace kiln::cuda {

struct QuantizedGemmSpec {
  int64_t m = 0, n = 0, k = 0;        // tokens, output channels, input channels
  DType input = DType::kInt8;         // X's and W's type: int8 or float8e4m3fn
  DType output = DType::kFloat16;     // float16, or the input's type
  std::vector<float> alpha;           // n entries: x_scale * w_scales[n]
  std::vector<float> bias;            // n entries, or empty
  bool has_z = false;                 // a float16 residual Z [M, N]
  ir::Activation act;
  float out_scale = 1.f;              // 1 / y_scale for an 8-bit Y
};

// "" when a kernel of this build can run `spec` on `device`, else why not.
std::string quantized_gemm_unsupported(const QuantizedGemmSpec& spec, const cudaDeviceProp& device);

class QuantizedGemm {
 public:
  // `weights`: the device copy of W [N, K] row-major, in spec.input's type. `only_kernel`: the
  // one kernel to offer, by name ("64x128x128 pingpong"; "" offers every one).
  // Throws kUnsupported when no compiled kernel (of that name) takes the product.
  QuantizedGemm(const QuantizedGemmSpec& spec, const void* weights, BuildServices& services,
                const std::string& only_kernel = "");
  ~QuantizedGemm();
  QuantizedGemm(const QuantizedGemm&) = delete;
  QuantizedGemm& operator=(const QuantizedGemm&) = delete;

  int candidate_count() const { return static_cast<int>(candidates_.size()); }
  void select(int index) { selected_ = index; }
  int selected() const { return selected_; }
  // Y from X (and Z, or null) with the selected kernel; `workspace` holds workspace_bytes().
  void run(const void* x, const void* z, void* y, void* workspace, cudaStream_t stream) const;
  size_t workspace_bytes() const;
  std::string name() const;  // "cutlass:int8 128x128x128 ..."

 private:
  QuantizedGemmSpec spec_;
  const void* weights_ = nullptr;
  const float* alpha_ = nullptr;  // on the device
  const float* bias_ = nullptr;   // on the device, or null
  std::vector<const QuantizedGemmKernel*> candidates_;  // those that take the product
  int selected_ = 0;
};

}  // namespace kiln::cuda
