// Schema of BatchNormalization (inference mode only):
//   Y = (X - mean) / sqrt(var + epsilon) * scale + B, per channel (dim 1).
#include "ir/op_schema.h"

namespace kiln::ir {

namespace {
void infer_batchnorm(InferContext& ctx) {
  const Node& node = ctx.node;
  if (node.attrs.get_int("training_mode", 0) != 0)
    ctx.unsupported("training_mode=1 is not supported: kiln runs inference only");
  if (node.outputs.size() > 1)
    ctx.unsupported("outputs running_mean / running_var are only produced in training mode, which kiln does not run");
  DType dt = ctx.dtype(0);
  if (!is_float(dt)) ctx.unsupported("X has type " + to_string(dt) + "; BatchNormalization takes floating point");
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dt, std::nullopt);
    return;
  }
  const Dims& x = ctx.shape(0);
  if (x.size() < 2) ctx.fail("X has shape " + dims_to_string(x) + "; expected N x C x ... (rank >= 2)");
  const char* names[] = {"", "scale", "B", "input_mean", "input_var"};
  for (size_t i = 1; i <= 4; ++i) {
    if (!is_float(ctx.dtype(i))) ctx.fail(std::string(names[i]) + " has type " + to_string(ctx.dtype(i)));
    if (!ctx.shape_known(i)) continue;
    const Dims& p = ctx.shape(i);
    if (p.size() != 1 || (p[0].known() && x[1].known() && p[0].value != x[1].value))
      ctx.fail(std::string(names[i]) + " has shape " + dims_to_string(p) + "; expected [" + x[1].str() +
               "] (one per channel of X " + dims_to_string(x) + ")");
  }
  ctx.set_output(0, dt, x);
}
}  // namespace

KILN_REGISTER_OPS(batchnorm) {
  OpSchema s;
  s.op = "BatchNormalization";
  s.min_inputs = 5;
  s.max_inputs = 5;
  s.max_outputs = 3;  // accepted so the error says why (training outputs), not "3 outputs"
  s.infer = infer_batchnorm;
  // A folded scale and shift per element: one multiply-add.
  s.flops = [](const FlopsContext& c) { return 2 * FlopsContext::numel(c.output_types[0]); };
  s.limits = "inference mode only (training_mode=0, one output)";
  registry.add(std::move(s));
}

}  // namespace kiln::ir
