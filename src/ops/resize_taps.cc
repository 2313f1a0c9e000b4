// Resize's interpolation taps (see resize_taps.h); the arithmetic follows ONNX's reference.
#include "ops/resize_taps.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ir/saturating_cast.h"

namespace kiln::ir {

ResizeOptions resize_options(const Node& node) {
  const Attributes& a = node.attrs;
  ResizeOptions o;
  o.mode = a.get_string("mode", "nearest");
  o.ctm = a.get_string("coordinate_transformation_mode", "half_pixel");
  o.nearest = a.get_string("nearest_mode", "round_prefer_floor");
  o.cubic_a = a.get_float("cubic_coeff_a", -0.75f);
  o.exclude_outside = a.get_int("exclude_outside", 0) != 0;
  o.antialias = a.get_int("antialias", 0) != 0 && o.mode != "nearest";
  o.extrapolation = a.get_float("extrapolation_value", 0.f);
  return o;
}

uint64_t resize_fill_bits(const ResizeOptions& o, DType dtype) {
  uint64_t bits = 0;
  if (o.ctm != "tf_crop_and_resize") return bits;
  const float v = o.extrapolation;
  auto put = [&](auto value) { std::memcpy(&bits, &value, sizeof(value)); };
  switch (dtype) {
    case DType::kFloat32: put(v); break;
    case DType::kFloat64: put(static_cast<double>(v)); break;
    case DType::kFloat16: put(float_to_half(v)); break;
    case DType::kBFloat16: put(float_to_bfloat16(v)); break;
    case DType::kInt8: put(saturating_integer<int8_t>(v)); break;
    case DType::kInt16: put(saturating_integer<int16_t>(v)); break;
    case DType::kInt32: put(saturating_integer<int32_t>(v)); break;
    case DType::kInt64: put(saturating_integer<int64_t>(v)); break;
    case DType::kUInt8: put(saturating_integer<uint8_t>(v)); break;
    case DType::kUInt16: put(saturating_integer<uint16_t>(v)); break;
    case DType::kUInt32: put(saturating_integer<uint32_t>(v)); break;
    case DType::kUInt64: put(saturating_integer<uint64_t>(v)); break;
    case DType::kBool: put(static_cast<uint8_t>(v != 0.f)); break;
    default:
      if (v != 0.f)
        throw Error(ErrorKind::kUnsupported,
                    "Resize: an extrapolation_value other than 0 on " + to_string(dtype) + " is not supported");
  }
  return bits;
}

namespace {

// Output coordinate j of an axis -> input coordinate, per coordinate_transformation_mode.
// Like ONNX's reference, the resized length is in_len * scale, unrounded (it differs from the
// output size when scales do not divide evenly, e.g. align_corners with scale 0.6).
double source_coord(const ResizeOptions& o, int64_t j, int64_t in_len, double scale, double roi_s, double roi_e) {
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

int64_t nearest_index(const ResizeOptions& o, double x) {
  double f = std::floor(x);
  if (o.nearest == "floor") return static_cast<int64_t>(f);
  if (o.nearest == "ceil") return static_cast<int64_t>(std::ceil(x));
  if (x - f == 0.5) return static_cast<int64_t>(o.nearest == "round_prefer_ceil" ? f + 1 : f);
  return static_cast<int64_t>(std::round(x));
}


}  // namespace

std::vector<ResizeTaps> resize_axis_taps(const ResizeOptions& o, int64_t in_len, int64_t out_len, double scale, double roi_s, double roi_e) {
  std::vector<ResizeTaps> taps(static_cast<size_t>(out_len));
  auto clamp = [in_len](int64_t i) { return std::min(std::max<int64_t>(i, 0), in_len - 1); };
  for (int64_t j = 0; j < out_len; ++j) {
    ResizeTaps& t = taps[static_cast<size_t>(j)];
    double x = source_coord(o, j, in_len, scale, roi_s, roi_e);
    if (o.ctm == "tf_crop_and_resize" && !(x >= 0 && x <= static_cast<double>(in_len - 1))) {  // NaN too
      t.outside = 1;
      continue;
    }
    // A coordinate has no int64 index when it is NaN (fuzz_graph: a roi of -inf) or past int64.
    // A few samples past the input every tap already clamps to the edge, so clamping x there
    // changes no result.
    x = std::isnan(x) ? 0.0 : std::clamp(x, -4.0, static_cast<double>(in_len) + 4.0);
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

bool resize_taps_identity(const std::vector<ResizeTaps>& taps, int64_t in_len) {
  if (static_cast<int64_t>(taps.size()) != in_len) return false;
  for (size_t j = 0; j < taps.size(); ++j) {
    const ResizeTaps& t = taps[j];
    if (t.outside) return false;
    for (int k = 0; k < t.n; ++k)
      if (t.w[k] != 0.f && !(t.idx[k] == static_cast<int64_t>(j) && t.w[k] == 1.f)) return false;
  }
  return true;
}

namespace {

// The antialiasing filters' kernels at a distance d (in output samples): a tent for linear,
// Keys' cubic for cubic.
double filter_weight(const ResizeOptions& o, double d) {
  d = std::abs(d);
  if (o.mode == "linear") return std::max(0.0, 1.0 - d);
  const double a = o.cubic_a;
  if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
  if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
  return 0.0;
}

}  // namespace

bool ResizeFilter::identity(int64_t in_len) const {
  if (static_cast<int64_t>(outside.size()) != in_len) return false;
  for (size_t j = 0; j < outside.size(); ++j) {
    if (outside[j]) return false;
    for (int64_t k = first[j]; k < first[j + 1]; ++k) {
      const size_t t = static_cast<size_t>(k);
      if (w[t] != 0.f && !(idx[t] == static_cast<int64_t>(j) && w[t] == 1.f)) return false;
    }
  }
  return true;
}

ResizeFilter resize_axis_filter(const ResizeOptions& o, int64_t in_len, int64_t out_len, double scale, double roi_s,
                                double roi_e) {
  ResizeFilter f;
  f.first.reserve(static_cast<size_t>(out_len) + 1);
  f.first.push_back(0);
  if (!o.antialias) {
    for (const ResizeTaps& t : resize_axis_taps(o, in_len, out_len, scale, roi_s, roi_e)) {
      f.outside.push_back(static_cast<uint8_t>(t.outside != 0));
      for (int k = 0; k < (t.outside ? 0 : t.n); ++k) {
        f.idx.push_back(t.idx[k]);
        f.w.push_back(t.w[k]);
      }
      f.first.push_back(static_cast<int64_t>(f.idx.size()));
    }
    return f;
  }
  // The reference's support: with s = min(scale, 1), source offsets start .. 1 - start around
  // the sample, start = floor(-R / s) + 1 for the kernel's radius R (1: linear, 2: cubic).
  // (A NaN scale, which leaves nothing to compute, taken as 1; the support bounded for absurd
  // scales: one past the whole axis only happens where the output has no index to compute.)
  const double s = scale > 0 && scale < 1 ? scale : 1.0, radius = o.mode == "linear" ? 1.0 : 2.0;
  const double start = std::max(std::floor(-radius / s) + 1, -static_cast<double>(in_len) - 2);
  const int64_t first_offset = static_cast<int64_t>(start), count = 2 - 2 * first_offset;
  // The taps number out_len * count, about 2 * radius * in_len: out_len is in_len * scale (roi
  // does not enter it, as in ONNX's reference and ONNX Runtime) and count about 2 * radius / s.
  std::vector<double> weights(static_cast<size_t>(count));
  for (int64_t j = 0; j < out_len; ++j) {
    double x = source_coord(o, j, in_len, scale, roi_s, roi_e);
    const bool outside = o.ctm == "tf_crop_and_resize" && !(x >= 0 && x <= static_cast<double>(in_len - 1));
    f.outside.push_back(static_cast<uint8_t>(outside));
    if (!outside) {
      x = std::isnan(x) ? 0.0 : std::clamp(x, -4.0 - static_cast<double>(count), static_cast<double>(in_len + count) + 4.0);
      // The sample's base index: the reference's neighbours of an integral x start one lower.
      const int64_t base = static_cast<int64_t>(std::ceil(x)) - 1;
      double sum = 0;
      for (int64_t k = 0; k < count; ++k) {
        const int64_t i = base + first_offset + k;
        double weight = filter_weight(o, (static_cast<double>(i) - x) * s);
        if (o.exclude_outside && (i < 0 || i >= in_len)) weight = 0;
        weights[static_cast<size_t>(k)] = weight;
        sum += weight;
      }
      for (int64_t k = 0; k < count; ++k) {
        f.idx.push_back(std::clamp<int64_t>(base + first_offset + k, 0, in_len - 1));
        f.w.push_back(static_cast<float>(sum != 0 ? weights[static_cast<size_t>(k)] / sum : 0.0));
      }
    }
    f.first.push_back(static_cast<int64_t>(f.idx.size()));
  }
  return f;
}

}  // namespace kiln::ir
