// The program of kiln::FusedElementwise (fused_elementwise.h) and its schema.
#include "ops/fused_elementwise.h"

#include <algorithm>

#include "ir/op_schema.h"

namespace kiln::ir {

namespace {

struct BinaryName {
  const char* name;
  ElementwiseBinary op;
};
constexpr BinaryName kBinaryOps[] = {{"Add", ElementwiseBinary::kAdd}, {"Sub", ElementwiseBinary::kSub},
                                     {"Mul", ElementwiseBinary::kMul}, {"Div", ElementwiseBinary::kDiv},
                                     {"Max", ElementwiseBinary::kMax}, {"Min", ElementwiseBinary::kMin}};
constexpr const char* kGeluTanhName = "GeluTanh";

}  // namespace

bool parse_elementwise_op(const std::string& name, ElementwiseStep& step) {
  for (const BinaryName& b : kBinaryOps)
    if (name == b.name) {
      step.binary = true;
      step.binary_op = b.op;
      return true;
    }
  step.binary = false;
  if (name == kGeluTanhName) {
    step.unary_op = UnaryOp::kGeluTanh;
    return true;
  }
  const UnaryOpInfo* info = find_unary_op(name);
  if (!info || !has_float_math(info->op)) return false;
  step.unary_op = info->op;
  return true;
}

std::string elementwise_op_name(const ElementwiseStep& step) {
  if (step.binary) {
    for (const BinaryName& b : kBinaryOps)
      if (b.op == step.binary_op) return b.name;
  }
  if (step.unary_op == UnaryOp::kGeluTanh) return kGeluTanhName;
  for (const UnaryOpInfo& u : kUnaryOps)
    if (u.op == step.unary_op) return u.name;
  return "?";
}

ElementwiseProgram ElementwiseProgram::of(const Node& node) {
  ElementwiseProgram p;
  const Attributes& a = node.attrs;
  const std::vector<std::string> ops = a.get_strings("steps");
  const std::vector<int64_t> operands = a.get_ints("operands");
  const std::vector<float> alphas = a.get_floats("alphas"), betas = a.get_floats("betas");
  p.members = a.get_strings("members");
  const int64_t parts = a.get_int("concat_parts", 0), axis = a.get_int("concat_axis", 0);
  const int64_t n_inputs = static_cast<int64_t>(node.inputs.size());
  if (ops.empty()) throw node.error(ErrorKind::kInvalidModel, "a fused elementwise group needs at least one step");
  if (operands.size() != 2 * ops.size() || alphas.size() != ops.size() || betas.size() != ops.size())
    throw node.error(ErrorKind::kInvalidModel, "the steps, operands (two per step), alphas and betas of a fused "
                                               "elementwise group disagree in length");
  if (parts < 0 || parts > n_inputs || axis < 0)
    throw node.error(ErrorKind::kInvalidModel, "concat_parts " + std::to_string(parts) + " and concat_axis " +
                                                   std::to_string(axis) + " do not fit " + std::to_string(n_inputs) +
                                                   " inputs");
  for (size_t i = 0; i < node.inputs.size(); ++i)
    if (node.inputs[i].empty()) throw node.error(ErrorKind::kInvalidModel, "input " + std::to_string(i) + " is omitted");
  p.concat_parts = static_cast<int>(parts);
  p.concat_axis = static_cast<int>(axis);
  p.inputs = static_cast<int>(parts > 0 ? n_inputs - parts + 1 : n_inputs);
  for (size_t s = 0; s < ops.size(); ++s) {
    ElementwiseStep step;
    if (!parse_elementwise_op(ops[s], step))
      throw node.error(ErrorKind::kInvalidModel, "step " + std::to_string(s) + ": '" + ops[s] +
                                                     "' is not an elementwise float op of a fused group");
    const int available = p.inputs + static_cast<int>(s);
    const int64_t ra = operands[2 * s], rb = operands[2 * s + 1];
    const bool ok = ra >= 0 && ra < available && (step.binary ? rb >= 0 && rb < available : rb == -1);
    if (!ok)
      throw node.error(ErrorKind::kInvalidModel, "step " + std::to_string(s) + " (" + ops[s] + ") reads register(s) " +
                                                     std::to_string(ra) + ", " + std::to_string(rb) + " of the " +
                                                     std::to_string(available) + " defined before it");
    step.a = static_cast<int>(ra);
    step.b = static_cast<int>(rb);
    step.params.alpha = alphas[s];
    step.params.beta = betas[s];
    p.steps.push_back(step);
  }
  return p;
}

int ElementwiseProgram::live_results() const {
  const int n = static_cast<int>(steps.size());
  std::vector<int> last_use(static_cast<size_t>(n), -1);  // per step result
  for (int s = 0; s < n; ++s)
    for (int r : {steps[static_cast<size_t>(s)].a, steps[static_cast<size_t>(s)].b})
      if (r >= inputs) last_use[static_cast<size_t>(r - inputs)] = s;
  int most = 0;
  for (int s = 0; s + 1 < n; ++s) {
    int alive = 0;
    for (int v = 0; v <= s; ++v) alive += last_use[static_cast<size_t>(v)] > s;
    most = std::max(most, alive);
  }
  return most;
}

void ElementwiseProgram::store(Node& node) const {
  std::vector<std::string> ops;
  std::vector<int64_t> operands;
  std::vector<float> alphas, betas;
  for (const ElementwiseStep& s : steps) {
    ops.push_back(elementwise_op_name(s));
    operands.push_back(s.a);
    operands.push_back(s.binary ? s.b : -1);
    alphas.push_back(s.params.alpha);
    betas.push_back(s.params.beta);
  }
  node.attrs.set("steps", ops);
  node.attrs.set("operands", operands);
  node.attrs.set("alphas", alphas);
  node.attrs.set("betas", betas);
  node.attrs.set("concat_parts", int64_t{concat_parts});
  node.attrs.set("concat_axis", int64_t{concat_axis});
  node.attrs.set("members", members);
}

namespace {

void infer_fused_elementwise(InferContext& ctx) {
  const ElementwiseProgram p = ElementwiseProgram::of(ctx.node);
  for (size_t i = 0; i < ctx.num_inputs(); ++i)
    if (ctx.dtype(i) != DType::kFloat32)
      ctx.unsupported("input " + std::to_string(i) + " has type " + to_string(ctx.dtype(i)) + ": a fused elementwise group computes float32");
  std::optional<Dims> out;
  auto join = [&](const Dims& d) {
    if (!out) {
      out = d;
      return;
    }
    std::optional<Dims> b = broadcast_dims(*out, d);
    if (!b) ctx.fail("input shapes " + dims_to_string(*out) + " and " + dims_to_string(d) + " cannot be broadcast together");
    out = std::move(b);
  };
  size_t first = 0;
  if (p.concat_parts > 0) {
    for (int i = 0; i < p.concat_parts; ++i)
      if (!ctx.shape_known(static_cast<size_t>(i))) {
        ctx.set_output(0, DType::kFloat32, std::nullopt);
        return;
      }
    Dims joined = ctx.shape(0);
    if (p.concat_axis >= static_cast<int>(joined.size()))
      ctx.fail("concat_axis " + std::to_string(p.concat_axis) + " is outside rank " + std::to_string(joined.size()));
    const size_t axis = static_cast<size_t>(p.concat_axis);
    for (int i = 1; i < p.concat_parts; ++i) {
      const Dims& d = ctx.shape(static_cast<size_t>(i));
      if (d.size() != joined.size()) ctx.fail("concatenated inputs differ in rank");
      for (size_t k = 0; k < d.size(); ++k) {
        if (k == axis) {
          joined[k] = joined[k].known() && d[k].known() ? Dim(joined[k].value + d[k].value) : Dim();
        } else if (joined[k].known() && d[k].known() && joined[k].value != d[k].value) {
          ctx.fail("concatenated inputs " + dims_to_string(ctx.shape(0)) + " and " + dims_to_string(d) +
                   " differ outside axis " + std::to_string(axis));
        }
      }
    }
    join(joined);
    first = static_cast<size_t>(p.concat_parts);
  }
  for (size_t i = first; i < ctx.num_inputs(); ++i) {
    if (!ctx.shape_known(i)) {
      ctx.set_output(0, DType::kFloat32, std::nullopt);
      return;
    }
    join(ctx.shape(i));
  }
  ctx.set_output(0, DType::kFloat32, out);
}

}  // namespace

KILN_REGISTER_OPS(fused_elementwise) {
  OpSchema s;
  s.op = "FusedElementwise";
  s.domain = "kiln";
  s.min_inputs = 1;
  s.max_inputs = 1 << 16;
  s.infer = infer_fused_elementwise;
  s.flops = [](const FlopsContext& c) {
    return FlopsContext::numel(c.output_types.empty() ? nullptr : c.output_types[0]) *
           static_cast<int64_t>(c.node.attrs.get_strings("steps").size());
  };
  registry.add(std::move(s));
}

}  // namespace kiln::ir
