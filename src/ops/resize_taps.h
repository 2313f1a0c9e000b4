// Resize's interpolation taps, shared by the CPU kernel and the CUDA layer so both read the
// same source elements with the same weights: for one resized axis, per output index, up to
// four source indices and weights (nearest: 1, linear: 2, cubic: 4), or "outside" (the
// extrapolation value, tf_crop_and_resize beyond the input).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

struct ResizeOptions {
  std::string mode, ctm, nearest;  // mode, coordinate_transformation_mode, nearest_mode
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;  // linear and cubic: widen the filter by 1 / scale when downscaling
  float extrapolation = 0.f;
};

// The node's Resize attributes, with ONNX's defaults.
ResizeOptions resize_options(const Node& node);

// What a nearest Resize writes where it reads outside the input (tf_crop_and_resize): the
// options' extrapolation_value in `dtype`'s bits, as ONNX Runtime converts it (float16 and
// bfloat16 rounded to nearest, integers truncated and saturated, bool "!= 0"); 0 for other modes.
// Refuses a value other than 0 in a type it has no conversion to (the float8 and 4-bit types).
uint64_t resize_fill_bits(const ResizeOptions& o, DType dtype);

// A plain struct, uploaded as is to the GPU as a table.
struct ResizeTaps {
  int64_t idx[4] = {0, 0, 0, 0};
  float w[4] = {0, 0, 0, 0};
  int32_t n = 0;
  int32_t outside = 0;
};

// The taps of every output index along an axis of in_len resized to out_len by `scale`
// (roi_s, roi_e: the axis' roi, for tf_crop_and_resize).
std::vector<ResizeTaps> resize_axis_taps(const ResizeOptions& o, int64_t in_len, int64_t out_len, double scale,
                                         double roi_s, double roi_e);

// True when the taps read each input index as it is (the axis is not really resized).
bool resize_taps_identity(const std::vector<ResizeTaps>& taps, int64_t in_len);

// The taps of an axis with any number per output index: those of resize_axis_taps, or with
// `antialias` the linear and cubic filters stretched by 1 / scale when downscaling (a tent or
// Keys kernel over every source index within its support, weights normalized to sum 1, source
// indices past the edges reading the edge), as ONNX's reference computes them. Output j reads
// idx and w from first[j] to first[j + 1]; `outside` outputs read none and take the
// extrapolation value.
struct ResizeFilter {
  std::vector<int64_t> first, idx;
  std::vector<float> w;
  std::vector<uint8_t> outside;
  // True when every output index reads the input index of its own number with weight 1.
  bool identity(int64_t in_len) const;
};
ResizeFilter resize_axis_filter(const ResizeOptions& o, int64_t in_len, int64_t out_len, double scale, double roi_s,
                                double roi_e);

}  // namespace kiln::ir
