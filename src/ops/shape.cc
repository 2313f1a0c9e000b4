// Schemas of Shape and Size: their outputs are small int64 tensors computed from the input's
// shape, so they carry the (possibly symbolic) dims as the output's symbolic value.
#include <algorithm>

#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_shape(InferContext& ctx) {
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, DType::kInt64, Dims{Dim::unknown()});
    return;
  }
  const Dims& in = ctx.shape(0);
  int64_t rank = static_cast<int64_t>(in.size());
  // start/end (opset 15) are clamped, not checked: Shape(start=-10) of a 4-D tensor is all 4.
  auto clamp = [rank](int64_t v) {
    if (v < 0) v += rank;
    return std::clamp<int64_t>(v, 0, rank);
  };
  int64_t start = clamp(ctx.node.attrs.get_int("start", 0));
  int64_t end = clamp(ctx.node.attrs.get_int("end", rank));
  Dims value;
  for (int64_t i = start; i < end; ++i) value.push_back(in[static_cast<size_t>(i)]);
  ctx.set_output(0, DType::kInt64, Dims{Dim(static_cast<int64_t>(value.size()))});
  ctx.set_symbolic(0, std::move(value));
}

void infer_size(InferContext& ctx) {
  ctx.set_output(0, DType::kInt64, Dims{});
  if (ctx.shape_known(0)) {
    Dim n = dim_product(ctx.shape(0), 0, ctx.shape(0).size()).as_dim();
    ctx.set_symbolic(0, Dims{n});
  }
}

}  // namespace

KILN_REGISTER_OPS(shape) {
  registry.add({"Shape", "", 1, 1, 1, 1, infer_shape, nullptr, ""});
  registry.add({"Size", "", 1, 1, 1, 1, infer_size, nullptr, ""});
}

}  // namespace kiln::ir
