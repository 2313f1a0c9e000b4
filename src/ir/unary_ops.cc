#include "ir/unary_ops.h"

namespace kiln::ir {

UnaryOp float_unary_op_of(const Node& node, UnaryParams& p) {
  const UnaryOpInfo* info = find_unary_op(node.op);
  if (!info || !has_float_math(info->op) || !node.domain.empty())
    throw node.error(ErrorKind::kInternal, "not a unary op with float math");
  const Attributes& a = node.attrs;
  UnaryOp op = info->op;
  switch (op) {
    case UnaryOp::kElu: case UnaryOp::kCelu: case UnaryOp::kThresholdedRelu: p.alpha = a.get_float("alpha", 1.f); break;
    case UnaryOp::kLeakyRelu: p.alpha = a.get_float("alpha", 0.01f); break;
    case UnaryOp::kSwish: p.alpha = a.get_float("alpha", 1.f); break;
    case UnaryOp::kSelu:
      p.alpha = a.get_float("alpha", 1.67326319217681884765625f);
      p.beta = a.get_float("gamma", 1.05070102214813232421875f);
      break;
    case UnaryOp::kHardSigmoid:
      p.alpha = a.get_float("alpha", 0.2f);
      p.beta = a.get_float("beta", 0.5f);
      break;
    case UnaryOp::kGelu:
      if (a.get_string("approximate", "none") == "tanh") op = UnaryOp::kGeluTanh;
      break;
    default: break;
  }
  return op;
}

}  // namespace kiln::ir
