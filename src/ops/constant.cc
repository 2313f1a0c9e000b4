// Schemas of ops that generate tensors: ConstantOfShape, EyeLike and Range. Their output
// shapes come from int_elements (ConstantOfShape) or the values (Range), so ConstantOfShape of
// a symbolic shape and Range(0, N, 1) keep the symbol.
#include <cmath>

#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_constant_of_shape(InferContext& ctx) {
  const Tensor* value = ctx.node.attrs.get_tensor("value");
  if (value && value->numel() != 1) ctx.fail("value must have exactly one element");
  DType dtype = value ? value->dtype() : DType::kFloat32;
  if (ctx.dtype(0) != DType::kInt64) ctx.fail("the shape input must be int64");
  std::optional<Dims> shape = ctx.int_elements(0);
  if (!shape) {
    if (ctx.shape_known(0) && ctx.shape(0).size() == 1 && ctx.shape(0)[0].known())
      ctx.set_output(0, dtype, unknown_dims(ctx, ctx.shape(0)[0].value));
    else
      ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  if (std::optional<std::vector<int64_t>> raw = raw_ints(ctx, 0))
    for (int64_t d : *raw)
      if (d < 0) ctx.fail("the shape has a negative dimension " + std::to_string(d));
  ctx.set_output(0, dtype, *shape);
  // A small int64 vector of ones (exporters build Expand shapes that way) stays a shape value.
  if (shape->size() == 1 && (*shape)[0].known() && (*shape)[0].value <= 64 && is_integer(dtype)) {
    int64_t v = value ? value->value_as_int(0) : 0;
    ctx.set_symbolic(0, Dims(static_cast<size_t>((*shape)[0].value), Dim(v)));
  }
}

void infer_eye_like(InferContext& ctx) {
  DType dtype = ctx.node.attrs.has("dtype") ? static_cast<DType>(ctx.node.attrs.get_int("dtype", 1)) : ctx.dtype(0);
  if (element_size(dtype) == 0) ctx.unsupported("dtype " + to_string(dtype) + " is not supported");
  if (ctx.shape_known(0) && ctx.shape(0).size() != 2) ctx.fail("the input must be 2-D");
  ctx.set_output(0, dtype, ctx.type(0).shape);
}

// Range's length: max(ceil((limit - start) / delta), 0).
void infer_range(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  if (ctx.dtype(1) != dtype || ctx.dtype(2) != dtype) ctx.fail("start, limit and delta must have the same type");
  // A scalar, or one value in a 1-D tensor (as ONNX Runtime takes it); a 1-D length not known yet
  // is checked when the run knows it.
  for (size_t i = 0; i < 3; ++i)
    if (ctx.shape_known(i) &&
        !(ctx.shape(i).empty() || (ctx.shape(i).size() == 1 && (ctx.shape(i)[0] == Dim(1) || !ctx.shape(i)[0].known()))))
      ctx.fail("input " + std::to_string(i) + " must be a scalar");
  const Tensor *s = ctx.value(0), *l = ctx.value(1), *d = ctx.value(2);
  if (s && l && d) {
    if (d->value_as_double(0) == 0) ctx.fail("delta is 0");
    int64_t n;
    if (is_integer(dtype)) {
      const int64_t a = s->value_as_int(0), b = l->value_as_int(0), c = d->value_as_int(0);
      // ceil((b - a) / c) without overflow: the values come from the model or the caller, and
      // b - a of two int64 values needs 65 bits. In magnitudes, where the signs agree.
      n = 0;
      if (b != a && (b > a) == (c > 0)) {
        const uint64_t span = b > a ? static_cast<uint64_t>(b) - static_cast<uint64_t>(a)
                                    : static_cast<uint64_t>(a) - static_cast<uint64_t>(b);
        const uint64_t step = c > 0 ? static_cast<uint64_t>(c) : 0 - static_cast<uint64_t>(c);
        const uint64_t count = span / step + (span % step != 0);
        if (count > static_cast<uint64_t>(kMaxTensorBytes)) ctx.fail("the range has " + std::to_string(count) + " elements");
        n = static_cast<int64_t>(count);
      }
    } else {
      double len = std::ceil((l->value_as_double(0) - s->value_as_double(0)) / d->value_as_double(0));
      if (!std::isfinite(len) || len > 1e15) ctx.fail("the range's length is not a finite size");
      n = len > 0 ? static_cast<int64_t>(len) : 0;  // a range running away from its limit is empty
    }
    n = std::max<int64_t>(n, 0);
    ctx.set_output(0, dtype, Dims{Dim(n)});
    if (is_integer(dtype) && n <= 64) {
      Dims value;
      for (int64_t i = 0; i < n; ++i) value.push_back(Dim(s->value_as_int(0) + i * d->value_as_int(0)));
      ctx.set_symbolic(0, std::move(value));
    }
    return;
  }
  // Range(0, N, 1) has N elements, whatever N is.
  std::optional<Dims> se = ctx.int_elements(0), le = ctx.int_elements(1), de = ctx.int_elements(2);
  if (se && le && de && se->size() == 1 && de->size() == 1 && le->size() == 1 && (*se)[0] == Dim(0) && (*de)[0] == Dim(1)) {
    ctx.set_output(0, dtype, Dims{(*le)[0]});
    return;
  }
  ctx.set_output(0, dtype, Dims{Dim::unknown()});
}

}  // namespace

KILN_REGISTER_OPS(constant) {
  registry.add({"ConstantOfShape", "", 1, 1, 1, 1, infer_constant_of_shape, nullptr, ""});
  registry.add({"EyeLike", "", 1, 1, 1, 1, infer_eye_like, nullptr, ""});
  registry.add({"Range", "", 3, 3, 1, 1, infer_range, nullptr, ""});
}

}  // namespace kiln::ir
