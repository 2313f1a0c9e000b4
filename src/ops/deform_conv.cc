// Schema of DeformConv (opset 19; 22 added types): 2-D only.
#include "ops/deform_conv.h"

#include <string>

#include "ir/graph.h"
#include "ops/known_shapes.h"

namespace kiln::ir {

DeformConvParams deform_conv_params(const Node& node, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                    const std::vector<int64_t>& offset, const std::optional<std::vector<int64_t>>& mask,
                                    const std::optional<std::vector<int64_t>>& bias) {
  auto fail = [&](const std::string& why) { throw node.error(ErrorKind::kInvalidModel, why); };
  if (x.size() != 4) {
    if (x.size() < 3) fail("X must be [N, C, spatial...], has shape " + shape_string(x));
    throw node.error(ErrorKind::kUnsupported, "only 2-D deformable convolutions are supported (X has shape " + shape_string(x) + ")");
  }
  if (w.size() != 4) fail("W must be [M, C / group, kH, kW], has shape " + shape_string(w));
  DeformConvParams p;
  p.geometry = conv_geometry(node, 2, {w[2], w[3]}, {x[2], x[3]}, false);
  if (p.geometry.auto_pad != "NOTSET") fail("DeformConv has no auto_pad");
  p.batch = x[0], p.channels = x[1], p.height = x[2], p.width = x[3];
  p.out_channels = w[0];
  const int64_t group = p.geometry.group;
  if (p.channels != w[1] * group || p.out_channels % group != 0)
    fail("X has " + std::to_string(p.channels) + " channels and W shape " + shape_string(w) + ", which group " +
         std::to_string(group) + " does not fit");
  p.offset_group = node.attrs.get_int("offset_group", 1);
  if (p.offset_group < 1 || p.channels % p.offset_group != 0)
    fail("offset_group " + std::to_string(p.offset_group) + " must divide the " + std::to_string(p.channels) + " input channels");
  p.out_height = conv_output_size(node, p.geometry, 0, p.height, false);
  p.out_width = conv_output_size(node, p.geometry, 1, p.width, false);
  const int64_t taps = w[2] * w[3];
  const std::vector<int64_t> want_offset = {p.batch, p.offset_group * 2 * taps, p.out_height, p.out_width};
  if (offset != want_offset)
    fail("offset has shape " + shape_string(offset) + "; this input, kernel and offset_group need " + shape_string(want_offset));
  if (mask) {
    const std::vector<int64_t> want_mask = {p.batch, p.offset_group * taps, p.out_height, p.out_width};
    if (*mask != want_mask) fail("mask has shape " + shape_string(*mask) + "; it must be " + shape_string(want_mask));
  }
  if (bias && *bias != std::vector<int64_t>{p.out_channels})
    fail("B has shape " + shape_string(*bias) + "; it must be [" + std::to_string(p.out_channels) + "]");
  return p;
}

namespace {


void infer_deform_conv(InferContext& ctx) {
  const DType dt = ctx.dtype(0);
  if (!is_float(dt)) ctx.fail("input type " + to_string(dt) + " is not a float type");
  for (size_t i = 1; i < ctx.num_inputs(); ++i)
    if (ctx.has_input(i) && ctx.dtype(i) != dt)
      ctx.fail("input " + std::to_string(i) + " is " + to_string(ctx.dtype(i)) + ", X is " + to_string(dt));
  const auto x = known_shape(ctx, 0), w = known_shape(ctx, 1), offset = known_shape(ctx, 2);
  const bool optional_known = (!ctx.has_input(3) || known_shape(ctx, 3)) && (!ctx.has_input(4) || known_shape(ctx, 4));
  if (!x || !w || !offset || !optional_known) {
    // Known when the engine runs (the CPU engine infers shapes again then).
    ctx.set_output(0, dt, unknown_dims(ctx, 4));
    return;
  }
  const DeformConvParams p = deform_conv_params(ctx.node, *x, *w, *offset, known_shape(ctx, 4), known_shape(ctx, 3));
  ctx.set_output(0, dt, dims_of(std::vector<int64_t>{p.batch, p.out_channels, p.out_height, p.out_width}));
}

}  // namespace

KILN_REGISTER_OPS(deform_conv) {
  OpSchema s;
  s.op = "DeformConv";
  s.min_inputs = 3;
  s.max_inputs = 5;
  s.infer = infer_deform_conv;
  s.limits = "2-D only; GPU: no layer";
  registry.add(std::move(s));
}

}  // namespace kiln::ir
