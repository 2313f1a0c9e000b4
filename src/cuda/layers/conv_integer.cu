// CUDA layers of ConvInteger and QLinearConv (int8 or uint8, 1-D to 3-D, any group), the CPU
// kernels' arithmetic (src/cpu/conv_integer.cc): exact int32 sums of (X - x_zero_point) and
// (W - w_zero_point); QLinearConv adds B and requantizes by x_scale * w_scale / y_scale (a float32
// factor per output channel), plus y_zero_point, saturated and rounded half to even, each step
// rounded on its own as on the CPU, so both engines give the same integers. Scales and zero
// points are read on the device (constants or runtime inputs). One thread per output element,
// as 3-D with leading unit dims: for the models ONNX Runtime's quantizer writes in its QOperator
// format, which otherwise leave the GPU at every convolution; kiln's own INT8 convolutions (QDQ
// models) are the fast path.
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ops/conv_geometry.h"

namespace kiln::cuda {

namespace {

struct IntegerConvGeom {
  int64_t n = 0, c = 0, m = 0, group = 1;
  int64_t in[3] = {1, 1, 1}, kernel[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1}, dilation[3] = {1, 1, 1}, pad[3] = {0, 0, 0};
  int64_t outputs = 0;
  bool x_signed = false, w_signed = false;
  int64_t x_zero_count = 0, w_zero_count = 0;  // 0: none
  // QLinearConv
  bool requantize = false, y_signed = false, has_bias = false;
  int64_t w_scale_count = 1;
};

__device__ __forceinline__ int32_t byte_at(const void* p, int64_t i, bool is_signed) {
  return is_signed ? static_cast<int32_t>(static_cast<const int8_t*>(p)[i]) : static_cast<int32_t>(static_cast<const uint8_t*>(p)[i]);
}

// QLinearConv's inputs: x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, B; ConvInteger's
// (x, w, x_zero, w_zero) come in the same slots, the others null.
__global__ void integer_conv_kernel(const void* __restrict__ x, const void* __restrict__ x_zero, const void* __restrict__ w,
                                    const void* __restrict__ w_zero, const float* __restrict__ x_scale,
                                    const float* __restrict__ w_scale, const float* __restrict__ y_scale,
                                    const void* __restrict__ y_zero, const int32_t* __restrict__ bias, void* __restrict__ y,
                                    IntegerConvGeom g) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  const int64_t out_plane = g.out[0] * g.out[1] * g.out[2], in_plane = g.in[0] * g.in[1] * g.in[2];
  const int64_t k_plane = g.kernel[0] * g.kernel[1] * g.kernel[2];
  const int64_t cg = g.c / g.group, mg = g.m / g.group;
  const int32_t xz = g.x_zero_count ? byte_at(x_zero, 0, g.x_signed) : 0;
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < g.outputs; o += step) {
    const int64_t p = o % out_plane, oc = (o / out_plane) % g.m, b = o / (out_plane * g.m);
    const int64_t od = p / (g.out[1] * g.out[2]), oh = p / g.out[2] % g.out[1], ow = p % g.out[2];
    const int64_t gi = oc / mg;
    const int32_t wz = g.w_zero_count ? byte_at(w_zero, g.w_zero_count == 1 ? 0 : oc, g.w_signed) : 0;
    int64_t acc = 0;  // int32's wrap-around, without signed overflow, as on the CPU
    for (int64_t ic = 0; ic < cg; ++ic) {
      const int64_t xc = (b * g.c + gi * cg + ic) * in_plane, wc = (oc * cg + ic) * k_plane;
      for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
        const int64_t id = od * g.stride[0] + kd * g.dilation[0] - g.pad[0];
        if (id < 0 || id >= g.in[0]) continue;
        for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
          const int64_t ih = oh * g.stride[1] + kh * g.dilation[1] - g.pad[1];
          if (ih < 0 || ih >= g.in[1]) continue;
          for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
            const int64_t iw = ow * g.stride[2] + kw * g.dilation[2] - g.pad[2];
            if (iw < 0 || iw >= g.in[2]) continue;
            acc += static_cast<int64_t>(byte_at(x, xc + (id * g.in[1] + ih) * g.in[2] + iw, g.x_signed) - xz) *
                   (byte_at(w, wc + (kd * g.kernel[1] + kh) * g.kernel[2] + kw, g.w_signed) - wz);
          }
        }
      }
    }
    const int32_t sum = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(acc)));
    if (!g.requantize) {
      static_cast<int32_t*>(y)[o] = sum;
      continue;
    }
    const int32_t biased = static_cast<int32_t>(static_cast<uint32_t>(sum) + static_cast<uint32_t>(g.has_bias ? bias[oc] : 0));
    const double factor = __fdiv_rn(__fmul_rn(x_scale[0], w_scale[g.w_scale_count == 1 ? 0 : oc]), y_scale[0]);
    const double lo = g.y_signed ? -128 : 0, hi = g.y_signed ? 127 : 255;
    const double v = __dadd_rn(__dmul_rn(static_cast<double>(biased), factor), static_cast<double>(byte_at(y_zero, 0, g.y_signed)));
    const double q = rint(v < lo ? lo : hi < v ? hi : v);  // std::clamp, then rounded
    if (g.y_signed) static_cast<int8_t*>(y)[o] = static_cast<int8_t>(q);
    else static_cast<uint8_t*>(y)[o] = static_cast<uint8_t>(q);
  }
}

bool is_byte_type(DType d) { return d == DType::kInt8 || d == DType::kUInt8; }

struct Slots {
  int x, w, x_zero, w_zero, x_scale, w_scale, y_scale, y_zero, bias;
};
Slots slots_of(const std::string& op) {
  if (op == "QLinearConv") return {0, 3, 2, 5, 1, 4, 6, 7, 8};
  return {0, 1, 2, 3, -1, -1, -1, -1, -1};
}

int64_t count_of(const LayerRequest& r, int i) { return r.given(i) ? shape_numel(r.input_shape(static_cast<size_t>(i))) : 0; }

std::string integer_conv_geometry(const LayerRequest& r, IntegerConvGeom& g) {
  const Slots s = slots_of(r.node.op);
  if (!r.given(s.x) || !r.given(s.w)) return "X and W are required";
  const DType tx = r.input_dtypes[static_cast<size_t>(s.x)], tw = r.input_dtypes[static_cast<size_t>(s.w)];
  if (!is_byte_type(tx) || !is_byte_type(tw))
    return "input types " + to_string(tx) + ", " + to_string(tw) + " are not supported (supported: int8, uint8)";
  const std::vector<int64_t>& xs = r.input_shape(static_cast<size_t>(s.x));
  const std::vector<int64_t>& ws = r.input_shape(static_cast<size_t>(s.w));
  const int spatial = static_cast<int>(xs.size()) - 2;
  if (spatial < 1 || spatial > 3 || ws.size() != xs.size()) return "X and W must have rank 3 to 5, the same";
  if (r.output_shapes.empty() || r.output_shapes[0].size() != xs.size()) return "the output's shape is not known";
  std::vector<int64_t> wk, sizes;
  for (int i = 0; i < spatial; ++i) wk.push_back(ws[static_cast<size_t>(i) + 2]), sizes.push_back(xs[static_cast<size_t>(i) + 2]);
  const ir::ConvGeometry cg = ir::conv_geometry(r.node, spatial, wk, sizes, false);
  g = IntegerConvGeom{};
  g.n = xs[0], g.c = xs[1], g.m = ws[0], g.group = cg.group;
  if (g.group < 1 || g.c % g.group || g.m % g.group || ws[1] * g.group != g.c) return "the channels do not match the group";
  const int lead = 3 - spatial;
  for (int i = 0; i < spatial; ++i) {
    g.in[lead + i] = sizes[static_cast<size_t>(i)];
    g.kernel[lead + i] = cg.kernel[static_cast<size_t>(i)];
    g.out[lead + i] = r.output_shapes[0][static_cast<size_t>(i) + 2];
    g.stride[lead + i] = cg.strides[static_cast<size_t>(i)];
    g.dilation[lead + i] = cg.dilations[static_cast<size_t>(i)];
    g.pad[lead + i] = cg.pad_begin[static_cast<size_t>(i)];
  }
  g.outputs = shape_numel(r.output_shapes[0]);
  g.x_signed = tx == DType::kInt8, g.w_signed = tw == DType::kInt8;
  g.x_zero_count = count_of(r, s.x_zero);
  g.w_zero_count = count_of(r, s.w_zero);
  if (r.given(s.x_zero) && r.input_dtypes[static_cast<size_t>(s.x_zero)] != tx) return "x_zero_point's type differs from X's";
  if (r.given(s.w_zero) && r.input_dtypes[static_cast<size_t>(s.w_zero)] != tw) return "w_zero_point's type differs from W's";
  if (g.x_zero_count > 1) return "x_zero_point must have one element";
  if (g.w_zero_count > 1 && g.w_zero_count != g.m) return "w_zero_point must have one element or one per output channel";
  if (r.node.op == "QLinearConv") {
    g.requantize = true;
    for (int slot : {s.x_scale, s.w_scale, s.y_scale})
      if (!r.given(slot) || r.input_dtypes[static_cast<size_t>(slot)] != DType::kFloat32) return "the scales must be float32";
    if (count_of(r, s.x_scale) != 1 || count_of(r, s.y_scale) != 1 || count_of(r, s.y_zero) != 1 || g.x_zero_count != 1)
      return "x and y scales and zero points must have one element";
    g.w_scale_count = count_of(r, s.w_scale);
    if (g.w_scale_count != 1 && g.w_scale_count != g.m) return "w_scale must have one element or one per output channel";
    const DType ty = r.input_dtypes[static_cast<size_t>(s.y_zero)];
    if (!is_byte_type(ty)) return "y_zero_point must be int8 or uint8";
    g.y_signed = ty == DType::kInt8;
    g.has_bias = r.given(s.bias);
    if (g.has_bias && (r.input_dtypes[static_cast<size_t>(s.bias)] != DType::kInt32 || count_of(r, s.bias) != g.m))
      return "B must be int32 with one element per output channel";
  }
  return "";
}

std::string check_integer_conv(const LayerRequest& r) {
  IntegerConvGeom g;
  try {
    return integer_conv_geometry(r, g);
  } catch (const Error& e) {
    return e.what();
  }
}

LayerFormats integer_conv_formats(const LayerRequest& r) {
  LayerFormats f;
  for (size_t i = 0; i < r.inputs.size(); ++i)
    f.inputs.push_back(r.given(static_cast<int64_t>(i)) ? Format{r.input_dtypes[i], Layout::kLinear} : Format{});
  f.outputs.push_back(Format{r.output_dtypes[0], Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_integer_conv(const LayerRequest& r, const LayerFormats&, BuildServices&) {
  IntegerConvGeom g;
  if (std::string why = integer_conv_geometry(r, g); !why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  if (g.outputs == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const Slots s = slots_of(r.node.op);
  return make_layer("kernel:integer-conv", [g, s](const LayerIO& io, cudaStream_t stream) {
    auto in = [&](int slot) -> const void* {
      return slot >= 0 && static_cast<size_t>(slot) < io.inputs.size() ? io.inputs[static_cast<size_t>(slot)] : nullptr;
    };
    integer_conv_kernel<<<grid_for(g.outputs, 128), 128, 0, stream>>>(
        in(s.x), in(s.x_zero), in(s.w), in(s.w_zero), static_cast<const float*>(in(s.x_scale)),
        static_cast<const float*>(in(s.w_scale)), static_cast<const float*>(in(s.y_scale)), in(s.y_zero),
        static_cast<const int32_t*>(in(s.bias)), io.outputs[0], g);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(conv_integer) {
  for (const char* op : {"ConvInteger", "QLinearConv"}) {
    LayerEntry e;
    e.op = op;
    e.check = check_integer_conv;
    e.formats = integer_conv_formats;
    e.create = create_integer_conv;
    e.dtypes = std::string(op) == "QLinearConv" ? "int8, uint8; float32 scales" : "int8, uint8 (int32 output)";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
