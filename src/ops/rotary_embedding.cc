// Schema of RotaryEmbedding (opset 23): input [batch, heads, seq, head_size] or
// [batch, seq, heads * head_size] (num_heads given), cos_cache and sin_cache [max_pos, rot / 2]
// indexed by position_ids [batch, seq], or [batch, seq, rot / 2] without them. The output has the
// input's shape.
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_rotary_embedding(InferContext& ctx) {
  const DType dtype = ctx.dtype(0);
  if (ctx.dtype(1) != dtype || ctx.dtype(2) != dtype) ctx.fail("the caches must have the input's type");
  if (ctx.has_input(3) && ctx.dtype(3) != DType::kInt64) ctx.fail("position_ids must be int64");
  if (ctx.shape_known(0)) {
    const size_t rank = ctx.shape(0).size();
    if (rank != 3 && rank != 4) ctx.fail("the input must have rank 3 or 4");
    if (rank == 3 && ctx.node.attrs.get_int("num_heads", 0) <= 0) ctx.fail("a 3-D input needs num_heads");
  }
  if (ctx.shape_known(1) && ctx.shape(1).size() != (ctx.has_input(3) ? 2u : 3u))
    ctx.fail(ctx.has_input(3) ? "with position_ids the caches must have rank 2" : "without position_ids the caches must have rank 3");
  ctx.set_output(0, dtype, ctx.type(0).shape);
}

}  // namespace

KILN_REGISTER_OPS(rotary_embedding) {
  registry.add({"RotaryEmbedding", "", 3, 4, 1, 1, infer_rotary_embedding, nullptr, ""});
}

}  // namespace kiln::ir
