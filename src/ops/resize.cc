// Schema of Resize (roi, scales, sizes as inputs; opset 18's axes and
// keep_aspect_ratio_policy). Sizes read through int_elements, so a size computed from a
// symbolic batch keeps it.
#include <cmath>

#include "ops/resize_params.h"

namespace kiln::ir {

ResizePlan resize_plan(const Node& node, const Dims& in, const Tensor* roi, const Tensor* scales,
                       const std::optional<Dims>& sizes) {
  auto fail = [&node](const std::string& m) { throw node.error(ErrorKind::kInvalidModel, m); };
  int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> axes = node.attrs.get_ints("axes");
  if (!node.attrs.has("axes"))
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  for (int64_t& a : axes) {
    if (a < -rank || a >= rank) fail("axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    if (a < 0) a += rank;
  }
  ResizePlan p;
  p.out = in;
  p.scale.assign(in.size(), 1.0);
  p.roi_start.assign(in.size(), 0.0);
  p.roi_end.assign(in.size(), 1.0);
  if (roi && roi->numel() > 0) {
    if (roi->numel() != static_cast<int64_t>(2 * axes.size()))
      fail("roi has " + std::to_string(roi->numel()) + " values, expected " + std::to_string(2 * axes.size()));
    for (size_t k = 0; k < axes.size(); ++k) {
      p.roi_start[static_cast<size_t>(axes[k])] = roi->value_as_double(static_cast<int64_t>(k));
      p.roi_end[static_cast<size_t>(axes[k])] = roi->value_as_double(static_cast<int64_t>(k + axes.size()));
    }
  }
  if (scales && sizes) fail("only one of scales and sizes may be given");
  if (scales) {
    if (scales->numel() != static_cast<int64_t>(axes.size()))
      fail("scales has " + std::to_string(scales->numel()) + " values for " + std::to_string(axes.size()) + " axes");
    for (size_t k = 0; k < axes.size(); ++k) {
      size_t a = static_cast<size_t>(axes[k]);
      double s = scales->value_as_double(static_cast<int64_t>(k));
      if (!(s > 0) || !std::isfinite(s)) fail("scales must be positive and finite");
      p.scale[a] = s;
      if (in[a].known()) {
        double n = std::floor(static_cast<double>(in[a].value) * s);
        if (n > 1e12) fail("scale " + std::to_string(s) + " makes axis " + std::to_string(a) + " too large");
        p.out[a] = Dim(static_cast<int64_t>(n));
      }
      else if (s != 1.0) p.out[a] = Dim::unknown();
    }
    return p;
  }
  if (!sizes) fail("one of scales and sizes must be given");
  if (sizes->size() != axes.size())
    fail("sizes has " + std::to_string(sizes->size()) + " values for " + std::to_string(axes.size()) + " axes");
  std::string policy = node.attrs.get_string("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
    fail("unknown keep_aspect_ratio_policy '" + policy + "'");
  bool all_known = true;
  for (size_t k = 0; k < axes.size(); ++k)
    all_known = all_known && in[static_cast<size_t>(axes[k])].known() && (*sizes)[k].known();
  if (policy == "stretch" || !all_known) {
    for (size_t k = 0; k < axes.size(); ++k) {
      size_t a = static_cast<size_t>(axes[k]);
      p.out[a] = (*sizes)[k];
      if (in[a].known() && (*sizes)[k].known() && in[a].value > 0)
        p.scale[a] = static_cast<double>((*sizes)[k].value) / static_cast<double>(in[a].value);
      if (policy != "stretch") p.out[a] = Dim::unknown();
    }
    return p;
  }
  // One scale for all axes: the largest that fits (not_larger) or the smallest that covers.
  double s = policy == "not_larger" ? 1e300 : 0.0;
  for (size_t k = 0; k < axes.size(); ++k) {
    double r = static_cast<double>((*sizes)[k].value) / static_cast<double>(in[static_cast<size_t>(axes[k])].value);
    s = policy == "not_larger" ? std::min(s, r) : std::max(s, r);
  }
  for (int64_t a : axes) {
    // As for scales: a size past 1e12 (or not a number, from an empty axis) is refused before
    // it is converted to int64, where it would not fit.
    const double n = std::round(s * static_cast<double>(in[static_cast<size_t>(a)].value));
    if (!(n >= 0 && n <= 1e12))
      fail("sizes with keep_aspect_ratio_policy " + policy + " make axis " + std::to_string(a) + " too large");
    p.scale[static_cast<size_t>(a)] = s;
    p.out[static_cast<size_t>(a)] = Dim(static_cast<int64_t>(n));
  }
  return p;
}

namespace {

// Sizes must be >= 0, and an empty axis cannot be resized to a non-empty one.
void check_plan(const Node& node, const Dims& in, const ResizePlan& p) {
  for (size_t a = 0; a < in.size(); ++a)
    if (in[a].known() && in[a].value == 0 && p.out[a].known() && p.out[a].value > 0)
      throw node.error(ErrorKind::kInvalidModel, "cannot resize an empty axis " + std::to_string(a) + " to a non-empty one");
}


void infer_resize(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  const Attributes& a = ctx.node.attrs;
  std::string mode = a.get_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear" && mode != "cubic") ctx.fail("unknown mode '" + mode + "'");
  std::string ctm = a.get_string("coordinate_transformation_mode", "half_pixel");
  if (ctm != "half_pixel" && ctm != "half_pixel_symmetric" && ctm != "pytorch_half_pixel" && ctm != "align_corners" &&
      ctm != "asymmetric" && ctm != "tf_crop_and_resize" && ctm != "tf_half_pixel_for_nn")
    ctx.fail("unknown coordinate_transformation_mode '" + ctm + "'");
  std::string nm = a.get_string("nearest_mode", "round_prefer_floor");
  if (nm != "round_prefer_floor" && nm != "round_prefer_ceil" && nm != "floor" && nm != "ceil")
    ctx.fail("unknown nearest_mode '" + nm + "'");
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims& in = ctx.shape(0);
  // An input given as an empty tensor counts as absent (opset 11 had no optional scales).
  auto present = [&](size_t i) {
    if (!ctx.has_input(i)) return false;
    if (ctx.shape_known(i) && ctx.shape(i).size() == 1 && ctx.shape(i)[0] == Dim(0)) return false;
    return true;
  };
  bool has_scales = present(2), has_sizes = present(3);
  if (has_scales && !is_float(ctx.dtype(2))) ctx.fail("scales must be float, are " + to_string(ctx.dtype(2)));
  if (has_sizes && ctx.dtype(3) != DType::kInt64) ctx.fail("sizes must be int64, are " + to_string(ctx.dtype(3)));
  if (present(1) && !is_float(ctx.dtype(1))) ctx.fail("roi must be float, is " + to_string(ctx.dtype(1)));
  const Tensor* scales = has_scales ? ctx.value(2) : nullptr;
  std::optional<Dims> sizes = has_sizes ? ctx.int_elements(3) : std::nullopt;
  if ((has_scales && !scales) || (has_sizes && !sizes) || (ctx.has_input(1) && present(1) && !ctx.value(1))) {
    // Computed at run time: the rank is all that is known.
    ctx.set_output(0, dtype, Dims(in.size(), Dim::unknown()));
    return;
  }
  if (has_sizes)
    if (std::optional<std::vector<int64_t>> raw = raw_ints(ctx, 3))
      for (int64_t s : *raw)
        if (s < 0) ctx.fail("sizes must be >= 0, one is " + std::to_string(s));
  ResizePlan p = resize_plan(ctx.node, in, present(1) ? ctx.value(1) : nullptr, scales, sizes);
  check_plan(ctx.node, in, p);
  ctx.set_output(0, dtype, p.out);
}

}  // namespace

KILN_REGISTER_OPS(resize) {
  registry.add({"Resize", "", 1, 4, 1, 1, infer_resize, nullptr, "GPU: antialias is not supported"});
}

}  // namespace kiln::ir
