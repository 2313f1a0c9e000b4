// Schema of Concat. Concatenating shape values (e.g. [N] and [-1]) concatenates their
// symbolic elements, which is how exported dynamic-batch Reshapes get their target shape.
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_concat(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  size_t n = ctx.num_inputs();
  for (size_t i = 1; i < n; ++i)
    if (ctx.dtype(i) != dtype)
      ctx.fail("input " + std::to_string(i) + " is " + to_string(ctx.dtype(i)) + ", input 0 is " + to_string(dtype));
  int rank = -1;
  for (size_t i = 0; i < n; ++i)
    if (ctx.shape_known(i)) rank = static_cast<int>(ctx.shape(i).size());
  if (rank < 0) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  int64_t axis = static_cast<int64_t>(dim_axis(ctx, ctx.node.attrs.require_int("axis"), rank));
  Dims out(static_cast<size_t>(rank), Dim::unknown());
  int64_t axis_sum = 0;
  bool axis_known = true;
  bool first = true;
  for (size_t i = 0; i < n; ++i) {
    if (!ctx.shape_known(i)) {
      axis_known = false;
      continue;
    }
    const Dims& s = ctx.shape(i);
    if (static_cast<int>(s.size()) != rank)
      ctx.fail("input " + std::to_string(i) + " has rank " + std::to_string(s.size()) + ", expected " + std::to_string(rank));
    for (size_t d = 0; d < s.size(); ++d) {
      if (static_cast<int64_t>(d) == axis) continue;
      if (first || (!out[d].known() && (s[d].known() || s[d].symbolic()))) {
        out[d] = s[d];
      } else if (out[d].known() && s[d].known() && out[d].value != s[d].value) {
        ctx.fail("input " + std::to_string(i) + " has shape " + dims_to_string(s) + ", which differs from the others outside axis " +
                 std::to_string(axis));
      }
    }
    first = false;
    const Dim& a = s[static_cast<size_t>(axis)];
    if (a.known()) axis_sum += a.value;
    else axis_known = false;
  }
  out[static_cast<size_t>(axis)] = axis_known ? Dim(axis_sum) : Dim::unknown();
  ctx.set_output(0, dtype, out);

  if (rank == 1) {
    Dims value;
    for (size_t i = 0; i < n; ++i) {
      std::optional<Dims> e = ctx.int_elements(i);
      if (!e) return;
      value.insert(value.end(), e->begin(), e->end());
    }
    ctx.set_symbolic(0, std::move(value));
  }
}

}  // namespace

KILN_REGISTER_OPS(concat) {
  registry.add({"Concat", "", 1, 1 << 20, 1, 1, infer_concat, nullptr, ""});
}

}  // namespace kiln::ir
