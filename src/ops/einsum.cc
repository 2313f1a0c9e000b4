// Schema of Einsum: the output's dims are its labels' sizes (src/ops/einsum_params.h parses the
// equation); a label's size must agree across operands, where an ellipsis dim of 1 broadcasts.
#include "ops/einsum_params.h"
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_einsum(InferContext& ctx) {
  const DType dtype = ctx.dtype(0);
  std::vector<int64_t> ranks;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (ctx.dtype(i) != dtype) ctx.fail("the operands' types differ");
    if (!ctx.shape_known(i)) {
      ctx.set_output(0, dtype, std::nullopt);
      return;
    }
    ranks.push_back(static_cast<int64_t>(ctx.shape(i).size()));
  }
  ops::EinsumEquation eq;
  const std::string why = ops::parse_einsum(ctx.node.attrs.get_string("equation", ""), ranks, eq);
  if (!why.empty()) ctx.fail("equation '" + ctx.node.attrs.get_string("equation", "") + "': " + why);
  std::vector<Dim> size(static_cast<size_t>(eq.labels), Dim(1));
  std::vector<bool> seen(static_cast<size_t>(eq.labels), false);
  for (size_t i = 0; i < eq.inputs.size(); ++i)
    for (size_t a = 0; a < eq.inputs[i].size(); ++a) {
      const Dim& d = ctx.shape(i)[a];
      const auto l = static_cast<size_t>(eq.inputs[i][a]);
      if (!seen[l] || (size[l].known() && size[l].value == 1)) {
        size[l] = d;
        seen[l] = true;
      } else if (d.known() && size[l].known() && d.value != size[l].value && d.value != 1) {
        ctx.fail("label " + std::to_string(l) + " has sizes " + std::to_string(size[l].value) + " and " + std::to_string(d.value));
      }
    }
  Dims out;
  for (int l : eq.output) out.push_back(size[static_cast<size_t>(l)]);
  ctx.set_output(0, dtype, out);
}

}  // namespace

KILN_REGISTER_OPS(einsum) {
  registry.add({"Einsum", "", 1, 1 << 10, 1, 1, infer_einsum, nullptr, ""});
}

}  // namespace kiln::ir
