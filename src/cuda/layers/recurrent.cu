// CUDA layer of RNN, GRU and LSTM (float32; kept float32 under fp16), the CPU kernel's
// arithmetic (src/cpu/recurrent.cc says what each gate computes): every attribute the CPU kernel
// takes (directions, layout, activations, clip, GRU's linear_before_reset, LSTM's input_forget
// and peepholes) and sequence_lens, with sums of products in double.
//
// Two kernels:
// - the input projection W x + Wb of every step, direction and batch entry at once (it does not
//   depend on the state): one thread per gate row, into the workspace;
// - the recurrence: one block per (direction, batch entry), the state in shared memory, each
//   step R h + Rb over the block's threads (a gate row each), then the gates. Entries and
//   directions are independent, so no step waits on another block.
// The recurrence runs on as many SMs as there are directions times batch entries: fast enough to
// keep a model's recurrent layers on the GPU (no copies to and from the host), not a tuned RNN.
//
// A sequence length outside [0, seq_length] (which the CPU kernel refuses with an error) leaves
// that entry's outputs 0 and raises the layer's RunFlag, and run() throws.
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ops/recurrent_params.h"

namespace kiln::cuda {

namespace {

constexpr int kRecurrentThreads = 256;
constexpr int kMaxShared = 200 * 1024;  // bytes of state a block holds at most (recurrence_shared_bytes)

struct RecurrentGeom {
  int gates = 1, dirs = 1;
  bool reverse_only = false, batch_first = false, linear_before_reset = false, input_forget = false;
  bool lens64 = false;
  float clip = -1.f;  // < 0: no clipping
  int64_t seq = 0, batch = 0, feat = 0, hidden = 0;
  ir::RecurrentActivation act[2][3];
};

__device__ __forceinline__ float clipped(const RecurrentGeom& g, float v) {
  return g.clip >= 0.f ? fmaxf(-g.clip, fminf(g.clip, v)) : v;  // std::max(-clip, std::min(clip, v))
}

// pre[d][t][b][row] = Wb[row] + W[d][row] . x[t][b], summed in double.
__global__ void recurrent_input_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                       const float* __restrict__ bias, float* __restrict__ pre, RecurrentGeom g) {
  const int64_t gh = g.gates * g.hidden, total = g.dirs * g.seq * g.batch * gh;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t row = i % gh, rest = i / gh, b = rest % g.batch, t = (rest / g.batch) % g.seq, d = rest / (g.batch * g.seq);
    const float* wr = w + (d * gh + row) * g.feat;
    const float* xt = x + (g.batch_first ? b * g.seq + t : t * g.batch + b) * g.feat;
    double s = bias ? bias[d * 2 * gh + row] : 0.0;
    for (int64_t k = 0; k < g.feat; ++k) s += static_cast<double>(wr[k]) * xt[k];
    pre[i] = static_cast<float>(s);
  }
}

template <class Len>
__global__ void __launch_bounds__(kRecurrentThreads)
    recurrent_kernel(const float* __restrict__ pre, const float* __restrict__ r, const float* __restrict__ bias,
                     const Len* __restrict__ lens, const float* __restrict__ h0, const float* __restrict__ c0,
                     const float* __restrict__ peep, float* __restrict__ y, float* __restrict__ y_h,
                     float* __restrict__ y_c, RecurrentGeom g, int* __restrict__ refused) {
  extern __shared__ float shared[];
  const int64_t H = g.hidden, gh = g.gates * H;
  float* h = shared;       // [H]
  float* c = h + H;        // [H]
  float* next = c + H;     // [H]
  float* reset = next + H; // [H] (GRU)
  float* rh = reset + H;   // [gh]
  const int64_t d = blockIdx.x / g.batch, b = blockIdx.x % g.batch;
  const bool reverse = g.reverse_only || d == 1;
  const float* rd = r + d * gh * H;
  const float* rb = bias ? bias + d * 2 * gh + gh : nullptr;
  const float* p = peep ? peep + d * 3 * H : nullptr;
  const ir::RecurrentActivation* act = g.act[d];
  auto y_at = [&](int64_t t) { return g.batch_first ? ((b * g.seq + t) * g.dirs + d) * H : ((t * g.dirs + d) * g.batch + b) * H; };
  const int64_t state_at = g.batch_first ? (b * g.dirs + d) * H : (d * g.batch + b) * H;
  const int64_t len = lens ? static_cast<int64_t>(lens[b]) : g.seq;
  const bool bad = len < 0 || len > g.seq;
  if (bad && threadIdx.x == 0) *refused = 1;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
    h[j] = h0 && !bad ? h0[state_at + j] : 0.f;
    c[j] = c0 && !bad ? c0[state_at + j] : 0.f;
  }
  // Y's steps past the entry's length (every step of a refused entry) are 0.
  if (y)
    for (int64_t t = bad ? 0 : len; t < g.seq; ++t)
      for (int64_t j = threadIdx.x; j < H; j += blockDim.x) y[y_at(t) + j] = 0.f;
  __syncthreads();
  for (int64_t s = 0; !bad && s < len; ++s) {
    const int64_t t = reverse ? len - 1 - s : s;
    const float* pt = pre + ((d * g.seq + t) * g.batch + b) * gh;
    for (int64_t row = threadIdx.x; row < gh; row += blockDim.x) {
      const float* rr = rd + row * H;
      double sum = rb ? rb[row] : 0.0;
      for (int64_t k = 0; k < H; ++k) sum += static_cast<double>(rr[k]) * h[k];
      rh[row] = static_cast<float>(sum);
    }
    __syncthreads();
    if (g.gates == 1) {
      for (int64_t j = threadIdx.x; j < H; j += blockDim.x) next[j] = act[0](clipped(g, pt[j] + rh[j]));
    } else if (g.gates == 3) {
      for (int64_t k = threadIdx.x; k < H; k += blockDim.x) reset[k] = act[0](clipped(g, pt[H + k] + rh[H + k]));
      __syncthreads();
      for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
        const float z = act[0](clipped(g, pt[j] + rh[j]));
        float n_in;
        if (g.linear_before_reset) {
          n_in = pt[2 * H + j] + reset[j] * rh[2 * H + j];
        } else {
          const float* rr = rd + (2 * H + j) * H;
          double sum = rb ? rb[2 * H + j] : 0.0;
          for (int64_t k = 0; k < H; ++k) sum += static_cast<double>(rr[k]) * reset[k] * h[k];
          n_in = pt[2 * H + j] + static_cast<float>(sum);
        }
        const float n = act[1](clipped(g, n_in));
        next[j] = (1.f - z) * n + z * h[j];
      }
    } else {
      for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
        const float pi = p ? p[j] : 0.f, po = p ? p[H + j] : 0.f, pf = p ? p[2 * H + j] : 0.f;
        const float i = act[0](clipped(g, pt[j] + rh[j] + pi * c[j]));
        const float f = g.input_forget ? 1.f - i : act[0](clipped(g, pt[2 * H + j] + rh[2 * H + j] + pf * c[j]));
        const float cc = act[1](clipped(g, pt[3 * H + j] + rh[3 * H + j]));
        const float cn = f * c[j] + i * cc;
        const float o = act[0](clipped(g, pt[H + j] + rh[H + j] + po * cn));
        c[j] = cn;
        next[j] = o * act[2](cn);
      }
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      h[j] = next[j];
      if (y) y[y_at(t) + j] = next[j];
    }
    __syncthreads();
  }
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
    if (y_h) y_h[state_at + j] = h[j];
    if (y_c) y_c[state_at + j] = c[j];
  }
}

int64_t recurrence_shared_bytes(int gates, int64_t hidden) { return (4 + gates) * hidden * 4; }

std::string check_recurrent(const LayerRequest& r) {
  const bool lstm = r.node.op == "LSTM";
  const size_t last_float = lstm ? 8 : 6;
  for (size_t i = 0; i < std::min(r.inputs.size(), last_float); ++i)
    if (i != 4 && r.has_input(i) && r.input_dtypes[i] != DType::kFloat32)
      return "input type " + to_string(r.input_dtypes[i]) + " is not supported (supported: float32)";
  if (r.has_input(4) && r.input_dtypes[4] != DType::kInt32 && r.input_dtypes[4] != DType::kInt64)
    return "sequence_lens must be int32, is " + to_string(r.input_dtypes[4]);
  for (size_t i = 0; i < 3; ++i)
    if (!r.has_input(i) || r.input_shape(i).size() != 3) return "X, W and R must be given, of rank 3";
  const int gates = lstm ? 4 : r.node.op == "GRU" ? 3 : 1;
  const std::vector<int64_t>& w = r.input_shape(1);
  const int64_t hidden = w[1] / gates;
  if (hidden <= 0 || w[1] != gates * hidden) return "W's second dim is not " + std::to_string(gates) + " x hidden";
  if (recurrence_shared_bytes(gates, hidden) > kMaxShared)
    return "hidden size " + std::to_string(hidden) + " is above the GPU layer's " +
           std::to_string(kMaxShared / 4 / (4 + gates));
  try {
    const int dirs = r.node.attrs.get_string("direction", "forward") == "bidirectional" ? 2 : 1;
    ir::recurrent_activations(r.node, dirs);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

LayerFormats recurrent_formats(const LayerRequest& r) {
  LayerFormats f;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    if (!r.has_input(i)) f.inputs.emplace_back();
    else if (i == 4) f.inputs.push_back(Format{r.input_dtypes[i], Layout::kLinear});
    else f.inputs.push_back(Format{DType::kFloat32, Layout::kLinear});
  }
  for (size_t o = 0; o < r.output_dtypes.size(); ++o)
    f.outputs.push_back(r.output_dtypes[o] == DType::kUndefined ? Format{} : Format{DType::kFloat32, Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_recurrent(const LayerRequest& r, const LayerFormats& f, BuildServices& services) {
  const ir::Node& node = r.node;
  const bool lstm = node.op == "LSTM";
  RecurrentGeom g;
  g.gates = lstm ? 4 : node.op == "GRU" ? 3 : 1;
  const std::string direction = node.attrs.get_string("direction", "forward");
  g.dirs = direction == "bidirectional" ? 2 : 1;
  g.reverse_only = direction == "reverse";
  g.batch_first = node.attrs.get_int("layout", 0) == 1;
  g.linear_before_reset = node.attrs.get_int("linear_before_reset", 0) != 0;
  g.input_forget = node.attrs.get_int("input_forget", 0) != 0;
  g.clip = node.attrs.has("clip") ? node.attrs.get_float("clip", 0.f) : -1.f;
  const std::vector<std::vector<ir::RecurrentActivation>> acts = ir::recurrent_activations(node, g.dirs);
  for (int d = 0; d < g.dirs; ++d)
    for (size_t k = 0; k < acts[static_cast<size_t>(d)].size(); ++k) g.act[d][k] = acts[static_cast<size_t>(d)][k];
  const std::vector<int64_t>& x = r.input_shape(0);
  g.seq = x[g.batch_first ? 1 : 0], g.batch = x[g.batch_first ? 0 : 1], g.feat = x[2];
  g.hidden = r.input_shape(1)[1] / g.gates;
  const int64_t gh = g.gates * g.hidden;
  auto fail = [&](const std::string& what) { throw node.error(ErrorKind::kInvalidModel, what); };
  const std::vector<int64_t>& w = r.input_shape(1);
  const std::vector<int64_t>& rs = r.input_shape(2);
  if (w[0] != g.dirs || w[2] != g.feat || rs[0] != g.dirs || rs[1] != gh || rs[2] != g.hidden)
    fail("W must be [directions, " + std::to_string(g.gates) + " x hidden, input] and R [directions, " +
         std::to_string(g.gates) + " x hidden, hidden], matching X");
  auto numel_of = [&](size_t i) { return r.has_input(i) ? shape_numel(r.input_shape(i)) : -1; };
  if (numel_of(3) >= 0 && numel_of(3) != g.dirs * 2 * gh)
    fail("B must be [directions, " + std::to_string(2 * g.gates) + " x hidden]");
  if (numel_of(4) >= 0 && numel_of(4) != g.batch) fail("sequence_lens must have one element per batch entry");
  for (size_t i : {size_t{5}, size_t{6}})
    if ((i == 5 || lstm) && numel_of(i) >= 0 && numel_of(i) != g.dirs * g.batch * g.hidden)
      fail("initial_h and initial_c must be [directions, batch, hidden]");
  if (lstm && numel_of(7) >= 0 && numel_of(7) != g.dirs * 3 * g.hidden) fail("P must be [directions, 3 x hidden]");
  g.lens64 = r.has_input(4) && f.inputs[4].dtype == DType::kInt64;
  const bool has_lens = r.has_input(4);
  const int64_t shared = recurrence_shared_bytes(g.gates, g.hidden);
  if (shared > static_cast<int64_t>(services.device().sharedMemPerBlockOptin))
    throw node.error(ErrorKind::kUnsupported, "hidden size " + std::to_string(g.hidden) + " needs " + std::to_string(shared) +
                                                  " bytes of shared memory, more than a block has on this GPU");
  const size_t workspace = static_cast<size_t>(g.dirs * g.seq * g.batch * gh) * sizeof(float);
  if (g.batch == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});  // every output is empty
  auto input_at = [](const LayerIO& io, size_t i) -> const void* { return i < io.inputs.size() ? io.inputs[i] : nullptr; };
  auto output_at = [](const LayerIO& io, size_t i) -> float* {
    return i < io.outputs.size() ? static_cast<float*>(io.outputs[i]) : nullptr;
  };
  return make_checked_layer("kernel:recurrent", [=](const LayerIO& io, cudaStream_t stream, int* refused) {
    auto* pre = static_cast<float*>(io.workspace);
    const auto* xs = static_cast<const float*>(io.inputs[0]);
    const auto* ws = static_cast<const float*>(io.inputs[1]);
    const auto* rsd = static_cast<const float*>(io.inputs[2]);
    const auto* bias = static_cast<const float*>(input_at(io, 3));
    recurrent_input_kernel<<<grid_for(g.dirs * g.seq * g.batch * gh), 256, 0, stream>>>(xs, ws, bias, pre, g);
    KILN_CUDA_CHECK_LAUNCH();
    const auto* h0 = static_cast<const float*>(input_at(io, 5));
    const auto* c0 = lstm ? static_cast<const float*>(input_at(io, 6)) : nullptr;
    const auto* peep = lstm ? static_cast<const float*>(input_at(io, 7)) : nullptr;
    float* y = output_at(io, 0);
    float* y_h = output_at(io, 1);
    float* y_c = lstm ? output_at(io, 2) : nullptr;
    const unsigned blocks = static_cast<unsigned>(g.dirs * g.batch);
    auto launch = [&](auto kernel, const auto* lens) {
      prepare_kernel(kernel, kRecurrentThreads, static_cast<int>(shared), false, "the recurrent kernel");
      kernel<<<blocks, kRecurrentThreads, static_cast<size_t>(shared), stream>>>(pre, rsd, bias, lens, h0, c0, peep, y,
                                                                                 y_h, y_c, g, refused);
      KILN_CUDA_CHECK_LAUNCH();
    };
    if (g.lens64) launch(recurrent_kernel<int64_t>, has_lens ? static_cast<const int64_t*>(input_at(io, 4)) : nullptr);
    else launch(recurrent_kernel<int32_t>, has_lens ? static_cast<const int32_t*>(input_at(io, 4)) : nullptr);
  }, node.op + " '" + node.name + "': a sequence_lens value is outside [0, " + std::to_string(g.seq) + "]", workspace);
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(recurrent) {
  for (const char* op : {"RNN", "GRU", "LSTM"}) {
    LayerEntry e;
    e.op = op;
    e.check = check_recurrent;
    e.formats = recurrent_formats;
    e.create = create_recurrent;
    e.dtypes = "float32 (kept float32 under fp16)";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
