// Schemas of TopK and of small ops without a family: Trilu, CumSum, CumProd, OneHot, NonZero.
// NonZero's length depends on the data: unknown at build time, computed at run time.
#include "ops/non_zero.h"
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_topk(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  if (ctx.dtype(1) != DType::kInt64) ctx.fail("K must be int64");
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dtype, std::nullopt);
    ctx.set_output(1, DType::kInt64, std::nullopt);
    return;
  }
  Dims out = ctx.shape(0);
  int64_t axis = static_cast<int64_t>(dim_axis(ctx, ctx.node.attrs.get_int("axis", -1), static_cast<int64_t>(out.size())));
  Dim& d = out[static_cast<size_t>(axis)];
  if (const Tensor* kt = ctx.value(1); kt && kt->numel() != 1) ctx.fail("K must have exactly one element");
  std::optional<Dims> k = ctx.int_elements(1);
  if (k && k->size() == 1) {
    const Dim& kd = (*k)[0];
    if (kd.known() && d.known() && kd.value > d.value)
      ctx.fail("K = " + std::to_string(kd.value) + " exceeds axis size " + std::to_string(d.value));
    if (const Tensor* kt = ctx.value(1); kt && kt->value_as_int(0) < 0) ctx.fail("K must be >= 0");
    d = kd;
  } else {
    d = Dim::unknown();
  }
  ctx.set_output(0, dtype, out);
  ctx.set_output(1, DType::kInt64, out);
}

void infer_trilu(InferContext& ctx) {
  if (ctx.shape_known(0) && ctx.shape(0).size() < 2) ctx.fail("the input must have rank >= 2");
  ctx.set_output(0, ctx.dtype(0), ctx.type(0).shape);
}

void infer_cumsum(InferContext& ctx) {
  if (ctx.dtype(1) != DType::kInt64 && ctx.dtype(1) != DType::kInt32) ctx.fail("axis must be int32 or int64");
  ctx.set_output(0, ctx.dtype(0), ctx.type(0).shape);
}

void infer_one_hot(InferContext& ctx) {
  DType dtype = ctx.dtype(2);
  if (const Tensor* v = ctx.value(2); v && v->numel() != 2) ctx.fail("values must have 2 elements (off, on)");
  if (ctx.shape_known(2) && ctx.shape(2).size() == 1 && ctx.shape(2)[0].known() && ctx.shape(2)[0].value != 2)
    ctx.fail("values must have 2 elements (off, on)");
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  Dims out = ctx.shape(0);
  int64_t rank = static_cast<int64_t>(out.size()) + 1;
  int64_t axis = normalize_axis(ctx, ctx.node.attrs.get_int("axis", -1), rank);
  Dim depth = Dim::unknown();
  if (const Tensor* t = ctx.value(1)) {
    if (t->numel() != 1) ctx.fail("depth must have one element");
    double dv = t->value_as_double(0);
    if (!(dv >= 1) || dv > 1e12) ctx.fail("depth must be >= 1");
    int64_t v = static_cast<int64_t>(dv);
    depth = Dim(v);
  } else if (std::optional<Dims> e = ctx.int_elements(1); e && e->size() == 1) {
    depth = (*e)[0];
  }
  out.insert(out.begin() + axis, depth);
  ctx.set_output(0, dtype, out);
}

void infer_non_zero(InferContext& ctx) {
  Dim rank = ctx.shape_known(0) ? Dim(static_cast<int64_t>(ctx.shape(0).size())) : Dim::unknown();
  Dim count = Dim::unknown();
  if (const Tensor* t = ctx.value(0)) count = Dim(count_nonzero(*t));
  ctx.set_output(0, DType::kInt64, Dims{rank, count});
}

}  // namespace

KILN_REGISTER_OPS(topk) {
  registry.add({"TopK", "", 2, 2, 2, 2, infer_topk, nullptr, ""});
  registry.add({"Trilu", "", 1, 2, 1, 1, infer_trilu, nullptr, ""});
  registry.add({"CumSum", "", 2, 2, 1, 1, infer_cumsum, nullptr, ""});
  registry.add({"CumProd", "", 2, 2, 1, 1, infer_cumsum, nullptr, ""});
  registry.add({"OneHot", "", 3, 3, 1, 1, infer_one_hot, nullptr, ""});
  registry.add({"NonZero", "", 1, 1, 1, 1, infer_non_zero, nullptr,
                "output length depends on the data: unknown when building, known when run"});
}

}  // namespace kiln::ir
