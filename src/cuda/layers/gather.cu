// CUDA layers of Gather, GatherElements, GatherND (any dtype, moved by element size) and
// ScatterElements (any dtype without reduction; float32, float64, int32, int64 with add, mul,
// max, min), with indices that may be runtime tensors.
//
// Indices are checked on the device. The CPU engine throws on an out-of-range index; a GPU
// kernel cannot, so here an out-of-range index has a defined result instead of a read or
// write out of bounds: the gathers write zeros (all bytes 0) for the elements it selects and
// raise their RunFlag, so that run() throws (the zeros never reach the caller as an answer);
// ScatterElements skips that update and raises its flag the same way.
//
// ScatterElements without reduction is deterministic and matches the CPU, which applies the
// updates in order: when several updates hit one element, the last one (highest update index)
// wins, found with an atomicMax over a per-element winner table in the workspace. With a
// reduction the updates are applied with atomics (floating-point add and mul in whatever
// order the GPU runs them); reductions keep float32 storage under fp16, where repeated
// float16 rounding would compound.
#include <algorithm>
#include <cstring>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

constexpr int kBlock = 256;

template <class F> void with_index_type(DType d, F&& f) {
  if (d == DType::kInt32) f(int32_t{});
  else f(int64_t{});
}

int64_t normalized_axis(const ir::Node& node, int64_t rank) {
  int64_t a = node.attrs.get_int("axis", 0);
  return a < 0 ? a + rank : a;
}

std::string storable(DType d) {
  if (element_size(d) == 0) return to_string(d) + " tensors are not supported";
  return "";
}

std::string index_reason(const LayerRequest& r, size_t i, bool int64_only) {
  DType d = r.input_dtypes[i];
  if (d == DType::kInt64 || (!int64_only && d == DType::kInt32)) return "";
  return std::string("indices must be ") + (int64_only ? "int64" : "int32 or int64") + ", are " + to_string(d);
}

std::vector<int64_t> contiguous(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

// --- Gather ----------------------------------------------------------------------------------

// data [outer, dim, inner] -> out [outer, n, inner]; inner in units of U.
template <class U, class T, class I>
__global__ void gather_kernel(const U* __restrict__ data, const T* __restrict__ indices, U* __restrict__ out,
                              int64_t outer, int64_t dim, int64_t n, int64_t inner, int* __restrict__ out_of_range) {
  const I total = static_cast<I>(outer * n * inner);
  const I in_ = static_cast<I>(inner), n_ = static_cast<I>(n), dim_ = static_cast<I>(dim);
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const I r = i % in_, t = i / in_;
    const I j = t % n_, o = t / n_;
    int64_t v = static_cast<int64_t>(indices[j]);
    if (v < 0) v += dim;
    const bool inside = v >= 0 && v < dim;
    if (!inside) *out_of_range = 1;
    out[i] = inside ? data[(o * dim_ + static_cast<I>(v)) * in_ + r] : U{};
  }
}

// --- GatherElements / ScatterElements: coordinates of the indices tensor ----------------------

struct ElementsParams {
  int rank = 0;
  int axis = 0;
  int64_t n = 0;    // index elements
  int64_t dim = 0;  // data's axis size
  int64_t idx_dims[kMaxKernelRank] = {};
  int64_t data_strides[kMaxKernelRank] = {};
};

// The data offset of index element i, or -1 when its index is out of range.
template <class T>
__device__ __forceinline__ int64_t element_offset(const ElementsParams& p, const T* __restrict__ indices, int64_t i) {
  int64_t rem = i, off = 0;
#pragma unroll
  for (int d = kMaxKernelRank - 1; d >= 0; --d) {
    if (d >= p.rank) continue;
    const int64_t c = rem % p.idx_dims[d];
    rem /= p.idx_dims[d];
    if (d != p.axis) off += c * p.data_strides[d];
  }
  int64_t v = static_cast<int64_t>(indices[i]);
  if (v < 0) v += p.dim;
  if (v < 0 || v >= p.dim) return -1;
  return off + v * p.data_strides[p.axis];
}

template <class U, class T>
__global__ void gather_elements_kernel(const U* __restrict__ data, const T* __restrict__ indices, U* __restrict__ out,
                                       ElementsParams p, int* __restrict__ out_of_range) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += step) {
    const int64_t off = element_offset(p, indices, i);
    if (off < 0) *out_of_range = 1;
    out[i] = off >= 0 ? data[off] : U{};
  }
}

// Without reduction, pass 1: the highest update index (+1) per destination element.
template <class T>
__global__ void scatter_winner_kernel(const T* __restrict__ indices, unsigned int* __restrict__ winner, ElementsParams p,
                                      int* __restrict__ out_of_range) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += step) {
    const int64_t off = element_offset(p, indices, i);
    if (off >= 0) atomicMax(winner + off, static_cast<unsigned int>(i + 1));
    else *out_of_range = 1;
  }
}

// Pass 2: the winning update of each destination writes it.
template <class U, class T>
__global__ void scatter_write_kernel(const T* __restrict__ indices, const U* __restrict__ updates,
                                     const unsigned int* __restrict__ winner, U* __restrict__ out, ElementsParams p) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += step) {
    const int64_t off = element_offset(p, indices, i);
    if (off >= 0 && winner[off] == static_cast<unsigned int>(i + 1)) out[off] = updates[i];
  }
}

enum class Reduction : int { kNone, kAdd, kMul, kMax, kMin };

template <class T> __device__ __forceinline__ T reduce_op(T cur, T u, int op) {
  switch (static_cast<Reduction>(op)) {
    case Reduction::kAdd: return cur + u;
    case Reduction::kMul: return cur * u;
    case Reduction::kMax: return cur < u ? u : cur;  // std::max(cur, u)
    case Reduction::kMin: return u < cur ? u : cur;  // std::min(cur, u)
    default: return u;
  }
}

template <class T> __device__ __forceinline__ void atomic_reduce(T* addr, T u, int op) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t>) {
    if (static_cast<Reduction>(op) == Reduction::kAdd) {
      atomicAdd(addr, u);
      return;
    }
  }
  if constexpr (sizeof(T) == 4) {
    auto* a = reinterpret_cast<unsigned int*>(addr);
    unsigned int old = *a, assumed;
    do {
      assumed = old;
      T cur;
      memcpy(&cur, &assumed, 4);
      T next = reduce_op(cur, u, op);
      unsigned int bits;
      memcpy(&bits, &next, 4);
      old = atomicCAS(a, assumed, bits);
    } while (assumed != old);
  } else {
    auto* a = reinterpret_cast<unsigned long long*>(addr);
    unsigned long long old = *a, assumed;
    do {
      assumed = old;
      T cur;
      memcpy(&cur, &assumed, 8);
      T next = reduce_op(cur, u, op);
      unsigned long long bits;
      memcpy(&bits, &next, 8);
      old = atomicCAS(a, assumed, bits);
    } while (assumed != old);
  }
}

template <class V, class T>
__global__ void scatter_reduce_kernel(const T* __restrict__ indices, const V* __restrict__ updates, V* __restrict__ out,
                                      ElementsParams p, int op, int* __restrict__ out_of_range) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += step) {
    const int64_t off = element_offset(p, indices, i);
    if (off >= 0) atomic_reduce(out + off, updates[i], op);
    else *out_of_range = 1;
  }
}

// Checks shared with the CPU kernel: indices reach no further than the data off the axis.
void check_within(const ir::Node& node, const std::vector<int64_t>& data, const std::vector<int64_t>& idx, size_t axis) {
  if (idx.size() != data.size()) throw node.error(ErrorKind::kInvalidModel, "indices and data must have the same rank");
  for (size_t d = 0; d < idx.size(); ++d)
    if (d != axis && idx[d] > data[d])
      throw node.error(ErrorKind::kInvalidModel, "indices " + shape_to_string(idx) + " reach past data " +
                                                     shape_to_string(data) + " off the axis");
}

ElementsParams elements_params(const ir::Node& node, const std::vector<int64_t>& data, const std::vector<int64_t>& idx) {
  const size_t axis = static_cast<size_t>(normalized_axis(node, static_cast<int64_t>(data.size())));
  check_within(node, data, idx, axis);
  ElementsParams p;
  p.rank = static_cast<int>(data.size());
  p.axis = static_cast<int>(axis);
  p.n = shape_numel(idx);
  p.dim = data[axis];
  std::vector<int64_t> ds = contiguous(data);
  for (size_t d = 0; d < data.size(); ++d) {
    p.idx_dims[d] = idx[d];
    p.data_strides[d] = ds[d];
  }
  return p;
}

// --- GatherND ----------------------------------------------------------------------------------

struct GatherNDParams {
  int k = 0;
  int64_t n = 0;            // output units
  int64_t slice = 1;        // units per gathered slice
  int64_t per_batch = 1;    // index tuples per batch
  int64_t batch_stride = 0; // units
  int64_t sizes[kMaxKernelRank] = {};
  int64_t strides[kMaxKernelRank] = {};  // units
};

template <class U>
__global__ void gather_nd_kernel(const U* __restrict__ data, const int64_t* __restrict__ indices, U* __restrict__ out,
                                 GatherNDParams p, int* __restrict__ out_of_range) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += step) {
    const int64_t t = i / p.slice, r = i - t * p.slice;
    int64_t off = (t / p.per_batch) * p.batch_stride;
    bool ok = true;
    for (int j = 0; j < p.k; ++j) {
      int64_t v = indices[t * p.k + j];
      if (v < 0) v += p.sizes[j];
      ok = ok && v >= 0 && v < p.sizes[j];
      off += v * p.strides[j];
    }
    if (!ok) *out_of_range = 1;
    out[i] = ok ? data[off + r] : U{};
  }
}

Format data_format(const LayerRequest& r, size_t i) {
  return Format{r.storage_of(r.input_dtypes[i]), Layout::kLinear};
}

Format index_format(const LayerRequest& r, size_t i) { return Format{r.input_dtypes[i], Layout::kLinear}; }

bool is_reduction_type(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kInt32 || d == DType::kInt64;
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(gather) {
  {
    LayerEntry e;
    e.op = "Gather";
    e.dtypes = "all (float32 as float16 under fp16); int32 or int64 indices";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.input_dtypes[0]); !why.empty()) return why;
      if (r.inputs[0]->rank() < 1) return "data must have rank >= 1";
      return index_reason(r, 1, false);
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {data_format(r, 0), index_format(r, 1)};
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const std::vector<int64_t>& s = r.inputs[0]->shape;
      const size_t axis = static_cast<size_t>(normalized_axis(r.node, static_cast<int64_t>(s.size())));
      const size_t es = element_size(f.inputs[0].dtype);
      int64_t outer = 1, inner = 1;
      for (size_t d = 0; d < axis; ++d) outer *= s[d];
      for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
      const int64_t dim = s[axis], n = shape_numel(r.inputs[1]->shape);
      const DType idx = f.inputs[1].dtype;
      const size_t max_unit = widest_unit(es, {static_cast<uint64_t>(inner) * es});
      return make_checked_layer("kernel:gather", [=](const LayerIO& io, cudaStream_t stream, int* out_of_range) {
        const int64_t total = outer * n * inner;
        if (total == 0) return;
        const size_t unit = std::max(es, pointer_unit(max_unit, io.inputs[0], io.outputs[0]));
        const int64_t f = static_cast<int64_t>(unit / es), in_units = inner / f;
        const int64_t units = total / f;
        const bool small = units <= (int64_t{1} << 30) && outer * dim * in_units <= (int64_t{1} << 30);
        with_unit(unit, [&](auto utag) {
          using U = decltype(utag);
          with_index_type(idx, [&](auto itag) {
            using T = decltype(itag);
            if (small)
              gather_kernel<U, T, int32_t><<<grid_for(units, kBlock, 4), kBlock, 0, stream>>>(
                  static_cast<const U*>(io.inputs[0]), static_cast<const T*>(io.inputs[1]), static_cast<U*>(io.outputs[0]),
                  outer, dim, n, in_units, out_of_range);
            else
              gather_kernel<U, T, int64_t><<<grid_for(units, kBlock, 4), kBlock, 0, stream>>>(
                  static_cast<const U*>(io.inputs[0]), static_cast<const T*>(io.inputs[1]), static_cast<U*>(io.outputs[0]),
                  outer, dim, n, in_units, out_of_range);
            KILN_CUDA_CHECK_LAUNCH();
          });
        });
      }, "Gather '" + r.node.name + "': an index is outside the data's axis of " + std::to_string(dim));
    };
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "GatherElements";
    e.dtypes = "all (float32 as float16 under fp16); int32 or int64 indices";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.input_dtypes[0]); !why.empty()) return why;
      if (r.inputs[0]->rank() > kMaxKernelRank) return "rank above " + std::to_string(kMaxKernelRank) + " is not supported";
      return index_reason(r, 1, false);
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {data_format(r, 0), index_format(r, 1)};
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const ElementsParams p = elements_params(r.node, r.inputs[0]->shape, r.inputs[1]->shape);
      const size_t es = element_size(f.inputs[0].dtype);
      const DType idx = f.inputs[1].dtype;
      return make_checked_layer("kernel:gather_elements", [=](const LayerIO& io, cudaStream_t stream, int* out_of_range) {
        if (p.n == 0) return;
        with_unit(es, [&](auto utag) {
          using U = decltype(utag);
          with_index_type(idx, [&](auto itag) {
            using T = decltype(itag);
            gather_elements_kernel<U, T><<<grid_for(p.n, kBlock, 4), kBlock, 0, stream>>>(
                static_cast<const U*>(io.inputs[0]), static_cast<const T*>(io.inputs[1]), static_cast<U*>(io.outputs[0]), p,
                out_of_range);
            KILN_CUDA_CHECK_LAUNCH();
          });
        });
      }, "GatherElements '" + r.node.name + "': an index is outside the data's axis");
    };
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "GatherND";
    e.dtypes = "all (float32 as float16 under fp16); int64 indices";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.input_dtypes[0]); !why.empty()) return why;
      if (std::string why = index_reason(r, 1, true); !why.empty()) return why;
      const std::vector<int64_t>& idx = r.inputs[1]->shape;
      if (idx.empty()) return "indices must have rank >= 1";
      if (idx.back() > kMaxKernelRank) return "index tuples longer than " + std::to_string(kMaxKernelRank) + " are not supported";
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {data_format(r, 0), index_format(r, 1)};
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const std::vector<int64_t>& s = r.inputs[0]->shape;
      const std::vector<int64_t>& is = r.inputs[1]->shape;
      const size_t b = static_cast<size_t>(r.node.attrs.get_int("batch_dims", 0));
      const size_t k = static_cast<size_t>(is.back());
      if (b + k > s.size() || b >= is.size())
        throw r.node.error(ErrorKind::kInvalidModel, "batch_dims and the index length exceed the data rank");
      const size_t es = element_size(f.inputs[0].dtype);
      const std::vector<int64_t> ds = contiguous(s);
      int64_t slice = 1, batch = 1;
      for (size_t d = b + k; d < s.size(); ++d) slice *= s[d];
      for (size_t d = 0; d < b; ++d) batch *= s[d];
      const int64_t tuples = shape_numel(std::vector<int64_t>(is.begin(), is.end() - 1));
      GatherNDParams p;
      p.k = static_cast<int>(k);
      p.slice = slice;
      p.per_batch = batch > 0 ? std::max<int64_t>(tuples / batch, 1) : 1;
      p.batch_stride = b ? ds[b - 1] : 0;
      for (size_t j = 0; j < k; ++j) {
        p.sizes[j] = s[b + j];
        p.strides[j] = ds[b + j];
      }
      p.n = tuples * slice;
      const size_t max_unit = widest_unit(es, {static_cast<uint64_t>(slice) * es});
      return make_checked_layer("kernel:gather_nd", [=](const LayerIO& io, cudaStream_t stream, int* out_of_range) {
        if (p.n == 0) return;
        const size_t unit = std::max(es, pointer_unit(max_unit, io.inputs[0], io.outputs[0]));
        const int64_t f = static_cast<int64_t>(unit / es);
        GatherNDParams q = p;
        q.n /= f;
        q.slice /= f;
        q.batch_stride /= f;
        for (int j = 0; j < q.k; ++j) q.strides[j] /= f;
        with_unit(unit, [&](auto utag) {
          using U = decltype(utag);
          gather_nd_kernel<U><<<grid_for(q.n, kBlock, 4), kBlock, 0, stream>>>(
              static_cast<const U*>(io.inputs[0]), static_cast<const int64_t*>(io.inputs[1]), static_cast<U*>(io.outputs[0]), q,
              out_of_range);
          KILN_CUDA_CHECK_LAUNCH();
        });
      }, "GatherND '" + r.node.name + "': an index is outside the data's dimension");
    };
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "ScatterElements";
    e.dtypes = "all (reduction none; float32 as float16 under fp16); float32, float64, int32, int64 (add, mul, max, min)";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.input_dtypes[0]); !why.empty()) return why;
      if (r.inputs[0]->rank() > kMaxKernelRank) return "rank above " + std::to_string(kMaxKernelRank) + " is not supported";
      if (std::string why = index_reason(r, 1, false); !why.empty()) return why;
      const std::string red = r.node.attrs.get_string("reduction", "none");
      if (red != "none" && !is_reduction_type(r.input_dtypes[0]))
        return "reduction on " + to_string(r.input_dtypes[0]) + " is not supported";
      if (shape_numel(r.inputs[1]->shape) >= (int64_t{1} << 32) - 1) return "more than 2^32 - 2 updates are not supported";
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      const bool reduce = r.node.attrs.get_string("reduction", "none") != "none";
      // Reductions accumulate in the logical dtype (float32 stays float32 under fp16).
      auto fmt = [&](size_t i) { return reduce ? Format{r.input_dtypes[i], Layout::kLinear} : data_format(r, i); };
      LayerFormats f;
      f.inputs = {fmt(0), index_format(r, 1), fmt(2)};
      f.outputs = {Format{reduce ? r.output_dtypes[0] : r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      if (r.inputs[1]->shape != r.inputs[2]->shape)
        throw r.node.error(ErrorKind::kInvalidModel, "indices " + shape_to_string(r.inputs[1]->shape) + " and updates " +
                                                         shape_to_string(r.inputs[2]->shape) + " must have the same shape");
      const ElementsParams p = elements_params(r.node, r.inputs[0]->shape, r.inputs[1]->shape);
      const std::string red = r.node.attrs.get_string("reduction", "none");
      const Reduction op = red == "add" ? Reduction::kAdd : red == "mul" ? Reduction::kMul
                           : red == "max" ? Reduction::kMax : red == "min" ? Reduction::kMin : Reduction::kNone;
      const DType dtype = f.inputs[0].dtype, idx = f.inputs[1].dtype;
      const size_t es = element_size(dtype);
      const int64_t data_elements = shape_numel(r.inputs[0]->shape);
      const size_t data_bytes = static_cast<size_t>(data_elements) * es;
      const size_t workspace = op == Reduction::kNone ? static_cast<size_t>(data_elements) * sizeof(unsigned int) : 0;
      return make_checked_layer(
          op == Reduction::kNone ? "kernel:scatter_elements" : "kernel:scatter_elements(" + red + ")",
          [=](const LayerIO& io, cudaStream_t stream, int* out_of_range) {
            if (data_bytes && io.outputs[0] != io.inputs[0])
              KILN_CUDA_CHECK(cudaMemcpyAsync(io.outputs[0], io.inputs[0], data_bytes, cudaMemcpyDeviceToDevice, stream));
            if (p.n == 0 || data_elements == 0) return;
            const unsigned grid = grid_for(p.n, kBlock, 4);
            with_index_type(idx, [&](auto itag) {
              using T = decltype(itag);
              const T* indices = static_cast<const T*>(io.inputs[1]);
              if (op == Reduction::kNone) {
                auto* winner = static_cast<unsigned int*>(io.workspace);
                KILN_CUDA_CHECK(cudaMemsetAsync(winner, 0, workspace, stream));
                scatter_winner_kernel<T><<<grid, kBlock, 0, stream>>>(indices, winner, p, out_of_range);
                KILN_CUDA_CHECK_LAUNCH();
                with_unit(es, [&](auto utag) {
                  using U = decltype(utag);
                  scatter_write_kernel<U, T><<<grid, kBlock, 0, stream>>>(indices, static_cast<const U*>(io.inputs[2]),
                                                                          winner, static_cast<U*>(io.outputs[0]), p);
                  KILN_CUDA_CHECK_LAUNCH();
                });
                return;
              }
              auto launch = [&](auto vtag) {
                using V = decltype(vtag);
                scatter_reduce_kernel<V, T><<<grid, kBlock, 0, stream>>>(indices, static_cast<const V*>(io.inputs[2]),
                                                                         static_cast<V*>(io.outputs[0]), p, static_cast<int>(op),
                                                                         out_of_range);
                KILN_CUDA_CHECK_LAUNCH();
              };
              switch (dtype) {
                case DType::kFloat32: launch(float{}); break;
                case DType::kFloat64: launch(double{}); break;
                case DType::kInt32: launch(int32_t{}); break;
                case DType::kInt64: launch(int64_t{}); break;
                default: throw Error(ErrorKind::kInternal, "ScatterElements reduction on " + to_string(dtype));
              }
            });
          },
          "ScatterElements '" + r.node.name + "': an index is outside the data's dimension", workspace);
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
