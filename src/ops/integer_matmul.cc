// Schemas of the integer matrix products: MatMulInteger (int8/uint8 operands, zero points,
// int32 output) and QLinearMatMul (quantized operands and output, with scales and zero points).
// Batch dims broadcast as MatMul's.
#include "ops/linear.h"

namespace kiln::ir {

namespace {

bool is_8bit(DType d) { return d == DType::kInt8 || d == DType::kUInt8; }

void infer_matmul_integer(InferContext& ctx) {
  if (!is_8bit(ctx.dtype(0)) || !is_8bit(ctx.dtype(1))) ctx.fail("A and B must be int8 or uint8");
  if (ctx.has_input(2) && ctx.dtype(2) != ctx.dtype(0)) ctx.fail("a_zero_point must have A's type");
  if (ctx.has_input(3) && ctx.dtype(3) != ctx.dtype(1)) ctx.fail("b_zero_point must have B's type");
  ctx.set_output(0, DType::kInt32, matmul_dims(ctx, 0, 1));
}

// Inputs: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point.
void infer_qlinear_matmul(InferContext& ctx) {
  if (!is_8bit(ctx.dtype(0)) || !is_8bit(ctx.dtype(3))) ctx.fail("a and b must be int8 or uint8");
  for (size_t scale : {1, 4, 6})
    if (ctx.dtype(scale) != DType::kFloat32 && ctx.dtype(scale) != DType::kFloat16)
      ctx.fail("the scales must be float32 or float16");
  for (size_t zero : {2, 5})
    if (ctx.dtype(zero) != ctx.dtype(zero == 2 ? 0 : 3)) ctx.fail("a zero point must have its operand's type");
  if (!is_8bit(ctx.dtype(7))) ctx.fail("y_zero_point must be int8 or uint8");
  ctx.set_output(0, ctx.dtype(7), matmul_dims(ctx, 0, 3));
}

}  // namespace

KILN_REGISTER_OPS(integer_matmul) {
  registry.add({"MatMulInteger", "", 2, 4, 1, 1, infer_matmul_integer, matmul_flops, ""});
  registry.add({"QLinearMatMul", "", 8, 8, 1, 1, infer_qlinear_matmul, nullptr, "zero points and scales per tensor"});
}

}  // namespace kiln::ir
