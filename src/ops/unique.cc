// Schema of Unique: Y (the distinct elements, or the distinct slices along `axis`), indices (each
// one's first index), inverse_indices (per element or slice of X, its position in Y) and counts.
// Their lengths depend on the data: unknown when building, known when the CPU engine runs.
#include "ops/shape_dims.h"
#include "ops/unique_params.h"

namespace kiln::ir {

namespace {

void infer_unique(InferContext& ctx) {
  const DType dtype = ctx.dtype(0);
  const bool has_axis = ctx.node.attrs.has("axis");
  std::optional<int64_t> axis;
  if (has_axis && ctx.shape_known(0))
    axis = normalize_axis(ctx, ctx.node.attrs.get_int("axis", 0), static_cast<int64_t>(ctx.shape(0).size()));
  Dim count = Dim::unknown(), along = Dim::unknown();
  if (const Tensor* x = ctx.value(0)) {
    const ops::UniqueSlices u = ops::unique_slices(*x, axis, ctx.node.attrs.get_int("sorted", 1) != 0);
    count = Dim(static_cast<int64_t>(u.first.size()));
    along = Dim(u.along);
  } else if (ctx.shape_known(0)) {
    if (axis) along = ctx.shape(0)[static_cast<size_t>(*axis)];
  }
  std::optional<Dims> y;
  if (has_axis) {
    if (ctx.shape_known(0)) {
      y = ctx.shape(0);
      (*y)[static_cast<size_t>(*axis)] = count;
    }
  } else {
    y = Dims{count};
  }
  ctx.set_output(0, dtype, y);
  for (size_t o = 1; o < ctx.node.outputs.size(); ++o) ctx.set_output(o, DType::kInt64, Dims{o == 2 ? along : count});
}

}  // namespace

KILN_REGISTER_OPS(unique) {
  registry.add({"Unique", "", 1, 1, 1, 4, infer_unique, nullptr,
                "output lengths depend on the data: unknown when building, known when run"});
}

}  // namespace kiln::ir
