// kiln::ChannelsLastConv: kiln::FusedConv on channels-last tensors (domain "kiln"). The CPU
// engine's layout pass (src/passes/channels_last_convs.cc) writes it where whole chains of
// convolutions then pass each other [N, H, W, C] activations, which its kernels read in place.
//
//   kiln::ChannelsLastConv(X, W, B?, Z?) -> Y
//     X [N, H, W, C]; W Conv's weights [M, C/group, kH, kW] (not transposed); B [M]; Z, the
//     residual, and Y [N, OH, OW, M]. Attributes: Conv's (auto_pad, dilations, group,
//     kernel_shape, pads, strides) plus the epilogue activation's (src/ir/activation.h), and
//     input_channels_first (int, default 0): 1 where X is [N, C, H, W] (a network's first
//     convolution reading its input as it comes; one group only). Y = act(Conv(X, W) + B + Z),
//     Y and Z channels-last.
#include "ir/activation.h"
#include "ops/conv_geometry.h"

namespace kiln::ir {

namespace {

void infer_channels_last_conv(InferContext& ctx) {
  const std::string kind = ctx.node.attrs.get_string("activation", "");
  if (!Activation::is_known(kind)) ctx.unsupported("unknown epilogue activation '" + kind + "'");
  const DType dt = ctx.dtype(0);
  if (!is_float(dt)) ctx.unsupported("input X has type " + to_string(dt) + "; a convolution takes floating point");
  if (ctx.dtype(1) != dt) ctx.fail("W has type " + to_string(ctx.dtype(1)) + " but X has " + to_string(dt));
  if (ctx.has_input(2) && ctx.dtype(2) != dt) ctx.fail("B has type " + to_string(ctx.dtype(2)) + " but X has " + to_string(dt));
  if (ctx.has_input(3) && ctx.dtype(3) != dt) ctx.fail("residual Z has type " + to_string(ctx.dtype(3)) + " but X has " + to_string(dt));
  if (!ctx.shape_known(0) || !ctx.shape_known(1)) {
    ctx.set_output(0, dt, std::nullopt);
    return;
  }
  const bool channels_first = ctx.node.attrs.get_int("input_channels_first", 0) != 0;
  const Dims& given = ctx.shape(0);
  const Dims& w = ctx.shape(1);
  if (given.size() != 4)
    ctx.fail("X has shape " + dims_to_string(given) + "; expected " + (channels_first ? "N x C x H x W" : "N x H x W x C"));
  const Dims x = channels_first ? Dims{given[0], given[2], given[3], given[1]} : given;  // N, H, W, C
  if (w.size() != 4) ctx.fail("W has shape " + dims_to_string(w) + "; expected M x C/group x kH x kW");
  const ConvGeometry g = conv_geometry(ctx.node, 2, {w[2].value, w[3].value}, {x[1].value, x[2].value}, false);
  const Dim& c = x[3];
  if (c.known() && w[1].known() && c.value != w[1].value * g.group)
    ctx.fail("X has " + std::to_string(c.value) + " channels but W " + dims_to_string(w) + " with group " +
             std::to_string(g.group) + " expects " + std::to_string(w[1].value * g.group));
  if (channels_first && g.group != 1)
    ctx.fail("input_channels_first takes one group, not group " + std::to_string(g.group));
  if (w[0].known() && w[0].value % g.group != 0)
    ctx.fail("W has " + std::to_string(w[0].value) + " output channels, not a multiple of group " + std::to_string(g.group));
  if (ctx.has_input(2) && ctx.shape_known(2)) {
    const Dims& b = ctx.shape(2);
    if (b.size() != 1 || (b[0].known() && w[0].known() && b[0].value != w[0].value))
      ctx.fail("B has shape " + dims_to_string(b) + "; expected [" + w[0].str() + "] (one per output channel)");
  }
  Dims out{x[0]};
  for (int i = 0; i < 2; ++i) {
    const int64_t o = conv_output_size(ctx.node, g, i, x[static_cast<size_t>(i + 1)].value, false);
    out.push_back(o >= 0 ? Dim(o) : Dim::unknown());
  }
  out.push_back(w[0]);
  ctx.set_output(0, dt, out);
  if (!ctx.has_input(3) || !ctx.shape_known(3)) return;
  const Dims& z = ctx.shape(3);
  bool same = z.size() == out.size();
  for (size_t i = 0; same && i < z.size(); ++i)
    if (z[i].known() && out[i].known()) same = z[i].value == out[i].value;
  if (!same) ctx.fail("residual Z has shape " + dims_to_string(z) + " but the output is " + dims_to_string(out));
}

}  // namespace

KILN_REGISTER_OPS(channels_last_conv) {
  OpSchema s;
  s.op = "ChannelsLastConv";
  s.domain = "kiln";
  s.min_inputs = 2;
  s.max_inputs = 4;
  s.infer = infer_channels_last_conv;
  s.flops = [](const FlopsContext& c) { return conv_flops(c, false); };  // output elements x fan-in, as Conv's
  registry.add(std::move(s));
}

}  // namespace kiln::ir
