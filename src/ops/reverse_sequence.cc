// Schema of ReverseSequence: the output has the input's shape; for each batch entry b the first
// sequence_lens[b] elements along time_axis are reversed.
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_reverse_sequence(InferContext& ctx) {
  if (ctx.dtype(1) != DType::kInt64) ctx.fail("sequence_lens must be int64");
  const int64_t batch_axis = ctx.node.attrs.get_int("batch_axis", 1), time_axis = ctx.node.attrs.get_int("time_axis", 0);
  if (!((batch_axis == 0 && time_axis == 1) || (batch_axis == 1 && time_axis == 0)))
    ctx.fail("batch_axis and time_axis must be 0 and 1 (either way round)");
  if (ctx.shape_known(0)) {
    const Dims& x = ctx.shape(0);
    if (x.size() < 2) ctx.fail("the input must have rank >= 2");
    if (ctx.shape_known(1)) {
      const Dims& lens = ctx.shape(1);
      const Dim& batch = x[static_cast<size_t>(batch_axis)];
      if (lens.size() != 1 || (lens[0].known() && batch.known() && lens[0].value != batch.value))
        ctx.fail("sequence_lens must have one element per batch entry");
    }
  }
  ctx.set_output(0, ctx.dtype(0), ctx.type(0).shape);
}

}  // namespace

KILN_REGISTER_OPS(reverse_sequence) {
  registry.add({"ReverseSequence", "", 2, 2, 1, 1, infer_reverse_sequence, nullptr, ""});
}

}  // namespace kiln::ir
