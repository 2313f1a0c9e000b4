// Schema of TensorScatter (opset 24): a key/value cache with `update` written into it along
// `axis` (default -2, never the batch axis 0), from write_indices[b] for batch b (default 0);
// mode "linear" (the rows must fit) or "circular" (they wrap around the cache's length).
#include "ir/op_schema.h"

namespace kiln::ir {

namespace {

void infer_tensor_scatter(InferContext& ctx) {
  const TensorType& cache = ctx.type(0);
  if (ctx.dtype(1) != cache.dtype) ctx.fail("update has type " + to_string(ctx.dtype(1)) + ", the cache " + to_string(cache.dtype));
  if (ctx.has_input(2) && ctx.dtype(2) != DType::kInt64) ctx.fail("write_indices must be int64");
  const std::string mode = ctx.node.attrs.get_string("mode", "linear");
  if (mode != "linear" && mode != "circular") ctx.fail("mode must be linear or circular, is '" + mode + "'");
  if (cache.shape) {
    const Dims& c = *cache.shape;
    const int64_t rank = static_cast<int64_t>(c.size());
    if (rank < 2) ctx.fail("the cache must have rank 2 or more ([batch, ..., sequence, ...])");
    const int64_t axis = normalize_axis(ctx, ctx.node.attrs.get_int("axis", -2), rank);
    if (axis == 0) ctx.fail("axis must not be the batch axis 0");
    if (ctx.shape_known(1)) {
      const Dims& u = ctx.shape(1);
      if (u.size() != c.size()) ctx.fail("update has shape " + dims_to_string(u) + ", the cache " + dims_to_string(c));
      for (size_t d = 0; d < c.size(); ++d) {
        if (!c[d].known() || !u[d].known()) continue;
        if (static_cast<int64_t>(d) == axis ? u[d].value > c[d].value : u[d].value != c[d].value)
          ctx.fail("update " + dims_to_string(u) + " does not fit the cache " + dims_to_string(c) + " along dim " + std::to_string(d));
      }
    }
    if (ctx.shape_known(2) && (ctx.shape(2).size() != 1 || (ctx.shape(2)[0].known() && c[0].known() && ctx.shape(2)[0] != c[0])))
      ctx.fail("write_indices must have shape [batch] = [" + c[0].str() + "], has " + dims_to_string(ctx.shape(2)));
  }
  ctx.set_output(0, cache.dtype, cache.shape);
}

}  // namespace

KILN_REGISTER_OPS(tensor_scatter) {
  OpSchema s;
  s.op = "TensorScatter";
  s.min_inputs = 2;
  s.max_inputs = 3;
  s.infer = infer_tensor_scatter;
  registry.add(std::move(s));
}

}  // namespace kiln::ir
