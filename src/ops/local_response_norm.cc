// Schema of LRN, local response normalization across channels:
//   y[n, c, ...] = x[n, c, ...] / (bias + alpha / size * sum of x[n, c', ...]^2)^beta
// over c' from c - floor((size - 1) / 2) to c + ceil((size - 1) / 2), within [0, C).
#include <algorithm>

#include "ir/op_schema.h"

namespace kiln::ir {

namespace {

void infer_lrn(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  const int64_t size = ctx.node.attrs.require_int("size");
  if (size < 1) ctx.fail("size must be at least 1, is " + std::to_string(size));
  if (x.shape && x.shape->size() < 2) ctx.fail("input must have rank 2 or more ([N, C, ...])");
  ctx.set_output(0, x.dtype, x.shape);
}

}  // namespace

KILN_REGISTER_OPS(local_response_norm) {
  OpSchema s;
  s.op = "LRN";
  s.infer = infer_lrn;
  s.flops = [](const FlopsContext& c) {
    return FlopsContext::numel(c.input_types[0]) * (2 * std::min<int64_t>(c.node.attrs.get_int("size", 1), 1 << 20) + 4);
  };
  registry.add(std::move(s));
}

}  // namespace kiln::ir
