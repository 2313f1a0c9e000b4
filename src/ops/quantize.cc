// Schemas of QuantizeLinear, DequantizeLinear (see quantize.h) and DynamicQuantizeLinear.
#include "ops/quantize.h"

#include <algorithm>
#include <cmath>

#include "ir/op_schema.h"
#include "ir/small_types.h"

namespace kiln::ir {

bool quantized_range(DType dtype, int64_t& lo, int64_t& hi) {
  switch (dtype) {
    case DType::kInt8: lo = -128, hi = 127; return true;
    case DType::kUInt8: lo = 0, hi = 255; return true;
    case DType::kInt16: lo = -32768, hi = 32767; return true;
    case DType::kUInt16: lo = 0, hi = 65535; return true;
    case DType::kInt4: case DType::kUInt4: case DType::kInt2: case DType::kUInt2: sub_byte_range(dtype, lo, hi); return true;
    default: return false;
  }
}

QuantizeAxis quantize_axis(const Node& node, const std::vector<int64_t>& x, int64_t scale_numel) {
  QuantizeAxis q;
  if (scale_numel == 1) return q;
  const int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = node.attrs.get_int("axis", 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank)
    throw node.error(ErrorKind::kInvalidModel, "axis " + std::to_string(node.attrs.get_int("axis", 1)) +
                                                   " is out of range for an input of rank " + std::to_string(rank));
  if (x[static_cast<size_t>(axis)] != scale_numel)
    throw node.error(ErrorKind::kInvalidModel, "the scale has " + std::to_string(scale_numel) + " values; axis " +
                                                   std::to_string(axis) + " of the input has " +
                                                   std::to_string(x[static_cast<size_t>(axis)]));
  q.channels = scale_numel;
  for (int64_t d = axis + 1; d < rank; ++d) q.inner *= x[static_cast<size_t>(d)];
  return q;
}

QuantizeAxis quantize_layout(const Node& node, const std::vector<int64_t>& x, const std::vector<int64_t>& scale) {
  const int64_t block = node.attrs.get_int("block_size", 0);
  if (block == 0) return quantize_axis(node, x, shape_numel(scale));
  auto fail = [&](const std::string& why) { throw node.error(ErrorKind::kInvalidModel, why); };
  if (block < 0) fail("block_size must be positive, is " + std::to_string(block));
  const int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = node.attrs.get_int("axis", 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank)
    fail("axis " + std::to_string(node.attrs.get_int("axis", 1)) + " is out of range for an input of rank " + std::to_string(rank));
  QuantizeAxis q;
  q.channels = x[static_cast<size_t>(axis)];
  q.block = block;
  q.blocks = q.channels / block + (q.channels % block != 0);
  std::vector<int64_t> want = x;
  want[static_cast<size_t>(axis)] = q.blocks;
  if (scale != want)
    fail("with block_size " + std::to_string(block) + " on axis " + std::to_string(axis) + ", the scale must have shape " +
         shape_to_string(want) + ", has " + shape_to_string(scale));
  for (int64_t d = axis + 1; d < rank; ++d) q.inner *= x[static_cast<size_t>(d)];
  if (q.channels == 0) q.channels = 1;  // an empty input: no element asks for an index
  return q;
}

namespace {

void check_scale(InferContext& ctx) {
  if (ctx.dtype(1) != DType::kFloat32)
    ctx.unsupported("scale of type " + to_string(ctx.dtype(1)) + " is not supported (float32 only)");
  if (ctx.node.attrs.get_int("block_size", 0) != 0) {
    // Blocked: the scale has the input's rank; the zero point, the scale's shape.
    if (ctx.shape_known(0) && ctx.shape_known(1) && all_known(ctx.shape(0)) && all_known(ctx.shape(1)))
      quantize_layout(ctx.node, known_values(ctx.shape(0)), known_values(ctx.shape(1)));
    if (ctx.has_input(2) && ctx.shape_known(2) && ctx.shape_known(1) && ctx.shape(2) != ctx.shape(1))
      ctx.fail("the zero point's shape differs from the scale's");
    return;
  }
  if (ctx.shape_known(1) && ctx.shape(1).size() > 1)
    ctx.fail("the scale must be a scalar or 1-D (per channel), has rank " + std::to_string(ctx.shape(1).size()));
  // A scalar and a one-element 1-D tensor are the same per-tensor parameter (ONNX's own float8
  // test cases pair them).
  auto one_element = [&](size_t i) {
    const Dims& d = ctx.shape(i);
    return d.empty() || (d.size() == 1 && d[0].known() && d[0].value == 1);
  };
  if (ctx.has_input(2) && ctx.shape_known(2) && ctx.shape_known(1) && ctx.shape(2).size() != ctx.shape(1).size() &&
      !(one_element(1) && one_element(2)))
    ctx.fail("the zero point's shape differs from the scale's");
}

void infer_quantize(InferContext& ctx) {
  check_scale(ctx);
  if (ctx.dtype(0) != DType::kFloat32)
    ctx.unsupported("input of type " + to_string(ctx.dtype(0)) + " is not supported (float32 only)");
  DType to = DType::kUInt8;
  if (ctx.has_input(2)) {
    to = ctx.dtype(2);
  } else if (int64_t code = ctx.node.attrs.get_int("output_dtype", 0); code != 0) {
    if (code < 0 || code > INT32_MAX || !is_known_dtype(static_cast<int32_t>(code)))
      ctx.unsupported("cannot quantize to data type " + std::to_string(code));
    to = static_cast<DType>(code);
  }
  int64_t lo, hi;
  if (!quantized_range(to, lo, hi) && !is_small_float(to))
    ctx.unsupported("quantizing to " + to_string(to) +
                    " is not supported (int2..int16, uint2..uint16, the float8 types, float4e2m1)");
  ctx.set_output(0, to, ctx.type(0).shape);
}

void infer_dequantize(InferContext& ctx) {
  check_scale(ctx);
  int64_t lo, hi;
  if (!quantized_range(ctx.dtype(0), lo, hi) && ctx.dtype(0) != DType::kInt32 && !is_small_float(ctx.dtype(0)))
    ctx.unsupported("dequantizing " + to_string(ctx.dtype(0)) +
                    " is not supported (int2..int32, uint2..uint16, the float8 types, float4e2m1)");
  if (ctx.has_input(2) && ctx.dtype(2) != ctx.dtype(0))
    ctx.fail("the zero point has type " + to_string(ctx.dtype(2)) + ", the input " + to_string(ctx.dtype(0)));
  ctx.set_output(0, DType::kFloat32, ctx.type(0).shape);
}

int64_t elementwise_flops(const FlopsContext& c) { return 2 * FlopsContext::numel(c.output_types[0]); }

// DynamicQuantizeLinear: x float32 -> y uint8 (x's shape), its scale (float32) and zero point
// (uint8), both scalars, from x's range widened to include 0.
void infer_dynamic_quantize(InferContext& ctx) {
  if (ctx.dtype(0) != DType::kFloat32) ctx.fail("x must be float32");
  ctx.set_output(0, DType::kUInt8, ctx.type(0).shape);
  ctx.set_output(1, DType::kFloat32, Dims{});
  ctx.set_output(2, DType::kUInt8, Dims{});
}

}  // namespace

KILN_REGISTER_OPS(quantize) {
  for (const char* op : {"QuantizeLinear", "DequantizeLinear"}) {
    OpSchema s;
    s.op = op;
    s.min_inputs = 2;
    s.max_inputs = 3;
    s.infer = std::string(op) == "QuantizeLinear" ? infer_quantize : infer_dequantize;
    s.flops = elementwise_flops;
    s.limits = "float32 data and scales; int8, uint8, int16, uint16, float8e4m3fn (and int32 for Dequantize); GPU: no block_size";
    registry.add(std::move(s));
  }
  registry.add({"DynamicQuantizeLinear", "", 1, 1, 3, 3, infer_dynamic_quantize, elementwise_flops, ""});
}

namespace {
// scales[c] = max|row c| / largest (1 for an all-zero row).
void per_channel_scales(const float* w, int64_t count, int64_t channels, int64_t inner, float largest, float* scales) {
  std::fill(scales, scales + channels, 0.f);
  for (int64_t i = 0; i < count; ++i) {
    float& s = scales[(i / inner) % channels];
    s = std::max(s, std::fabs(w[i]));
  }
  for (int64_t c = 0; c < channels; ++c) scales[c] = scales[c] > 0 ? scales[c] / largest : 1.f;
}
}  // namespace

void quantize_per_channel(const float* w, int64_t count, int64_t channels, int64_t inner, int8_t* q, float* scales) {
  per_channel_scales(w, count, channels, inner, 127.f, scales);
  for (int64_t i = 0; i < count; ++i)
    q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(w[i] / scales[(i / inner) % channels]), -127.f, 127.f));
}

void quantize_per_channel_float8(const float* w, int64_t count, int64_t channels, int64_t inner, uint8_t* q, float* scales) {
  per_channel_scales(w, count, channels, inner, 448.f, scales);
  for (int64_t i = 0; i < count; ++i) q[i] = float_to_float8e4m3fn(w[i] / scales[(i / inner) % channels]);
}

}  // namespace kiln::ir
