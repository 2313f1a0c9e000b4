// CUDA layers of Softmax, LogSoftmax and Hardmax (opset-13 semantics: along one axis), float32 and
// float16 storage, float32 arithmetic, in any layout (the kernels index the logical tensor
// through its strides, so a kNHWC tensor is read and written where it is).
//
// As on the CPU (src/cpu/normalization.cc) the max is subtracted before exp(); the max skips
// NaN (std::max from -inf does), the sum does not. Kernels, by the axis' stride:
//  - contiguous axis of up to 1024 elements: one warp per line, the line held in registers;
//  - longer contiguous axis: one 512-thread block per line, three passes over it;
//  - strided axis (inner dims after it), or a line of up to 8 elements: one thread per
//    line (consecutive lines consecutive in memory when strided), three passes.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

constexpr int kBlock = 256;       // warp and thread kernels
constexpr int kLineBlock = 512;   // block-per-line kernel

struct MaxOp {
  __device__ float operator()(float a, float b) const { return a < b ? b : a; }  // NaN-free operands
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// The block's reduction, in every thread. Every thread of the block must call it.
template <class Op> __device__ __forceinline__ float block_all(float v, Op op, float* smem) {
  v = warp_all(v, op);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float r = smem[0];
  for (int w = 1; w < warps; ++w) r = op(r, smem[w]);
  __syncthreads();
  return r;
}

// Max that skips NaN x, as std::max(m, x) does.
__device__ __forceinline__ float max_skip_nan(float m, float x) { return m < x ? x : m; }

// One warp per line; element c of a line is at base + c (the axis is contiguous).
template <class T, int ITEMS, bool LOG>
__global__ void __launch_bounds__(kBlock) softmax_warp_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                              StridedShape lines, int64_t count, int n) {
  constexpr int kWarps = kBlock / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  for (int64_t line = int64_t{blockIdx.x} * kWarps + warp; line < count; line += int64_t{gridDim.x} * kWarps) {
    const int64_t base = strided_offset(lines, line);
    float v[ITEMS];
    float m = -INFINITY;
#pragma unroll
    for (int t = 0; t < ITEMS; ++t) {
      const int c = lane + 32 * t;
      v[t] = c < n ? load_float(x, base + c) : -INFINITY;
      m = max_skip_nan(m, v[t]);
    }
    m = warp_all(m, MaxOp{});
    float sum = 0.f;
#pragma unroll
    for (int t = 0; t < ITEMS; ++t) {
      if (lane + 32 * t < n) {
        const float e = expf(v[t] - m);
        if constexpr (!LOG) v[t] = e;
        sum += e;
      }
    }
    sum = warp_all(sum, SumOp{});
    if constexpr (LOG) {
      const float shift = m + logf(sum);
#pragma unroll
      for (int t = 0; t < ITEMS; ++t)
        if (lane + 32 * t < n) store_float(y, base + lane + 32 * t, v[t] - shift);
    } else {
      const float inv = 1.f / sum;
#pragma unroll
      for (int t = 0; t < ITEMS; ++t)
        if (lane + 32 * t < n) store_float(y, base + lane + 32 * t, v[t] * inv);
    }
  }
}

// One block per line of a contiguous axis, three passes.
template <class T, bool LOG>
__global__ void __launch_bounds__(kLineBlock) softmax_block_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                   StridedShape lines, int64_t count, int64_t n) {
  __shared__ float smem[32];
  for (int64_t line = blockIdx.x; line < count; line += gridDim.x) {
    const int64_t base = strided_offset(lines, line);
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) m = max_skip_nan(m, load_float(x, base + c));
    m = block_all(m, MaxOp{}, smem);
    float sum = 0.f;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) sum += expf(load_float(x, base + c) - m);
    sum = block_all(sum, SumOp{}, smem);
    if constexpr (LOG) {
      const float shift = m + logf(sum);
      for (int64_t c = threadIdx.x; c < n; c += blockDim.x) store_float(y, base + c, load_float(x, base + c) - shift);
    } else {
      const float inv = 1.f / sum;
      for (int64_t c = threadIdx.x; c < n; c += blockDim.x)
        store_float(y, base + c, expf(load_float(x, base + c) - m) * inv);
    }
  }
}

// One thread per line of a strided axis.
template <class T, bool LOG>
__global__ void __launch_bounds__(kBlock) softmax_strided_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                 StridedShape lines, int64_t count, int64_t n,
                                                                 int64_t stride) {
  for (int64_t line = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; line < count;
       line += int64_t{gridDim.x} * blockDim.x) {
    const int64_t base = strided_offset(lines, line);
    float m = -INFINITY;
    for (int64_t c = 0; c < n; ++c) m = max_skip_nan(m, load_float(x, base + c * stride));
    float sum = 0.f;
    for (int64_t c = 0; c < n; ++c) sum += expf(load_float(x, base + c * stride) - m);
    if constexpr (LOG) {
      const float shift = m + logf(sum);
      for (int64_t c = 0; c < n; ++c) store_float(y, base + c * stride, load_float(x, base + c * stride) - shift);
    } else {
      const float inv = 1.f / sum;
      for (int64_t c = 0; c < n; ++c)
        store_float(y, base + c * stride, expf(load_float(x, base + c * stride) - m) * inv);
    }
  }
}

// Hardmax, one thread per line: 1 at the first largest element, NaN counting as the largest
// (the CPU kernel's numpy argmax).
template <class T>
__global__ void __launch_bounds__(kBlock) hardmax_kernel(const T* __restrict__ x, T* __restrict__ y, StridedShape lines,
                                                         int64_t count, int64_t n, int64_t stride) {
  for (int64_t line = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; line < count;
       line += int64_t{gridDim.x} * blockDim.x) {
    const int64_t base = strided_offset(lines, line);
    int64_t best = 0;
    float b = load_float(x, base);
    for (int64_t c = 1; c < n; ++c) {
      const float v = load_float(x, base + c * stride);
      if (!isnan(b) && (isnan(v) || v > b)) {
        best = c;
        b = v;
      }
    }
    for (int64_t c = 0; c < n; ++c) store_float(y, base + c * stride, c == best ? 1.f : 0.f);
  }
}

// The lines of an axis: the other dims (logical order) with their strides, size-1 dims
// dropped and contiguous runs merged. False when more than kMaxKernelRank dims remain.
bool lines_of(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, size_t axis, StridedShape& out) {
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (size_t d = 0; d < shape.size(); ++d)
    if (d != axis) dims.emplace_back(shape[d], strides[d]);
  return merge_dims(dims, out);
}

struct AxisGeom {
  StridedShape lines;
  int64_t count = 0, n = 1, stride = 1;
};

// The axis geometry of a tensor; throws for an axis out of range.
std::string axis_geom(const ir::Node& node, const TensorSpec& x, AxisGeom& g) {
  const int64_t rank = x.rank();
  int64_t axis = node.attrs.get_int("axis", -1);
  if (rank == 0) {  // one element, a line of one (as the CPU computes it)
    g = AxisGeom{};
    g.count = 1;
    return "";
  }
  if (axis < -rank || axis >= rank)
    throw node.error(ErrorKind::kInvalidModel, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  const std::vector<int64_t> strides = x.logical_strides();
  const size_t a = static_cast<size_t>(axis);
  if (!lines_of(x.shape, strides, a, g.lines))
    return "more than " + std::to_string(kMaxKernelRank) + " dims remain after merging contiguous ones";
  g.n = x.shape[a];
  g.stride = strides[a];
  g.count = g.n ? x.elements() / g.n : 0;
  return "";
}

template <class T, bool LOG>
std::unique_ptr<Layer> softmax_layer_typed(const AxisGeom& g) {
  const int64_t n = g.n;
  if ((g.stride == 1 || n == 1) && n > 8) {
    if (n <= 1024) {
      const int items = n <= 32 ? 1 : n <= 64 ? 2 : n <= 128 ? 4 : n <= 256 ? 8 : n <= 512 ? 16 : 32;
      const unsigned blocks = capped_blocks((g.count + kBlock / 32 - 1) / (kBlock / 32));
      return make_layer("kernel:softmax-warp", [g, items, blocks](const LayerIO& io, cudaStream_t stream) {
        const T* x = static_cast<const T*>(io.inputs[0]);
        T* y = static_cast<T*>(io.outputs[0]);
        const int n32 = static_cast<int>(g.n);
        switch (items) {
          case 1: softmax_warp_kernel<T, 1, LOG><<<blocks, kBlock, 0, stream>>>(x, y, g.lines, g.count, n32); break;
          case 2: softmax_warp_kernel<T, 2, LOG><<<blocks, kBlock, 0, stream>>>(x, y, g.lines, g.count, n32); break;
          case 4: softmax_warp_kernel<T, 4, LOG><<<blocks, kBlock, 0, stream>>>(x, y, g.lines, g.count, n32); break;
          case 8: softmax_warp_kernel<T, 8, LOG><<<blocks, kBlock, 0, stream>>>(x, y, g.lines, g.count, n32); break;
          case 16: softmax_warp_kernel<T, 16, LOG><<<blocks, kBlock, 0, stream>>>(x, y, g.lines, g.count, n32); break;
          default: softmax_warp_kernel<T, 32, LOG><<<blocks, kBlock, 0, stream>>>(x, y, g.lines, g.count, n32); break;
        }
        KILN_CUDA_CHECK_LAUNCH();
      });
    }
    const unsigned blocks = capped_blocks(g.count);
    return make_layer("kernel:softmax-block", [g, blocks](const LayerIO& io, cudaStream_t stream) {
      softmax_block_kernel<T, LOG><<<blocks, kLineBlock, 0, stream>>>(static_cast<const T*>(io.inputs[0]),
                                                                      static_cast<T*>(io.outputs[0]), g.lines,
                                                                      g.count, g.n);
      KILN_CUDA_CHECK_LAUNCH();
    });
  }
  const unsigned blocks = capped_blocks((g.count + kBlock - 1) / kBlock);
  return make_layer("kernel:softmax-strided", [g, blocks](const LayerIO& io, cudaStream_t stream) {
    softmax_strided_kernel<T, LOG><<<blocks, kBlock, 0, stream>>>(static_cast<const T*>(io.inputs[0]),
                                                                  static_cast<T*>(io.outputs[0]), g.lines, g.count,
                                                                  g.n, g.stride);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

std::string softmax_check(const LayerRequest& r) {
  const DType d = r.input_dtypes[0];
  if (d != DType::kFloat32 && d != DType::kFloat16)
    return "input type " + to_string(d) + " is not supported (supported: float32, float16)";
  try {
    AxisGeom g;
    return axis_geom(r.node, *r.inputs[0], g);
  } catch (const Error& e) {
    return e.what();
  }
}

LayerFormats softmax_formats(const LayerRequest& r) {
  LayerFormats f = uniform_formats(r, true, true);
  // A constant input (not folded away) is uploaded.
  if (r.is_constant(0)) f.inputs[0] = Format{r.storage_of(r.input_dtypes[0]), Layout::kLinear};
  return f;
}

std::unique_ptr<Layer> softmax_create(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const TensorSpec& x = *r.inputs[0];
  if (f.outputs[0].layout != x.format.layout && x.rank() == 4)
    throw r.node.error(ErrorKind::kInternal, "softmax input and output layouts differ");
  AxisGeom g;
  std::string why = axis_geom(r.node, x, g);
  if (!why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  if (g.count == 0 || g.n == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  if (r.node.op == "Hardmax") {
    const unsigned blocks = capped_blocks((g.count + kBlock - 1) / kBlock);
    EnqueueFn fn;
    auto make = [&](auto tag) {
      using T = decltype(tag);
      fn = [g, blocks](const LayerIO& io, cudaStream_t stream) {
        hardmax_kernel<T><<<blocks, kBlock, 0, stream>>>(static_cast<const T*>(io.inputs[0]), static_cast<T*>(io.outputs[0]),
                                                         g.lines, g.count, g.n, g.stride);
        KILN_CUDA_CHECK_LAUNCH();
      };
    };
    if (f.inputs[0].dtype == DType::kFloat32) make(float{});
    else if (f.inputs[0].dtype == DType::kFloat16) make(__half{});
    else throw r.node.error(ErrorKind::kUnsupported, "storage type " + to_string(f.inputs[0].dtype) + " is not supported");
    return make_layer("kernel:hardmax-strided", std::move(fn));
  }
  const bool log = r.node.op == "LogSoftmax";
  switch (f.inputs[0].dtype) {
    case DType::kFloat32: return log ? softmax_layer_typed<float, true>(g) : softmax_layer_typed<float, false>(g);
    case DType::kFloat16: return log ? softmax_layer_typed<__half, true>(g) : softmax_layer_typed<__half, false>(g);
    default: break;
  }
  throw r.node.error(ErrorKind::kUnsupported, "storage type " + to_string(f.inputs[0].dtype) + " is not supported");
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(softmax) {
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax"}) {
    LayerEntry e;
    e.op = op;
    e.check = softmax_check;
    e.formats = softmax_formats;
    e.create = softmax_create;
    e.dtypes = "float32, float16";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
