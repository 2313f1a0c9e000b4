// CUDA layer of TopK: the k largest (or smallest) elements along an axis, sorted, with their
// int64 indices; equal values keep the lower index first, as on the CPU (src/cpu/topk.cc).
//
// Each row (a line along the axis) is padded to a power of two P and bitonic-sorted by
// (value, index). Rows of up to 2048 elements sort in shared memory, one block per row;
// longer rows sort in the workspace with one launch per step of the network, a batch of rows
// at a time. NaN sorts as larger than every number (the CPU's order with NaN is unspecified).
#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int64_t kSharedMaxRow = 2048;                  // P of the shared-memory kernel, at most
constexpr size_t kWorkspaceBudget = size_t{256} << 20;   // of the workspace kernels, per batch

// The type values are compared in: float for float16 storage, the storage type otherwise.
template <class T> using topk_key_t = std::conditional_t<std::is_same_v<T, __half>, float, T>;

template <class K, class T> __device__ __forceinline__ K to_key(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return v;
}
template <class T, class K> __device__ __forceinline__ T from_key(K v) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return v;
}

// a < b with NaN above every number (and NaN == NaN).
template <class K> __device__ __forceinline__ bool key_less(K a, K b) {
  if constexpr (std::is_floating_point_v<K>) {
    if (a != a) return false;
    if (b != b) return true;
  }
  return a < b;
}

// Whether element (ka, ia) goes before (kb, ib) in the output; index -1 is padding, last.
template <class K>
__device__ __forceinline__ bool before(K ka, int64_t ia, K kb, int64_t ib, bool largest) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  if (key_less(ka, kb)) return !largest;
  if (key_less(kb, ka)) return largest;
  return ia < ib;
}

// One compare-exchange of the bitonic network (step `size`, `stride`) on pair t of a row.
template <class K>
__device__ __forceinline__ void bitonic_pair(K* keys, int64_t* idx, int64_t t, int64_t size, int64_t stride,
                                             bool largest) {
  const int64_t i = 2 * stride * (t / stride) + (t % stride), l = i + stride;
  const bool up = (i & size) == 0;
  const bool swap = up ? before(keys[l], idx[l], keys[i], idx[i], largest)
                       : before(keys[i], idx[i], keys[l], idx[l], largest);
  if (swap) {
    const K tk = keys[i];
    keys[i] = keys[l];
    keys[l] = tk;
    const int64_t ti = idx[i];
    idx[i] = idx[l];
    idx[l] = ti;
  }
}

struct RowGeom {
  int64_t rows = 0, n = 0, inner = 1, k = 0, p = 1;  // rows = outer * inner
};

// One block per row, sorted in shared memory (P <= kSharedMaxRow).
template <class T>
__global__ void __launch_bounds__(kBlock) topk_shared_kernel(const T* __restrict__ x, T* __restrict__ values,
                                                             int64_t* __restrict__ indices, RowGeom g,
                                                             bool largest) {
  using K = topk_key_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  int64_t* idx = reinterpret_cast<int64_t*>(smem);
  K* keys = reinterpret_cast<K*>(smem + g.p * sizeof(int64_t));
  for (int64_t row = blockIdx.x; row < g.rows; row += gridDim.x) {
    const int64_t o = row / g.inner, in = row - o * g.inner;
    const T* xr = x + o * g.n * g.inner + in;
    for (int64_t e = threadIdx.x; e < g.p; e += blockDim.x) {
      if (e < g.n) {
        keys[e] = to_key<K>(xr[e * g.inner]);
        idx[e] = e;
      } else {
        keys[e] = K(0);
        idx[e] = -1;
      }
    }
    __syncthreads();
    for (int64_t size = 2; size <= g.p; size <<= 1)
      for (int64_t stride = size >> 1; stride > 0; stride >>= 1) {
        for (int64_t t = threadIdx.x; t < g.p / 2; t += blockDim.x) bitonic_pair(keys, idx, t, size, stride, largest);
        __syncthreads();
      }
    for (int64_t j = threadIdx.x; j < g.k; j += blockDim.x) {
      const int64_t at = (o * g.k + j) * g.inner + in;
      if (values) values[at] = from_key<T>(keys[j]);
      if (indices) indices[at] = idx[j];
    }
    __syncthreads();
  }
}

// The workspace path: rows [first, first + count) padded to P in keys/idx.
template <class T>
__global__ void __launch_bounds__(kBlock) topk_load_kernel(const T* __restrict__ x, topk_key_t<T>* __restrict__ keys,
                                                           int64_t* __restrict__ idx, RowGeom g, int64_t first,
                                                           int64_t count) {
  using K = topk_key_t<T>;
  const int64_t total = count * g.p;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = first + e / g.p, j = e % g.p;
    if (j < g.n) {
      const int64_t o = row / g.inner, in = row - o * g.inner;
      keys[e] = to_key<K>(x[(o * g.n + j) * g.inner + in]);
      idx[e] = j;
    } else {
      keys[e] = K(0);
      idx[e] = -1;
    }
  }
}

template <class K>
__global__ void __launch_bounds__(kBlock) topk_step_kernel(K* __restrict__ keys, int64_t* __restrict__ idx,
                                                           int64_t p, int64_t count, int64_t size, int64_t stride,
                                                           bool largest) {
  const int64_t half = p / 2, total = count * half;
  for (int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < total; t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = t / half;
    bitonic_pair(keys + row * p, idx + row * p, t - row * half, size, stride, largest);
  }
}

template <class T>
__global__ void __launch_bounds__(kBlock) topk_store_kernel(const topk_key_t<T>* __restrict__ keys,
                                                            const int64_t* __restrict__ idx, T* __restrict__ values,
                                                            int64_t* __restrict__ indices, RowGeom g, int64_t first,
                                                            int64_t count) {
  const int64_t total = count * g.k;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / g.k, j = e - r * g.k, row = first + r;
    const int64_t o = row / g.inner, in = row - o * g.inner;
    const int64_t at = (o * g.k + j) * g.inner + in;
    if (values) values[at] = from_key<T>(keys[r * g.p + j]);
    if (indices) indices[at] = idx[r * g.p + j];
  }
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>((n + kBlock - 1) / kBlock, 1, int64_t{1} << 20)); }

template <class T>
std::unique_ptr<Layer> topk_layer(const RowGeom& g, bool largest) {
  using K = topk_key_t<T>;
  if (g.p <= kSharedMaxRow) {
    const int threads = static_cast<int>(std::clamp<int64_t>(g.p / 2, 32, kBlock));
    const size_t smem = static_cast<size_t>(g.p) * (sizeof(int64_t) + sizeof(K));
    const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>(g.rows, 1, int64_t{1} << 20));
    return make_layer("kernel:topk-bitonic-shared p=" + std::to_string(g.p),
                      [g, largest, threads, smem, blocks](const LayerIO& io, cudaStream_t stream) {
      topk_shared_kernel<T><<<blocks, threads, smem, stream>>>(static_cast<const T*>(io.inputs[0]),
                                                               static_cast<T*>(io.outputs[0]),
                                                               static_cast<int64_t*>(io.outputs[1]), g, largest);
      KILN_CUDA_CHECK_LAUNCH();
    });
  }
  const size_t row_bytes = static_cast<size_t>(g.p) * (sizeof(int64_t) + sizeof(K));
  const int64_t batch = std::clamp<int64_t>(static_cast<int64_t>(kWorkspaceBudget / row_bytes), 1, g.rows);
  const size_t workspace = static_cast<size_t>(batch) * row_bytes;
  return make_layer("kernel:topk-bitonic-global p=" + std::to_string(g.p),
                    [g, largest, batch](const LayerIO& io, cudaStream_t stream) {
    const T* x = static_cast<const T*>(io.inputs[0]);
    int64_t* idx = static_cast<int64_t*>(io.workspace);
    K* keys = reinterpret_cast<K*>(idx + batch * g.p);
    for (int64_t first = 0; first < g.rows; first += batch) {
      const int64_t count = std::min(batch, g.rows - first);
      topk_load_kernel<T><<<blocks_for(count * g.p), kBlock, 0, stream>>>(x, keys, idx, g, first, count);
      KILN_CUDA_CHECK_LAUNCH();
      for (int64_t size = 2; size <= g.p; size <<= 1)
        for (int64_t stride = size >> 1; stride > 0; stride >>= 1) {
          topk_step_kernel<K><<<blocks_for(count * g.p / 2), kBlock, 0, stream>>>(keys, idx, g.p, count, size,
                                                                                   stride, largest);
          KILN_CUDA_CHECK_LAUNCH();
        }
      topk_store_kernel<T><<<blocks_for(count * g.k), kBlock, 0, stream>>>(
          keys, idx, static_cast<T*>(io.outputs[0]), static_cast<int64_t*>(io.outputs[1]), g, first, count);
      KILN_CUDA_CHECK_LAUNCH();
    }
  }, workspace);
}

bool topk_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kFloat64 || d == DType::kInt32 ||
         d == DType::kInt64;
}

std::string topk_check(const LayerRequest& r) {
  const DType d = r.input_dtypes[0];
  if (!topk_dtype(d))
    return "input type " + to_string(d) + " is not supported (supported: float32, float16, float64, int32, int64)";
  if (!r.is_constant(1)) return "K must be a constant";
  if (r.constants[1]->numel() != 1) return "K must have exactly one element";
  return "";
}

LayerFormats topk_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs.resize(r.inputs.size());
  const DType storage = r.storage_of(r.input_dtypes[0]);
  f.inputs[0] = Format{storage, Layout::kLinear};
  f.outputs.push_back(Format{storage, Layout::kLinear});
  for (size_t i = 1; i < r.output_dtypes.size(); ++i) f.outputs.push_back(Format{DType::kInt64, Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> topk_create(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const std::vector<int64_t>& shape = r.input_shape(0);
  const int64_t rank = static_cast<int64_t>(shape.size());
  int64_t axis = r.node.attrs.get_int("axis", -1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) throw r.node.error(ErrorKind::kInvalidModel, "axis is out of range for rank " + std::to_string(rank));
  RowGeom g;
  g.n = shape[static_cast<size_t>(axis)];
  g.k = r.constants[1]->value_as_int(0);
  if (g.k < 0 || g.k > g.n)
    throw r.node.error(ErrorKind::kInvalidArgument, "K = " + std::to_string(g.k) + " is not in [0, " + std::to_string(g.n) + "]");
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[static_cast<size_t>(d)];
  for (int64_t d = axis + 1; d < rank; ++d) g.inner *= shape[static_cast<size_t>(d)];
  g.rows = outer * g.inner;
  while (g.p < g.n) g.p <<= 1;
  if (g.rows == 0 || g.k == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  if (r.output_dtypes.size() < 2) throw r.node.error(ErrorKind::kInvalidModel, "TopK has two outputs");
  const bool largest = r.node.attrs.get_int("largest", 1) != 0;
  switch (f.inputs[0].dtype) {
    case DType::kFloat32: return topk_layer<float>(g, largest);
    case DType::kFloat16: return topk_layer<__half>(g, largest);
    case DType::kFloat64: return topk_layer<double>(g, largest);
    case DType::kInt32: return topk_layer<int32_t>(g, largest);
    case DType::kInt64: return topk_layer<int64_t>(g, largest);
    default: break;
  }
  throw r.node.error(ErrorKind::kUnsupported, "input type " + to_string(f.inputs[0].dtype) + " is not supported");
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(topk) {
  LayerEntry e;
  e.op = "TopK";
  e.check = topk_check;
  e.formats = topk_formats;
  e.create = topk_create;
  e.dtypes = "float32, float16, float64, int32, int64";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
