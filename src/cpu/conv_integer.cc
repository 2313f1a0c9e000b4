// CPU kernels of the integer convolutions: a direct convolution of (X - x_zero_point) and
// (W - w_zero_point), summed exactly in int32 (every 1-D to 3-D geometry; 1-D and 2-D run as 3-D
// with unit dims). ConvInteger outputs the sums; QLinearConv adds B and requantizes them as ONNX's
// reference does: times x_scale * w_scale / y_scale (a float32 factor per output channel), plus
// y_zero_point, saturated, rounded half to even.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/kernel.h"
#include "ops/conv_geometry.h"

namespace kiln::cpu {

namespace {

// The 8-bit values of an int8 or uint8 tensor, widened.
std::vector<int32_t> widened(const Tensor& t) {
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = static_cast<int32_t>(t.value_as_int(i));
  return out;
}

// The sums of every output element of X (*) W into `y`'s shape: emit(index in y, output channel,
// int32 sum).
template <class Emit>
void integer_conv(const ir::Node& node, const Tensor& x, const Tensor* x_zero_point, const Tensor& w, const Tensor* w_zero,
                  const Tensor& y, Emit emit) {
  const int spatial = static_cast<int>(x.rank()) - 2;
  std::vector<int64_t> wk, sizes;
  for (int i = 0; i < spatial; ++i) wk.push_back(w.dim(i + 2)), sizes.push_back(x.dim(i + 2));
  const ir::ConvGeometry g = ir::conv_geometry(node, spatial, wk, sizes, false);
  // Everything as 3-D: leading unit spatial dims.
  auto dims3 = [&](const std::vector<int64_t>& v, int64_t fill) {
    std::vector<int64_t> out(static_cast<size_t>(3 - spatial), fill);
    out.insert(out.end(), v.begin(), v.end());
    return out;
  };
  std::vector<int64_t> out_sizes;
  for (int i = 0; i < spatial; ++i) out_sizes.push_back(y.dim(i + 2));
  const std::vector<int64_t> is = dims3(sizes, 1), ks = dims3(g.kernel, 1), os = dims3(out_sizes, 1), st = dims3(g.strides, 1),
                             dl = dims3(g.dilations, 1), pb = dims3(g.pad_begin, 0);
  const int64_t n = x.dim(0), c = x.dim(1), m = w.dim(0), group = g.group, cg = c / group, mg = m / group;
  const std::vector<int32_t> xv = widened(x), wv = widened(w);
  const int32_t x_zero = x_zero_point && x_zero_point->numel() ? static_cast<int32_t>(x_zero_point->value_as_int(0)) : 0;
  if (w_zero && w_zero->numel() == 0) w_zero = nullptr;
  if (w_zero && w_zero->numel() != 1 && w_zero->numel() != m)
    throw node.error(ErrorKind::kInvalidArgument, "w_zero_point has " + std::to_string(w_zero->numel()) + " elements for " +
                                                      std::to_string(m) + " output channels");
  const int64_t in_plane = is[0] * is[1] * is[2], k_plane = ks[0] * ks[1] * ks[2], out_plane = os[0] * os[1] * os[2];
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < m; ++oc) {
      const int64_t gi = oc / mg;
      const int32_t wz = w_zero ? static_cast<int32_t>(w_zero->value_as_int(w_zero->numel() == 1 ? 0 : oc)) : 0;
      for (int64_t o = 0; o < out_plane; ++o) {
        const int64_t od = o / (os[1] * os[2]), oh = o / os[2] % os[1], ow = o % os[2];
        int64_t acc = 0;  // int32's wrap-around, without signed overflow, for sums past its range
        for (int64_t ic = 0; ic < cg; ++ic) {
          const int32_t* xc = xv.data() + (b * c + gi * cg + ic) * in_plane;
          const int32_t* wc = wv.data() + (oc * cg + ic) * k_plane;
          for (int64_t kd = 0; kd < ks[0]; ++kd) {
            const int64_t id = od * st[0] + kd * dl[0] - pb[0];
            if (id < 0 || id >= is[0]) continue;
            for (int64_t kh = 0; kh < ks[1]; ++kh) {
              const int64_t ih = oh * st[1] + kh * dl[1] - pb[1];
              if (ih < 0 || ih >= is[1]) continue;
              for (int64_t kw = 0; kw < ks[2]; ++kw) {
                const int64_t iw = ow * st[2] + kw * dl[2] - pb[2];
                if (iw < 0 || iw >= is[2]) continue;
                acc += static_cast<int64_t>(xc[(id * is[1] + ih) * is[2] + iw] - x_zero) * (wc[(kd * ks[1] + kh) * ks[2] + kw] - wz);
              }
            }
          }
        }
        emit((b * m + oc) * out_plane + o, oc, static_cast<int32_t>(static_cast<uint32_t>(acc)));
      }
    }
}

const Tensor* optional_input(const std::vector<const Tensor*>& in, size_t i) { return i < in.size() ? in[i] : nullptr; }

void conv_integer(const ir::Node& node, const std::vector<const Tensor*>& in, Tensor& y) {
  int32_t* out = y.data<int32_t>();
  integer_conv(node, *in[0], optional_input(in, 2), *in[1], optional_input(in, 3), y,
               [out](int64_t i, int64_t, int32_t sum) { out[i] = sum; });
}

// QLinearConv's inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
// y_zero_point, B.
void qlinear_conv(const ir::Node& node, const std::vector<const Tensor*>& in, Tensor& y) {
  for (size_t scalar : {1, 6, 7})
    if (in[scalar]->numel() != 1)
      throw node.error(ErrorKind::kInvalidArgument, "input " + std::to_string(scalar) + " must have one element, has " +
                                                        std::to_string(in[scalar]->numel()));
  const Tensor& w_scale = *in[4];
  const int64_t channels = in[3]->dim(0);
  if (w_scale.numel() != 1 && w_scale.numel() != channels)
    throw node.error(ErrorKind::kInvalidArgument, "w_scale has " + std::to_string(w_scale.numel()) + " elements for " +
                                                      std::to_string(channels) + " output channels");
  const Tensor* bias = optional_input(in, 8);
  if (bias && bias->numel() != channels)
    throw node.error(ErrorKind::kInvalidArgument,
                     "B has " + std::to_string(bias->numel()) + " elements for " + std::to_string(channels) + " output channels");
  // The factor per output channel in float32, as the reference computes it from float32 scales.
  const float x_scale = in[1]->data<float>()[0], y_scale = in[6]->data<float>()[0];
  std::vector<double> factor(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c)
    factor[static_cast<size_t>(c)] = x_scale * w_scale.data<float>()[w_scale.numel() == 1 ? 0 : c] / y_scale;
  const double y_zero = static_cast<double>(in[7]->value_as_int(0));
  const bool is_signed = y.dtype() == DType::kInt8;
  const double lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
  void* out = y.raw();
  integer_conv(node, *in[0], in[2], *in[3], in[5], y, [&](int64_t i, int64_t c, int32_t sum) {
    const int32_t biased = static_cast<int32_t>(static_cast<uint32_t>(sum) + static_cast<uint32_t>(bias ? bias->data<int32_t>()[c] : 0));
    const double q = std::nearbyint(std::clamp(biased * factor[static_cast<size_t>(c)] + y_zero, lo, hi));
    if (is_signed) static_cast<int8_t*>(out)[i] = static_cast<int8_t>(q);
    else static_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(q);
  });
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(conv_integer) {
  {
    KernelEntry e;
    e.op = "QLinearConv";
    e.check = accept_dtypes({DType::kInt8, DType::kUInt8});
    e.dtypes = "int8, uint8; float32 scales";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel(
          [node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) { qlinear_conv(*node, in, out[0]); });
    };
    registry.add(std::move(e));
  }
  KernelEntry e;
  e.op = "ConvInteger";
  e.check = accept_dtypes({DType::kInt8, DType::kUInt8});
  e.dtypes = "int8, uint8";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel(
        [node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) { conv_integer(*node, in, out[0]); });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
