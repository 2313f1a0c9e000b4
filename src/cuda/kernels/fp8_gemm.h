// An FP8 matrix product on cuBLASLt: kiln::QConv's 1x1 convolutions (a transformer's
// projections, which gemm_as_conv writes as such) as one GEMM over the tokens,
//   Y[M, N] = act(x_scale * w_scales[n] * (X[M, K] W[N, K]^T) + bias[n] + Z[M, N])
// with X and W float8e4m3fn (NHWC rows and KRSC filters), Y and Z float16, and Y optionally
// requantized to float8e4m3fn (saturate(Y / y_scale)) for the next FP8 layer.
//
// The weights' per-channel scales and the activation's scale are cuBLASLt's outer-vector
// scales (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F; Hopper's FP8 kernels), bias and
// ReLU / tanh-GELU its epilogue, Z its C (beta 1). What cuBLASLt cannot do runs in one
// finishing pass over its float16 product: another activation, and the requantization (outer
// vector scales leave D in 16 or 32 bits).
#pragma once

#include <cublasLt.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda/runtime/layer.h"
#include "ir/activation.h"

namespace kiln::cuda {

struct Fp8GemmSpec {
  int64_t m = 0, n = 0, k = 0;     // tokens, output channels, input channels
  float x_scale = 1.f;
  std::vector<float> w_scales;     // n entries
  std::vector<float> bias;         // n entries, or empty
  bool has_z = false;              // a float16 residual Z [M, N]
  ir::Activation act;
  float y_scale = 0.f;             // > 0: Y is float8e4m3fn, Y / y_scale saturated
};

// "" when cuBLASLt's FP8 product can run `spec` (shapes and types), else why not.
std::string fp8_gemm_unsupported(const Fp8GemmSpec& spec);

class Fp8Gemm {
 public:
  // `weights`: the device copy of W, float8e4m3fn [N, K] row-major. Throws kUnsupported when
  // cuBLASLt offers no algorithm for the product on this GPU.
  Fp8Gemm(const Fp8GemmSpec& spec, const void* weights, BuildServices& services);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  int candidate_count() const { return static_cast<int>(algos_.size()); }
  void select(int index) { selected_ = index; }
  int selected() const { return selected_; }
  // Y from X (and Z, or null) with the selected algorithm; `workspace` holds workspace_bytes().
  void run(cublasLtHandle_t handle, const void* x, const void* z, void* y, void* workspace, cudaStream_t stream) const;
  size_t workspace_bytes() const;
  std::string name() const;

 private:
  Fp8GemmSpec spec_;
  const void* weights_ = nullptr;
  const void* a_scales_ = nullptr;  // w_scales, on the device
  const void* b_scales_ = nullptr;  // x_scale once per token
  const void* bias_ = nullptr;      // float16, for cuBLASLt's epilogue
  const float* finish_bias_ = nullptr;  // float32, when the finishing pass adds the bias
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos_;
  std::vector<size_t> algo_workspace_;  // what each algorithm asks for
  size_t library_workspace() const;    // the selected algorithm's, aligned
  int selected_ = 0;
  bool library_act_ = false;   // the activation runs in cuBLASLt's epilogue
  bool library_bias_ = false;  // and the bias
  bool finish_ = false;        // a finishing pass runs after the product
};

}  // namespace kiln::cuda
