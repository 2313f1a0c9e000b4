// Schemas of Softmax, LogSoftmax, Hardmax, LayerNormalization, RMSNormalization, InstanceNormalization,
// GroupNormalization (opset 21: scale and bias per channel), MeanVarianceNormalization and
// LpNormalization. Softmax (and Hardmax) here has opset 13's per-axis meaning; the importer rewrites the
// older "flatten to 2-D at axis" form.
//
// And kiln's fused form of the channel-group normalizations (passes/fuse_group_norm.cc makes it):
//   kiln::FusedGroupNorm(X, scale, bias) -> Y
//     GroupNormalization of opset 21 (statistics over each group of C / num_groups channels and
//     the spatial dims; scale and bias per channel [C]), then the activation of
//     src/ir/activation.h. InstanceNormalization is num_groups = C.
//     Attributes: num_groups (int), epsilon (float, 1e-5), activation, activation_alpha,
//     activation_beta; members (strings: the nodes it replaced, for inspection).
//     Y = act((X - mean) / sqrt(var + epsilon) * scale[c] + bias[c])
//
// And a LayerNormalization that also writes its output quantized, for the 8-bit product that
// reads it (passes/fuse_layer_norm_quantize.cc makes it in INT8 and FP8 builds):
//   kiln::QuantizingLayerNorm(X, Scale, B, y_scale, y_zero_point) -> (Y, Q)
//     Y as LayerNormalization's (axis, epsilon; B may be absent, "") and Q =
//     QuantizeLinear(Y, y_scale, y_zero_point) per tensor (y_scale one float32, y_zero_point one
//     int8 or float8e4m3fn value; saturate as QuantizeLinear's, for float8e4m3fn), quantized
//     from Y's float32 value. Y may be absent ("") when only Q is read.
#include "ir/activation.h"
#include "ir/op_schema.h"

namespace kiln::ir {

namespace {

void infer_softmax(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  if (x.shape) normalize_axis(ctx, ctx.node.attrs.get_int("axis", -1), static_cast<int64_t>(x.shape->size()));
  if (ctx.node.op == "LpNormalization") {
    int64_t p = ctx.node.attrs.get_int("p", 2);
    if (p != 1 && p != 2) ctx.fail("p must be 1 or 2, is " + std::to_string(p));
  }
  ctx.set_output(0, x.dtype, x.shape);
}

// Checks that a per-channel / per-feature parameter broadcasts to `target`.
void check_param(InferContext& ctx, size_t i, const Dims& target, const char* what) {
  if (!ctx.has_input(i)) return;
  if (ctx.dtype(i) != ctx.dtype(0))
    ctx.fail(std::string(what) + " has type " + to_string(ctx.dtype(i)) + ", X has " + to_string(ctx.dtype(0)));
  if (!ctx.shape_known(i)) return;
  // Unidirectional: the parameter may only stretch to the target, never widen it.
  std::optional<Dims> b = broadcast_dims(target, ctx.shape(i));
  bool widens = !b || b->size() != target.size();
  for (size_t d = 0; b && !widens && d < target.size(); ++d)
    widens = (*b)[d].known() && target[d].known() && (*b)[d].value != target[d].value;
  if (widens)
    ctx.fail(std::string(what) + " shape " + dims_to_string(ctx.shape(i)) + " does not broadcast to " + dims_to_string(target));
}

void infer_layer_norm(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  if (!x.shape) {
    ctx.set_output(0, x.dtype, std::nullopt);
    return;
  }
  const Dims& dims = *x.shape;
  int64_t axis = normalize_axis(ctx, ctx.node.attrs.get_int("axis", -1), static_cast<int64_t>(dims.size()));
  Dims normalized(dims.begin() + axis, dims.end());
  check_param(ctx, 1, normalized, "Scale");
  check_param(ctx, 2, normalized, "B");
  ctx.set_output(0, x.dtype, dims);
  // Mean and InvStdDev: X's shape with the normalized dims set to 1.
  Dims stats(dims.begin(), dims.begin() + axis);
  stats.resize(dims.size(), Dim(1));
  DType stash = static_cast<DType>(ctx.node.attrs.get_int("stash_type", 1));
  ctx.set_output(1, stash, stats);
  ctx.set_output(2, stash, stats);
}

void infer_quantizing_layer_norm(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  if (!ctx.has_input(3) || !ctx.has_input(4)) ctx.fail("y_scale and y_zero_point are required");
  if (ctx.dtype(3) != DType::kFloat32) ctx.fail("y_scale must be float32, is " + to_string(ctx.dtype(3)));
  const DType q = ctx.dtype(4);
  if (q != DType::kInt8 && q != DType::kFloat8E4M3FN)
    ctx.fail("y_zero_point must be int8 or float8e4m3fn, is " + to_string(q));
  for (size_t i : {size_t{3}, size_t{4}})
    if (ctx.shape_known(i) && !ctx.shape(i).empty() && !(ctx.shape(i).size() == 1 && ctx.shape(i)[0].known() && ctx.shape(i)[0].value == 1))
      ctx.fail(std::string(i == 3 ? "y_scale" : "y_zero_point") + " must hold one value (per tensor), has shape " +
               dims_to_string(ctx.shape(i)));
  if (!x.shape) {
    ctx.set_output(0, x.dtype, std::nullopt);
    ctx.set_output(1, q, std::nullopt);
    return;
  }
  const Dims& dims = *x.shape;
  const int64_t axis = normalize_axis(ctx, ctx.node.attrs.get_int("axis", -1), static_cast<int64_t>(dims.size()));
  Dims normalized(dims.begin() + axis, dims.end());
  check_param(ctx, 1, normalized, "Scale");
  check_param(ctx, 2, normalized, "B");
  ctx.set_output(0, x.dtype, dims);
  ctx.set_output(1, q, dims);
}

// RMSNormalization (opset 23): X / sqrt(mean(X^2 over the axes from `axis` on) + epsilon) * scale.
void infer_rms_norm(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  if (ctx.dtype(1) != x.dtype) ctx.fail("scale must have X's type");
  if (x.shape) {
    const Dims& dims = *x.shape;
    const int64_t axis = normalize_axis(ctx, ctx.node.attrs.get_int("axis", -1), static_cast<int64_t>(dims.size()));
    check_param(ctx, 1, Dims(dims.begin() + axis, dims.end()), "scale");
  }
  ctx.set_output(0, x.dtype, x.shape);
}

void infer_instance_norm(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  if (x.shape) {
    if (x.shape->size() < 3) ctx.fail("input must have rank 3 or more ([N, C, spatial...])");
    Dims c = {(*x.shape)[1]};
    for (size_t i = 1; i < 3; ++i) {
      if (ctx.dtype(i) != x.dtype) ctx.fail("input " + std::to_string(i) + " has type " + to_string(ctx.dtype(i)));
      if (ctx.shape_known(i) && (ctx.shape(i).size() != 1 || (ctx.shape(i)[0].known() && c[0].known() && ctx.shape(i)[0] != c[0])))
        ctx.fail("input " + std::to_string(i) + " must have shape [C] = [" + c[0].str() + "], has " + dims_to_string(ctx.shape(i)));
    }
  }
  ctx.set_output(0, x.dtype, x.shape);
}

void infer_group_norm(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  const int64_t groups = ctx.node.attrs.require_int("num_groups");
  if (groups < 1) ctx.fail("num_groups must be at least 1, is " + std::to_string(groups));
  if (x.shape) {
    if (x.shape->size() < 2) ctx.fail("input must have rank 2 or more ([N, C, ...])");
    const Dim& c = (*x.shape)[1];
    if (c.known() && c.value % groups != 0)
      ctx.fail(std::to_string(c.value) + " channels do not split into " + std::to_string(groups) + " groups");
    for (size_t i = 1; i < 3; ++i) {
      if (ctx.dtype(i) != x.dtype) ctx.fail("input " + std::to_string(i) + " has type " + to_string(ctx.dtype(i)));
      if (ctx.shape_known(i) && (ctx.shape(i).size() != 1 || (ctx.shape(i)[0].known() && c.known() && ctx.shape(i)[0] != c)))
        ctx.fail("input " + std::to_string(i) + " must have shape [C] = [" + c.str() + "], has " + dims_to_string(ctx.shape(i)));
    }
  }
  ctx.set_output(0, x.dtype, x.shape);
}

void infer_fused_group_norm(InferContext& ctx) {
  const std::string activation = ctx.node.attrs.get_string("activation", "");
  if (!Activation::is_known(activation)) ctx.unsupported("unknown activation '" + activation + "'");
  infer_group_norm(ctx);
}

void infer_mean_variance_norm(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  if (x.shape) {
    const int64_t rank = static_cast<int64_t>(x.shape->size());
    if (rank == 0) ctx.fail("the input is a scalar; axes need rank 1 or more");
    std::vector<bool> seen(static_cast<size_t>(rank), false);
    for (int64_t a : ctx.node.attrs.get_ints("axes", {0, 2, 3})) {
      const int64_t axis = normalize_axis(ctx, a, rank);
      if (seen[static_cast<size_t>(axis)]) ctx.fail("axis " + std::to_string(a) + " appears twice in axes");
      seen[static_cast<size_t>(axis)] = true;
    }
  }
  ctx.set_output(0, x.dtype, x.shape);
}

int64_t elementwise_flops(const FlopsContext& c, int64_t per_element) {
  return FlopsContext::numel(c.input_types[0]) * per_element;
}

}  // namespace

KILN_REGISTER_OPS(normalization) {
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax", "LpNormalization"}) {
    OpSchema s;
    s.op = op;
    s.infer = infer_softmax;
    s.flops = [](const FlopsContext& c) { return elementwise_flops(c, 5); };
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "LayerNormalization";
    s.min_inputs = 2;
    s.max_inputs = 3;
    s.max_outputs = 3;
    s.infer = infer_layer_norm;
    s.flops = [](const FlopsContext& c) { return elementwise_flops(c, 8); };
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "QuantizingLayerNorm";
    s.domain = "kiln";
    s.min_inputs = 2;  // B (input 2) may be absent; infer requires y_scale and y_zero_point
    s.max_inputs = 5;
    s.min_outputs = s.max_outputs = 2;
    s.infer = infer_quantizing_layer_norm;
    s.flops = [](const FlopsContext& c) { return elementwise_flops(c, 10); };
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "RMSNormalization";
    s.min_inputs = s.max_inputs = 2;
    s.infer = infer_rms_norm;
    s.flops = [](const FlopsContext& c) { return elementwise_flops(c, 4); };
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "InstanceNormalization";
    s.min_inputs = s.max_inputs = 3;
    s.infer = infer_instance_norm;
    s.flops = [](const FlopsContext& c) { return elementwise_flops(c, 8); };
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "GroupNormalization";
    s.min_inputs = s.max_inputs = 3;
    s.infer = infer_group_norm;
    s.flops = [](const FlopsContext& c) { return elementwise_flops(c, 8); };
    s.limits = "opset 21's form (scale and bias per channel; opset 18's per-group form is refused)";
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "FusedGroupNorm";
    s.domain = "kiln";
    s.min_inputs = s.max_inputs = 3;
    s.infer = infer_fused_group_norm;
    s.flops = [](const FlopsContext& c) { return elementwise_flops(c, 9); };
    registry.add(std::move(s));
  }
  {
    OpSchema s;
    s.op = "MeanVarianceNormalization";
    s.infer = infer_mean_variance_norm;
    s.flops = [](const FlopsContext& c) { return elementwise_flops(c, 6); };
    registry.add(std::move(s));
  }
}

}  // namespace kiln::ir
