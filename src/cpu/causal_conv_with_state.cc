// CPU kernel of CausalConvWithState (float32): each channel's row [past_state, input] convolved
// with its kernel, one output position at a time (ops/causal_conv_with_state.h). SiLU is
// y * sigmoid(y), as ONNX's reference computes it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "cpu/kernel.h"
#include "ops/causal_conv_with_state.h"

namespace kiln::cpu {

namespace {

void causal_conv(const ir::Node& node, const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
  const Tensor& x = *in[0];
  const Tensor& w = *in[1];
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  const Tensor* past = in.size() > 3 ? in[3] : nullptr;
  const ir::CausalConvParams p =
      ir::causal_conv_params(node, x.shape(), w.shape(), bias ? std::optional(bias->shape()) : std::nullopt,
                             past ? std::optional(past->shape()) : std::nullopt);
  const int64_t L = p.length, K = p.kernel, S = K - 1;
  const float* xs = x.data<float>();
  const float* ws = w.data<float>();
  const float* bs = bias ? bias->data<float>() : nullptr;
  const float* ps = past ? past->data<float>() : nullptr;
  float* ys = out[0].data<float>();
  float* state = out.size() > 1 && out[1].defined() ? out[1].data<float>() : nullptr;
  std::vector<float> row(static_cast<size_t>(S + L));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t c = 0; c < p.channels; ++c) {
      const int64_t r = b * p.channels + c;
      // The row: the carried state (zeros without one), then this call's input.
      if (ps) std::memcpy(row.data(), ps + r * S, static_cast<size_t>(S) * sizeof(float));
      else std::fill(row.begin(), row.begin() + S, 0.f);
      std::memcpy(row.data() + S, xs + r * L, static_cast<size_t>(L) * sizeof(float));
      const float* k = ws + c * K;
      float* y = ys + r * L;
      for (int64_t t = 0; t < L; ++t) {
        float sum = bs ? bs[c] : 0.f;
        for (int64_t j = 0; j < K; ++j) sum += k[j] * row[static_cast<size_t>(t + j)];
        y[t] = p.silu ? sum * (1.f / (1.f + std::exp(-sum))) : sum;
      }
      if (state) std::memcpy(state + r * S, row.data() + L, static_cast<size_t>(S) * sizeof(float));
    }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(causal_conv_with_state) {
  KernelEntry e;
  e.op = "CausalConvWithState";
  e.check = accept_dtypes({DType::kFloat32});
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) {
    const ir::Node node = init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) { causal_conv(node, in, out); });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
