// Schemas of If, Loop and Scan in kiln's form (src/onnx/control_flow.cc makes it). If: input 0 the
// condition (one bool), the others the values the branches read; attributes then_model and
// else_model (each branch a self-contained ONNX model whose inputs are the node's inputs after
// the condition). Loop: inputs M (int64 trip count) and cond (bool), either omitted, the carried
// values, then the values the body reads; attribute body_model, whose inputs are the iteration,
// the condition, the carried values and the node's inputs after them. Scan: inputs the states
// (attribute states counts them), the scanned values (num_scan_inputs), then the values the body
// reads; body_model takes the states, one slice of each scanned value and the values read; with
// batched = 1 (opset 8's form) every input it carries or scans has a batch axis first, each batch
// entry scanned on its own. All three: output_dtypes and output_ranks. Output shapes are known only once the node has run, even on the CPU engine,
// whose kernels make their outputs themselves.
#include <optional>

#include "ir/subgraph_types.h"
#include "ops/control_flow.h"
#include "ops/shape_dims.h"

namespace kiln::ir {

std::string subgraph_input_types(const Node& node, const std::vector<const TensorType*>& inputs, std::vector<TensorType>& types) {
  types.clear();
  size_t first = 1, any_shape_end = 0;  // If: every input after the condition, as it is
  const size_t scanned = node.op == "Scan" ? static_cast<size_t>(node.attrs.get_int("num_scan_inputs", 0)) : 0;
  if (node.op == "Loop") {
    types = {TensorType{DType::kInt64, Dims{}}, TensorType{DType::kBool, Dims{}}};
    first = 2;
    any_shape_end = 2 + static_cast<size_t>(node.attrs.get_int("carried", 0));
  } else if (node.op == "Scan") {
    first = 0;
    any_shape_end = static_cast<size_t>(node.attrs.get_int("states", 0));
  }
  // Opset 8's batched Scan: the body sees one batch entry (axis 0 gone) of every input it scans or
  // carries.
  const bool batched = node.op == "Scan" && node.attrs.get_int("batched", 0) != 0;
  const size_t per_entry_end = batched ? any_shape_end + scanned : 0;
  const std::vector<int64_t> axes = node.attrs.get_ints("scan_input_axes", std::vector<int64_t>(scanned, 0));
  if (axes.size() != scanned) throw node.error(ErrorKind::kInvalidModel, "scan_input_axes must give one axis per scanned input");
  for (size_t i = first; i < inputs.size(); ++i) {
    if (!inputs[i] || !inputs[i]->shape)
      return "the rank of input '" + (i < node.inputs.size() ? node.inputs[i] : std::to_string(i)) + "' is not known";
    TensorType t = *inputs[i];
    if (i < per_entry_end) {
      if (t.shape->empty()) return "input '" + node.inputs[i] + "' has no batch axis";
      t.shape->erase(t.shape->begin());
    }
    if (i < any_shape_end) t.shape = Dims(t.shape->size(), Dim::unknown());
    if (node.op == "Scan" && i >= any_shape_end && i < any_shape_end + scanned) {
      // The body sees one slice: the scanned axis removed.
      const int64_t rank = static_cast<int64_t>(t.shape->size()), axis = axes[i - any_shape_end];
      if (axis < -rank || axis >= rank)
        throw node.error(ErrorKind::kInvalidModel, "scan input axis " + std::to_string(axis) + " is out of range for rank " +
                                                       std::to_string(rank));
      t.shape->erase(t.shape->begin() + (axis < 0 ? axis + rank : axis));
    }
    types.push_back(std::move(t));
  }
  return "";
}

namespace {

// Input i, when given, must be a single value of `dtype`.
void require_scalar(InferContext& ctx, size_t i, DType dtype, const std::string& what) {
  if (!ctx.has_input(i)) return;
  if (ctx.dtype(i) != dtype) ctx.fail(what + " must be " + to_string(dtype) + ", not " + to_string(ctx.dtype(i)));
  if (ctx.shape_known(i))
    for (const Dim& d : ctx.shape(i))
      if (d.known() && d.value != 1) ctx.fail(what + " must hold one value");
}

// The type of each output that no subgraph declares, from the subgraph's own inference (If: the
// then branch's, else the else branch's).
std::vector<TensorType> inferred_outputs(InferContext& ctx, size_t undeclared) {
  const SubgraphTyper typer = subgraph_typer();
  std::vector<TensorType> inputs;
  const std::string why = typer ? subgraph_input_types(ctx.node, ctx.input_types, inputs) : "no ONNX importer is linked";
  if (!why.empty())
    ctx.unsupported("no subgraph declares the type of output " + std::to_string(undeclared) + ", and it cannot be inferred: " + why);
  const bool branches = ctx.node.op == "If";
  if (!branches) {
    std::vector<TensorType> types = typer(ctx.node.attrs.get_string("body_model", ""), inputs, ctx.node.name + "/body");
    // A Loop's body gives the condition first.
    if (ctx.node.op == "Loop" && !types.empty()) types.erase(types.begin());
    if (types.size() != ctx.node.outputs.size())
      ctx.fail("its body gives " + std::to_string(types.size()) + " outputs besides its condition; the node has " +
               std::to_string(ctx.node.outputs.size()));
    return types;
  }
  // If whose condition is known (a comparison of known sizes): the branch that runs gives the
  // types, dims and all.
  if (std::optional<Dims> cond = ctx.int_elements(0); cond && cond->size() == 1 && (*cond)[0].known()) {
    const std::string branch = (*cond)[0].value != 0 ? "then" : "else";
    std::vector<TensorType> types =
        typer(ctx.node.attrs.get_string(branch + "_model", ""), inputs, ctx.node.name + "/" + branch + "_branch");
    if (types.size() != ctx.node.outputs.size())
      ctx.fail("its " + branch + " branch gives " + std::to_string(types.size()) + " outputs; the node has " +
               std::to_string(ctx.node.outputs.size()));
    return types;
  }
  // If: a branch that cannot be inferred at these input types (one written for inputs of another
  // rank, which the condition keeps from running) leaves the types to the other.
  std::vector<TensorType> types, other;
  std::optional<Error> then_error;
  bool else_failed = false;
  try {
    types = typer(ctx.node.attrs.get_string("then_model", ""), inputs, ctx.node.name + "/then_branch");
  } catch (const Error& e) {
    then_error = e;
  }
  try {
    other = typer(ctx.node.attrs.get_string("else_model", ""), inputs, ctx.node.name + "/else_branch");
  } catch (const Error&) {
    if (then_error) throw *then_error;
    else_failed = true;
  }
  if (then_error) {
    types = std::move(other);
    other.clear();
  }
  if (then_error || else_failed)  // one branch's dims alone: the other's are not known, so none are
    for (TensorType& t : types)
      if (t.shape) t.shape = Dims(t.shape->size(), Dim::unknown());
  for (size_t i = 0; i < types.size() && i < other.size(); ++i) {
    if (types[i].dtype == DType::kUndefined) {
      types[i] = other[i];
      if (types[i].shape) types[i].shape = Dims(types[i].shape->size(), Dim::unknown());
    } else if (other[i].dtype != DType::kUndefined && other[i].dtype != types[i].dtype) {
      ctx.fail("its branches give output " + std::to_string(i) + " as " + to_string(types[i].dtype) + " and " +
               to_string(other[i].dtype));
    } else if (!other[i].shape || !types[i].shape || other[i].shape->size() != types[i].shape->size()) {
      types[i].shape.reset();  // the rank depends on the branch taken
      continue;
    }
    if (types[i].shape && other[i].shape)
      for (size_t d = 0; d < types[i].shape->size(); ++d)
        if (!((*types[i].shape)[d].known() && (*other[i].shape)[d].known() &&
              (*types[i].shape)[d].value == (*other[i].shape)[d].value))
          (*types[i].shape)[d] = Dim::unknown();  // a dim the branches give differently, or either does not know
  }
  if (types.size() != ctx.node.outputs.size())
    ctx.fail("its branches give " + std::to_string(types.size()) + " outputs; the node has " + std::to_string(ctx.node.outputs.size()));
  return types;
}

void set_declared_outputs(InferContext& ctx) {
  std::vector<int64_t> dtypes = ctx.node.attrs.get_ints("output_dtypes");
  std::vector<int64_t> ranks = ctx.node.attrs.get_ints("output_ranks");
  if (dtypes.size() != ctx.node.outputs.size() || ranks.size() != dtypes.size())
    ctx.fail("output_dtypes and output_ranks must give one value per output");
  const size_t carried = ctx.node.op == "Loop" ? static_cast<size_t>(ctx.node.attrs.get_int("carried", 0))
                         : ctx.node.op == "Scan" ? static_cast<size_t>(ctx.node.attrs.get_int("states", 0))
                                                 : 0;
  std::vector<TensorType> inferred;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    // An If's inferred dims (those both branches give as one number, or the taken branch's):
    // whichever branch runs, they hold, so the shape arithmetic after it stays known.
    std::optional<Dims> if_dims;
    // -1: a Loop's carried value whose body does not declare it: its initial value's type.
    if (dtypes[i] == -1 && ctx.node.op == "Loop" && ctx.has_input(2 + i)) dtypes[i] = static_cast<int64_t>(ctx.dtype(2 + i));
    // A Scan state that its body does not declare: its initial value's type.
    if (dtypes[i] == -1 && ctx.node.op == "Scan" && ctx.has_input(i)) dtypes[i] = static_cast<int64_t>(ctx.dtype(i));
    if (dtypes[i] == -1) {
      // Declared by no subgraph: what the subgraph's inference gives, a Loop's or Scan's per-iteration
      // output stacked over the iterations.
      if (inferred.empty()) inferred = inferred_outputs(ctx, i);
      const TensorType& t = inferred[i];
      dtypes[i] = t.dtype == DType::kUndefined ? -1 : static_cast<int64_t>(t.dtype);
      const bool stacked = ctx.node.op != "If" && i >= carried;
      const bool batched = ctx.node.op == "Scan" && ctx.node.attrs.get_int("batched", 0) != 0;
      ranks[i] = t.shape ? static_cast<int64_t>(t.shape->size()) + (stacked ? 1 : 0) + (batched ? 1 : 0) : -1;
      if (ctx.node.op == "If") if_dims = t.shape;
    }
    if (dtypes[i] < 0 || dtypes[i] > INT32_MAX || !is_known_dtype(static_cast<int32_t>(dtypes[i])))
      ctx.fail("output " + std::to_string(i) + " has an unknown type");
    std::optional<Dims> shape;
    if (ranks[i] >= 0 && ranks[i] <= 64) shape = Dims(static_cast<size_t>(ranks[i]), Dim::unknown());
    if (shape && if_dims) shape = if_dims;
    ctx.set_output(i, static_cast<DType>(dtypes[i]), shape);
  }
}

void infer_if(InferContext& ctx) {
  require_scalar(ctx, 0, DType::kBool, "the condition");
  if (ctx.node.attrs.get_string("then_model", "").empty() || ctx.node.attrs.get_string("else_model", "").empty())
    ctx.fail("has no branches (then_model, else_model)");
  set_declared_outputs(ctx);
}

void infer_scan(InferContext& ctx) {
  if (ctx.node.attrs.get_string("body_model", "").empty()) ctx.fail("has no body (body_model)");
  const int64_t states = ctx.node.attrs.get_int("states", -1), scanned = ctx.node.attrs.get_int("num_scan_inputs", -1);
  if (states < 0 || scanned < 1 || states + scanned > static_cast<int64_t>(ctx.num_inputs()) ||
      states > static_cast<int64_t>(ctx.node.outputs.size()))
    ctx.fail("its attributes states and num_scan_inputs must count its state and scanned inputs");
  set_declared_outputs(ctx);
}

void infer_loop(InferContext& ctx) {
  require_scalar(ctx, 0, DType::kInt64, "the trip count M");
  require_scalar(ctx, 1, DType::kBool, "the condition");
  if (ctx.node.attrs.get_string("body_model", "").empty()) ctx.fail("has no body (body_model)");
  set_declared_outputs(ctx);
}

}  // namespace

KILN_REGISTER_OPS(control_flow) {
  registry.add({"If", "", 1, 1 << 20, 1, 1 << 20, infer_if, nullptr,
                "CPU engine; the branches' output shapes are known when the chosen branch has run"});
  // M and cond may both be omitted (""): no input is required by position.
  registry.add({"Scan", "", 1, 1 << 20, 1, 1 << 20, infer_scan, nullptr,
                "CPU engine; opset 8's batched form without sequence_lens; the outputs' shapes are known when it has run"});
  registry.add({"Loop", "", 0, 1 << 20, 0, 1 << 20, infer_loop, nullptr,
                "CPU engine; tensors only (no sequence outputs); at most 10,000,000 iterations"});
}

}  // namespace kiln::ir
