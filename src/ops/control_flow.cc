// Schemas of If, Loop and Scan in kiln's form (src/onnx/control_flow.cc makes it). If: input 0 the
// condition (one bool), the others the values the branches read; attributes then_model and
// else_model (each branch a self-contained ONNX model whose inputs are the node's inputs after
// the condition). Loop: inputs M (int64 trip count) and cond (bool), either omitted, the carried
// values, then the values the body reads; attribute body_model, whose inputs are the iteration,
// the condition, the carried values and the node's inputs after them. Scan: inputs the states
// (attribute states counts them), the scanned values (num_scan_inputs), then the values the body
// reads; body_model takes the states, one slice of each scanned value and the values read. All
// three: output_dtypes and output_ranks. Output shapes are known only once the node has run, even on the CPU engine,
// whose kernels make their outputs themselves.
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

// Input i, when given, must be a single value of `dtype`.
void require_scalar(InferContext& ctx, size_t i, DType dtype, const std::string& what) {
  if (!ctx.has_input(i)) return;
  if (ctx.dtype(i) != dtype) ctx.fail(what + " must be " + to_string(dtype) + ", not " + to_string(ctx.dtype(i)));
  if (ctx.shape_known(i))
    for (const Dim& d : ctx.shape(i))
      if (d.known() && d.value != 1) ctx.fail(what + " must hold one value");
}

void set_declared_outputs(InferContext& ctx) {
  std::vector<int64_t> dtypes = ctx.node.attrs.get_ints("output_dtypes");
  const std::vector<int64_t> ranks = ctx.node.attrs.get_ints("output_ranks");
  if (dtypes.size() != ctx.node.outputs.size() || ranks.size() != dtypes.size())
    ctx.fail("output_dtypes and output_ranks must give one value per output");
  for (size_t i = 0; i < dtypes.size(); ++i) {
    // -1: a Loop's carried value whose body does not declare it: its initial value's type.
    if (dtypes[i] == -1 && ctx.node.op == "Loop" && ctx.has_input(2 + i)) dtypes[i] = static_cast<int64_t>(ctx.dtype(2 + i));
    // A Scan state that its body does not declare: its initial value's type.
    if (dtypes[i] == -1 && ctx.node.op == "Scan" && ctx.has_input(i)) dtypes[i] = static_cast<int64_t>(ctx.dtype(i));
    if (dtypes[i] < 0 || dtypes[i] > INT32_MAX || !is_known_dtype(static_cast<int32_t>(dtypes[i])))
      ctx.fail("output " + std::to_string(i) + " has an unknown type");
    std::optional<Dims> shape;
    if (ranks[i] >= 0 && ranks[i] <= 64) shape = Dims(static_cast<size_t>(ranks[i]), Dim::unknown());
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
                "CPU engine, opset 9 on; the outputs' shapes are known when it has run"});
  registry.add({"Loop", "", 0, 1 << 20, 0, 1 << 20, infer_loop, nullptr,
                "CPU engine; tensors only (no sequence outputs); at most 10,000,000 iterations"});
}

}  // namespace kiln::ir
