// Schema of Gemm: Y = alpha * op(A) @ op(B) + beta * C, op = optional transpose.
#include "ops/linear.h"

namespace kiln::ir {

namespace {
// True when dim `c` of C may broadcast to `target` (equal, 1, or not known yet).
bool broadcasts_to(const Dim& c, const Dim& target) {
  if (!c.known() || !target.known()) return true;
  return c.value == 1 || c.value == target.value;
}
}  // namespace

void infer_gemm(InferContext& ctx) {
  DType dt = ctx.dtype(0);
  if (ctx.dtype(1) != dt) ctx.fail("B has type " + to_string(ctx.dtype(1)) + " but A has " + to_string(dt));
  if (!ctx.shape_known(0) || !ctx.shape_known(1)) {
    ctx.set_output(0, dt, std::nullopt);
    return;
  }
  const Dims& a = ctx.shape(0);
  const Dims& b = ctx.shape(1);
  if (a.size() != 2) ctx.fail("A has shape " + dims_to_string(a) + "; Gemm takes a 2-D A");
  if (b.size() != 2) ctx.fail("B has shape " + dims_to_string(b) + "; Gemm takes a 2-D B");
  bool ta = ctx.node.attrs.get_int("transA", 0) != 0;
  bool tb = ctx.node.attrs.get_int("transB", 0) != 0;
  const Dim& m = ta ? a[1] : a[0];
  const Dim& ka = ta ? a[0] : a[1];
  const Dim& kb = tb ? b[1] : b[0];
  const Dim& n = tb ? b[0] : b[1];
  if (ka.known() && kb.known() && ka.value != kb.value)
    ctx.fail("inner dims differ: A " + dims_to_string(a) + (ta ? " (transposed)" : "") + " and B " + dims_to_string(b) +
             (tb ? " (transposed)" : ""));
  if (ctx.has_input(2)) {
    if (ctx.dtype(2) != dt) ctx.fail("C has type " + to_string(ctx.dtype(2)) + " but A has " + to_string(dt));
    if (ctx.shape_known(2)) {
      const Dims& c = ctx.shape(2);
      bool ok = c.size() <= 2;
      if (ok && c.size() == 2) ok = broadcasts_to(c[0], m) && broadcasts_to(c[1], n);
      if (ok && c.size() == 1) ok = broadcasts_to(c[0], n);
      if (!ok)
        ctx.fail("C has shape " + dims_to_string(c) + ", which does not broadcast to the output " + m.str() + "x" + n.str());
    }
  }
  ctx.set_output(0, dt, Dims{m, n});
}

int64_t gemm_flops(const FlopsContext& ctx) {
  const TensorType* a = ctx.input_types[0];
  if (!a || !a->shape || a->shape->size() != 2) return 0;
  bool ta = ctx.node.attrs.get_int("transA", 0) != 0;
  const Dim& k = ta ? (*a->shape)[0] : (*a->shape)[1];
  if (!k.known()) return 0;
  return 2 * FlopsContext::numel(ctx.output_types.empty() ? nullptr : ctx.output_types[0]) * k.value;
}

KILN_REGISTER_OPS(gemm) {
  OpSchema s;
  s.op = "Gemm";
  s.min_inputs = 2;
  s.max_inputs = 3;
  s.infer = infer_gemm;
  s.flops = gemm_flops;
  registry.add(std::move(s));
}

}  // namespace kiln::ir
