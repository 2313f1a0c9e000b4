// Schemas of pooling: MaxPool, AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool,
// GlobalLpPool. Input [N, C, spatial...]; the output keeps N and C. And, domain "kiln", which the
// CPU engine's layout pass (src/passes/channels_last_convs.cc) writes where a pool joins chains of
// channels-last convolutions: kiln::ChannelsLastMaxPool, MaxPool on [N, H, W, C] tensors without
// Indices, and kiln::ChannelsLastGlobalAveragePool, [N, H, W, C] -> [N, 1, 1, C].
#include "ops/pool.h"

#include <utility>

#include "ir/op_schema.h"

namespace kiln::ir {

PoolGeometry pool_geometry(const Node& node, size_t spatial) {
  PoolGeometry g;
  g.kernel = node.attrs.get_ints("kernel_shape");
  if (g.kernel.size() != spatial)
    throw node.error(ErrorKind::kInvalidModel, "kernel_shape has " + std::to_string(g.kernel.size()) +
                                                   " values for an input with " + std::to_string(spatial) +
                                                   " spatial dims");
  g.strides = node.attrs.get_ints("strides", std::vector<int64_t>(spatial, 1));
  g.dilations = node.attrs.get_ints("dilations", std::vector<int64_t>(spatial, 1));
  std::vector<int64_t> pads = node.attrs.get_ints("pads", std::vector<int64_t>(2 * spatial, 0));
  if (g.strides.size() != spatial || g.dilations.size() != spatial || pads.size() != 2 * spatial)
    throw node.error(ErrorKind::kInvalidModel, "strides, dilations and pads must have " + std::to_string(spatial) +
                                                   ", " + std::to_string(spatial) + " and " +
                                                   std::to_string(2 * spatial) + " values");
  for (size_t i = 0; i < spatial; ++i) {
    if (g.kernel[i] <= 0 || g.strides[i] <= 0 || g.dilations[i] <= 0)
      throw node.error(ErrorKind::kInvalidModel, "kernel_shape, strides and dilations must be positive");
    if (pads[i] < 0 || pads[i + spatial] < 0)
      throw node.error(ErrorKind::kInvalidModel, "pads must not be negative");
    // No window, step or pad may pass the largest dim a tensor can have (kMaxTensorBytes): then
    // the output sizes here and the window arithmetic of the kernels, sums and products of
    // these with a dim, stay far inside int64.
    if (g.strides[i] > kMaxTensorBytes || g.dilations[i] > kMaxTensorBytes || pads[i] > kMaxTensorBytes ||
        pads[i + spatial] > kMaxTensorBytes || g.kernel[i] - 1 > kMaxTensorBytes / g.dilations[i])
      throw node.error(ErrorKind::kInvalidModel, "kernel_shape, strides, dilations or pads of spatial dim " + std::to_string(i) +
                                                     " exceed the largest tensor dim");
  }
  g.pad_begin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(spatial));
  g.pad_end.assign(pads.begin() + static_cast<std::ptrdiff_t>(spatial), pads.end());
  g.auto_pad = node.attrs.get_string("auto_pad", "NOTSET");
  if (g.auto_pad != "NOTSET" && g.auto_pad != "VALID" && g.auto_pad != "SAME_UPPER" && g.auto_pad != "SAME_LOWER")
    throw node.error(ErrorKind::kInvalidModel, "auto_pad '" + g.auto_pad + "' is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER");
  g.ceil_mode = node.attrs.get_int("ceil_mode", 0) != 0;
  return g;
}

int64_t pool_output_size(const Node& node, PoolGeometry& g, size_t i, int64_t in) {
  if (in < 0) return -1;
  const int64_t k = g.effective_kernel(i), s = g.strides[i];
  int64_t out;
  if (g.auto_pad == "SAME_UPPER" || g.auto_pad == "SAME_LOWER") {
    out = (in + s - 1) / s;
    int64_t total = std::max<int64_t>(0, (out - 1) * s + k - in);
    int64_t small = total / 2;
    g.pad_begin[i] = g.auto_pad == "SAME_UPPER" ? small : total - small;
    g.pad_end[i] = total - g.pad_begin[i];
  } else {
    if (g.auto_pad == "VALID") g.pad_begin[i] = g.pad_end[i] = 0;
    const int64_t span = in + g.pad_begin[i] + g.pad_end[i] - k;
    if (span < 0)
      throw node.error(ErrorKind::kInvalidModel, "the kernel (" + std::to_string(k) + ") is larger than the padded input (" +
                                                     std::to_string(in + g.pad_begin[i] + g.pad_end[i]) + ") in spatial dim " +
                                                     std::to_string(i));
    out = (g.ceil_mode ? (span + s - 1) / s : span / s) + 1;
    // With ceil_mode the last window must still start inside the input or its begin pad.
    if (g.ceil_mode && (out - 1) * s >= in + g.pad_begin[i]) --out;
  }
  return out;
}

namespace {

bool is_global(const std::string& op) { return op.rfind("Global", 0) == 0 || op == "ChannelsLastGlobalAveragePool"; }

void infer_pool(InferContext& ctx) {
  const Node& node = ctx.node;
  DType dt = ctx.dtype(0);
  bool max = node.op == "MaxPool" || node.op == "GlobalMaxPool";
  if (!is_float(dt) && !(max && (dt == DType::kInt8 || dt == DType::kUInt8)))
    ctx.fail("input type " + to_string(dt) + " is not supported");
  const Dims& x = ctx.shape(0);
  if (x.size() < 3) ctx.fail("input must have rank 3 or more ([N, C, spatial...]), has shape " + dims_to_string(x));
  Dims out(x.begin(), x.begin() + 2);
  const size_t spatial = x.size() - 2;
  if (is_global(node.op)) {
    out.resize(x.size(), Dim(1));
  } else {
    PoolGeometry g = pool_geometry(node, spatial);
    if (node.op == "MaxPool" && node.attrs.get_int("storage_order", 0) != 0 && node.attrs.get_int("storage_order", 0) != 1)
      ctx.fail("storage_order must be 0 or 1");
    for (size_t i = 0; i < spatial; ++i) {
      const Dim& d = x[2 + i];
      int64_t o = pool_output_size(node, g, i, d.known() ? d.value : -1);
      out.push_back(o >= 0 ? Dim(o) : Dim::unknown());
    }
  }
  ctx.set_output(0, dt, out);
  if (node.op == "MaxPool") ctx.set_output(1, DType::kInt64, out);
}

// kiln::ChannelsLastMaxPool(X [N, H, W, C]) -> Y [N, OH, OW, C], MaxPool's attributes.
void infer_channels_last_max_pool(InferContext& ctx) {
  const DType dt = ctx.dtype(0);
  if (!is_float(dt)) ctx.fail("input type " + to_string(dt) + " is not supported");
  const Dims& x = ctx.shape(0);
  if (x.size() != 4) ctx.fail("input must be N x H x W x C, has shape " + dims_to_string(x));
  PoolGeometry g = pool_geometry(ctx.node, 2);
  Dims out{x[0]};
  for (size_t i = 0; i < 2; ++i) {
    const Dim& d = x[1 + i];
    const int64_t o = pool_output_size(ctx.node, g, i, d.known() ? d.value : -1);
    out.push_back(o >= 0 ? Dim(o) : Dim::unknown());
  }
  out.push_back(x[3]);
  ctx.set_output(0, dt, out);
}

// kiln::ChannelsLastGlobalAveragePool(X [N, H, W, C]) -> Y [N, 1, 1, C].
void infer_channels_last_global_average_pool(InferContext& ctx) {
  const DType dt = ctx.dtype(0);
  if (dt != DType::kFloat32) ctx.fail("input type " + to_string(dt) + " is not supported");
  const Dims& x = ctx.shape(0);
  if (x.size() != 4) ctx.fail("input must be N x H x W x C, has shape " + dims_to_string(x));
  ctx.set_output(0, dt, Dims{x[0], Dim(1), Dim(1), x[3]});
}

int64_t pool_flops(const FlopsContext& c) {
  const Node& node = c.node;
  int64_t window = 1;
  if (is_global(node.op)) {
    return FlopsContext::numel(c.input_types[0]);
  }
  for (int64_t k : node.attrs.get_ints("kernel_shape")) window *= k;
  return FlopsContext::numel(c.output_types[0]) * window;
}

}  // namespace

KILN_REGISTER_OPS(pool) {
  for (const char* op : {"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}) {
    OpSchema s;
    s.op = op;
    s.infer = infer_pool;
    s.flops = pool_flops;
    if (std::string(op) == "MaxPool") s.max_outputs = 2;
    registry.add(std::move(s));
  }
  using Infer = void (*)(InferContext&);
  for (auto [op, infer] : {std::pair<const char*, Infer>{"ChannelsLastMaxPool", infer_channels_last_max_pool},
                           std::pair<const char*, Infer>{"ChannelsLastGlobalAveragePool", infer_channels_last_global_average_pool}}) {
    OpSchema s;
    s.op = op;
    s.domain = "kiln";
    s.infer = infer;
    s.flops = pool_flops;
    registry.add(std::move(s));
  }
}

}  // namespace kiln::ir
