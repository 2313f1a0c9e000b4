// CUDA layer of TensorScatter (every dtype, moved as units of up to 16 bytes): a KV cache with
// this step's rows written into it along `axis`, from each batch entry's write index (or 0), in
// linear or circular mode, as the CPU kernel writes them (src/cpu/tensor_scatter.cc). One thread
// per output unit takes the update's row that lands on its position, if one does (the schema
// keeps an update no longer than the cache, so at most one does), else the cache's. A write
// index that is negative, or in linear mode runs the update past the cache's end (which the CPU
// kernel refuses with an error), raises the layer's RunFlag, and run() throws.
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

struct TensorScatterGeom {
  int64_t outer = 0, length = 0, rows = 0, inner = 0, per_batch = 1;  // inner in units
  bool circular = false, has_indices = false;
};

template <class U>
__global__ void tensor_scatter_kernel(const U* __restrict__ cache, const U* __restrict__ update, const int64_t* __restrict__ indices,
                                      U* __restrict__ y, TensorScatterGeom g, int* __restrict__ refused) {
  const int64_t total = g.outer * g.length * g.inner, step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t u = i % g.inner, l = (i / g.inner) % g.length, o = i / (g.inner * g.length);
    const int64_t start = g.has_indices ? indices[o / g.per_batch] : 0;
    if (start < 0 || (!g.circular && start > g.length - g.rows)) {
      *refused = 1;
      y[i] = U{};
      continue;
    }
    int64_t r = -1;  // the update row that lands here, if any
    if (g.circular) {
      const int64_t at = ((l - start % g.length) % g.length + g.length) % g.length;
      if (at < g.rows) r = at;
    } else if (l >= start && l < start + g.rows) {
      r = l - start;
    }
    y[i] = r >= 0 ? update[(o * g.rows + r) * g.inner + u] : cache[i];
  }
}

std::string check_tensor_scatter(const LayerRequest& r) {
  if (element_size(r.input_dtypes[0]) == 0) return to_string(r.input_dtypes[0]) + " tensors are not supported";
  if (!r.given(1) || r.input_dtypes[1] != r.input_dtypes[0]) return "the update must have the cache's type";
  if (r.given(2) && r.input_dtypes[2] != DType::kInt64) return "write_indices must be int64";
  const size_t rank = r.input_shape(0).size();
  if (rank < 1 || r.input_shape(1).size() != rank) return "the update must have the cache's rank";
  return "";
}

LayerFormats tensor_scatter_formats(const LayerRequest& r) {
  LayerFormats f;
  const Format data{r.storage_of(r.input_dtypes[0]), Layout::kLinear};
  f.inputs = {data, data};
  if (r.inputs.size() > 2) f.inputs.push_back(r.given(2) ? Format{DType::kInt64, Layout::kLinear} : Format{});
  f.outputs.push_back(data);
  return f;
}

std::unique_ptr<Layer> create_tensor_scatter(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const std::vector<int64_t>& cache = r.input_shape(0);
  const std::vector<int64_t>& update = r.input_shape(1);
  const int64_t rank = static_cast<int64_t>(cache.size());
  int64_t axis = r.node.attrs.get_int("axis", -2);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) throw r.node.error(ErrorKind::kInvalidModel, "axis is out of range");
  TensorScatterGeom g;
  g.circular = r.node.attrs.get_string("mode", "linear") == "circular";
  g.has_indices = r.given(2);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= cache[static_cast<size_t>(d)];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= cache[static_cast<size_t>(d)];
  g.outer = outer, g.length = cache[static_cast<size_t>(axis)], g.rows = update[static_cast<size_t>(axis)];
  g.per_batch = std::max<int64_t>(1, outer / std::max<int64_t>(cache[0], 1));
  if (outer * g.length * inner == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  if (g.circular && g.length == 0) throw r.node.error(ErrorKind::kInvalidModel, "a circular cache of length 0");
  const size_t es = element_size(f.inputs[0].dtype);
  const size_t max_unit = widest_unit(es, {static_cast<uint64_t>(inner) * es});
  const int64_t elements_inner = inner;
  return make_checked_layer("kernel:tensor-scatter", [g, es, max_unit, elements_inner](const LayerIO& io, cudaStream_t stream,
                                                                                       int* refused) {
    size_t unit = std::max(es, pointer_unit(max_unit, io.inputs[0], io.outputs[0]));
    unit = std::max(es, pointer_unit(unit, io.inputs[1], io.outputs[0]));
    TensorScatterGeom run = g;
    run.inner = elements_inner * static_cast<int64_t>(es) / static_cast<int64_t>(unit);
    with_unit(unit, [&](auto tag) {
      using U = decltype(tag);
      tensor_scatter_kernel<U><<<grid_for(run.outer * run.length * run.inner), 256, 0, stream>>>(
          static_cast<const U*>(io.inputs[0]), static_cast<const U*>(io.inputs[1]),
          run.has_indices ? static_cast<const int64_t*>(io.inputs[2]) : nullptr, static_cast<U*>(io.outputs[0]), run, refused);
      KILN_CUDA_CHECK_LAUNCH();
    });
  }, "TensorScatter '" + r.node.name + "': a write index puts the update's rows outside the cache");
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(tensor_scatter) {
  LayerEntry e;
  e.op = "TensorScatter";
  e.check = check_tensor_scatter;
  e.formats = tensor_scatter_formats;
  e.create = create_tensor_scatter;
  e.dtypes = "all (float32 as float16 under fp16)";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
