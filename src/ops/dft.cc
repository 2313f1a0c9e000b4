// Schemas of DFT (opset 20; older forms are converted by the importer): the discrete Fourier
// transform along one axis of a real ([..., 1]) or complex ([..., 2]) signal; inverse, and
// onesided (forward: the first length / 2 + 1 frequencies; inverse: from them, a real signal);
// and of STFT (opset 17): DFTs of a signal's windowed frames.
#include "ops/dft.h"

namespace kiln::ir {

DftParams dft_params(const Node& node, const std::vector<int64_t>& shape, std::optional<int64_t> length,
                     std::optional<int64_t> axis) {
  auto fail = [&](const std::string& why) { throw Error(ErrorKind::kInvalidModel, why).node(node.name, node.op); };
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank < 2) fail("the input must have rank 2 or more ([..., 1] real or [..., 2] complex)");
  if (shape.back() != 1 && shape.back() != 2)
    fail("the input's last dim must be 1 (real) or 2 (complex), is " + std::to_string(shape.back()));
  DftParams p;
  const int64_t a = axis.value_or(-2);
  if (a < -rank || a >= rank - 1 || a == -1) fail("axis " + std::to_string(a) + " is out of range or the last dim");
  p.axis = a < 0 ? a + rank : a;
  p.inverse = node.attrs.get_int("inverse", 0) != 0;
  p.onesided = node.attrs.get_int("onesided", 0) != 0;
  p.real_output = p.inverse && p.onesided;
  const int64_t n = shape[static_cast<size_t>(p.axis)];
  p.length = length ? *length : p.real_output ? 2 * (n - 1) : n;
  if (p.length < 1) fail("the transform's length must be positive, is " + std::to_string(p.length));
  p.out_size = p.onesided && !p.inverse ? p.length / 2 + 1 : p.length;
  return p;
}

StftParams stft_params(const Node& node, const std::vector<int64_t>& shape, int64_t frame_step,
                       std::optional<int64_t> window_length, std::optional<int64_t> frame_length) {
  auto fail = [&](const std::string& why) { throw Error(ErrorKind::kInvalidModel, why).node(node.name, node.op); };
  if (shape.size() != 3 || (shape[2] != 1 && shape[2] != 2))
    fail("the signal must be [batch, length, 1] (real) or [batch, length, 2] (complex)");
  StftParams p;
  p.batch = shape[0];
  p.signal_length = shape[1];
  p.complex_input = shape[2] == 2;
  if (!window_length && !frame_length) fail("it needs a window or a frame_length");
  p.frame_length = frame_length ? *frame_length : *window_length;
  if (window_length && *window_length != p.frame_length)
    fail("the window has " + std::to_string(*window_length) + " values for frames of " + std::to_string(p.frame_length));
  if (frame_step < 1) fail("frame_step must be positive, is " + std::to_string(frame_step));
  if (p.frame_length < 1 || p.frame_length > p.signal_length)
    fail("frame_length " + std::to_string(p.frame_length) + " must be from 1 to the signal's length " + std::to_string(p.signal_length));
  p.frame_step = frame_step;
  p.frames = (p.signal_length - p.frame_length) / frame_step + 1;
  p.bins = node.attrs.get_int("onesided", 1) != 0 ? p.frame_length / 2 + 1 : p.frame_length;
  return p;
}

namespace {

std::optional<int64_t> scalar_input(InferContext& ctx, size_t i, const char* what) {
  if (!ctx.has_input(i)) return std::nullopt;
  if (ctx.dtype(i) != DType::kInt64 && ctx.dtype(i) != DType::kInt32)
    ctx.fail(std::string(what) + " must be int32 or int64, is " + to_string(ctx.dtype(i)));
  const std::optional<Dims> v = ctx.int_elements(i);
  if (!v) return std::nullopt;
  if (v->size() != 1 || !(*v)[0].known()) ctx.fail(std::string(what) + " must be a scalar");
  return (*v)[0].value;
}

void infer_dft(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  const std::optional<int64_t> length = scalar_input(ctx, 1, "dft_length");
  const std::optional<int64_t> axis = scalar_input(ctx, 2, "axis");
  const bool values_known = (!ctx.has_input(1) || length) && (!ctx.has_input(2) || axis);
  if (!x.shape || !all_known(*x.shape) || !values_known) {
    // Known when the engine runs (the CPU engine infers shapes again then).
    ctx.set_output(0, x.dtype, x.shape ? std::optional<Dims>(unknown_dims(ctx, static_cast<int64_t>(x.shape->size())))
                                       : std::nullopt);
    return;
  }
  std::vector<int64_t> shape = known_values(*x.shape);
  const DftParams p = dft_params(ctx.node, shape, length, axis);
  shape[static_cast<size_t>(p.axis)] = p.out_size;
  shape.back() = p.real_output ? 1 : 2;
  ctx.set_output(0, x.dtype, dims_of(shape));
}

void infer_stft(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not a float type");
  if (ctx.has_input(2)) {
    if (ctx.dtype(2) != x.dtype) ctx.fail("the window must be " + to_string(x.dtype) + " as the signal, is " + to_string(ctx.dtype(2)));
    if (ctx.shape_known(2) && ctx.shape(2).size() != 1) ctx.fail("the window must be 1-D");
  }
  const std::optional<int64_t> step = scalar_input(ctx, 1, "frame_step");
  const std::optional<int64_t> frame_length = scalar_input(ctx, 3, "frame_length");
  std::optional<int64_t> window_length;
  bool window_known = !ctx.has_input(2);
  if (ctx.has_input(2) && ctx.shape_known(2) && ctx.shape(2)[0].known()) {
    window_length = ctx.shape(2)[0].value;
    window_known = true;
  }
  if (!x.shape || !all_known(*x.shape) || !step || (ctx.has_input(3) && !frame_length) || !window_known) {
    // Known when the engine runs (the CPU engine infers shapes again then).
    ctx.set_output(0, x.dtype, unknown_dims(ctx, 4));
    return;
  }
  const StftParams p = stft_params(ctx.node, known_values(*x.shape), *step, window_length, frame_length);
  ctx.set_output(0, x.dtype, dims_of(std::vector<int64_t>{p.batch, p.frames, p.bins, 2}));
}

}  // namespace

KILN_REGISTER_OPS(dft) {
  OpSchema s;
  s.op = "DFT";
  s.min_inputs = 1;
  s.max_inputs = 3;
  s.infer = infer_dft;
  registry.add(std::move(s));
  OpSchema stft;
  stft.op = "STFT";
  stft.min_inputs = 2;
  stft.max_inputs = 4;
  stft.infer = infer_stft;
  registry.add(std::move(stft));
}

}  // namespace kiln::ir
