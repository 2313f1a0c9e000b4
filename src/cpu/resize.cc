// CPU kernel of Resize. Nearest works on raw bytes (any dtype) through one index table per
// axis. Linear and cubic (float32) are separable: one 1-D interpolation pass per resized
// axis, each output index reading a few weighted source indices, so any rank works.
#include <cmath>
#include <cstring>

#include "cpu/data_movement.h"
#include "cpu/kernel.h"
#include "ops/resize_params.h"

namespace kiln::cpu {

namespace {

struct Options {
  std::string mode, ctm, nearest;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  float extrapolation = 0.f;
};

// Output coordinate j of an axis -> input coordinate, per coordinate_transformation_mode.
// Like ONNX's reference, the resized length is in_len * scale, unrounded (it differs from the
// output size when scales do not divide evenly, e.g. align_corners with scale 0.6).
double source_coord(const Options& o, int64_t j, int64_t in_len, double scale, double roi_s, double roi_e) {
  double x = static_cast<double>(j);
  double out_len = static_cast<double>(in_len) * scale;
  if (o.ctm == "asymmetric") return x / scale;
  if (o.ctm == "align_corners") return out_len == 1 ? 0.0 : x * static_cast<double>(in_len - 1) / (out_len - 1);
  if (o.ctm == "pytorch_half_pixel") return out_len > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (o.ctm == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (o.ctm == "tf_crop_and_resize") {
    double span = static_cast<double>(in_len - 1);
    return out_len > 1 ? roi_s * span + x * (roi_e - roi_s) * span / (out_len - 1) : 0.5 * (roi_s + roi_e) * span;
  }
  if (o.ctm == "half_pixel_symmetric") {
    double adjustment = std::floor(out_len) / out_len;
    double offset = static_cast<double>(in_len) / 2.0 * (1.0 - adjustment);
    return offset + (x + 0.5) / scale - 0.5;
  }
  return (x + 0.5) / scale - 0.5;  // half_pixel
}

int64_t nearest_index(const Options& o, double x) {
  double f = std::floor(x);
  if (o.nearest == "floor") return static_cast<int64_t>(f);
  if (o.nearest == "ceil") return static_cast<int64_t>(std::ceil(x));
  if (x - f == 0.5) return static_cast<int64_t>(o.nearest == "round_prefer_ceil" ? f + 1 : f);
  return static_cast<int64_t>(std::round(x));
}

// The taps of one output index along one axis: source indices and weights; `outside` asks for
// the extrapolation value (tf_crop_and_resize beyond the input).
struct Taps {
  int64_t idx[4] = {0, 0, 0, 0};
  float w[4] = {0, 0, 0, 0};
  int n = 0;
  bool outside = false;
};

std::vector<Taps> axis_taps(const Options& o, int64_t in_len, int64_t out_len, double scale, double roi_s, double roi_e) {
  std::vector<Taps> taps(static_cast<size_t>(out_len));
  auto clamp = [in_len](int64_t i) { return std::min(std::max<int64_t>(i, 0), in_len - 1); };
  for (int64_t j = 0; j < out_len; ++j) {
    Taps& t = taps[static_cast<size_t>(j)];
    double x = source_coord(o, j, in_len, scale, roi_s, roi_e);
    if (o.ctm == "tf_crop_and_resize" && (x < 0 || x > static_cast<double>(in_len - 1))) {
      t.outside = true;
      continue;
    }
    if (o.mode == "nearest") {
      t.n = 1;
      t.idx[0] = clamp(nearest_index(o, x));
      t.w[0] = 1.f;
    } else if (o.mode == "linear") {
      x = std::min(std::max(x, 0.0), static_cast<double>(in_len - 1));
      int64_t i0 = static_cast<int64_t>(std::floor(x));
      double r = x - static_cast<double>(i0);
      t.n = 2;
      t.idx[0] = clamp(i0);
      t.idx[1] = clamp(i0 + 1);
      t.w[0] = static_cast<float>(1.0 - r);
      t.w[1] = static_cast<float>(r);
    } else {  // cubic (Keys), neighbours i0-1 .. i0+2 with edge padding
      int64_t i0 = static_cast<int64_t>(std::floor(x));
      double r = x - static_cast<double>(i0), a = o.cubic_a;
      double d[4] = {r + 1, r, 1 - r, 2 - r};
      double sum = 0, w[4];
      for (int k = 0; k < 4; ++k) {
        double s = d[k];
        w[k] = s <= 1 ? ((a + 2) * s - (a + 3)) * s * s + 1 : ((a * s - 5 * a) * s + 8 * a) * s - 4 * a;
        int64_t i = i0 - 1 + k;
        if (o.exclude_outside && (i < 0 || i >= in_len)) w[k] = 0;
        sum += w[k];
      }
      t.n = 4;
      for (int k = 0; k < 4; ++k) {
        t.idx[k] = clamp(i0 - 1 + k);
        t.w[k] = static_cast<float>(o.exclude_outside && sum != 0 ? w[k] / sum : w[k]);
      }
    }
  }
  return taps;
}

bool is_identity(const std::vector<Taps>& taps, int64_t in_len) {
  if (static_cast<int64_t>(taps.size()) != in_len) return false;
  for (size_t j = 0; j < taps.size(); ++j) {
    const Taps& t = taps[j];
    if (t.outside) return false;
    for (int k = 0; k < t.n; ++k)
      if (t.w[k] != 0.f && !(t.idx[k] == static_cast<int64_t>(j) && t.w[k] == 1.f)) return false;
  }
  return true;
}

// One interpolation pass along `axis`: x has shape `shape`, y gets shape[axis] = taps.size().
void interpolate_axis(const float* x, const std::vector<int64_t>& shape, size_t axis, const std::vector<Taps>& taps,
                      float extrapolation, float* y) {
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  int64_t in_len = shape[axis], out_len = static_cast<int64_t>(taps.size());
#pragma omp parallel for if (outer * out_len * inner > (1 << 15)) schedule(static)
  for (int64_t o = 0; o < outer; ++o) {
    const float* xs = x + o * in_len * inner;
    for (int64_t j = 0; j < out_len; ++j) {
      float* yr = y + (o * out_len + j) * inner;
      const Taps& t = taps[static_cast<size_t>(j)];
      if (t.outside) {
        for (int64_t i = 0; i < inner; ++i) yr[i] = extrapolation;
        continue;
      }
      for (int64_t i = 0; i < inner; ++i) yr[i] = 0.f;
      for (int k = 0; k < t.n; ++k) {
        const float* xr = xs + t.idx[k] * inner;
        float w = t.w[k];
        for (int64_t i = 0; i < inner; ++i) yr[i] += w * xr[i];
      }
    }
  }
}

void resize_nearest(const Tensor& x, Tensor& y, const std::vector<std::vector<Taps>>& taps, const Options& o) {
  size_t es = element_size(x.dtype());
  const auto& os = y.shape();
  size_t rank = os.size();
  if (y.numel() == 0) return;
  std::vector<int64_t> in_strides = contiguous_strides(x.shape());
  std::vector<unsigned char> fill(es, 0);
  if (x.dtype() == DType::kFloat32) std::memcpy(fill.data(), &o.extrapolation, es);
  const auto* src = static_cast<const unsigned char*>(x.raw());
  auto* dst = static_cast<unsigned char*>(y.raw());
  if (rank == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  int64_t row = os.back();
  int64_t rows = y.numel() / row;
  const std::vector<Taps>& last = taps.back();
  std::vector<int64_t> c(rank - 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t s = 0;
    bool outside = false;
    for (size_t k = 0; k + 1 < rank; ++k) {
      const Taps& t = taps[k][static_cast<size_t>(c[k])];
      outside = outside || t.outside;
      s += t.idx[0] * in_strides[k];
    }
    unsigned char* d = dst + static_cast<size_t>(r * row) * es;
    for (int64_t j = 0; j < row; ++j) {
      const Taps& t = last[static_cast<size_t>(j)];
      const unsigned char* from = (outside || t.outside) ? fill.data() : src + static_cast<size_t>(s + t.idx[0]) * es;
      std::memcpy(d + static_cast<size_t>(j) * es, from, es);
    }
    for (size_t k = c.size(); k-- > 0;) {
      if (++c[k] < os[k]) break;
      c[k] = 0;
    }
  }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(resize) {
  KernelEntry e;
  e.op = "Resize";
  e.dtypes = "all (nearest); float32 (linear, cubic)";
  e.check = [](const KernelInit& init) -> std::string {
    const ir::Attributes& a = init.node.attrs;
    if (a.get_int("antialias", 0) != 0) return "antialias is not supported";
    if (a.get_string("mode", "nearest") != "nearest" && init.dtype(0) != DType::kFloat32)
      return a.get_string("mode", "nearest") + " mode on " + to_string(init.dtype(0)) + " is not supported (float32 only)";
    return "";
  };
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    const ir::Attributes& a = init.node.attrs;
    Options o;
    o.mode = a.get_string("mode", "nearest");
    o.ctm = a.get_string("coordinate_transformation_mode", "half_pixel");
    o.nearest = a.get_string("nearest_mode", "round_prefer_floor");
    o.cubic_a = a.get_float("cubic_coeff_a", -0.75f);
    o.exclude_outside = a.get_int("exclude_outside", 0) != 0;
    o.extrapolation = a.get_float("extrapolation_value", 0.f);
    return make_kernel([node, o](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      auto present = [&](size_t i) { return i < in.size() && in[i] && in[i]->numel() > 0; };
      std::optional<ir::Dims> sizes;
      if (present(3)) sizes = ir::dims_of(in[3]->to_int_vector());
      ir::ResizePlan p = ir::resize_plan(*node, ir::dims_of(x.shape()), present(1) ? in[1] : nullptr,
                                         present(2) ? in[2] : nullptr, sizes);
      const auto& is = x.shape();
      std::vector<std::vector<Taps>> taps;
      for (size_t d = 0; d < is.size(); ++d)
        taps.push_back(axis_taps(o, is[d], out[0].shape()[d], p.scale[d], p.roi_start[d], p.roi_end[d]));
      if (o.mode == "nearest") {
        resize_nearest(x, out[0], taps, o);
        return;
      }
      // One pass per axis that changes, ping-ponging between buffers.
      std::vector<int64_t> shape = is;
      Tensor cur = x;
      for (size_t d = 0; d < is.size(); ++d) {
        if (is_identity(taps[d], is[d])) continue;
        std::vector<int64_t> next_shape = shape;
        next_shape[d] = static_cast<int64_t>(taps[d].size());
        Tensor next(DType::kFloat32, next_shape);
        interpolate_axis(cur.data<float>(), shape, d, taps[d], o.extrapolation, next.data<float>());
        cur = next;
        shape = next_shape;
      }
      std::memcpy(out[0].raw(), cur.raw(), out[0].nbytes());
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
