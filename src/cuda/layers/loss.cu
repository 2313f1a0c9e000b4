// CUDA layers of NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (float32, float64; float32
// stays float32 under fp16, as the CPU kernel sums in double), as ONNX's reference defines them
// and src/cpu/loss.cc computes them: loss[n, d] = -weight[t] * x[n, t, d] with t = target[n, d]
// (0 where t is ignore_index); "sum" adds them, "mean" divides the sum by the sum of the weights
// taken (by the count of elements when there are neither weights nor an ignore_index).
// SoftmaxCrossEntropyLoss takes x = log_softmax(scores) over C (its optional second output).
//
// A thread per (n, d): the log-softmax of its line, then its loss and weight; a reduction is one
// block summing those in double in a fixed order, so a run is deterministic. A target outside
// [0, C) (and not ignore_index) is an error on the CPU; here it raises the layer's run flag
// (make_checked_layer), and run() throws.
#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

constexpr int kBlock = 256;

struct LossGeom {
  int64_t n = 0, c = 0, inner = 0;  // scores [n, c, inner...]
  bool has_ignore = false;
  int64_t ignore_index = 0;
};

// One line of scores (stride `inner`) to its log-softmax, in double.
template <class T>
__global__ void log_softmax_kernel(const T* __restrict__ x, T* __restrict__ y, LossGeom g) {
  const int64_t lines = g.n * g.inner;
  for (int64_t line = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; line < lines; line += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = line / g.inner, d = line % g.inner;
    const T* xs = x + i * g.c * g.inner + d;
    T* ys = y + i * g.c * g.inner + d;
    double m = -INFINITY;
    for (int64_t k = 0; k < g.c; ++k) m = fmax(m, static_cast<double>(xs[k * g.inner]));
    double sum = 0;
    for (int64_t k = 0; k < g.c; ++k) sum += exp(static_cast<double>(xs[k * g.inner]) - m);
    const double log_sum = log(sum);
    for (int64_t k = 0; k < g.c; ++k) ys[k * g.inner] = static_cast<T>(static_cast<double>(xs[k * g.inner]) - m - log_sum);
  }
}

// Each element's loss (and the weight it took: 0 when ignored). `out` gets the loss itself
// (reduction none) or null; `losses` and `weights` get them for a reduction, or are null.
template <class T, class I>
__global__ void nll_kernel(const T* __restrict__ x, const I* __restrict__ targets, const T* __restrict__ class_weights,
                           T* __restrict__ out, double* __restrict__ losses, double* __restrict__ weights, LossGeom g,
                           int* __restrict__ bad_target) {
  const int64_t count = g.n * g.inner;
  for (int64_t at = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; at < count; at += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = static_cast<int64_t>(targets[at]);
    double loss = 0, w = 0;
    if (!(g.has_ignore && t == g.ignore_index)) {
      if (t < 0 || t >= g.c) {
        *bad_target = 1;
      } else {
        const int64_t i = at / g.inner, d = at % g.inner;
        w = class_weights ? static_cast<double>(class_weights[t]) : 1.0;
        loss = -w * static_cast<double>(x[(i * g.c + t) * g.inner + d]);
      }
    }
    if (out) out[at] = static_cast<T>(loss);
    if (losses) {
      losses[at] = loss;
      weights[at] = w;
    }
  }
}

// One block: the sum of the losses, divided as the reduction says.
template <class T>
__global__ void __launch_bounds__(kBlock) reduce_loss_kernel(const double* __restrict__ losses, const double* __restrict__ weights,
                                                             int64_t count, bool mean, bool weighted, T* __restrict__ out) {
  __shared__ double loss_sum[kBlock], weight_sum[kBlock];
  double l = 0, w = 0;
  for (int64_t i = threadIdx.x; i < count; i += kBlock) {
    l += losses[i];
    w += weights[i];
  }
  loss_sum[threadIdx.x] = l;
  weight_sum[threadIdx.x] = w;
  __syncthreads();
  for (int half = kBlock / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      loss_sum[threadIdx.x] += loss_sum[threadIdx.x + half];
      weight_sum[threadIdx.x] += weight_sum[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    double sum = loss_sum[0];
    if (mean) sum /= weighted ? weight_sum[0] : static_cast<double>(count);
    out[0] = static_cast<T>(sum);
  }
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

bool has_output(const LayerRequest& r, size_t i) {
  return i < r.output_dtypes.size() && r.output_dtypes[i] != DType::kUndefined;
}

std::string check_loss(const LayerRequest& r) {
  const DType d = r.input_dtypes[0];
  if (d != DType::kFloat32 && d != DType::kFloat64) return "input type " + to_string(d) + " is not supported (float32, float64)";
  if (!r.has_input(1)) return "the target is missing";
  if (r.input_dtypes[1] != DType::kInt32 && r.input_dtypes[1] != DType::kInt64)
    return "the target must be int32 or int64, is " + to_string(r.input_dtypes[1]);
  if (r.has_input(2) && r.input_dtypes[2] != d) return "the weights must have the scores' type";
  if (r.input_shape(0).size() < 2) return "the scores need a class dimension (rank 2 or more)";
  const std::string reduction = r.node.attrs.get_string("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean") return "reduction '" + reduction + "' is not known";
  return "";
}

LayerFormats loss_formats(const LayerRequest& r) {
  const DType d = r.input_dtypes[0];
  LayerFormats f;
  f.inputs.resize(r.inputs.size());
  f.inputs[0] = Format{d, Layout::kLinear};
  f.inputs[1] = Format{r.input_dtypes[1], Layout::kLinear};
  if (r.has_input(2)) f.inputs[2] = Format{d, Layout::kLinear};  // uploaded when constant
  for (size_t i = 0; i < r.output_dtypes.size(); ++i)
    f.outputs.push_back(has_output(r, i) ? Format{d, Layout::kLinear} : Format{});
  return f;
}

std::unique_ptr<Layer> create_loss(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const std::vector<int64_t>& shape = r.input_shape(0);
  LossGeom g;
  g.n = shape[0];
  g.c = shape[1];
  g.inner = 1;
  for (size_t i = 2; i < shape.size(); ++i) g.inner *= shape[i];
  if (r.has_input(2) && shape_numel(r.input_shape(2)) != g.c)
    throw r.node.error(ErrorKind::kInvalidModel, "the weights have " + std::to_string(shape_numel(r.input_shape(2))) +
                                                     " elements for " + std::to_string(g.c) + " classes");
  if (shape_numel(r.input_shape(1)) != g.n * g.inner)
    throw r.node.error(ErrorKind::kInvalidModel, "the target " + shape_to_string(r.input_shape(1)) + " does not match the scores " +
                                                     shape_to_string(shape));
  if (r.node.attrs.has("ignore_index")) {
    g.has_ignore = true;
    g.ignore_index = r.node.attrs.get_int("ignore_index", 0);
  }
  const bool softmax = r.node.op == "SoftmaxCrossEntropyLoss";
  const bool log_prob_out = softmax && has_output(r, 1);
  const std::string reduction = r.node.attrs.get_string("reduction", "mean");
  const bool reduce = reduction != "none";
  const bool mean = reduction == "mean", weighted = r.has_input(2) || g.has_ignore;
  const DType dtype = f.inputs[0].dtype, index = f.inputs[1].dtype;
  const int64_t count = g.n * g.inner;
  // Workspace: the log-softmax when it is no output, then the losses and weights to reduce.
  const size_t log_prob_bytes = softmax && !log_prob_out ? aligned(static_cast<size_t>(shape_numel(shape)) * element_size(dtype)) : 0;
  const size_t reduce_bytes = reduce ? aligned(static_cast<size_t>(count) * sizeof(double)) : 0;
  const size_t workspace = log_prob_bytes + 2 * reduce_bytes;
  const std::string tactic = std::string("kernel:") + (softmax ? "softmax-cross-entropy" : "nll") + "(" + reduction + ")";
  return make_checked_layer(
      tactic,
      [=](const LayerIO& io, cudaStream_t stream, int* bad_target) {
        auto run = [&](auto ttag, auto itag) {
          using T = decltype(ttag);
          using I = decltype(itag);
          const T* x = static_cast<const T*>(io.inputs[0]);
          auto* ws = static_cast<unsigned char*>(io.workspace);
          const unsigned blocks = capped_blocks((count + kBlock - 1) / kBlock);
          if (softmax) {
            T* log_prob = log_prob_out ? static_cast<T*>(io.outputs[1]) : reinterpret_cast<T*>(ws);
            if (count > 0) {
              log_softmax_kernel<T><<<blocks, kBlock, 0, stream>>>(x, log_prob, g);
              KILN_CUDA_CHECK_LAUNCH();
            }
            x = log_prob;
          }
          double* losses = reduce ? reinterpret_cast<double*>(ws + log_prob_bytes) : nullptr;
          double* weights = reduce ? reinterpret_cast<double*>(ws + log_prob_bytes + reduce_bytes) : nullptr;
          T* out = static_cast<T*>(io.outputs[0]);
          if (count > 0) {
            nll_kernel<T, I><<<blocks, kBlock, 0, stream>>>(x, static_cast<const I*>(io.inputs[1]),
                                                            static_cast<const T*>(io.inputs.size() > 2 ? io.inputs[2] : nullptr),
                                                            reduce ? nullptr : out, losses, weights, g, bad_target);
            KILN_CUDA_CHECK_LAUNCH();
          }
          if (reduce) {
            reduce_loss_kernel<T><<<1, kBlock, 0, stream>>>(losses, weights, count, mean, weighted, out);
            KILN_CUDA_CHECK_LAUNCH();
          }
        };
        auto with_index = [&](auto ttag) {
          if (index == DType::kInt32) run(ttag, int32_t{});
          else run(ttag, int64_t{});
        };
        if (dtype == DType::kFloat64) with_index(double{});
        else with_index(float{});
      },
      r.node.op + " '" + r.node.name + "': a target is not a class in [0, " + std::to_string(g.c) + ") nor ignore_index",
      workspace);
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(loss) {
  for (const char* op : {"NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"}) {
    LayerEntry e;
    e.op = op;
    e.dtypes = "float32, float64 (float32 stays float32 under fp16); int32 or int64 targets";
    e.check = check_loss;
    e.formats = loss_formats;
    e.create = create_loss;
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
