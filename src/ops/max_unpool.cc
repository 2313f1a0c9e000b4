// Schema of MaxUnpool (opset 11): X [N, C, spatial...] scattered by MaxPool's flat indices I
// into zeros of [N, C, out...], out = (in - 1) * stride + kernel - pads, then zero-padded at
// the end of each dim to the optional output_shape input (as ONNX's reference does).
#include "ops/max_unpool.h"

#include "ir/sizes.h"

namespace kiln::ir {

std::vector<int64_t> max_unpool_sizes(const Node& node, const std::vector<int64_t>& in) {
  auto fail = [&](const std::string& why) { throw Error(ErrorKind::kInvalidModel, why).node(node.name, node.op); };
  const size_t spatial = in.size();
  const std::vector<int64_t> kernel = node.attrs.get_ints("kernel_shape");
  const std::vector<int64_t> strides = node.attrs.get_ints("strides", std::vector<int64_t>(spatial, 1));
  const std::vector<int64_t> pads = node.attrs.get_ints("pads", std::vector<int64_t>(2 * spatial, 0));
  if (kernel.size() != spatial || strides.size() != spatial || pads.size() != 2 * spatial)
    fail("kernel_shape and strides need " + std::to_string(spatial) + " values and pads " + std::to_string(2 * spatial));
  std::vector<int64_t> out;
  for (size_t d = 0; d < spatial; ++d) {
    if (kernel[d] < 1 || strides[d] < 1 || pads[d] < 0 || pads[d + spatial] < 0)
      fail("kernel_shape and strides must be positive and pads not negative");
    if (in[d] < 0) {
      out.push_back(-1);
      continue;
    }
    const int64_t grown = checked_add(checked_mul(in[d] - 1, strides[d], "MaxUnpool's output size"), kernel[d],
                                      "MaxUnpool's output size");
    const int64_t size = checked_sub(grown, checked_add(pads[d], pads[d + spatial], "MaxUnpool's pads"), "MaxUnpool's output size");
    if (size < 0) fail("the pads leave a negative output size");
    out.push_back(size);
  }
  return out;
}

namespace {

void infer_max_unpool(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  if (ctx.dtype(1) != DType::kInt64) ctx.fail("the indices must be int64, are " + to_string(ctx.dtype(1)));
  if (!x.shape) {
    ctx.set_output(0, x.dtype, std::nullopt);
    return;
  }
  const Dims& s = *x.shape;
  if (s.size() < 3) ctx.fail("X must have rank 3 or more ([N, C, spatial...]), has " + dims_to_string(s));
  if (ctx.shape_known(1) && ctx.shape(1).size() != s.size())
    ctx.fail("the indices have shape " + dims_to_string(ctx.shape(1)) + ", X has " + dims_to_string(s));
  std::vector<int64_t> in;
  for (size_t d = 2; d < s.size(); ++d) in.push_back(s[d].known() ? s[d].value : -1);
  const std::vector<int64_t> sizes = max_unpool_sizes(ctx.node, in);
  Dims out{s[0], s[1]};
  for (int64_t v : sizes) out.push_back(v >= 0 ? Dim(v) : Dim::unknown());
  if (ctx.has_input(2)) {
    // The indices refer to the sizes above; output_shape only pads them at the end of each dim.
    const std::optional<Dims> shape = ctx.int_elements(2);
    if (!shape) {  // known when the engine runs (the CPU engine infers shapes again then)
      ctx.set_output(0, x.dtype, Dims(s.size(), Dim::unknown()));
      return;
    }
    if (shape->size() != s.size()) ctx.fail("output_shape " + dims_to_string(*shape) + " must have X's rank " + std::to_string(s.size()));
    for (size_t d = 0; d < shape->size(); ++d)
      if (!(*shape)[d].known() || (out[d].known() && (*shape)[d].value < out[d].value) ||
          (d < 2 && out[d].known() && (*shape)[d].value != out[d].value))
        ctx.fail("output_shape " + dims_to_string(*shape) + " must keep N and C and hold " + dims_to_string(out));
    out = *shape;
  }
  ctx.set_output(0, x.dtype, out);
}

}  // namespace

KILN_REGISTER_OPS(max_unpool) {
  OpSchema s;
  s.op = "MaxUnpool";
  s.min_inputs = 2;
  s.max_inputs = 3;
  s.infer = infer_max_unpool;
  s.limits = "GPU: no layer";
  registry.add(std::move(s));
}

}  // namespace kiln::ir
