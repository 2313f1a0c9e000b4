// Schema of MatMul (numpy matmul semantics).
#include "ops/linear.h"

namespace kiln::ir {

void infer_matmul(InferContext& ctx) {
  DType dt = ctx.dtype(0);
  if (ctx.dtype(1) != dt) ctx.fail("B has type " + to_string(ctx.dtype(1)) + " but A has " + to_string(dt));
  ctx.set_output(0, dt, matmul_dims(ctx, 0, 1));
}

std::optional<Dims> matmul_dims(InferContext& ctx, size_t a_input, size_t b_input) {
  if (!ctx.shape_known(a_input) || !ctx.shape_known(b_input)) return std::nullopt;
  Dims a = ctx.shape(a_input);
  Dims b = ctx.shape(b_input);
  if (a.empty() || b.empty()) ctx.fail("matrix product operands must have rank >= 1, got " + dims_to_string(a) + " and " + dims_to_string(b));
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), Dim(1));
  if (b_vec) b.push_back(Dim(1));
  const Dim& ka = a[a.size() - 1];
  const Dim& kb = b[b.size() - 2];
  if (ka.known() && kb.known() && ka.value != kb.value)
    ctx.fail("inner dims differ: A " + dims_to_string(ctx.shape(a_input)) + " and B " + dims_to_string(ctx.shape(b_input)));
  Dims batch_a(a.begin(), a.end() - 2), batch_b(b.begin(), b.end() - 2);
  std::optional<Dims> batch = broadcast_dims(batch_a, batch_b);
  if (!batch)
    ctx.fail("batch dims of A " + dims_to_string(ctx.shape(a_input)) + " and B " + dims_to_string(ctx.shape(b_input)) + " do not broadcast");
  Dims out = *batch;
  if (!a_vec) out.push_back(a[a.size() - 2]);
  if (!b_vec) out.push_back(b[b.size() - 1]);
  return out;
}

int64_t matmul_flops(const FlopsContext& ctx) {
  const TensorType* a = ctx.input_types[0];
  if (!a || !a->shape || a->shape->empty()) return 0;
  const Dim& k = a->shape->back();
  if (!k.known()) return 0;
  return 2 * FlopsContext::numel(ctx.output_types.empty() ? nullptr : ctx.output_types[0]) * k.value;
}

KILN_REGISTER_OPS(matmul) {
  OpSchema s;
  s.op = "MatMul";
  s.min_inputs = 2;
  s.max_inputs = 2;
  s.infer = infer_matmul;
  s.flops = matmul_flops;
  registry.add(std::move(s));
}

}  // namespace kiln::ir
