// Schema of RoiAlign (roi_align_params.h has the arithmetic): X [N, C, H, W], rois [R, 4] and
// batch_indices [R] give Y [R, C, output_height, output_width].
#include "ops/roi_align_params.h"
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_roi_align(InferContext& ctx) {
  const DType dtype = ctx.dtype(0);
  if (ctx.dtype(1) != dtype) ctx.fail("rois must have X's type, " + to_string(dtype));
  if (ctx.dtype(2) != DType::kInt64) ctx.fail("batch_indices must be int64");
  const std::string mode = ctx.node.attrs.get_string("mode", "avg");
  if (mode != "avg" && mode != "max") ctx.fail("unknown mode '" + mode + "'");
  const std::string transform = ctx.node.attrs.get_string("coordinate_transformation_mode", "half_pixel");
  if (transform != "half_pixel" && transform != "output_half_pixel")
    ctx.fail("unknown coordinate_transformation_mode '" + transform + "'");
  const int64_t oh = ctx.node.attrs.get_int("output_height", 1), ow = ctx.node.attrs.get_int("output_width", 1);
  if (oh < 1 || ow < 1) ctx.fail("output_height and output_width must be at least 1");
  const int64_t ratio = ctx.node.attrs.get_int("sampling_ratio", 0);
  if (ratio < 0) ctx.fail("sampling_ratio must not be negative");
  if (ratio > kMaxRoiSamplesPerAxis)
    ctx.unsupported("sampling_ratio " + std::to_string(ratio) + ": at most " + std::to_string(kMaxRoiSamplesPerAxis));
  Dim rois = Dim::unknown(), channels = Dim::unknown();
  if (ctx.shape_known(0)) {
    if (ctx.shape(0).size() != 4) ctx.fail("X must be [N, C, H, W]");
    channels = ctx.shape(0)[1];
  }
  if (ctx.shape_known(1)) {
    const Dims& r = ctx.shape(1);
    if (r.size() != 2 || (r[1].known() && r[1].value != 4)) ctx.fail("rois must be [num_rois, 4]");
    rois = r[0];
  }
  if (ctx.shape_known(2)) {
    const Dims& b = ctx.shape(2);
    if (b.size() != 1) ctx.fail("batch_indices must be [num_rois]");
    if (rois.known() && b[0].known() && b[0].value != rois.value) ctx.fail("batch_indices must have one index per roi");
    if (!rois.known()) rois = b[0];
  }
  ctx.set_output(0, dtype, Dims{rois, channels, Dim(oh), Dim(ow)});
}

}  // namespace

KILN_REGISTER_OPS(roi_align) {
  registry.add({"RoiAlign", "", 3, 3, 1, 1, infer_roi_align, nullptr,
                "float32; at most 1024 samples per bin along an axis"});
}

}  // namespace kiln::ir
