// Schemas of Expand and Tile. Both read their shape/repeats through int_elements, so a
// symbolic batch flows through (Expand to [N, 1, 1] of a [1, 3, 4] tensor gives [N, 3, 4]).
#include "ir/sizes.h"
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_expand(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  if (ctx.dtype(1) != DType::kInt64) ctx.fail("the shape input must be int64");
  std::optional<Dims> target = ctx.int_elements(1);
  if (!target || !ctx.shape_known(0)) {
    int64_t len = ctx.shape_known(1) && ctx.shape(1).size() == 1 && ctx.shape(1)[0].known() ? ctx.shape(1)[0].value : -1;
    if (len >= 0 && ctx.shape_known(0))
      ctx.set_output(0, dtype, unknown_dims(ctx, std::max<int64_t>(len, static_cast<int64_t>(ctx.shape(0).size()))));
    else
      ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  if (std::optional<std::vector<int64_t>> raw = raw_ints(ctx, 1))
    for (int64_t d : *raw)
      if (d < 0) ctx.fail("the shape has a negative dimension " + std::to_string(d));
  std::optional<Dims> out = broadcast_dims(ctx.shape(0), *target);
  if (!out)
    ctx.fail("cannot expand shape " + dims_to_string(ctx.shape(0)) + " to " + dims_to_string(*target));
  ctx.set_output(0, dtype, out);
}

void infer_tile(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  if (ctx.dtype(1) != DType::kInt64) ctx.fail("repeats must be int64");
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims& in = ctx.shape(0);
  std::optional<Dims> repeats = ctx.int_elements(1);
  if (!repeats) {
    ctx.set_output(0, dtype, Dims(in.size(), Dim::unknown()));
    return;
  }
  if (repeats->size() != in.size())
    ctx.fail("repeats has " + std::to_string(repeats->size()) + " values for an input of rank " + std::to_string(in.size()));
  if (std::optional<std::vector<int64_t>> raw = raw_ints(ctx, 1))
    for (int64_t r : *raw)
      if (r < 0) ctx.fail("repeats must be >= 0, one is " + std::to_string(r));
  Dims out;
  for (size_t i = 0; i < in.size(); ++i) {
    const Dim& r = (*repeats)[i];
    if (r.known() && r.value == 1) {
      out.push_back(in[i]);
    } else if (r.known() && in[i].known()) {
      int64_t size = 0;
      try {
        size = checked_mul(in[i].value, r.value, "the tiled axis");
      } catch (const Error& error) {
        ctx.fail("axis " + std::to_string(i) + ": " + error.message());
      }
      out.push_back(Dim(size));
    } else if (in[i].known() && in[i].value == 1) {
      out.push_back(r);
    } else {
      out.push_back(Dim::unknown());
    }
  }
  ctx.set_output(0, dtype, out);
}

}  // namespace

KILN_REGISTER_OPS(expand) {
  registry.add({"Expand", "", 2, 2, 1, 1, infer_expand, nullptr, ""});
  registry.add({"Tile", "", 2, 2, 1, 1, infer_tile, nullptr, ""});
}

}  // namespace kiln::ir
