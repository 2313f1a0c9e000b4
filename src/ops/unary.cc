// Schemas of elementwise unary ops: the output has the input's type and shape.
#include "ir/op_schema.h"

namespace kiln::ir {

namespace {
const char* const kFloatUnary[] = {"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal",
                                   "Erf", "Abs", "Neg", "Floor", "Ceil", "Round", "Sin", "Cos",
                                   "Elu", "LeakyRelu", "Selu", "Softplus", "Softsign",
                                   "HardSigmoid", "HardSwish", "Gelu", "Sign", "Celu", "Mish",
                                   "ThresholdedRelu", "Identity", "Not", "Tan", "Asin", "Acos",
                                   "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "IsNaN",
                                   "IsInf"};

void same_as_input(InferContext& ctx) {
  DType out = ctx.dtype(0);
  if (ctx.node.op == "IsNaN" || ctx.node.op == "IsInf") out = DType::kBool;
  ctx.set_output(0, out, ctx.type(0).shape);
  if (ctx.node.op == "Identity" && ctx.input_symbolic.size() && ctx.input_symbolic[0])
    ctx.set_symbolic(0, *ctx.input_symbolic[0]);
}
}  // namespace

KILN_REGISTER_OPS(unary) {
  for (const char* op : kFloatUnary) {
    OpSchema s;
    s.op = op;
    s.infer = same_as_input;
    if (std::string(op) != "Identity")
      s.flops = [](const FlopsContext& c) { return FlopsContext::numel(c.output_types[0]); };
    registry.add(std::move(s));
  }
}

}  // namespace kiln::ir
