// Schema of ConvInteger (opset 10): Conv over (u)int8 X and W less their zero points, summed
// exactly in int32. x_zero_point is a scalar; w_zero_point a scalar or one per output channel.
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

void infer_conv_integer(InferContext& ctx) {
  if (!is_8_bit(ctx.dtype(0)) || !is_8_bit(ctx.dtype(1)))
    ctx.fail("X and W must be int8 or uint8, are " + to_string(ctx.dtype(0)) + " and " + to_string(ctx.dtype(1)));
  for (size_t i = 2; i < 4; ++i) {
    if (!ctx.has_input(i)) continue;
    if (ctx.dtype(i) != ctx.dtype(i - 2))
      ctx.fail("input " + std::to_string(i) + " has type " + to_string(ctx.dtype(i)) + ", not " + to_string(ctx.dtype(i - 2)));
  }
  if (ctx.has_input(2) && ctx.shape_known(2) && known_count(ctx.shape(2)) != 1)
    ctx.unsupported("x_zero_point must be a scalar");
  if (!ctx.shape_known(0) || !ctx.shape_known(1)) {
    ctx.set_output(0, DType::kInt32, std::nullopt);
    return;
  }
  const Dims& x = ctx.shape(0);
  const Dims& w = ctx.shape(1);
  if (x.size() < 3 || x.size() > 5) ctx.fail("X has shape " + dims_to_string(x) + "; expected N x C x 1 to 3 spatial dims");
  if (w.size() != x.size()) ctx.fail("W has shape " + dims_to_string(w) + " but X has " + dims_to_string(x));
  const int spatial = static_cast<int>(x.size()) - 2;
  std::vector<int64_t> wk, in;
  for (int i = 0; i < spatial; ++i) {
    wk.push_back(w[static_cast<size_t>(i + 2)].value);
    in.push_back(x[static_cast<size_t>(i + 2)].value);
  }
  const ConvGeometry g = conv_geometry(ctx.node, spatial, wk, in, false);
  if (x[1].known() && w[1].known() && x[1].value != w[1].value * g.group)
    ctx.fail("X has " + x[1].str() + " channels but W " + dims_to_string(w) + " with group " + std::to_string(g.group) +
             " expects " + std::to_string(w[1].value * g.group));
  if (w[0].known() && w[0].value % g.group != 0)
    ctx.fail("W has " + w[0].str() + " output channels, not a multiple of group " + std::to_string(g.group));
  if (ctx.has_input(3) && ctx.shape_known(3)) {
    const int64_t count = known_count(ctx.shape(3));
    if (count != 1 && (ctx.shape(3).size() != 1 || (w[0].known() && count != w[0].value)))
      ctx.fail("w_zero_point has shape " + dims_to_string(ctx.shape(3)) + "; expected a scalar or one per output channel");
  }
  Dims out{x[0], w[0]};
  for (int i = 0; i < spatial; ++i) {
    const int64_t o = conv_output_size(ctx.node, g, i, in[static_cast<size_t>(i)], false);
    out.push_back(o >= 0 ? Dim(o) : Dim::unknown());
  }
  ctx.set_output(0, DType::kInt32, out);
}

}  // namespace

KILN_REGISTER_OPS(conv_integer) {
  OpSchema s;
  s.op = "ConvInteger";
  s.min_inputs = 2;
  s.max_inputs = 4;
  s.infer = infer_conv_integer;
  s.flops = [](const FlopsContext& c) { return conv_flops(c, false); };
  s.limits = "1-D to 3-D; x_zero_point a scalar";
  registry.add(std::move(s));
}

}  // namespace kiln::ir
