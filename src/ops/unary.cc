// Schemas of the elementwise unary ops (src/ir/unary_ops.h): the output has the input's type and
// shape (IsNaN and IsInf: bool).
#include "ir/op_schema.h"
#include "ir/unary_ops.h"

namespace kiln::ir {

namespace {
void same_as_input(InferContext& ctx) {
  DType out = ctx.dtype(0);
  if (ctx.node.op == "IsNaN" || ctx.node.op == "IsInf") out = DType::kBool;
  ctx.set_output(0, out, ctx.type(0).shape);
  if (ctx.node.op == "Identity" && ctx.input_symbolic.size() && ctx.input_symbolic[0])
    ctx.set_symbolic(0, *ctx.input_symbolic[0]);
}
}  // namespace

KILN_REGISTER_OPS(unary) {
  for (const UnaryOpInfo& u : kUnaryOps) {
    OpSchema s;
    s.op = u.name;
    s.infer = same_as_input;
    if (u.op != UnaryOp::kIdentity)
      s.flops = [](const FlopsContext& c) { return FlopsContext::numel(c.output_types[0]); };
    registry.add(std::move(s));
  }
}

}  // namespace kiln::ir
