// Schema of If in kiln's form (src/onnx/control_flow.cc makes it): input 0 the condition (one
// bool), the others the values the branches read; attributes then_model and else_model (each
// branch as a self-contained ONNX model whose inputs are the node's inputs after the condition),
// output_dtypes and output_ranks. Output shapes are those of the branch that runs: unknown until
// it has run, even on the CPU engine, whose kernel makes its outputs itself.
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_if(InferContext& ctx) {
  if (ctx.dtype(0) != DType::kBool) ctx.fail("the condition must be bool, not " + to_string(ctx.dtype(0)));
  if (ctx.shape_known(0)) {
    int64_t elements = 1;
    for (const Dim& d : ctx.shape(0)) elements = d.known() ? elements * d.value : -1;
    if (elements != 1 && elements != -1) ctx.fail("the condition must hold one value");
  }
  if (ctx.node.attrs.get_string("then_model", "").empty() || ctx.node.attrs.get_string("else_model", "").empty())
    ctx.fail("has no branches (then_model, else_model)");
  const std::vector<int64_t> dtypes = ctx.node.attrs.get_ints("output_dtypes");
  const std::vector<int64_t> ranks = ctx.node.attrs.get_ints("output_ranks");
  if (dtypes.size() != ctx.node.outputs.size() || ranks.size() != dtypes.size())
    ctx.fail("output_dtypes and output_ranks must give one value per output");
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (dtypes[i] < 0 || dtypes[i] > INT32_MAX || !is_known_dtype(static_cast<int32_t>(dtypes[i])))
      ctx.fail("output " + std::to_string(i) + " has an unknown type");
    std::optional<Dims> shape;
    if (ranks[i] >= 0 && ranks[i] <= 64) shape = Dims(static_cast<size_t>(ranks[i]), Dim::unknown());
    ctx.set_output(i, static_cast<DType>(dtypes[i]), shape);
  }
}

}  // namespace

KILN_REGISTER_OPS(control_flow) {
  registry.add({"If", "", 1, 1 << 20, 1, 1 << 20, infer_if, nullptr,
                "CPU engine; the branches' output shapes are known when the chosen branch has run"});
}

}  // namespace kiln::ir
