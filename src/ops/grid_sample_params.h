// GridSample's arithmetic (ONNX opset 16 for 2-D, opset 20 for N-D), shared by every backend:
// a grid value in [-1, 1] becomes a coordinate in the input, out-of-range coordinates are clamped
// or reflected, and the output is the input at the coordinate, nearest or interpolated (linear
// or cubic, separable over the spatial dimensions; neighbours outside the input read 0, the
// border, or the reflection, by padding_mode).
#pragma once

#include <math.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ir/host_device.h"

namespace kiln::ir {

enum class GridSampleMode { kNearest, kLinear, kCubic };
enum class GridSamplePadding { kZeros, kBorder, kReflection };

// A normalized coordinate n in [-1, 1] as a position along a dimension of `length`.
KILN_HOST_DEVICE double grid_denormalize(double n, int64_t length, bool align_corners) {
  return align_corners ? (n + 1) / 2.0 * double(length - 1) : ((n + 1) * double(length) - 1) / 2.0;
}

// The lowest and highest position inside a dimension of `length`.
KILN_HOST_DEVICE void grid_borders(int64_t length, bool align_corners, double& lo, double& hi) {
  lo = align_corners ? 0.0 : -0.5;
  hi = align_corners ? double(length - 1) : double(length) - 0.5;
}

// x reflected at lo and hi until it lies between them. The reflection count stays a double: a
// huge or infinite x (fuzz_graph: grid values of 1e38 and inf) has no int64 count, and where
// rounding leaves the result outside it is clamped in; NaN gives lo.
KILN_HOST_DEVICE double grid_reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0 || !(x - x == 0)) return lo;  // x - x is 0 for finite x only
  if (x < lo) {
    const double dx = lo - x;
    const double n = ::floor(dx / range);
    const double r = dx - n * range;
    return std::clamp(::fmod(n, 2.0) == 0 ? lo + r : hi - r, lo, hi);
  }
  if (x > hi) {
    const double dx = x - hi;
    const double n = ::floor(dx / range);
    const double r = dx - n * range;
    return std::clamp(::fmod(n, 2.0) == 0 ? hi - r : lo + r, lo, hi);
  }
  return x;
}

// The index of a neighbour along a dimension of `length`, or -1 where padding reads a zero.
KILN_HOST_DEVICE int64_t grid_pixel_index(int64_t i, int64_t length, GridSamplePadding padding, double lo, double hi) {
  switch (padding) {
    case GridSamplePadding::kZeros: return i >= 0 && i < length ? i : -1;
    case GridSamplePadding::kBorder: return i < 0 ? 0 : (i > length - 1 ? length - 1 : i);
    case GridSamplePadding::kReflection: return static_cast<int64_t>(grid_reflect(double(i), lo, hi));
  }
  return -1;
}

// Keys' cubic convolution weights (alpha -0.75) of the 4 neighbours at distance t from the
// first inner one.
KILN_HOST_DEVICE void grid_cubic_weights(double t, double w[4]) {
  constexpr double a = -0.75;
  const double x = ::fabs(t);
  w[0] = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a;
  w[1] = ((a + 2) * x - (a + 3)) * x * x + 1;
  w[2] = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1;
  w[3] = ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a;
}

// The taps (1 nearest, 2 linear, 4 cubic) of grid value `g` along a spatial dimension of `length`
// whose borders grid_borders gives: each neighbour's index (-1 where padding reads a zero) and
// weight.
KILN_HOST_DEVICE void grid_neighbours(float g, int64_t length, bool align_corners, GridSampleMode mode,
                                      GridSamplePadding padding, double lo, double hi, int64_t* ix, double* w) {
  double v = grid_denormalize(g, length, align_corners);
  // A NaN grid value has no position: it reads as outside the input (fuzz_graph).
  if (v != v) v = lo - 4;
  if (mode == GridSampleMode::kNearest) v = ::nearbyint(v);  // half to even, as numpy's rint
  if (v < lo || v > hi) {
    if (padding == GridSamplePadding::kBorder) v = std::clamp(v, 0.0, double(length - 1));
    else if (padding == GridSamplePadding::kReflection) v = grid_reflect(v, lo, hi);
  }
  // With zeros padding every neighbour of a position 4 or more outside reads 0: clamping there
  // changes nothing and keeps a huge one (1e38, inf) in int64's range.
  v = std::clamp(v, lo - 4, hi + 4);
  if (mode == GridSampleMode::kNearest) {
    ix[0] = grid_pixel_index(static_cast<int64_t>(v), length, padding, lo, hi);
    w[0] = 1;
    return;
  }
  const int64_t base = static_cast<int64_t>(::floor(v)) - (mode == GridSampleMode::kCubic ? 1 : 0);
  const double t = v - ::floor(v);
  const int taps = mode == GridSampleMode::kLinear ? 2 : 4;
  if (mode == GridSampleMode::kLinear) {
    w[0] = 1 - t;
    w[1] = t;
  } else {
    grid_cubic_weights(t, w);
  }
  for (int k = 0; k < taps; ++k) ix[k] = grid_pixel_index(base + k, length, padding, lo, hi);
}

}  // namespace kiln::ir
