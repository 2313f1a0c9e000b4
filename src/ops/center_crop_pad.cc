// Schema of CenterCropPad: each axis of `axes` (all by default) cropped or zero-padded, centred,
// to the size `shape` gives (a constant, or known when the CPU engine runs).
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_center_crop_pad(InferContext& ctx) {
  if (ctx.dtype(1) != DType::kInt64 && ctx.dtype(1) != DType::kInt32) ctx.fail("shape must be int32 or int64");
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, ctx.dtype(0), std::nullopt);
    return;
  }
  Dims out = ctx.shape(0);
  const int64_t rank = static_cast<int64_t>(out.size());
  std::vector<int64_t> axes = ctx.node.attrs.get_ints("axes");
  if (!ctx.node.attrs.has("axes"))
    for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
  for (int64_t& a : axes) a = normalize_axis(ctx, a, rank);
  std::optional<Dims> sizes = ctx.int_elements(1);
  if (sizes && sizes->size() != axes.size()) ctx.fail("shape must have one element per axis");
  for (size_t i = 0; i < axes.size(); ++i) {
    Dim d = sizes ? (*sizes)[i] : Dim::unknown();
    if (d.known() && d.value < 0) ctx.fail("shape holds a negative size");
    out[static_cast<size_t>(axes[i])] = d;
  }
  ctx.set_output(0, ctx.dtype(0), out);
}

}  // namespace

KILN_REGISTER_OPS(center_crop_pad) {
  registry.add({"CenterCropPad", "", 2, 2, 1, 1, infer_center_crop_pad, nullptr, ""});
}

}  // namespace kiln::ir
