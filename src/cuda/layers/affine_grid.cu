// CUDA layer of AffineGrid (float32, float64; float32 kept float32 under fp16): each output
// location's normalized coordinates (x along the last dim, then y, then z) times theta, in
// double with each product and sum rounded on its own, as the CPU kernel computes them
// (src/cpu/affine_grid.cc; a single pixel with align_corners at -1, as ONNX's reference puts
// it), so both engines give the same bits. One thread per output coordinate. The size must be
// known when building (a constant size input).
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

struct AffineGridGeom {
  int dims = 2;                 // spatial dims: 2 or 3
  int64_t sizes[3] = {1, 1, 1};  // D, H, W (or H, W)
  int64_t points = 0, outputs = 0;
  bool align_corners = false;
};

__device__ __forceinline__ double grid_coordinate(int64_t i, int64_t n, bool align_corners) {
  if (align_corners) return n > 1 ? -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(n - 1) : -1.0;
  return (2.0 * static_cast<double>(i) + 1.0) / static_cast<double>(n) - 1.0;
}

template <class T>
__global__ void affine_grid_kernel(const T* __restrict__ theta, T* __restrict__ grid, AffineGridGeom g) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < g.outputs; e += step) {
    const int64_t row = e % g.dims, p = (e / g.dims) % g.points, b = e / (g.dims * g.points);
    double base[4] = {1.0, 1.0, 1.0, 1.0};  // x, y(, z), 1
    for (int64_t d = 0, r = p; d < g.dims; ++d) {
      const int64_t size = g.sizes[g.dims - 1 - d];
      base[d] = grid_coordinate(r % size, size, g.align_corners);
      r /= size;
    }
    double v = 0.0;
    for (int k = 0; k <= g.dims; ++k)
      v = __dadd_rn(v, __dmul_rn(static_cast<double>(theta[(b * g.dims + row) * (g.dims + 1) + k]), base[k]));
    grid[e] = static_cast<T>(v);
  }
}

std::string check_affine_grid(const LayerRequest& r) {
  const DType d = r.input_dtypes[0];
  if (d != DType::kFloat32 && d != DType::kFloat64) return "input type " + to_string(d) + " is not supported (supported: float32, float64)";
  const std::vector<int64_t>& theta = r.input_shape(0);
  if (theta.size() != 3 || (theta[1] != 2 && theta[1] != 3) || theta[2] != theta[1] + 1)
    return "theta must be [N, 2, 3] or [N, 3, 4]";
  // The grid's shape is the output's, known when building; the size is read then, never on the GPU.
  if (!r.is_constant(1)) return "size must be a constant";
  return "";
}

LayerFormats affine_grid_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs = {Format{r.input_dtypes[0], Layout::kLinear}};
  for (size_t i = 1; i < r.inputs.size(); ++i) f.inputs.emplace_back();  // the size: read when building
  f.outputs.push_back(Format{r.output_dtypes[0], Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_affine_grid(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const std::vector<int64_t>& out = r.output_shapes[0];
  AffineGridGeom g;
  g.dims = static_cast<int>(r.input_shape(0)[1]);
  if (out.size() != static_cast<size_t>(g.dims) + 2 || out.back() != g.dims)
    throw r.node.error(ErrorKind::kInternal, "the grid's shape does not match theta");
  g.points = 1;
  for (int d = 0; d < g.dims; ++d) g.sizes[d] = out[static_cast<size_t>(d) + 1], g.points *= g.sizes[d];
  g.outputs = shape_numel(out);
  g.align_corners = r.node.attrs.get_int("align_corners", 0) != 0;
  if (g.outputs == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const bool wide = f.inputs[0].dtype == DType::kFloat64;
  return make_layer("kernel:affine-grid", [g, wide](const LayerIO& io, cudaStream_t stream) {
    if (wide)
      affine_grid_kernel<double><<<grid_for(g.outputs), 256, 0, stream>>>(static_cast<const double*>(io.inputs[0]),
                                                                         static_cast<double*>(io.outputs[0]), g);
    else
      affine_grid_kernel<float><<<grid_for(g.outputs), 256, 0, stream>>>(static_cast<const float*>(io.inputs[0]),
                                                                        static_cast<float*>(io.outputs[0]), g);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(affine_grid) {
  LayerEntry e;
  e.op = "AffineGrid";
  e.check = check_affine_grid;
  e.formats = affine_grid_formats;
  e.create = create_affine_grid;
  e.dtypes = "float32 (kept float32 under fp16), float64; constant size";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
