// CUDA layer of RoiAlign (float32), with the CPU kernel's arithmetic (ops/roi_align_params.h,
// shared: the same positions, weights and sums, bit for bit). One thread per output element
// (region, channel, bin): it computes its region's grid, then walks its bin's samples in the
// CPU kernel's order. X, the regions and the output stay float32 under fp16 builds.
//
// A batch index outside X's batch, or a region that would need more than 1024 samples per bin
// along an axis, is refused by the CPU kernel with an error; a kernel cannot throw, so its bins
// read 0 and the layer's RunFlag is raised, and run() throws (layer.h, make_checked_layer).
#include <cfloat>
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ops/roi_align_params.h"

namespace kiln::cuda {

namespace {

struct RoiAlignGeom {
  ir::RoiAlignParams p;
  int64_t batch = 0, channels = 0, height = 0, width = 0, outputs = 0;
};

// std::max's choice: b where a < b, else a (a NaN in b is not taken).
__device__ __forceinline__ float larger(float a, float b) { return a < b ? b : a; }

__global__ void roi_align_kernel(const float* __restrict__ x, const float* __restrict__ rois,
                                 const int64_t* __restrict__ batch_indices, float* __restrict__ y, RoiAlignGeom g,
                                 int* __restrict__ refused) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  const int64_t OH = g.p.output_height, OW = g.p.output_width;
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < g.outputs; o += step) {
    const int64_t pw = o % OW, t = o / OW, ph = t % OH, rc = t / OH, c = rc % g.channels, r = rc / g.channels;
    const int64_t n = batch_indices[r];
    if (n < 0 || n >= g.batch) {
      *refused = 1;
      y[o] = 0.0f;
      continue;
    }
    if (g.height == 0 || g.width == 0) {  // nothing to sample: every bin reads 0
      y[o] = 0.0f;
      continue;
    }
    const ir::RoiGrid grid = ir::roi_grid(rois + r * 4, g.p);
    if (grid.too_many) {
      *refused = 1;
      y[o] = 0.0f;
      continue;
    }
    const float* plane = x + (n * g.channels + c) * g.height * g.width;
    float acc = g.p.max_mode ? -FLT_MAX : 0.0f;  // the CPU kernel's start: lowest() or 0
    for (int64_t iy = 0; iy < grid.grid_h; ++iy) {
      const float sy = grid.y(ph, iy);
      for (int64_t ix = 0; ix < grid.grid_w; ++ix) {
        const ir::RoiSample s = ir::roi_bilinear_sample(sy, grid.x(pw, ix), g.height, g.width);
        const float t0 = ir::roi_mul(s.weight[0], plane[s.offset[0]]), t1 = ir::roi_mul(s.weight[1], plane[s.offset[1]]);
        const float t2 = ir::roi_mul(s.weight[2], plane[s.offset[2]]), t3 = ir::roi_mul(s.weight[3], plane[s.offset[3]]);
        if (g.p.max_mode) acc = larger(acc, larger(larger(larger(t0, t1), t2), t3));
        else acc = ir::roi_add(acc, ir::roi_add(ir::roi_add(ir::roi_add(t0, t1), t2), t3));
      }
    }
    if (g.p.max_mode) y[o] = grid.grid_h * grid.grid_w > 0 ? acc : 0.0f;  // a bin without samples reads 0
    else y[o] = acc / float(grid.count());
  }
}

std::string check_roi_align(const LayerRequest& r) {
  for (size_t i = 0; i < 3; ++i)
    if (!r.has_input(i)) return "X, rois and batch_indices are required";
  if (r.input_dtypes[0] != DType::kFloat32 || r.input_dtypes[1] != DType::kFloat32)
    return "input types " + to_string(r.input_dtypes[0]) + ", " + to_string(r.input_dtypes[1]) +
           " are not supported (supported: float32)";
  if (r.input_dtypes[2] != DType::kInt64) return "batch_indices must be int64, are " + to_string(r.input_dtypes[2]);
  if (r.input_shape(0).size() != 4) return "X must have rank 4";
  const std::vector<int64_t>& rois = r.input_shape(1);
  if (rois.size() != 2 || rois[1] != 4) return "rois must have shape [num_rois, 4]";
  const std::vector<int64_t>& batch = r.input_shape(2);
  if (batch.size() != 1 || batch[0] != rois[0]) return "batch_indices must have shape [num_rois]";
  return "";
}

LayerFormats roi_align_formats(const LayerRequest&) {
  LayerFormats f;
  f.inputs = {Format{DType::kFloat32, Layout::kLinear}, Format{DType::kFloat32, Layout::kLinear},
              Format{DType::kInt64, Layout::kLinear}};
  f.outputs.push_back(Format{DType::kFloat32, Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_roi_align(const LayerRequest& r, const LayerFormats&, BuildServices&) {
  const std::vector<int64_t>& x = r.input_shape(0);
  RoiAlignGeom g;
  g.p.max_mode = r.node.attrs.get_string("mode", "avg") == "max";
  g.p.half_pixel = r.node.attrs.get_string("coordinate_transformation_mode", "half_pixel") == "half_pixel";
  g.p.output_height = r.node.attrs.get_int("output_height", 1);
  g.p.output_width = r.node.attrs.get_int("output_width", 1);
  g.p.sampling_ratio = r.node.attrs.get_int("sampling_ratio", 0);
  g.p.spatial_scale = r.node.attrs.get_float("spatial_scale", 1.0f);
  if (g.p.output_height < 1 || g.p.output_width < 1)
    throw r.node.error(ErrorKind::kInvalidModel, "output_height and output_width must be positive");
  g.batch = x[0], g.channels = x[1], g.height = x[2], g.width = x[3];
  g.outputs = shape_numel(r.output_shapes[0]);
  if (g.outputs == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  return make_checked_layer("kernel:roi-align", [g](const LayerIO& io, cudaStream_t stream, int* refused) {
    roi_align_kernel<<<grid_for(g.outputs), 256, 0, stream>>>(
        static_cast<const float*>(io.inputs[0]), static_cast<const float*>(io.inputs[1]),
        static_cast<const int64_t*>(io.inputs[2]), static_cast<float*>(io.outputs[0]), g, refused);
    KILN_CUDA_CHECK_LAUNCH();
  }, "RoiAlign '" + r.node.name + "': a batch index is outside X's batch of " + std::to_string(g.batch) +
         ", or a region needs more than " + std::to_string(ir::kMaxRoiSamplesPerAxis) +
         " samples per bin along an axis (sampling_ratio 0)");
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(roi_align) {
  LayerEntry e;
  e.op = "RoiAlign";
  e.check = check_roi_align;
  e.formats = roi_align_formats;
  e.create = create_roi_align;
  e.dtypes = "float32 (kept float32 under fp16)";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
