// Schemas of the loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (scores
// [N, C, d1..dk], targets [N, d1..dk] of class indices, optional per-class weights [C]; the loss
// per element with reduction "none", else a scalar; SoftmaxCrossEntropyLoss's optional second
// output is the log-probabilities, shaped as the scores).
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_loss(InferContext& ctx) {
  const DType dtype = ctx.dtype(0);
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64 && dtype != DType::kFloat16 && dtype != DType::kBFloat16)
    ctx.fail("the scores must be floating point, not " + to_string(dtype));
  if (ctx.dtype(1) != DType::kInt32 && ctx.dtype(1) != DType::kInt64) ctx.fail("the targets must be int32 or int64");
  if (ctx.has_input(2) && ctx.dtype(2) != dtype) ctx.fail("the weights must have the scores' type");
  const std::string reduction = ctx.node.attrs.get_string("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    ctx.fail("reduction must be none, sum or mean, not '" + reduction + "'");
  std::optional<Dims> per_element;
  if (ctx.shape_known(0)) {
    const Dims& scores = ctx.shape(0);
    if (scores.size() < 2) ctx.fail("the scores must have rank >= 2 ([N, C, ...])");
    if (ctx.shape_known(1)) {
      const Dims& targets = ctx.shape(1);
      if (targets.size() + 1 != scores.size()) ctx.fail("the targets must have the scores' rank minus one ([N, ...])");
      for (size_t d = 0; d < targets.size(); ++d) {
        const Dim& s = scores[d == 0 ? 0 : d + 1];
        if (s.known() && targets[d].known() && s.value != targets[d].value)
          ctx.fail("the targets' shape does not match the scores' (without C)");
      }
    }
    if (ctx.shape_known(2)) {
      const Dims& w = ctx.shape(2);
      if (w.size() != 1 || (w[0].known() && scores[1].known() && w[0].value != scores[1].value))
        ctx.fail("the weights must have one element per class (C)");
    }
    Dims dims{scores[0]};
    for (size_t d = 2; d < scores.size(); ++d) dims.push_back(scores[d]);
    per_element = dims;
  }
  ctx.set_output(0, dtype, reduction == "none" ? per_element : std::optional<Dims>(Dims{}));
  if (ctx.node.outputs.size() > 1) ctx.set_output(1, dtype, ctx.type(0).shape);
}

}  // namespace

KILN_REGISTER_OPS(loss) {
  registry.add({"NegativeLogLikelihoodLoss", "", 2, 3, 1, 1, infer_loss, nullptr, ""});
  registry.add({"SoftmaxCrossEntropyLoss", "", 2, 3, 1, 2, infer_loss, nullptr, ""});
}

}  // namespace kiln::ir
