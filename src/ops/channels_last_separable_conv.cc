// kiln::ChannelsLastSeparableConv: a depthwise-separable block of channels-last convolutions in
// one node (domain "kiln"): an optional 1x1 expansion, a depthwise convolution and a 1x1
// projection, as MobileNet's inverted residual blocks and depthwise-separable layers write them.
// The CPU engine's pass src/passes/separable_convs.cc makes it from three (or two)
// kiln::ChannelsLastConv; its kernel streams the block row by row, so the wide tensors between
// the convolutions never leave the cache.
//
//   kiln::ChannelsLastSeparableConv(X, We?, Be?, Wd, Bd?, Wp, Bp?, Z?) -> Y
//     X [N, H, W, C]; We [E, C, 1, 1] (absent: no expansion, E = C), Be [E]; Wd [E, 1, kH, kW],
//     Bd [E]; Wp [M, E, 1, 1], Bp [M]; Z, the residual, and Y [N, OH, OW, M].
//     Attributes: the depthwise convolution's (auto_pad, dilations, kernel_shape, pads, strides)
//     and three epilogue activations (src/ir/activation.h): "expand_activation...",
//     "depthwise_activation..." and the projection's "activation...".
//     Y = act(Wp * dact(Depthwise(eact(We * X + Be), Wd) + Bd) + Bp + Z), each tensor channels-last.
#include "ir/activation.h"
#include "ops/conv_geometry.h"

namespace kiln::ir {

namespace {

constexpr int kX = 0, kWe = 1, kBe = 2, kWd = 3, kBd = 4, kWp = 5, kBp = 6, kZ = 7;

void check_activation(InferContext& ctx, const std::string& prefix) {
  const std::string kind = ctx.node.attrs.get_string(prefix + "activation", "");
  if (!Activation::is_known(kind)) ctx.unsupported("unknown " + prefix + "activation '" + kind + "'");
}

// A 1x1 convolution's weights [out, in, 1, 1].
void check_pointwise(InferContext& ctx, int input, const char* name, const Dim& in) {
  const Dims& w = ctx.shape(input);
  if (w.size() != 4 || !(w[2].known() && w[2].value == 1) || !(w[3].known() && w[3].value == 1))
    ctx.fail(std::string(name) + " has shape " + dims_to_string(w) + "; expected out x in x 1 x 1");
  if (in.known() && w[1].known() && w[1].value != in.value)
    ctx.fail(std::string(name) + " " + dims_to_string(w) + " takes " + std::to_string(w[1].value) + " channels, not " +
             std::to_string(in.value));
}

void check_bias(InferContext& ctx, int input, const char* name, const Dim& channels) {
  if (!ctx.has_input(input) || !ctx.shape_known(input)) return;
  const Dims& b = ctx.shape(input);
  if (b.size() != 1 || (b[0].known() && channels.known() && b[0].value != channels.value))
    ctx.fail(std::string(name) + " has shape " + dims_to_string(b) + "; expected [" + channels.str() + "]");
}

void infer_separable_conv(InferContext& ctx) {
  for (const char* prefix : {"expand_", "depthwise_", ""}) check_activation(ctx, prefix);
  if (!ctx.has_input(kWd) || !ctx.has_input(kWp)) ctx.fail("the depthwise weights Wd and the projection's Wp are required");
  const DType dt = ctx.dtype(kX);
  if (!is_float(dt)) ctx.unsupported("input X has type " + to_string(dt) + "; a convolution takes floating point");
  for (size_t i = 1; i < ctx.num_inputs(); ++i)
    if (ctx.has_input(i) && ctx.dtype(i) != dt)
      ctx.fail("input " + std::to_string(i) + " has type " + to_string(ctx.dtype(i)) + " but X has " + to_string(dt));
  if (ctx.has_input(kBe) && !ctx.has_input(kWe)) ctx.fail("Be is given without We (an expansion's bias without its weights)");
  if (!ctx.shape_known(kX) || !ctx.shape_known(kWd) || !ctx.shape_known(kWp) || (ctx.has_input(kWe) && !ctx.shape_known(kWe))) {
    ctx.set_output(0, dt, std::nullopt);
    return;
  }
  const Dims& x = ctx.shape(kX);
  if (x.size() != 4) ctx.fail("X has shape " + dims_to_string(x) + "; expected N x H x W x C");
  Dim expanded = x[3];
  if (ctx.has_input(kWe)) {
    check_pointwise(ctx, kWe, "We", x[3]);
    expanded = ctx.shape(kWe)[0];
  }
  check_bias(ctx, kBe, "Be", expanded);
  const Dims& wd = ctx.shape(kWd);
  if (wd.size() != 4 || !(wd[1].known() && wd[1].value == 1))
    ctx.fail("Wd has shape " + dims_to_string(wd) + "; expected E x 1 x kH x kW (one channel per group)");
  if (wd[0].known() && expanded.known() && wd[0].value != expanded.value)
    ctx.fail("Wd " + dims_to_string(wd) + " has " + std::to_string(wd[0].value) + " channels, not " + expanded.str());
  check_bias(ctx, kBd, "Bd", expanded);
  check_pointwise(ctx, kWp, "Wp", expanded);
  const Dim out_channels = ctx.shape(kWp)[0];
  check_bias(ctx, kBp, "Bp", out_channels);
  const ConvGeometry g = conv_geometry(ctx.node, 2, {wd[2].value, wd[3].value}, {x[1].value, x[2].value}, false);
  Dims out{x[0]};
  for (int i = 0; i < 2; ++i) {
    const int64_t o = conv_output_size(ctx.node, g, i, x[static_cast<size_t>(i + 1)].value, false);
    out.push_back(o >= 0 ? Dim(o) : Dim::unknown());
  }
  out.push_back(out_channels);
  ctx.set_output(0, dt, out);
  if (!ctx.has_input(kZ) || !ctx.shape_known(kZ)) return;
  const Dims& z = ctx.shape(kZ);
  bool same = z.size() == out.size();
  for (size_t i = 0; same && i < z.size(); ++i)
    if (z[i].known() && out[i].known()) same = z[i].value == out[i].value;
  if (!same) ctx.fail("residual Z has shape " + dims_to_string(z) + " but the output is " + dims_to_string(out));
}

// 2 x the multiply-adds of the three convolutions.
int64_t separable_conv_flops(const FlopsContext& c) {
  const TensorType* x = c.input_types[kX];
  const TensorType* wd = c.input_types[kWd];
  const TensorType* wp = c.input_types[kWp];
  const TensorType* y = c.output_types.empty() ? nullptr : c.output_types[0];
  const int64_t in = FlopsContext::numel(x), out = FlopsContext::numel(y);
  if (!x || !wd || !wp || !y || in == 0 || out == 0 || !wd->shape || !wp->shape || !x->shape) return 0;
  const int64_t c_in = (*x->shape)[3].value, e = (*wd->shape)[0].value, m = (*wp->shape)[0].value;
  const int64_t taps = (*wd->shape)[2].value * (*wd->shape)[3].value;
  const int64_t out_pixels = out / m, in_pixels = in / c_in;
  const bool expands = c.input_types.size() > kWe && c.input_types[kWe];
  return 2 * ((expands ? in_pixels * c_in * e : 0) + out_pixels * e * taps + out_pixels * e * m);
}

}  // namespace

KILN_REGISTER_OPS(channels_last_separable_conv) {
  OpSchema s;
  s.op = "ChannelsLastSeparableConv";
  s.domain = "kiln";
  s.min_inputs = 1;  // We and Be may be absent in the middle: infer checks Wd and Wp
  s.max_inputs = 8;
  s.infer = infer_separable_conv;
  s.flops = separable_conv_flops;
  registry.add(std::move(s));
}

}  // namespace kiln::ir
