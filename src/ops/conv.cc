// Schemas of Conv and ConvTranspose, and the conv geometry (auto_pad, output sizes) that the
// schemas, kiln::FusedConv and the CPU kernels share.
#include <algorithm>
#include <string>

#include "ops/conv_geometry.h"

namespace kiln::ir {

namespace {

std::string join(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// An ints attribute of `count` entries (or `fallback` repeated when absent), each >= `min` and
// at most the largest dim a tensor can have (kMaxTensorBytes): then the output sizes here and
// the kernels' window arithmetic, sums and products of these with a dim, stay inside int64.
std::vector<int64_t> ints_attr(const Node& node, const char* name, size_t count, int64_t fallback,
                               int64_t min) {
  if (!node.attrs.has(name)) return std::vector<int64_t>(count, fallback);
  std::vector<int64_t> v = node.attrs.get_ints(name);
  if (v.size() != count)
    throw node.error(ErrorKind::kInvalidModel, std::string("attribute '") + name + "' has " +
                                                   std::to_string(v.size()) + " values, expected " +
                                                   std::to_string(count) + " for this input rank");
  for (int64_t x : v) {
    if (x < min)
      throw node.error(ErrorKind::kInvalidModel, std::string("attribute '") + name + "' = " + join(v) +
                                                     " has a value below " + std::to_string(min));
    if (x > kMaxTensorBytes)
      throw node.error(ErrorKind::kInvalidModel, std::string("attribute '") + name + "' = " + join(v) +
                                                     " has a value above the largest tensor dim");
  }
  return v;
}

// stride * size of ConvTranspose's output, refused when it passes the largest tensor dim.
int64_t strided(const Node& node, int64_t stride, int64_t size) {
  if (size > 0 && stride > kMaxTensorBytes / size)
    throw node.error(ErrorKind::kInvalidModel,
                     "stride " + std::to_string(stride) + " makes the output larger than the largest tensor dim");
  return stride * size;
}

}  // namespace

ConvGeometry conv_geometry(const Node& node, int spatial, const std::vector<int64_t>& weight_kernel,
                           const std::vector<int64_t>& in_sizes, bool transpose) {
  ConvGeometry g;
  g.spatial = spatial;
  size_t n = static_cast<size_t>(spatial);
  g.group = node.attrs.get_int("group", 1);
  if (g.group < 1) throw node.error(ErrorKind::kInvalidModel, "group must be >= 1, got " + std::to_string(g.group));
  g.strides = ints_attr(node, "strides", n, 1, 1);
  g.dilations = ints_attr(node, "dilations", n, 1, 1);
  std::vector<int64_t> pads = ints_attr(node, "pads", 2 * n, 0, 0);
  g.auto_pad = node.attrs.get_string("auto_pad", "NOTSET");
  if (g.auto_pad != "NOTSET" && g.auto_pad != "SAME_UPPER" && g.auto_pad != "SAME_LOWER" && g.auto_pad != "VALID")
    throw node.error(ErrorKind::kInvalidModel, "auto_pad '" + g.auto_pad + "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  if (g.auto_pad != "NOTSET")
    for (int64_t p : pads)
      if (p != 0)
        throw node.error(ErrorKind::kInvalidModel, "pads " + join(pads) + " cannot be used with auto_pad " + g.auto_pad);

  // The kernel size: W's spatial dims, which kernel_shape (when present) must agree with.
  g.kernel = weight_kernel;
  if (node.attrs.has("kernel_shape")) {
    std::vector<int64_t> ks = ints_attr(node, "kernel_shape", n, 1, 1);
    for (size_t i = 0; i < n; ++i) {
      if (g.kernel[i] >= 0 && g.kernel[i] != ks[i])
        throw node.error(ErrorKind::kInvalidModel, "kernel_shape " + join(ks) + " does not match the weight's spatial dims " +
                                                       join(weight_kernel));
      g.kernel[i] = ks[i];
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (g.kernel[i] > 0 && g.kernel[i] - 1 > kMaxTensorBytes / g.dilations[i])
      throw node.error(ErrorKind::kInvalidModel, "kernel " + join(g.kernel) + " with dilations " + join(g.dilations) +
                                                     " is larger than the largest tensor dim");
  if (transpose) {
    g.output_padding = ints_attr(node, "output_padding", n, 0, 0);
    if (node.attrs.has("output_shape")) {
      g.output_shape = node.attrs.get_ints("output_shape");
      // Some exporters write the full N, C, spatial... shape; keep the spatial part.
      if (g.output_shape.size() == n + 2) g.output_shape.erase(g.output_shape.begin(), g.output_shape.begin() + 2);
      if (g.output_shape.size() != n)
        throw node.error(ErrorKind::kInvalidModel, "output_shape " + join(node.attrs.get_ints("output_shape")) +
                                                       " does not have one value per spatial dim");
      for (int64_t x : g.output_shape)
        if (x < 1 || x > kMaxTensorBytes)
          throw node.error(ErrorKind::kInvalidModel,
                           "output_shape " + join(g.output_shape) + " has a size below 1 or above the largest tensor dim");
    }
  } else {
    g.output_padding.assign(n, 0);
  }

  g.pad_begin.assign(n, 0);
  g.pad_end.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    int ii = static_cast<int>(i);
    if (g.auto_pad == "NOTSET" && g.output_shape.empty()) {
      g.pad_begin[i] = pads[i];
      g.pad_end[i] = pads[i + n];
      continue;
    }
    if (g.auto_pad == "VALID" && g.output_shape.empty()) continue;
    if (in_sizes[i] < 0 || g.kernel[i] < 0) continue;  // resolved when the size is known
    int64_t in = in_sizes[i], s = g.strides[i], k = g.effective_kernel(ii);
    int64_t total = 0;
    bool upper = g.auto_pad == "SAME_UPPER";
    if (!transpose) {
      int64_t out = (in + s - 1) / s;
      total = std::max<int64_t>(0, (out - 1) * s + k - in);
      g.pad_begin[i] = upper ? total / 2 : total - total / 2;
    } else {
      int64_t out = g.output_shape.empty() ? strided(node, s, in) : g.output_shape[i];
      // Negative when output_shape asks for more than the natural output: the extra end
      // positions then receive no input (only the bias), as in ONNX's reference.
      total = strided(node, s, in - 1) + g.output_padding[i] + k - out;
      // ONNX's rule, with floor division: SAME_UPPER puts the smaller half first, anything
      // else the larger.
      int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      g.pad_begin[i] = upper ? half : total - half;
    }
    g.pad_end[i] = total - g.pad_begin[i];
  }
  return g;
}

int64_t conv_output_size(const Node& node, const ConvGeometry& g, int i, int64_t in_size, bool transpose) {
  size_t u = static_cast<size_t>(i);
  if (transpose && !g.output_shape.empty()) return g.output_shape[u];
  if (in_size < 0 || g.kernel[u] < 0) return -1;
  int64_t k = g.effective_kernel(i);
  int64_t out;
  if (!transpose) {
    int64_t span = in_size + g.pad_begin[u] + g.pad_end[u] - k;
    if (span < 0)
      throw node.error(ErrorKind::kInvalidModel, "spatial dim " + std::to_string(i) + ": the kernel (" +
                                                     std::to_string(k) + " with dilation) is larger than the padded input (" +
                                                     std::to_string(in_size + g.pad_begin[u] + g.pad_end[u]) + ")");
    out = span / g.strides[u] + 1;
  } else {
    out = strided(node, g.strides[u], in_size - 1) + g.output_padding[u] + k - g.pad_begin[u] - g.pad_end[u];
  }
  if (out <= 0)
    throw node.error(ErrorKind::kInvalidModel, "spatial dim " + std::to_string(i) + " of the output would be " +
                                                   std::to_string(out));
  return out;
}

void infer_conv(InferContext& ctx, bool transpose, bool quantized) {
  const Node& node = ctx.node;
  const DType x_type = ctx.dtype(0);
  // A quantized conv (kiln::QConv) reads int8 (or float8e4m3fn) X and W and a float32 bias; its output type is
  // set by its own schema.
  const DType dt = quantized ? DType::kFloat32 : x_type;
  if (quantized) {
    if (x_type != DType::kInt8 && x_type != DType::kFloat8E4M3FN)
      ctx.fail("input X has type " + to_string(x_type) + "; a quantized conv takes int8 or float8e4m3fn");
    if (ctx.dtype(1) != x_type) ctx.fail("W has type " + to_string(ctx.dtype(1)) + "; a quantized conv takes X's type, " + to_string(x_type));
  } else {
    if (!is_float(dt)) ctx.unsupported("input X has type " + to_string(dt) + "; Conv takes floating point");
    if (ctx.dtype(1) != dt)
      ctx.fail("W has type " + to_string(ctx.dtype(1)) + " but X has " + to_string(dt));
  }
  if (!ctx.shape_known(0) || !ctx.shape_known(1)) {
    ctx.set_output(0, dt, std::nullopt);
    return;
  }
  const Dims& x = ctx.shape(0);
  const Dims& w = ctx.shape(1);
  if (x.size() < 3) ctx.fail("X has shape " + dims_to_string(x) + "; expected N x C x spatial dims (rank >= 3)");
  if (w.size() != x.size())
    ctx.fail("W has shape " + dims_to_string(w) + " but X has shape " + dims_to_string(x) + " (ranks differ)");
  int spatial = static_cast<int>(x.size()) - 2;
  std::vector<int64_t> wk, in;
  for (int i = 0; i < spatial; ++i) {
    wk.push_back(w[static_cast<size_t>(i + 2)].value);  // -1 when unknown
    in.push_back(x[static_cast<size_t>(i + 2)].value);
  }
  ConvGeometry g = conv_geometry(node, spatial, wk, in, transpose);

  // Channels: Conv's W is M x C/group x k..., ConvTranspose's W is C x M/group x k....
  Dim out_channels = Dim::unknown();
  const Dim& c = x[1];
  if (!transpose) {
    if (c.known() && w[1].known() && c.value != w[1].value * g.group)
      ctx.fail("X has " + std::to_string(c.value) + " channels but W " + dims_to_string(w) + " with group " +
               std::to_string(g.group) + " expects " + std::to_string(w[1].value * g.group));
    if (w[0].known() && w[0].value % g.group != 0)
      ctx.fail("W has " + std::to_string(w[0].value) + " output channels, not a multiple of group " + std::to_string(g.group));
    out_channels = w[0];
  } else {
    if (c.known() && w[0].known() && c.value != w[0].value)
      ctx.fail("X has " + std::to_string(c.value) + " channels but W " + dims_to_string(w) + " expects " +
               std::to_string(w[0].value));
    if (c.known() && c.value % g.group != 0)
      ctx.fail("X has " + std::to_string(c.value) + " channels, not a multiple of group " + std::to_string(g.group));
    if (w[1].known()) out_channels = Dim(w[1].value * g.group);
  }
  if (ctx.has_input(2)) {
    if (ctx.dtype(2) != dt) ctx.fail("B has type " + to_string(ctx.dtype(2)) + "; expected " + to_string(dt));
    if (ctx.shape_known(2)) {
      const Dims& b = ctx.shape(2);
      if (b.size() != 1 || (b[0].known() && out_channels.known() && b[0].value != out_channels.value))
        ctx.fail("B has shape " + dims_to_string(b) + "; expected [" + out_channels.str() + "] (one per output channel)");
    }
  }

  Dims out{x[0], out_channels};
  for (int i = 0; i < spatial; ++i) {
    int64_t o = conv_output_size(node, g, i, in[static_cast<size_t>(i)], transpose);
    out.push_back(o >= 0 ? Dim(o) : Dim::unknown());
  }
  ctx.set_output(0, dt, out);
}

int64_t conv_flops(const FlopsContext& ctx, bool transpose) {
  const TensorType* w = ctx.input_types.size() > 1 ? ctx.input_types[1] : nullptr;
  if (!w || !w->shape) return 0;
  // Each output element (input element, for ConvTranspose) takes W's per-group fan-in MACs.
  int64_t fan = 1;
  for (size_t i = 1; i < w->shape->size(); ++i) {
    if (!(*w->shape)[i].known()) return 0;
    fan *= (*w->shape)[i].value;
  }
  if (transpose) {
    const TensorType* x = ctx.input_types[0];
    return 2 * FlopsContext::numel(x) * fan;
  }
  return 2 * FlopsContext::numel(ctx.output_types.empty() ? nullptr : ctx.output_types[0]) * fan;
}

KILN_REGISTER_OPS(conv) {
  for (bool transpose : {false, true}) {
    OpSchema s;
    s.op = transpose ? "ConvTranspose" : "Conv";
    s.min_inputs = 2;
    s.max_inputs = 3;
    s.infer = [transpose](InferContext& ctx) { infer_conv(ctx, transpose); };
    s.flops = [transpose](const FlopsContext& ctx) { return conv_flops(ctx, transpose); };
    s.limits = "1-D to 3-D";
    registry.add(std::move(s));
  }
}

}  // namespace kiln::ir
