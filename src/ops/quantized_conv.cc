// kiln::QConv: an INT8 convolution with a fused, requantizing epilogue (domain "kiln"). The
// INT8 pass (src/compiler/quantize_graph.cc) creates it from calibrated Conv/FusedConv
// nodes; every backend implements exactly this definition, and the CPU engine's kernel
// (src/cpu/quantized_conv.cc) is the exact integer reference the GPU is tested against.
//
//   kiln::QConv(X, W, B?, Z?) -> Y
//     X  int8, the input quantized symmetrically: its real value is X * x_scale.
//     W  int8 constant [M, C/group, k...], per output channel: real W[m] = W[m] * w_scales[m].
//     B  optional float32 [M] bias (real units).
//     Z  optional residual with Y's shape: float32 (real units) or int8 (real = Z * z_scale).
//     Attributes: Conv's (auto_pad, dilations, group, kernel_shape, pads, strides), the
//     activation attributes (src/ir/activation.h), and
//       x_scale   float > 0
//       w_scales  floats, one per output channel, > 0
//       z_scale   float: > 0 when Z is int8, absent otherwise
//       y_scale   float: > 0 makes Y int8, 0 or absent makes Y float32
//
//     acc[n,m,p] = sum over the window of X * W           (exact, int32)
//     v          = act(fma(acc, x_scale * w_scales[m], B[m]) + Zreal)   (float32; one fused
//                                                                       multiply-add)
//     Y          = y_scale > 0 ? saturate_int8(round_half_to_even(v * (1 / y_scale))) : v
//   with 1 / y_scale rounded to float32 once: requantizing multiplies by the reciprocal, as
//   TensorRT's does, because a division per element made the GPU kernel's epilogue several
//   times slower (docs/design/int8.md, "Requantizing by the reciprocal").
//
//   FP8 (--fp8 on Hopper): X, W, an int8-form Z and Y may instead all be float8e4m3fn (E4M3
//   values, the same per-tensor and per-channel scales with 448 in place of 127): acc is the
//   float32 sum of the products of their values, and Y = float8(v * (1 / y_scale)), rounded
//   to nearest even and saturated to +-448. Float sums are not exact: backends agree to
//   rounding, not bit for bit.
#include "ir/activation.h"
#include "ops/conv_geometry.h"

namespace kiln::ir {

namespace {

void infer_qconv(InferContext& ctx) {
  const Node& node = ctx.node;
  const std::string activation = node.attrs.get_string("activation", "");
  if (!Activation::is_known(activation)) ctx.unsupported("unknown epilogue activation '" + activation + "'");
  if (!(node.attrs.get_float("x_scale", 0.f) > 0.f)) ctx.fail("x_scale must be positive");
  const float y_scale = node.attrs.get_float("y_scale", 0.f);
  if (y_scale < 0.f) ctx.fail("y_scale must be positive, or 0 for a float32 output");
  const std::vector<float> w_scales = node.attrs.get_floats("w_scales");
  for (float s : w_scales)
    if (!(s > 0.f)) ctx.fail("w_scales must all be positive");
  infer_conv(ctx, /*transpose=*/false, /*quantized=*/true);
  TensorType& y = ctx.output_types[0];
  if (ctx.shape_known(1)) {
    const Dim& m = ctx.shape(1)[0];
    if (m.known() && static_cast<int64_t>(w_scales.size()) != m.value)
      ctx.fail("w_scales has " + std::to_string(w_scales.size()) + " entries but W has " + std::to_string(m.value) +
               " output channels");
  }
  const DType q = ctx.dtype(0);  // int8 or float8e4m3fn (infer_conv checked)
  if (ctx.has_input(3)) {
    const DType z = ctx.dtype(3);
    const bool z_int8 = node.attrs.get_float("z_scale", 0.f) > 0.f;
    if (z_int8 ? z != q : z != DType::kFloat32)
      ctx.fail("residual Z has type " + to_string(z) + (z_int8 ? "; with z_scale it must be X's type, " + to_string(q) : "; without z_scale it must be float32"));
    if (ctx.shape_known(3) && y.shape && ctx.shape(3).size() != y.shape->size())
      ctx.fail("residual Z has shape " + dims_to_string(ctx.shape(3)) + " but the output is " + dims_to_string(*y.shape));
  }
  y.dtype = y_scale > 0.f ? q : DType::kFloat32;
}

}  // namespace

KILN_REGISTER_OPS(quantized_conv) {
  OpSchema s;
  s.op = "QConv";
  s.domain = "kiln";
  s.min_inputs = 2;
  s.max_inputs = 4;
  s.infer = infer_qconv;
  s.flops = [](const FlopsContext& c) { return conv_flops(c, false); };
  registry.add(std::move(s));
}

}  // namespace kiln::ir
