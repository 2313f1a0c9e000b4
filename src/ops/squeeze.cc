// Schemas of Squeeze and Unsqueeze (axes as an input, as since opset 13). Both keep a shape
// value's elements, so [N] <-> N stays symbolic through them.
#include <algorithm>

#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void pass_symbolic(InferContext& ctx) {
  if (std::optional<Dims> sv = ctx.int_elements(0)) ctx.set_symbolic(0, *sv);
}

void infer_squeeze(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims& in = ctx.shape(0);
  int64_t rank = static_cast<int64_t>(in.size());
  std::vector<bool> drop(in.size(), false);
  if (ctx.has_input(1)) {
    std::optional<std::vector<int64_t>> axes = known_ints(ctx, 1);
    if (!axes) {
      ctx.set_output(0, dtype, std::nullopt);
      return;
    }
    for (int64_t a : *axes) {
      size_t i = dim_axis(ctx, a, rank);
      if (drop[i]) ctx.fail("axis " + std::to_string(a) + " is listed twice");
      if (in[i].known() && in[i].value != 1)
        ctx.fail("cannot squeeze axis " + std::to_string(a) + " of shape " + dims_to_string(in) + ": its size is not 1");
      drop[i] = true;
    }
  } else {
    // Without axes every size-1 dim goes; a symbolic dim might be 1, so the result is unknown.
    for (size_t i = 0; i < in.size(); ++i) {
      if (!in[i].known()) {
        ctx.set_output(0, dtype, std::nullopt);
        return;
      }
      drop[i] = in[i].value == 1;
    }
  }
  Dims out;
  for (size_t i = 0; i < in.size(); ++i)
    if (!drop[i]) out.push_back(in[i]);
  ctx.set_output(0, dtype, out);
  pass_symbolic(ctx);
}

void infer_unsqueeze(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  std::optional<std::vector<int64_t>> axes = known_ints(ctx, 1);
  if (!ctx.shape_known(0) || !axes) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims& in = ctx.shape(0);
  int64_t out_rank = static_cast<int64_t>(in.size() + axes->size());
  std::vector<bool> inserted(static_cast<size_t>(out_rank), false);
  for (int64_t a : *axes) {
    size_t i = static_cast<size_t>(normalize_axis(ctx, a, out_rank));
    if (inserted[i]) ctx.fail("axis " + std::to_string(a) + " is listed twice");
    inserted[i] = true;
  }
  Dims out;
  size_t next = 0;
  for (size_t i = 0; i < inserted.size(); ++i) out.push_back(inserted[i] ? Dim(1) : in[next++]);
  ctx.set_output(0, dtype, out);
  pass_symbolic(ctx);
}

}  // namespace

KILN_REGISTER_OPS(squeeze) {
  registry.add({"Squeeze", "", 1, 2, 1, 1, infer_squeeze, nullptr, ""});
  registry.add({"Unsqueeze", "", 2, 2, 1, 1, infer_unsqueeze, nullptr, ""});
}

}  // namespace kiln::ir
