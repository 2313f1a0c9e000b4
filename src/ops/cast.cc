// Schemas of Cast, CastLike, BitCast, Clip and Dropout: ops whose output has the input's shape.
#include "ir/op_schema.h"

namespace kiln::ir {

namespace {

void infer_cast(InferContext& ctx) {
  DType to;
  if (ctx.node.op == "CastLike") {
    to = ctx.dtype(1);
  } else {
    int64_t code = ctx.node.attrs.require_int("to");
    if (code > INT32_MAX || code < 0 || !is_known_dtype(static_cast<int32_t>(code)))
      ctx.unsupported("cannot cast to data type " + std::to_string(code));
    to = static_cast<DType>(code);
  }
  if (to == DType::kString || ctx.dtype(0) == DType::kString) ctx.unsupported("string tensors are not supported");
  ctx.set_output(0, to, ctx.type(0).shape);
  // Shape arithmetic often casts between int32 and int64: keep its known elements.
  if (is_integer(to) && is_integer(ctx.dtype(0)) && ctx.input_symbolic.size() && ctx.input_symbolic[0])
    ctx.set_symbolic(0, *ctx.input_symbolic[0]);
}

// BitCast: the same bits read as type `to`, which must have the input type's width.
void infer_bitcast(InferContext& ctx) {
  const int64_t code = ctx.node.attrs.require_int("to");
  if (code > INT32_MAX || code < 0 || !is_known_dtype(static_cast<int32_t>(code)))
    ctx.unsupported("cannot reinterpret as data type " + std::to_string(code));
  const DType to = static_cast<DType>(code), from = ctx.dtype(0);
  if (to == DType::kString || from == DType::kString) ctx.unsupported("string tensors are not supported");
  if (element_size(to) != element_size(from))
    ctx.fail("BitCast needs types of one width: " + to_string(from) + " has " + std::to_string(element_size(from) * 8) +
             " bits, " + to_string(to) + " " + std::to_string(element_size(to) * 8));
  ctx.set_output(0, to, ctx.type(0).shape);
}

void infer_clip(InferContext& ctx) {
  for (size_t i = 1; i < 3; ++i) {
    if (!ctx.has_input(i)) continue;
    if (ctx.dtype(i) != ctx.dtype(0))
      ctx.fail("input " + std::to_string(i) + " has type " + to_string(ctx.dtype(i)) + ", X has " + to_string(ctx.dtype(0)));
    if (ctx.shape_known(i) && !ctx.shape(i).empty() &&
        !(ctx.shape(i).size() == 1 && ctx.shape(i)[0].known() && ctx.shape(i)[0].value == 1))
      ctx.fail("input " + std::to_string(i) + " (min/max) must be a scalar, has shape " + dims_to_string(ctx.shape(i)));
  }
  ctx.set_output(0, ctx.dtype(0), ctx.type(0).shape);
}

void infer_dropout(InferContext& ctx) {
  if (const Tensor* training = ctx.value(2))
    if (training->numel() == 1 && training->value_as_int(0) != 0)
      ctx.unsupported("training_mode is true; kiln runs inference only (Dropout is the identity)");
  ctx.set_output(0, ctx.dtype(0), ctx.type(0).shape);
  ctx.set_output(1, DType::kBool, ctx.type(0).shape);
}

}  // namespace

KILN_REGISTER_OPS(cast) {
  {
    OpSchema s;
    s.op = "Cast";
    s.infer = infer_cast;
    s.limits = "no string types";
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "CastLike";
    s.min_inputs = s.max_inputs = 2;
    s.infer = infer_cast;
    s.limits = "no string types";
    registry.add(std::move(s));
  }
  registry.add({"BitCast", "", 1, 1, 1, 1, infer_bitcast, nullptr, "types of one width only (as ONNX asks)"});
  {
    OpSchema s;
    s.op = "Clip";
    s.min_inputs = 1;
    s.max_inputs = 3;
    s.infer = infer_clip;
    s.flops = [](const FlopsContext& c) { return FlopsContext::numel(c.output_types[0]); };
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "Dropout";
    s.min_inputs = 1;
    s.max_inputs = 3;
    s.max_outputs = 2;
    s.infer = infer_dropout;
    s.limits = "inference only: training_mode must be false";
    registry.add(std::move(s));
  }
}

}  // namespace kiln::ir
