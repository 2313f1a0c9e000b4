// A cuBLASLt matrix product as a building block of other layers (a 1x1 convolution on
// channels-last data is one): row-major Y[M,N] = act(A[M,K] B + bias + C) with B constant.
#pragma once

#include <memory>
#include <vector>

#include "cuda/runtime/layer.h"
#include "ir/activation.h"

namespace kiln::cuda {

struct GemmSpec {
  int64_t m = 0, n = 0, k = 0;
  bool trans_b = false;        // B is stored [N, K] (a conv's KRSC weights with R = S = 1)
  DType dtype = DType::kFloat16;
  Precision precision = Precision::kFp16;
  std::vector<float> bias;     // per column (N), or empty
  int addend_input = -1;       // layer input holding C [M, N] (a residual), or -1
  ir::Activation act;
};

// The layer reads A from io.inputs[0] and C from io.inputs[addend_input]; writes io.outputs[0].
// The cuBLASLt algorithm is timed at creation (through services.scratch_io()).
std::unique_ptr<Layer> make_gemm_layer(const GemmSpec& spec, const Tensor& b, BuildServices& services);

}  // namespace kiln::cuda
