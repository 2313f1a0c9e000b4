// CPU kernel of LinearAttention (float32): the state of each batch row and key/value head
// [dk, dv] stepped through the sequence as the update rule says, then read by the query heads
// that share it (ops/linear_attention.h). Everything accumulates in float32, as ONNX's
// reference does.
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "cpu/kernel.h"
#include "ops/linear_attention.h"

namespace kiln::cpu {

namespace {

void linear_attention(const ir::Node& node, const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
  auto shape = [&](size_t i) { return in.size() > i && in[i] ? std::optional(in[i]->shape()) : std::nullopt; };
  const ir::LinearAttentionParams p =
      ir::linear_attention_params(node, in[0]->shape(), in[1]->shape(), in[2]->shape(), shape(3), shape(4), shape(5));
  const int64_t T = p.length, Hq = p.q_heads, Hkv = p.kv_heads, dk = p.key_dim, dv = p.value_dim;
  const int64_t group = Hq / Hkv;
  const float* q = in[0]->data<float>();
  const float* k = in[1]->data<float>();
  const float* v = in[2]->data<float>();
  const float* past = shape(3) ? in[3]->data<float>() : nullptr;
  const float* decay = shape(4) ? in[4]->data<float>() : nullptr;
  const float* beta = shape(5) ? in[5]->data<float>() : nullptr;
  const int64_t decay_width = p.decay_per_key_dim ? Hkv * dk : Hkv, beta_width = p.beta_per_head ? Hkv : 1;
  float* y = out[0].data<float>();
  float* present = out.size() > 1 && out[1].defined() ? out[1].data<float>() : nullptr;
  std::vector<float> state(static_cast<size_t>(dk * dv)), written(static_cast<size_t>(dv));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t state_at = (b * Hkv + h) * dk * dv;
      if (past) std::memcpy(state.data(), past + state_at, state.size() * sizeof(float));
      else std::fill(state.begin(), state.end(), 0.f);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = b * T + t;
        const float* kt = k + (row * Hkv + h) * dk;
        const float* vt = v + (row * Hkv + h) * dv;
        if (p.rule.gated)
          for (int64_t d = 0; d < dk; ++d) {
            const float gate = std::exp(decay[row * decay_width + (p.decay_per_key_dim ? h * dk + d : h)]);
            for (int64_t m = 0; m < dv; ++m) state[static_cast<size_t>(d * dv + m)] *= gate;
          }
        // What is written: v, or with the delta step beta (v - S^T k).
        std::memcpy(written.data(), vt, written.size() * sizeof(float));
        if (p.rule.delta) {
          const float bt = beta[row * beta_width + (p.beta_per_head ? h : 0)];
          for (int64_t m = 0; m < dv; ++m) {
            float recalled = 0.f;
            for (int64_t d = 0; d < dk; ++d) recalled += state[static_cast<size_t>(d * dv + m)] * kt[d];
            written[static_cast<size_t>(m)] = bt * (vt[m] - recalled);
          }
        }
        for (int64_t d = 0; d < dk; ++d)
          for (int64_t m = 0; m < dv; ++m) state[static_cast<size_t>(d * dv + m)] += kt[d] * written[static_cast<size_t>(m)];
        // The query heads of this key/value head read the state.
        for (int64_t g = 0; g < group; ++g) {
          const int64_t head = h * group + g;
          const float* qt = q + (row * Hq + head) * dk;
          float* yt = y + (row * Hq + head) * dv;
          for (int64_t m = 0; m < dv; ++m) {
            float sum = 0.f;
            for (int64_t d = 0; d < dk; ++d) sum += qt[d] * state[static_cast<size_t>(d * dv + m)];
            yt[m] = p.scale * sum;
          }
        }
      }
      if (present) std::memcpy(present + state_at, state.data(), state.size() * sizeof(float));
    }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(linear_attention) {
  KernelEntry e;
  e.op = "LinearAttention";
  e.check = [](const KernelInit& init) -> std::string {
    for (size_t i = 0; i < init.input_types.size(); ++i)
      if (init.has_input(i) && init.dtype(i) != DType::kFloat32)
        return "input type " + to_string(init.dtype(i)) + " is not supported (supported: float32)";
    return "";
  };
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) {
    const ir::Node node = init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) { linear_attention(node, in, out); });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
