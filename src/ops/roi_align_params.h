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

#include <algorithm>
#include <cmath>
#include <cstdint>

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

inline RoiSample roi_bilinear_sample(float y, float x, int64_t height, int64_t width) {
  RoiSample s;
  if (!(y >= -1.0f && y <= float(height) && x >= -1.0f && x <= float(width))) return s;  // NaN too
  y = std::max(y, 0.0f);
  x = std::max(x, 0.0f);
  int64_t y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x), y_high, x_high;
  if (y_low >= height - 1) y_high = y_low = height - 1, y = float(y_low);
  else y_high = y_low + 1;
  if (x_low >= width - 1) x_high = x_low = width - 1, x = float(x_low);
  else x_high = x_low + 1;
  const float ly = y - float(y_low), lx = x - float(x_low), hy = 1 - ly, hx = 1 - lx;
  s.offset[0] = y_low * width + x_low, s.offset[1] = y_low * width + x_high;
  s.offset[2] = y_high * width + x_low, s.offset[3] = y_high * width + x_high;
  s.weight[0] = hy * hx, s.weight[1] = hy * lx, s.weight[2] = ly * hx, s.weight[3] = ly * lx;
  return s;
}

// Samples per bin along one axis, at most: a region's extent comes from the data, and a huge
// one would sample for hours.
constexpr int64_t kMaxRoiSamplesPerAxis = 1024;

// Calls sample(bin_y, bin_x, RoiSample) for every sample of every bin of one region, and
// returns the number of samples per bin (at least 1: the average's divisor), or 0 without
// sampling when an axis would need more than kMaxRoiSamplesPerAxis.
template <class F>
int64_t roi_align_samples(const float* roi, const RoiAlignParams& p, int64_t height, int64_t width, F&& sample) {
  const float offset = p.half_pixel ? 0.5f : 0.0f;
  const float start_w = roi[0] * p.spatial_scale - offset, start_h = roi[1] * p.spatial_scale - offset;
  const float end_w = roi[2] * p.spatial_scale - offset, end_h = roi[3] * p.spatial_scale - offset;
  float roi_w = end_w - start_w, roi_h = end_h - start_h;
  if (!p.half_pixel) roi_w = std::max(roi_w, 1.0f), roi_h = std::max(roi_h, 1.0f);
  const float bin_h = roi_h / float(p.output_height), bin_w = roi_w / float(p.output_width);
  // An empty, inverted or NaN region has no samples: its bins read 0.
  auto grid = [&](float extent, int64_t bins) -> int64_t {
    if (p.sampling_ratio > 0) return p.sampling_ratio;
    const float n = std::ceil(extent / float(bins));
    return n > float(kMaxRoiSamplesPerAxis) ? kMaxRoiSamplesPerAxis + 1 : n >= 1 ? static_cast<int64_t>(n) : 0;
  };
  const int64_t grid_h = grid(roi_h, p.output_height), grid_w = grid(roi_w, p.output_width);
  if (grid_h > kMaxRoiSamplesPerAxis || grid_w > kMaxRoiSamplesPerAxis) return 0;
  for (int64_t ph = 0; ph < p.output_height; ++ph)
    for (int64_t pw = 0; pw < p.output_width; ++pw)
      for (int64_t iy = 0; iy < grid_h; ++iy) {
        const float y = start_h + float(ph) * bin_h + (float(iy) + 0.5f) * bin_h / float(grid_h);
        for (int64_t ix = 0; ix < grid_w; ++ix) {
          const float x = start_w + float(pw) * bin_w + (float(ix) + 0.5f) * bin_w / float(grid_w);
          sample(ph, pw, roi_bilinear_sample(y, x, height, width));
        }
      }
  return std::max<int64_t>(grid_h * grid_w, 1);
}

}  // namespace kiln::ir
