// Schema of Shrink: y = x - bias where x > lambd, x + bias where x < -lambd, else 0 (opset 9).
#include "ir/op_schema.h"

namespace kiln::ir {

namespace {

void infer_shrink(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype) && !is_integer(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not numeric");
  ctx.set_output(0, x.dtype, x.shape);
}

}  // namespace

KILN_REGISTER_OPS(shrink) {
  OpSchema s;
  s.op = "Shrink";
  s.infer = infer_shrink;
  s.flops = [](const FlopsContext& c) { return FlopsContext::numel(c.input_types[0]) * 2; };
  registry.add(std::move(s));
}

}  // namespace kiln::ir
