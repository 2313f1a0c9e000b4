// Schema of MatMul (numpy matmul semantics).
#include "ops/linear.h"

namespace kiln::ir {

void infer_matmul(InferContext& ctx) {
  DType dt = ctx.dtype(0);
  if (ctx.dtype(1) != dt) ctx.fail("B has type " + to_string(ctx.dtype(1)) + " but A has " + to_string(dt));
  if (!ctx.shape_known(0) || !ctx.shape_known(1)) {
    ctx.set_output(0, dt, std::nullopt);
    return;
  }
  Dims a = ctx.shape(0);
  Dims b = ctx.shape(1);
  if (a.empty() || b.empty()) ctx.fail("MatMul operands must have rank >= 1, got " + dims_to_string(a) + " and " + dims_to_string(b));
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), Dim(1));
  if (b_vec) b.push_back(Dim(1));
  const Dim& ka = a[a.size() - 1];
  const Dim& kb = b[b.size() - 2];
  if (ka.known() && kb.known() && ka.value != kb.value)
    ctx.fail("inner dims differ: A " + dims_to_string(ctx.shape(0)) + " and B " + dims_to_string(ctx.shape(1)));
  Dims batch_a(a.begin(), a.end() - 2), batch_b(b.begin(), b.end() - 2);
  std::optional<Dims> batch = broadcast_dims(batch_a, batch_b);
  if (!batch)
    ctx.fail("batch dims of A " + dims_to_string(ctx.shape(0)) + " and B " + dims_to_string(ctx.shape(1)) + " do not broadcast");
  Dims out = *batch;
  if (!a_vec) out.push_back(a[a.size() - 2]);
  if (!b_vec) out.push_back(b[b.size() - 1]);
  ctx.set_output(0, dt, out);
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
  s.limits = "CPU: float32";
  registry.add(std::move(s));
}

}  // namespace kiln::ir
