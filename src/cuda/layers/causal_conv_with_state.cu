// CUDA layer of CausalConvWithState (float32; kept float32 under fp16), the CPU kernel's
// arithmetic (ops/causal_conv_with_state.h): each channel's row [past_state, input] convolved with
// its kernel, plus bias, optionally through SiLU (y * sigmoid(y)); present_state is the row's
// last K - 1 positions. One thread per output position, and one per state position.
#include <optional>
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ops/causal_conv_with_state.h"

namespace kiln::cuda {

namespace {

struct CausalConvGeom {
  int64_t rows = 0, length = 0, kernel = 0, channels = 0;
  bool silu = false;
};

// Position i of row r: the carried state (zeros without one), then this call's input.
__device__ __forceinline__ float row_at(const float* __restrict__ x, const float* __restrict__ past, int64_t r, int64_t i,
                                        const CausalConvGeom& g) {
  const int64_t S = g.kernel - 1;
  if (i >= S) return x[r * g.length + i - S];
  return past ? past[r * S + i] : 0.f;
}

__global__ void causal_conv_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                                   const float* __restrict__ past, float* __restrict__ y, float* __restrict__ present,
                                   CausalConvGeom g) {
  const int64_t S = g.kernel - 1, outputs = g.rows * g.length, states = g.rows * S;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < outputs + states; i += step) {
    if (i >= outputs) {  // present_state: the row's last S positions
      if (!present) continue;
      const int64_t s = i - outputs, r = s / S, at = s % S;
      present[s] = row_at(x, past, r, g.length + at, g);
      continue;
    }
    const int64_t r = i / g.length, t = i % g.length, c = r % g.channels;
    const float* k = w + c * g.kernel;
    float sum = bias ? bias[c] : 0.f;
    for (int64_t j = 0; j < g.kernel; ++j) sum += k[j] * row_at(x, past, r, t + j, g);
    y[i] = g.silu ? sum * (1.f / (1.f + expf(-sum))) : sum;
  }
}

std::string check_causal_conv(const LayerRequest& r) {
  for (size_t i = 0; i < r.inputs.size(); ++i)
    if (r.given(i) && r.input_dtypes[i] != DType::kFloat32)
      return "input type " + to_string(r.input_dtypes[i]) + " is not supported (supported: float32)";
  try {
    ir::causal_conv_params(r.node, r.input_shape(0), r.input_shape(1), r.shape_if_given(2), r.shape_if_given(3));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::unique_ptr<Layer> create_causal_conv(const LayerRequest& r, const LayerFormats&, BuildServices&) {
  const ir::CausalConvParams p =
      ir::causal_conv_params(r.node, r.input_shape(0), r.input_shape(1), r.shape_if_given(2), r.shape_if_given(3));
  CausalConvGeom g;
  g.rows = p.batch * p.channels, g.length = p.length, g.kernel = p.kernel, g.channels = p.channels, g.silu = p.silu;
  const bool has_bias = r.given(2), has_past = r.given(3);
  if (g.rows * (g.length + g.kernel - 1) == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  return make_layer("kernel:causal-conv", [g, has_bias, has_past](const LayerIO& io, cudaStream_t stream) {
    float* present = io.outputs.size() > 1 ? static_cast<float*>(io.outputs[1]) : nullptr;
    causal_conv_kernel<<<grid_for(g.rows * (g.length + g.kernel - 1)), 256, 0, stream>>>(
        static_cast<const float*>(io.inputs[0]), static_cast<const float*>(io.inputs[1]),
        has_bias ? static_cast<const float*>(io.inputs[2]) : nullptr, has_past ? static_cast<const float*>(io.inputs[3]) : nullptr,
        static_cast<float*>(io.outputs[0]), present, g);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(causal_conv_with_state) {
  LayerEntry e;
  e.op = "CausalConvWithState";
  e.check = check_causal_conv;
  e.formats = float32_linear_formats;
  e.create = create_causal_conv;
  e.dtypes = "float32 (kept float32 under fp16)";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
