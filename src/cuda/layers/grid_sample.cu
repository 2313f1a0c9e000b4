// CUDA layer of GridSample (2-D and 3-D: X of rank 4 or 5), with the CPU kernel's arithmetic
// (ops/grid_sample_params.h, shared): each output element finds its point's neighbours and
// weights in double, then sums the weighted neighbours of its channel. One thread per output
// element; X is read in its float storage (float32, or float16 under fp16), the grid as float32.
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ops/grid_sample_params.h"

namespace kiln::cuda {

namespace {

using ir::GridSampleMode;
using ir::GridSamplePadding;

constexpr int kMaxSpatial = 3;

struct GridGeom {
  int rank = 2;  // spatial dims
  int taps = 2;
  int64_t channels = 0, points = 0, spatial = 1, outputs = 0;
  int64_t dims[kMaxSpatial] = {};
  double lo[kMaxSpatial] = {}, hi[kMaxSpatial] = {};
  GridSampleMode mode = GridSampleMode::kLinear;
  GridSamplePadding padding = GridSamplePadding::kZeros;
  bool align = false;
};

template <class T>
__global__ void grid_sample_kernel(const T* __restrict__ x, const float* __restrict__ grid, T* __restrict__ y, GridGeom g) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < g.outputs; o += step) {
    const int64_t q = o % g.points, nc = o / g.points, n = nc / g.channels;
    const float* gp = grid + (n * g.points + q) * g.rank;
    int64_t index[kMaxSpatial][4];
    double weight[kMaxSpatial][4];
    for (int d = 0; d < g.rank; ++d)  // the grid lists the innermost dimension first (x, then y, ...)
      ir::grid_neighbours(gp[g.rank - 1 - d], g.dims[d], g.align, g.mode, g.padding, g.lo[d], g.hi[d], index[d], weight[d]);
    const T* xc = x + nc * g.spatial;
    double sum = 0;
    int tap[kMaxSpatial] = {};
    while (true) {
      double w = 1;
      int64_t offset = 0;
      bool zero = false;
      for (int d = 0; d < g.rank; ++d) {
        const int64_t i = index[d][tap[d]];
        if (i < 0) zero = true;
        w *= weight[d][tap[d]];
        offset = offset * g.dims[d] + i;
      }
      if (!zero) sum += w * static_cast<double>(load_float(xc, offset));
      int d = g.rank - 1;
      while (d >= 0 && ++tap[d] == g.taps) tap[d--] = 0;
      if (d < 0) break;
    }
    store_float(y, o, static_cast<float>(sum));
  }
}

std::string check_grid_sample(const LayerRequest& r) {
  if (!r.has_input(0) || !r.has_input(1)) return "X and grid are required";
  if (r.input_dtypes[0] != DType::kFloat32 || r.input_dtypes[1] != DType::kFloat32)
    return "input types " + to_string(r.input_dtypes[0]) + ", " + to_string(r.input_dtypes[1]) +
           " are not supported (supported: float32)";
  const int rank = static_cast<int>(r.input_shape(0).size());
  if (rank != 4 && rank != 5) return "X of rank " + std::to_string(rank) + " (2-D and 3-D only)";
  const std::vector<int64_t>& grid = r.input_shape(1);
  if (static_cast<int>(grid.size()) != rank || grid.back() != rank - 2 || grid[0] != r.input_shape(0)[0])
    return "the grid's shape does not match X";
  const std::string mode = r.node.attrs.get_string("mode", "linear"), padding = r.node.attrs.get_string("padding_mode", "zeros");
  if (mode != "nearest" && mode != "linear" && mode != "cubic")  // (the importer renames opset 16's)
    return "mode " + mode + " is not supported";
  if (padding != "zeros" && padding != "border" && padding != "reflection") return "padding_mode " + padding + " is not supported";
  return "";
}

LayerFormats grid_sample_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs = {Format{r.float_storage(), Layout::kLinear}, Format{DType::kFloat32, Layout::kLinear}};
  f.outputs.push_back(Format{r.float_storage(), Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_grid_sample(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const std::vector<int64_t>& x = r.input_shape(0);
  GridGeom g;
  g.rank = static_cast<int>(x.size()) - 2;
  const std::string mode = r.node.attrs.get_string("mode", "linear"), padding = r.node.attrs.get_string("padding_mode", "zeros");
  g.mode = mode == "nearest" ? GridSampleMode::kNearest
           : mode == "cubic" ? GridSampleMode::kCubic : GridSampleMode::kLinear;
  g.padding = padding == "border" ? GridSamplePadding::kBorder
              : padding == "reflection" ? GridSamplePadding::kReflection : GridSamplePadding::kZeros;
  g.align = r.node.attrs.get_int("align_corners", 0) != 0;
  g.taps = g.mode == GridSampleMode::kNearest ? 1 : g.mode == GridSampleMode::kLinear ? 2 : 4;
  g.channels = x[1];
  for (int d = 0; d < g.rank; ++d) {
    g.dims[d] = x[static_cast<size_t>(d) + 2];
    g.spatial *= g.dims[d];
    ir::grid_borders(g.dims[d], g.align, g.lo[d], g.hi[d]);
  }
  g.outputs = shape_numel(r.output_shapes[0]);
  g.points = x[0] * x[1] ? g.outputs / (x[0] * x[1]) : 0;
  if (g.outputs == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  EnqueueFn fn;
  auto make = [&](auto tag) {
    using T = decltype(tag);
    fn = [g](const LayerIO& io, cudaStream_t stream) {
      grid_sample_kernel<T><<<grid_for(g.outputs), 256, 0, stream>>>(static_cast<const T*>(io.inputs[0]),
                                                                    static_cast<const float*>(io.inputs[1]),
                                                                    static_cast<T*>(io.outputs[0]), g);
      KILN_CUDA_CHECK_LAUNCH();
    };
  };
  if (f.inputs[0].dtype == DType::kFloat16) make(__half{});
  else make(float{});
  return make_layer("kernel:grid-sample", std::move(fn));
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(grid_sample) {
  LayerEntry e;
  e.op = "GridSample";
  e.check = check_grid_sample;
  e.formats = grid_sample_formats;
  e.create = create_grid_sample;
  e.dtypes = "float32, float16 storage (double arithmetic)";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
