// Schema of AffineGrid (opset 20): the sampling grid [N, H, W, 2] (or [N, D, H, W, 3]) of affine
// matrices theta [N, 2, 3] (or [N, 3, 4]) over the normalized coordinates of an image of `size`
// [N, C, H, W] (or [N, C, D, H, W]); what GridSample reads.
#include "ir/op_schema.h"

namespace kiln::ir {

namespace {

void infer_affine_grid(InferContext& ctx) {
  const TensorType& theta = ctx.type(0);
  if (!is_float(theta.dtype)) ctx.fail("theta has type " + to_string(theta.dtype) + ", not a float type");
  if (ctx.dtype(1) != DType::kInt64) ctx.fail("size must be int64, is " + to_string(ctx.dtype(1)));
  const std::optional<Dims> size = ctx.int_elements(1);
  if (!size || !all_known(*size)) {
    // Known when the engine runs (the CPU engine infers shapes again then).
    const bool rank_known = ctx.shape_known(1) && ctx.shape(1).size() == 1 && ctx.shape(1)[0].known() &&
                            (ctx.shape(1)[0].value == 4 || ctx.shape(1)[0].value == 5);
    if (rank_known) ctx.set_output(0, theta.dtype, unknown_dims(ctx, ctx.shape(1)[0].value));
    else ctx.set_output(0, theta.dtype, std::nullopt);
    return;
  }
  if (size->size() != 4 && size->size() != 5) ctx.fail("size must have 4 ([N, C, H, W]) or 5 ([N, C, D, H, W]) values");
  const int64_t dims = static_cast<int64_t>(size->size()) - 2;
  for (const Dim& d : *size)
    if (d.value < 0) ctx.fail("size " + dims_to_string(*size) + " has a negative value");
  if (theta.shape) {
    const Dims& t = *theta.shape;
    if (t.size() != 3 || (t[1].known() && t[1].value != dims) || (t[2].known() && t[2].value != dims + 1))
      ctx.fail("theta has shape " + dims_to_string(t) + "; size " + dims_to_string(*size) + " needs [N, " +
               std::to_string(dims) + ", " + std::to_string(dims + 1) + "]");
    if (t[0].known() && t[0].value != (*size)[0].value)
      ctx.fail("theta's N (" + t[0].str() + ") differs from size's (" + (*size)[0].str() + ")");
  }
  Dims out{(*size)[0]};
  for (int64_t d = 0; d < dims; ++d) out.push_back((*size)[static_cast<size_t>(d + 2)]);
  out.push_back(Dim(dims));
  ctx.set_output(0, theta.dtype, out);
}

}  // namespace

KILN_REGISTER_OPS(affine_grid) {
  OpSchema s;
  s.op = "AffineGrid";
  s.min_inputs = s.max_inputs = 2;
  s.infer = infer_affine_grid;
  registry.add(std::move(s));
}

}  // namespace kiln::ir
