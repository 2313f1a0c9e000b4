// Schemas of broadcasting elementwise ops: binary arithmetic, comparisons, logic, BitShift,
// the bitwise ops (and BitwiseNot), PRelu, the variadic Max/Min/Sum/Mean, and Where.
//
// Add/Sub/Mul/Div also propagate symbolic values, so a shape computed by a legacy export
// (Shape -> Gather -> Div -> Mul -> Concat -> Reshape) stays known at build time.
#include <string>

#include "ir/op_schema.h"

namespace kiln::ir {

namespace {

const char* const kArithmetic[] = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "BitShift", "PRelu"};
const char* const kComparison[] = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"};
const char* const kLogic[] = {"And", "Or", "Xor"};
const char* const kBitwise[] = {"BitwiseAnd", "BitwiseOr", "BitwiseXor"};
const char* const kVariadic[] = {"Max", "Min", "Sum", "Mean"};

// Broadcast shape of inputs [first, last); nullopt when some rank is unknown.
std::optional<Dims> broadcast_inputs(const InferContext& ctx, size_t first, size_t last) {
  std::optional<Dims> out;
  for (size_t i = first; i < last; ++i) {
    if (!ctx.shape_known(i)) return std::nullopt;
    if (!out) {
      out = ctx.shape(i);
      continue;
    }
    std::optional<Dims> b = broadcast_dims(*out, ctx.shape(i));
    if (!b)
      ctx.fail("input shapes " + dims_to_string(*out) + " and " + dims_to_string(ctx.shape(i)) +
               " cannot be broadcast together");
    out = std::move(b);
  }
  return out;
}

// Small 0-D/1-D integer inputs only: this also runs on every CPU engine step, where reading the
// elements of a big tensor would cost time for nothing.
std::optional<Dims> small_int_elements(const InferContext& ctx, size_t i) {
  const TensorType& t = ctx.type(i);
  if (t.dtype != DType::kInt64 && t.dtype != DType::kInt32) return std::nullopt;
  if (!t.shape || t.shape->size() > 1) return std::nullopt;
  if (t.shape->size() == 1 && (!(*t.shape)[0].known() || (*t.shape)[0].value > 64)) return std::nullopt;
  return ctx.int_elements(i);
}

// One element of Add/Sub/Mul/Div on dims: exact when both are known; x*1, x+0, x-0, x/1 keep
// a symbol; anything else becomes unknown, a sum or product past int64 included (the op wraps
// when it runs: no dim; fuzz_graph's Add of INT64_MAX and 1).
Dim symbolic_binary(const std::string& op, const Dim& a, const Dim& b) {
  if (a.known() && b.known()) {
    int64_t r;
    if (op == "Add") return __builtin_add_overflow(a.value, b.value, &r) ? Dim::unknown() : Dim(r);
    if (op == "Sub") return a.value - b.value >= 0 ? Dim(a.value - b.value) : Dim::unknown();
    if (op == "Mul") return __builtin_mul_overflow(a.value, b.value, &r) ? Dim::unknown() : Dim(r);
    if (op == "Div") return b.value != 0 ? Dim(a.value / b.value) : Dim::unknown();
  }
  auto is = [](const Dim& d, int64_t v) { return d.known() && d.value == v; };
  if ((op == "Mul" && is(b, 1)) || (op == "Add" && is(b, 0)) || (op == "Sub" && is(b, 0)) ||
      (op == "Div" && is(b, 1)))
    return a;
  if ((op == "Mul" && is(a, 1)) || (op == "Add" && is(a, 0))) return b;
  return Dim::unknown();
}

// Note: a Dim holds only non-negative known values, so a negative intermediate (e.g. -1 in a
// Reshape target) makes the whole symbolic value unknown rather than wrong.
void propagate_symbolic(InferContext& ctx) {
  const std::string& op = ctx.node.op;
  if (op != "Add" && op != "Sub" && op != "Mul" && op != "Div") return;
  std::optional<Dims> a = small_int_elements(ctx, 0);
  std::optional<Dims> b = small_int_elements(ctx, 1);
  if (!a || !b) return;
  if (a->empty() || b->empty()) return;  // broadcasts to an empty value (fuzz_onnx_import: [0] + [1])
  if (a->size() != b->size() && a->size() != 1 && b->size() != 1) return;
  size_t n = std::max(a->size(), b->size());
  Dims out;
  bool any_known = false;
  for (size_t i = 0; i < n; ++i) {
    const Dim& da = (*a)[a->size() == 1 ? 0 : i];
    const Dim& db = (*b)[b->size() == 1 ? 0 : i];
    // Known negative inputs are not representable as Dim; give up on the whole value.
    out.push_back(symbolic_binary(op, da, db));
    any_known = any_known || out.back().known() || out.back().symbolic();
  }
  if (any_known) ctx.set_symbolic(0, std::move(out));
}

void infer_arithmetic(InferContext& ctx) {
  const std::string& op = ctx.node.op;
  DType a = ctx.dtype(0), b = ctx.dtype(1);
  // Pow takes an exponent of any numeric type; every other op needs one type.
  if (op != "Pow" && a != b)
    ctx.fail("input types differ: " + to_string(a) + " and " + to_string(b));
  if (op == "BitShift") {
    std::string dir = ctx.node.attrs.get_string("direction", "");
    if (dir != "LEFT" && dir != "RIGHT") ctx.fail("attribute 'direction' must be \"LEFT\" or \"RIGHT\", is \"" + dir + "\"");
  }
  std::optional<Dims> shape = broadcast_inputs(ctx, 0, 2);
  if (op == "PRelu" && shape && ctx.shape_known(0) && shape->size() != ctx.shape(0).size())
    ctx.fail("slope " + dims_to_string(ctx.shape(1)) + " does not broadcast to X " + dims_to_string(ctx.shape(0)));
  ctx.set_output(0, a, std::move(shape));
  propagate_symbolic(ctx);
}

// SwiGLU: A * sigmoid(alpha * A) * B, for A and B of one shape (no broadcasting, as ONNX asks).
void infer_swiglu(InferContext& ctx) {
  if (ctx.dtype(1) != ctx.dtype(0)) ctx.fail("A and B must have one type");
  if (ctx.shape_known(0) && ctx.shape_known(1)) {
    const Dims &a = ctx.shape(0), &b = ctx.shape(1);
    bool same = a.size() == b.size();
    for (size_t i = 0; same && i < a.size(); ++i) same = !(a[i].known() && b[i].known() && a[i].value != b[i].value);
    if (!same) ctx.fail("A " + dims_to_string(a) + " and B " + dims_to_string(b) + " must have one shape");
  }
  ctx.set_output(0, ctx.dtype(0), ctx.type(0).shape);
}

// BitwiseAnd/Or/Xor (two inputs of one integer type, broadcast) and BitwiseNot.
void infer_bitwise(InferContext& ctx) {
  const DType a = ctx.dtype(0);
  if (!is_integer(a)) ctx.fail("bitwise ops take integers, not " + to_string(a));
  if (ctx.num_inputs() > 1 && ctx.dtype(1) != a)
    ctx.fail("input types differ: " + to_string(a) + " and " + to_string(ctx.dtype(1)));
  ctx.set_output(0, a, ctx.num_inputs() > 1 ? broadcast_inputs(ctx, 0, 2) : ctx.type(0).shape);
}

// A comparison of small integers whose values are known (a rank or a size against a number, as
// exporters' expanded functions test which form an input has) has a known value too: 1 or 0 per
// element. An If it decides then folds (inline_constant_if), and its types follow the branch
// taken.
void compare_symbolic(InferContext& ctx) {
  std::optional<Dims> a = small_int_elements(ctx, 0);
  std::optional<Dims> b = small_int_elements(ctx, 1);
  if (!a || !b || a->empty() || b->empty()) return;
  if (a->size() != b->size() && a->size() != 1 && b->size() != 1) return;
  const std::string& op = ctx.node.op;
  Dims out;
  for (size_t i = 0; i < std::max(a->size(), b->size()); ++i) {
    const Dim& da = (*a)[a->size() == 1 ? 0 : i];
    const Dim& db = (*b)[b->size() == 1 ? 0 : i];
    if (!da.known() || !db.known()) return;
    const bool r = op == "Equal" ? da.value == db.value : op == "Less" ? da.value < db.value
                 : op == "LessOrEqual" ? da.value <= db.value : op == "Greater" ? da.value > db.value
                                                                : da.value >= db.value;
    out.push_back(Dim(r ? 1 : 0));
  }
  ctx.set_symbolic(0, std::move(out));
}

void infer_comparison(InferContext& ctx) {
  if (ctx.dtype(0) != ctx.dtype(1))
    ctx.fail("input types differ: " + to_string(ctx.dtype(0)) + " and " + to_string(ctx.dtype(1)));
  ctx.set_output(0, DType::kBool, broadcast_inputs(ctx, 0, 2));
  compare_symbolic(ctx);
}

void infer_logic(InferContext& ctx) {
  if (ctx.dtype(0) != DType::kBool || ctx.dtype(1) != DType::kBool)
    ctx.fail("inputs must be bool, are " + to_string(ctx.dtype(0)) + " and " + to_string(ctx.dtype(1)));
  ctx.set_output(0, DType::kBool, broadcast_inputs(ctx, 0, 2));
}

void infer_variadic(InferContext& ctx) {
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) ctx.fail("input " + std::to_string(i) + " is empty; all inputs are required");
    if (ctx.dtype(i) != ctx.dtype(0))
      ctx.fail("input types differ: " + to_string(ctx.dtype(0)) + " and " + to_string(ctx.dtype(i)));
  }
  ctx.set_output(0, ctx.dtype(0), broadcast_inputs(ctx, 0, ctx.num_inputs()));
}

void infer_where(InferContext& ctx) {
  if (ctx.dtype(0) != DType::kBool) ctx.fail("condition must be bool, is " + to_string(ctx.dtype(0)));
  if (ctx.dtype(1) != ctx.dtype(2))
    ctx.fail("X and Y types differ: " + to_string(ctx.dtype(1)) + " and " + to_string(ctx.dtype(2)));
  ctx.set_output(0, ctx.dtype(1), broadcast_inputs(ctx, 0, 3));
}

int64_t output_numel(const FlopsContext& c) { return FlopsContext::numel(c.output_types[0]); }

}  // namespace

KILN_REGISTER_OPS(binary) {
  // The two-input ops of one list, each with `infer`.
  auto add_binary = [&](const auto& ops, void (*infer)(InferContext&)) {
    for (const char* op : ops) registry.add({op, "", 2, 2, 1, 1, infer, output_numel, ""});
  };
  add_binary(kArithmetic, infer_arithmetic);
  add_binary(kComparison, infer_comparison);
  add_binary(kBitwise, infer_bitwise);
  add_binary(kLogic, infer_logic);
  registry.add({"BitwiseNot", "", 1, 1, 1, 1, infer_bitwise, output_numel, ""});
  registry.add({"SwiGLU", "", 2, 2, 1, 1, infer_swiglu, output_numel, ""});
  for (const char* op : kVariadic) {
    OpSchema s;
    s.op = op;
    s.min_inputs = 1;
    s.max_inputs = 1 << 20;
    s.infer = infer_variadic;
    s.flops = [](const FlopsContext& c) {
      return output_numel(c) * static_cast<int64_t>(c.input_types.size());
    };
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "Where";
    s.min_inputs = s.max_inputs = 3;
    s.infer = infer_where;
    registry.add(std::move(s));
  }
}

}  // namespace kiln::ir
