// CUDA layer of LinearAttention (float32; kept float32 under fp16), the CPU kernel's arithmetic
// (ops/linear_attention.h says what each update rule does): one block per batch row and
// key/value head keeps its [dk, dv] state in shared memory and steps it through the sequence
// (decay, the delta step's recall, the update, then the query heads that share the state read
// it), a thread per state column; sums in float32, as ONNX's reference takes them.
#include <optional>
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ops/linear_attention.h"

namespace kiln::cuda {

namespace {

constexpr int kLinearAttentionThreads = 128;

struct LinearAttentionGeom {
  int64_t batch = 0, length = 0, q_heads = 0, kv_heads = 0, dk = 0, dv = 0;
  bool gated = false, delta = false, decay_per_key_dim = false, beta_per_head = false;
  float scale = 1.f;
};

__global__ void __launch_bounds__(kLinearAttentionThreads)
    linear_attention_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                            const float* __restrict__ past, const float* __restrict__ decay, const float* __restrict__ beta,
                            float* __restrict__ y, float* __restrict__ present, LinearAttentionGeom g) {
  extern __shared__ float shared[];
  const int64_t dk = g.dk, dv = g.dv, Hq = g.q_heads, Hkv = g.kv_heads, group = Hq / Hkv;
  float* state = shared;            // [dk][dv]
  float* written = state + dk * dv; // [dv]
  const int64_t b = blockIdx.x / Hkv, h = blockIdx.x % Hkv;
  const int64_t state_at = (b * Hkv + h) * dk * dv;
  for (int64_t i = threadIdx.x; i < dk * dv; i += blockDim.x) state[i] = past ? past[state_at + i] : 0.f;
  __syncthreads();
  const int64_t decay_width = g.decay_per_key_dim ? Hkv * dk : Hkv, beta_width = g.beta_per_head ? Hkv : 1;
  for (int64_t t = 0; t < g.length; ++t) {
    const int64_t row = b * g.length + t;
    const float* kt = k + (row * Hkv + h) * dk;
    const float* vt = v + (row * Hkv + h) * dv;
    if (g.gated)
      for (int64_t i = threadIdx.x; i < dk * dv; i += blockDim.x) {
        const int64_t d = i / dv;
        state[i] *= expf(decay[row * decay_width + (g.decay_per_key_dim ? h * dk + d : h)]);
      }
    __syncthreads();
    // What is written: v, or with the delta step beta (v - S^T k).
    for (int64_t m = threadIdx.x; m < dv; m += blockDim.x) {
      if (g.delta) {
        const float bt = beta[row * beta_width + (g.beta_per_head ? h : 0)];
        float recalled = 0.f;
        for (int64_t d = 0; d < dk; ++d) recalled += state[d * dv + m] * kt[d];
        written[m] = bt * (vt[m] - recalled);
      } else {
        written[m] = vt[m];
      }
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < dk * dv; i += blockDim.x) state[i] += kt[i / dv] * written[i % dv];
    __syncthreads();
    // The query heads of this key/value head read the state.
    for (int64_t i = threadIdx.x; i < group * dv; i += blockDim.x) {
      const int64_t head = h * group + i / dv, m = i % dv;
      const float* qt = q + (row * Hq + head) * dk;
      float sum = 0.f;
      for (int64_t d = 0; d < dk; ++d) sum += qt[d] * state[d * dv + m];
      y[(row * Hq + head) * dv + m] = g.scale * sum;
    }
    __syncthreads();
  }
  if (present)
    for (int64_t i = threadIdx.x; i < dk * dv; i += blockDim.x) present[state_at + i] = state[i];
}

ir::LinearAttentionParams params_of(const LayerRequest& r) {
  return ir::linear_attention_params(r.node, r.input_shape(0), r.input_shape(1), r.input_shape(2), r.shape_if_given(3),
                                     r.shape_if_given(4), r.shape_if_given(5));
}

int64_t shared_bytes(const ir::LinearAttentionParams& p) { return (p.key_dim * p.value_dim + p.value_dim) * 4; }

std::string check_linear_attention(const LayerRequest& r) {
  for (size_t i = 0; i < r.inputs.size(); ++i)
    if (r.given(i) && r.input_dtypes[i] != DType::kFloat32)
      return "input type " + to_string(r.input_dtypes[i]) + " is not supported (supported: float32)";
  try {
    const ir::LinearAttentionParams p = params_of(r);
    if (shared_bytes(p) > 200 * 1024) return "a state of " + std::to_string(p.key_dim) + " x " + std::to_string(p.value_dim) +
                                             " is above the GPU layer's 200 KB of shared memory";
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::unique_ptr<Layer> create_linear_attention(const LayerRequest& r, const LayerFormats&, BuildServices& services) {
  const ir::LinearAttentionParams p = params_of(r);
  LinearAttentionGeom g;
  g.batch = p.batch, g.length = p.length, g.q_heads = p.q_heads, g.kv_heads = p.kv_heads, g.dk = p.key_dim, g.dv = p.value_dim;
  g.gated = p.rule.gated, g.delta = p.rule.delta, g.decay_per_key_dim = p.decay_per_key_dim, g.beta_per_head = p.beta_per_head;
  g.scale = p.scale;
  const int64_t shared = shared_bytes(p);
  if (shared > static_cast<int64_t>(services.device().sharedMemPerBlockOptin))
    throw r.node.error(ErrorKind::kUnsupported, "its state needs more shared memory than a block has on this GPU");
  if (g.batch * g.kv_heads == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const bool past = r.given(3), decay = r.given(4), beta = r.given(5);
  return make_layer("kernel:linear-attention", [g, shared, past, decay, beta](const LayerIO& io, cudaStream_t stream) {
    prepare_kernel(linear_attention_kernel, kLinearAttentionThreads, static_cast<int>(shared), false, "the LinearAttention kernel");
    float* present = io.outputs.size() > 1 ? static_cast<float*>(io.outputs[1]) : nullptr;
    linear_attention_kernel<<<static_cast<unsigned>(g.batch * g.kv_heads), kLinearAttentionThreads, static_cast<size_t>(shared),
                              stream>>>(
        static_cast<const float*>(io.inputs[0]), static_cast<const float*>(io.inputs[1]), static_cast<const float*>(io.inputs[2]),
        past ? static_cast<const float*>(io.inputs[3]) : nullptr, decay ? static_cast<const float*>(io.inputs[4]) : nullptr,
        beta ? static_cast<const float*>(io.inputs[5]) : nullptr, static_cast<float*>(io.outputs[0]), present, g);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(linear_attention) {
  LayerEntry e;
  e.op = "LinearAttention";
  e.check = check_linear_attention;
  e.formats = float32_linear_formats;
  e.create = create_linear_attention;
  e.dtypes = "float32 (kept float32 under fp16)";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
