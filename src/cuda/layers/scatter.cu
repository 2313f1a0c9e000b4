// CUDA layer of ScatterND: the output is the data with the slices the index tuples name
// replaced by (reduction none) or combined with (add, mul, max, min) the updates, as the CPU
// kernel (src/cpu/gather.cc) computes it.
//
// The data is copied, then one thread per updated element finds its slice's offset and writes
// or combines (atomics; reductions on float32, float64, int32 and int64, so sums of duplicates
// may round in another order than on the CPU). ONNX leaves duplicate indices with reduction
// none undefined; here one of the writes wins.
//
// An index outside its dimension is an error on the CPU. Here the kernel skips it and raises the
// layer's run flag (make_checked_layer), which CudaContext::run throws once the run has finished.
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

struct ScatterGeom {
  int k = 0;                        // the index tuples' length
  int64_t tuples = 0, slice = 1;    // index tuples, elements per slice
  int64_t dims[kMaxKernelRank] = {};     // the data's first k dims
  int64_t strides[kMaxKernelRank] = {};  // their strides, in elements
};

// a = op(a, b) atomically, by compare-and-swap on the element's bits.
template <class T, class Op>
__device__ void atomic_combine(T* a, T b, Op op) {
  using Bits = std::conditional_t<sizeof(T) == 4, unsigned int, unsigned long long>;
  Bits* word = reinterpret_cast<Bits*>(a);
  Bits seen = *word, assumed;
  do {
    assumed = seen;
    T now;
    memcpy(&now, &assumed, sizeof(T));
    const T next = op(now, b);
    Bits next_bits;
    memcpy(&next_bits, &next, sizeof(T));
    seen = atomicCAS(word, assumed, next_bits);
  } while (seen != assumed);
}

template <class T>
__device__ void combine(T* y, T u, Reduction r) {
  switch (r) {
    case Reduction::kNone: *y = u; return;
    case Reduction::kAdd: atomic_combine(y, u, [](T a, T b) { return static_cast<T>(a + b); }); return;
    case Reduction::kMul: atomic_combine(y, u, [](T a, T b) { return static_cast<T>(a * b); }); return;
    case Reduction::kMax: atomic_combine(y, u, [](T a, T b) { return a < b ? b : a; }); return;
    case Reduction::kMin: atomic_combine(y, u, [](T a, T b) { return b < a ? b : a; }); return;
  }
}

template <class T>
__global__ void scatter_nd_kernel(const int64_t* __restrict__ indices, const T* __restrict__ updates, T* __restrict__ y,
                                  ScatterGeom g, Reduction r, int* __restrict__ out_of_range) {
  const int64_t n = g.tuples * g.slice;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / g.slice, e = i - t * g.slice;
    int64_t offset = 0;
    bool inside = true;
    for (int j = 0; j < g.k; ++j) {
      int64_t v = indices[t * g.k + j];
      if (v < 0) v += g.dims[j];
      if (v < 0 || v >= g.dims[j]) inside = false;
      offset += v * g.strides[j];
    }
    if (!inside) {
      *out_of_range = 1;
      continue;
    }
    combine(y + offset + e, updates[i], r);
  }
}

Reduction reduction_of(const std::string& r) {
  if (r == "add") return Reduction::kAdd;
  if (r == "mul") return Reduction::kMul;
  if (r == "max") return Reduction::kMax;
  if (r == "min") return Reduction::kMin;
  return Reduction::kNone;
}

bool reducible(DType d) { return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kInt32 || d == DType::kInt64; }

// The data copied, then the updates written or combined; an index out of range raises `flag`.
void enqueue_scatter_nd(const LayerIO& io, cudaStream_t stream, int* flag, const ScatterGeom& g, Reduction reduction,
                        DType storage, size_t data_bytes) {
  if (data_bytes) KILN_CUDA_CHECK(cudaMemcpyAsync(io.outputs[0], io.inputs[0], data_bytes, cudaMemcpyDeviceToDevice, stream));
  const int64_t n = g.tuples * g.slice;
  if (n <= 0) return;
  const auto* indices = static_cast<const int64_t*>(io.inputs[1]);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    scatter_nd_kernel<T><<<grid_for(n), 256, 0, stream>>>(indices, static_cast<const T*>(io.inputs[2]),
                                                          static_cast<T*>(io.outputs[0]), g, reduction, flag);
  };
  switch (storage) {
    case DType::kFloat32: launch(float{}); break;
    case DType::kFloat64: launch(double{}); break;
    case DType::kInt32: launch(int32_t{}); break;
    case DType::kInt64: launch(int64_t{}); break;
    default:  // reduction none moves raw elements
      switch (element_size(storage)) {
        case 1: launch(uint8_t{}); break;
        case 2: launch(uint16_t{}); break;
        case 4: launch(uint32_t{}); break;
        default: launch(uint64_t{}); break;
      }
  }
  KILN_CUDA_CHECK_LAUNCH();
}

std::string check_scatter_nd(const LayerRequest& r) {
  if (!r.has_input(0) || !r.has_input(1) || !r.has_input(2)) return "data, indices and updates are required";
  if (r.input_dtypes[1] != DType::kInt64) return "indices must be int64";
  if (r.input_dtypes[2] != r.input_dtypes[0]) return "updates must have the data's type";
  const std::vector<int64_t>& data = r.input_shape(0);
  const std::vector<int64_t>& idx = r.input_shape(1);
  if (idx.empty()) return "indices must have rank 1 or more";
  const int64_t k = idx.back();
  if (k < 1 || k > static_cast<int64_t>(data.size()) || k > kMaxKernelRank) return "the index tuples' length must be 1.." +
                                                                                     std::to_string(data.size());
  const std::string red = r.node.attrs.get_string("reduction", "none");
  if (red != "none" && red != "add" && red != "mul" && red != "max" && red != "min") return "reduction " + red + " is not supported";
  const size_t es = element_size(r.input_dtypes[0]);
  if (red == "none" && es != 1 && es != 2 && es != 4 && es != 8) return "input type " + to_string(r.input_dtypes[0]) + " is not supported";
  if (red != "none" && !reducible(r.input_dtypes[0]))
    return "reduction " + red + " on " + to_string(r.input_dtypes[0]) + " (supported: float32, float64, int32, int64)";
  return "";
}

// The data and updates in their logical dtype (float32 stays float32: atomics), row-major.
LayerFormats scatter_nd_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs = {Format{r.input_dtypes[0], Layout::kLinear}, Format{DType::kInt64, Layout::kLinear},
              Format{r.input_dtypes[0], Layout::kLinear}};
  f.outputs.push_back(Format{r.input_dtypes[0], Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_scatter_nd(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const std::vector<int64_t>& data = r.input_shape(0);
  const std::vector<int64_t>& idx = r.input_shape(1);
  ScatterGeom g;
  g.k = static_cast<int>(idx.back());
  g.tuples = shape_numel(std::vector<int64_t>(idx.begin(), idx.end() - 1));
  for (size_t d = static_cast<size_t>(g.k); d < data.size(); ++d) g.slice *= data[d];
  int64_t stride = g.slice;
  for (int j = g.k - 1; j >= 0; --j) {
    g.dims[j] = data[static_cast<size_t>(j)];
    g.strides[j] = stride;
    stride *= data[static_cast<size_t>(j)];
  }
  if (shape_numel(r.input_shape(2)) != g.tuples * g.slice)
    throw r.node.error(ErrorKind::kInvalidModel, "updates must have one slice per index tuple");
  const size_t bytes = static_cast<size_t>(shape_numel(data)) * element_size(f.outputs[0].dtype);
  const Reduction reduction = reduction_of(r.node.attrs.get_string("reduction", "none"));
  const DType storage = f.outputs[0].dtype;
  return make_checked_layer(
      "kernel:scatter-nd",
      [g, reduction, storage, bytes](const LayerIO& io, cudaStream_t stream, int* flag) {
        enqueue_scatter_nd(io, stream, flag, g, reduction, storage, bytes);
      },
      "ScatterND: an index is outside the data's dimension (its slice was not updated)");
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(scatter) {
  LayerEntry e;
  e.op = "ScatterND";
  e.check = check_scatter_nd;
  e.formats = scatter_nd_formats;
  e.create = create_scatter_nd;
  e.dtypes = "all (reduction none); float32, float64, int32, int64 (add, mul, max, min)";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
