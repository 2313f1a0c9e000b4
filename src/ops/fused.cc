// kiln's fused compute ops (domain "kiln"). The fusion passes create them; every backend
// implements exactly these definitions. act() is the epilogue activation of
// src/ir/activation.h (attributes activation, activation_alpha, activation_beta; "" or
// absent = identity).
//
//   kiln::FusedConv(X, W, B?, Z?) -> Y
//     Attributes: Conv's (auto_pad, dilations, group, kernel_shape, pads, strides) plus the
//     activation attributes. B is Conv's optional bias [M] ("" when absent). Z is an optional
//     residual with exactly Y's shape, added before the activation.
//     Y = act(Conv(X, W) + B + Z)
//
//   kiln::FusedGemm(A, B, C?, Z?) -> Y
//     Attributes: Gemm's (alpha, beta, transA, transB) plus the activation attributes.
//     C is Gemm's optional addend, unidirectionally broadcastable to M x N; Z an optional
//     residual with exactly Y's shape.
//     Y = act(alpha * op(A) @ op(B) + beta * C + Z)
//
//   kiln::FusedMatMul(A, B, bias?, Z?) -> Y
//     Attributes: the activation attributes. A and B follow MatMul's numpy semantics; bias is
//     an optional 1-D [N] (N = B's last dim; B must then have rank >= 2) added to every row;
//     Z an optional residual with exactly Y's shape (a transformer block's skip connection).
//     Y = act(MatMul(A, B) + bias + Z)
#include "ir/activation.h"
#include "ops/conv_geometry.h"
#include "ops/linear.h"

namespace kiln::ir {

namespace {

void check_activation(const InferContext& ctx) {
  std::string kind = ctx.node.attrs.get_string("activation", "");
  if (!Activation::is_known(kind)) ctx.unsupported("unknown epilogue activation '" + kind + "'");
}

// The optional residual Z (input `index`): Y's type and exactly Y's shape.
void check_residual(const InferContext& ctx, size_t index) {
  if (!ctx.has_input(index)) return;
  const TensorType& y = ctx.output_types[0];
  if (ctx.dtype(index) != y.dtype)
    ctx.fail("residual Z has type " + to_string(ctx.dtype(index)) + " but Y has " + to_string(y.dtype));
  if (!ctx.shape_known(index) || !y.shape) return;
  const Dims& z = ctx.shape(index);
  bool ok = z.size() == y.shape->size();
  for (size_t i = 0; ok && i < z.size(); ++i) {
    const Dim& a = z[i];
    const Dim& b = (*y.shape)[i];
    if (a.known() && b.known()) ok = a.value == b.value;
  }
  if (!ok) ctx.fail("residual Z has shape " + dims_to_string(z) + " but the output is " + dims_to_string(*y.shape));
}

void infer_fused_conv(InferContext& ctx) {
  check_activation(ctx);
  infer_conv(ctx, /*transpose=*/false);
  check_residual(ctx, 3);
}

void infer_fused_gemm(InferContext& ctx) {
  check_activation(ctx);
  infer_gemm(ctx);
  check_residual(ctx, 3);
}

void infer_fused_matmul(InferContext& ctx) {
  check_activation(ctx);
  infer_matmul(ctx);
  check_residual(ctx, 3);
  if (!ctx.has_input(2)) return;
  if (ctx.dtype(2) != ctx.dtype(0)) ctx.fail("bias has type " + to_string(ctx.dtype(2)) + " but A has " + to_string(ctx.dtype(0)));
  if (!ctx.shape_known(1) || !ctx.shape_known(2)) return;
  const Dims& b = ctx.shape(1);
  const Dims& bias = ctx.shape(2);
  if (b.size() < 2) ctx.fail("a bias needs B of rank >= 2, B has shape " + dims_to_string(b));
  const Dim& n = b.back();
  if (bias.size() != 1 || (bias[0].known() && n.known() && bias[0].value != n.value))
    ctx.fail("bias has shape " + dims_to_string(bias) + "; expected [" + n.str() + "]");
}

}  // namespace

KILN_REGISTER_OPS(fused) {
  {
    OpSchema s;
    s.op = "FusedConv";
    s.domain = "kiln";
    s.min_inputs = 2;
    s.max_inputs = 4;
    s.infer = infer_fused_conv;
    s.flops = [](const FlopsContext& c) { return conv_flops(c, false); };
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "FusedGemm";
    s.domain = "kiln";
    s.min_inputs = 2;
    s.max_inputs = 4;
    s.infer = infer_fused_gemm;
    s.flops = gemm_flops;
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "FusedMatMul";
    s.domain = "kiln";
    s.min_inputs = 2;
    s.max_inputs = 4;
    s.infer = infer_fused_matmul;
    s.flops = matmul_flops;
    registry.add(std::move(s));
  }
}

}  // namespace kiln::ir
