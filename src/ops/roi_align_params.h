// RoiAlign's arithmetic (ONNX opsets 10 and 16), shared by every backend. Each region of
// interest [x1, y1, x2, y2], scaled by spatial_scale (and shifted by half a pixel under
// coordinate_transformation_mode "half_pixel"), is cut into output_height x output_width bins;
// each bin averages (mode "avg") or takes the largest of (mode "max") sampling_ratio^2 bilinear
// samples, or ceil(bin size) per axis when sampling_ratio is 0. "output_half_pixel" (opset 10's
// only behaviour) does not shift and makes a region at least one pixel wide and high. A sample
// more than one pixel outside the input reads 0; one less than that is clamped to the border.
// Positions and weights are computed in float, as ONNX Runtime's kernel does, and mode "max"
// takes, as it does, the largest of the four weighted neighbours of each sample.
#pragma once

#include <math.h>

#include <cstdint>

#include "ir/host_device.h"

namespace kiln::ir {

struct RoiAlignParams {
  bool max_mode = false;
  bool half_pixel = true;
  int64_t output_height = 1, output_width = 1, sampling_ratio = 0;
  float spatial_scale = 1;
};

// A sample's four neighbours (offsets into one channel's H x W plane) and their weights.
struct RoiSample {
  int64_t offset[4] = {0, 0, 0, 0};
  float weight[4] = {0, 0, 0, 0};
};

// a * b, a + b and a - b each rounded on its own, on the device too, where nvcc would otherwise
// fuse a product and a sum into one FMA: the CPU engine and the GPU then compute the same sample
// positions, weights and sums, bit for bit.
KILN_HOST_DEVICE float roi_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KILN_HOST_DEVICE float roi_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KILN_HOST_DEVICE float roi_sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

KILN_HOST_DEVICE RoiSample roi_bilinear_sample(float y, float x, int64_t height, int64_t width) {
  RoiSample s;
  if (!(y >= -1.0f && y <= float(height) && x >= -1.0f && x <= float(width))) return s;  // NaN too
  y = y < 0.0f ? 0.0f : y;
  x = x < 0.0f ? 0.0f : x;
  int64_t y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x), y_high, x_high;
  if (y_low >= height - 1) y_high = y_low = height - 1, y = float(y_low);
  else y_high = y_low + 1;
  if (x_low >= width - 1) x_high = x_low = width - 1, x = float(x_low);
  else x_high = x_low + 1;
  const float ly = y - float(y_low), lx = x - float(x_low), hy = 1 - ly, hx = 1 - lx;
  s.offset[0] = y_low * width + x_low, s.offset[1] = y_low * width + x_high;
  s.offset[2] = y_high * width + x_low, s.offset[3] = y_high * width + x_high;
  s.weight[0] = roi_mul(hy, hx), s.weight[1] = roi_mul(hy, lx), s.weight[2] = roi_mul(ly, hx), s.weight[3] = roi_mul(ly, lx);
  return s;
}

// Samples per bin along one axis, at most: a region's extent comes from the data, and a huge
// one would sample for hours.
constexpr int64_t kMaxRoiSamplesPerAxis = 1024;

// One region's bins: where they start, how large they are, and the samples per bin along each
// axis (0 for an empty, inverted or NaN region, whose bins read 0).
struct RoiGrid {
  float start_h = 0, start_w = 0, bin_h = 0, bin_w = 0;
  int64_t grid_h = 0, grid_w = 0;
  bool too_many = false;  // an axis would need more than kMaxRoiSamplesPerAxis samples per bin

  // The average's divisor: the samples per bin, at least 1.
  KILN_HOST_DEVICE int64_t count() const { return grid_h * grid_w > 1 ? grid_h * grid_w : 1; }
  // The position of sample (iy, ix) of bin (ph, pw).
  KILN_HOST_DEVICE float y(int64_t ph, int64_t iy) const {
    return roi_add(roi_add(start_h, roi_mul(float(ph), bin_h)), roi_mul(float(iy) + 0.5f, bin_h) / float(grid_h));
  }
  KILN_HOST_DEVICE float x(int64_t pw, int64_t ix) const {
    return roi_add(roi_add(start_w, roi_mul(float(pw), bin_w)), roi_mul(float(ix) + 0.5f, bin_w) / float(grid_w));
  }
};

KILN_HOST_DEVICE int64_t roi_samples_per_bin(float extent, int64_t bins, int64_t sampling_ratio) {
  if (sampling_ratio > 0) return sampling_ratio;
  const float n = ceilf(extent / float(bins));
  return n > float(kMaxRoiSamplesPerAxis) ? kMaxRoiSamplesPerAxis + 1 : n >= 1 ? static_cast<int64_t>(n) : 0;
}

KILN_HOST_DEVICE RoiGrid roi_grid(const float* roi, const RoiAlignParams& p) {
  const float offset = p.half_pixel ? 0.5f : 0.0f;
  RoiGrid g;
  g.start_w = roi_sub(roi_mul(roi[0], p.spatial_scale), offset);
  g.start_h = roi_sub(roi_mul(roi[1], p.spatial_scale), offset);
  const float end_w = roi_sub(roi_mul(roi[2], p.spatial_scale), offset);
  const float end_h = roi_sub(roi_mul(roi[3], p.spatial_scale), offset);
  float roi_w = end_w - g.start_w, roi_h = end_h - g.start_h;
  if (!p.half_pixel) roi_w = roi_w < 1.0f ? 1.0f : roi_w, roi_h = roi_h < 1.0f ? 1.0f : roi_h;
  g.bin_h = roi_h / float(p.output_height), g.bin_w = roi_w / float(p.output_width);
  g.grid_h = roi_samples_per_bin(roi_h, p.output_height, p.sampling_ratio);
  g.grid_w = roi_samples_per_bin(roi_w, p.output_width, p.sampling_ratio);
  g.too_many = g.grid_h > kMaxRoiSamplesPerAxis || g.grid_w > kMaxRoiSamplesPerAxis;
  return g;
}

// Calls sample(bin_y, bin_x, RoiSample) for every sample of every bin of one region, and
// returns the number of samples per bin (at least 1: the average's divisor), or 0 without
// sampling when an axis would need more than kMaxRoiSamplesPerAxis.
template <class F>
int64_t roi_align_samples(const float* roi, const RoiAlignParams& p, int64_t height, int64_t width, F&& sample) {
  const RoiGrid g = roi_grid(roi, p);
  if (g.too_many) return 0;
  for (int64_t ph = 0; ph < p.output_height; ++ph)
    for (int64_t pw = 0; pw < p.output_width; ++pw)
      for (int64_t iy = 0; iy < g.grid_h; ++iy) {
        const float y = g.y(ph, iy);
        for (int64_t ix = 0; ix < g.grid_w; ++ix) sample(ph, pw, roi_bilinear_sample(y, g.x(pw, ix), height, width));
      }
  return g.count();
}

}  // namespace kiln::ir
