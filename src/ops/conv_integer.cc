// Schemas of the integer convolutions (opset 10): ConvInteger, Conv over (u)int8 X and W less
// their zero points, summed exactly in int32; and QLinearConv, the same sums plus an int32 bias,
// scaled by x_scale * w_scale / y_scale into y_zero_point's 8-bit type. x_zero_point is a scalar;
// w_zero_point and w_scale a scalar or one per output channel.
#include "ops/conv_geometry.h"

namespace kiln::ir {

namespace {

bool is_8_bit(DType t) { return t == DType::kInt8 || t == DType::kUInt8; }

// The element count of a shape whose dims are known (checked shapes: no overflow), else -1.
int64_t known_count(const Dims& dims) {
  int64_t n = 1;
  for (const Dim& d : dims) {
    if (!d.known()) return -1;
    n *= d.value;
  }
  return n;
}

// A per-tensor parameter (one element) or one per output channel (1-D of `channels`).
bool scalar_or_per_channel(const Dims& dims, const Dim& channels) {
  const int64_t count = known_count(dims);
  return count == 1 || (dims.size() == 1 && (!channels.known() || count < 0 || count == channels.value));
}

// Where an integer convolution's operands are among its inputs.
struct IntegerConvInputs {
  size_t x, x_zero, w, w_zero;
};

// X, W and their zero points; sets output 0 to `out` with Conv's output shape.
void infer_integer_conv(InferContext& ctx, IntegerConvInputs in, DType out) {
  if (!is_8_bit(ctx.dtype(in.x)) || !is_8_bit(ctx.dtype(in.w)))
    ctx.fail("X and W must be int8 or uint8, are " + to_string(ctx.dtype(in.x)) + " and " + to_string(ctx.dtype(in.w)));
  for (auto [zero, of] : {std::pair{in.x_zero, in.x}, std::pair{in.w_zero, in.w}}) {
    if (!ctx.has_input(zero)) continue;
    if (ctx.dtype(zero) != ctx.dtype(of))
      ctx.fail("input " + std::to_string(zero) + " has type " + to_string(ctx.dtype(zero)) + ", not " + to_string(ctx.dtype(of)));
  }
  if (ctx.has_input(in.x_zero) && ctx.shape_known(in.x_zero) && known_count(ctx.shape(in.x_zero)) != 1)
    ctx.unsupported("x_zero_point must be a scalar");
  if (!ctx.shape_known(in.x) || !ctx.shape_known(in.w)) {
    ctx.set_output(0, out, std::nullopt);
    return;
  }
  const Dims& x = ctx.shape(in.x);
  const Dims& w = ctx.shape(in.w);
  if (x.size() < 3 || x.size() > 5) ctx.fail("X has shape " + dims_to_string(x) + "; expected N x C x 1 to 3 spatial dims");
  if (w.size() != x.size()) ctx.fail("W has shape " + dims_to_string(w) + " but X has " + dims_to_string(x));
  const int spatial = static_cast<int>(x.size()) - 2;
  std::vector<int64_t> wk, sizes;
  for (int i = 0; i < spatial; ++i) {
    wk.push_back(w[static_cast<size_t>(i + 2)].value);
    sizes.push_back(x[static_cast<size_t>(i + 2)].value);
  }
  const ConvGeometry g = conv_geometry(ctx.node, spatial, wk, sizes, false);
  if (x[1].known() && w[1].known() && x[1].value != w[1].value * g.group)
    ctx.fail("X has " + x[1].str() + " channels but W " + dims_to_string(w) + " with group " + std::to_string(g.group) +
             " expects " + std::to_string(w[1].value * g.group));
  if (w[0].known() && w[0].value % g.group != 0)
    ctx.fail("W has " + w[0].str() + " output channels, not a multiple of group " + std::to_string(g.group));
  if (ctx.has_input(in.w_zero) && ctx.shape_known(in.w_zero) && !scalar_or_per_channel(ctx.shape(in.w_zero), w[0]))
    ctx.fail("w_zero_point has shape " + dims_to_string(ctx.shape(in.w_zero)) + "; expected a scalar or one per output channel");
  Dims dims{x[0], w[0]};
  for (int i = 0; i < spatial; ++i) {
    const int64_t o = conv_output_size(ctx.node, g, i, sizes[static_cast<size_t>(i)], false);
    dims.push_back(o >= 0 ? Dim(o) : Dim::unknown());
  }
  ctx.set_output(0, out, dims);
}

void infer_conv_integer(InferContext& ctx) { infer_integer_conv(ctx, {0, 2, 1, 3}, DType::kInt32); }

// Inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B.
void infer_qlinear_conv(InferContext& ctx) {
  for (size_t scale : {1, 4, 6})
    if (ctx.dtype(scale) != DType::kFloat32) ctx.fail("the scales must be float32, input " + std::to_string(scale) + " is " + to_string(ctx.dtype(scale)));
  if (!is_8_bit(ctx.dtype(7))) ctx.fail("y_zero_point must be int8 or uint8, is " + to_string(ctx.dtype(7)));
  for (size_t scalar : {1, 6, 7})
    if (ctx.shape_known(scalar) && known_count(ctx.shape(scalar)) != 1)
      ctx.unsupported("input " + std::to_string(scalar) + " must be a scalar (per tensor), has shape " + dims_to_string(ctx.shape(scalar)));
  const Dim channels = ctx.shape_known(3) && !ctx.shape(3).empty() ? ctx.shape(3)[0] : Dim::unknown();
  if (ctx.shape_known(4) && !scalar_or_per_channel(ctx.shape(4), channels))
    ctx.fail("w_scale has shape " + dims_to_string(ctx.shape(4)) + "; expected a scalar or one per output channel");
  if (ctx.has_input(8)) {
    if (ctx.dtype(8) != DType::kInt32) ctx.fail("B must be int32, is " + to_string(ctx.dtype(8)));
    if (ctx.shape_known(8) && (ctx.shape(8).size() != 1 || (channels.known() && ctx.shape(8)[0].known() &&
                                                             ctx.shape(8)[0].value != channels.value)))
      ctx.fail("B has shape " + dims_to_string(ctx.shape(8)) + "; expected one per output channel");
  }
  infer_integer_conv(ctx, {0, 2, 3, 5}, ctx.dtype(7));
}

}  // namespace

KILN_REGISTER_OPS(conv_integer) {
  {
    OpSchema s;
    s.op = "ConvInteger";
    s.min_inputs = 2;
    s.max_inputs = 4;
    s.infer = infer_conv_integer;
    s.flops = [](const FlopsContext& c) { return conv_flops(c, false); };
    s.limits = "1-D to 3-D; x_zero_point a scalar";
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "QLinearConv";
    s.min_inputs = 8;
    s.max_inputs = 9;
    s.infer = infer_qlinear_conv;
    s.limits = "1-D to 3-D; x and y scales and zero points per tensor";
    registry.add(std::move(s));
  }
}

}  // namespace kiln::ir
