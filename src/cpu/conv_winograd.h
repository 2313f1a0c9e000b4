// 3x3 convolutions of stride 1 by Winograd's minimal filtering F(2x2, 3x3) (Lavin and Gray, "Fast
// Algorithms for Convolutional Neural Networks", 2016), for the float32 CPU engine on AVX-512.
//
// Each 2x2 block of outputs (a tile) is computed from the 4x4 block of inputs under it: the input
// block and the 3x3 filter are each transformed into 4x4 values, the 16 pairs multiplied and
// summed over the input channels, and the 16 sums transformed back into the 2x2 outputs. The sums
// over channels are 16 GEMMs, U_xi [M x C] @ V_xi [C x tiles], on kiln's packed sgemm; the filters'
// transforms U are packed once, when the kernel is created. Per output, 16 products of channel
// pairs replace the direct convolution's 36: 2.25x fewer multiply-adds for the transforms' adds.
//
// The transforms use the coefficients 0, +-1 (inputs, outputs) and 1/2 (filters), so they only
// round in their additions: the results differ from the direct convolution's by a few units in
// the last place of the sums (tests/unit/conv_test.cc compares both with the reference).
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/conv_shape.h"
#include "cpu/gemm_util.h"
#include "cpu/sgemm.h"

namespace kiln::cpu {

// How run() shares an image's work among the threads. kImagePhases: three loops over the whole
// image (input transforms by channel, the 16 GEMMs, output transforms by channel), each U read
// once; kThreadBlocks: each thread takes blocks of tile rows whole, their transforms and sums in
// its own cache, U read once per block. kAuto picks by the sizes; the others are a test and
// benchmark hook (bench/sgemm_bench.cc), as sgemm_set_narrow_policy.
enum class WinogradSchedule { kAuto, kImagePhases, kThreadBlocks };
void winograd_set_schedule(WinogradSchedule schedule);

// U [16][M][C] = G g G^T of every filter g of w [M, C, 3, 3]: the transformed filters, position
// xi = 4 i + j of the 4x4 values first.
std::vector<float> winograd_filters(const float* w, int64_t out_channels, int64_t in_channels);

class WinogradConv {
 public:
  // Does the kernel exist for a convolution of `group` groups by these weights [M, C, kh, kw]
  // (2-D, 3x3, one group) on this CPU? Strides and dilations are checked by runs_geometry().
  static bool available(const std::vector<int64_t>& w_shape, int64_t group);
  // Does a convolution node by constant weights of this shape take the kernel: available(),
  // strides and dilations 1, and the build option KILN_CPU_WINOGRAD on (OFF keeps every
  // convolution on the direct kernels). The channels-first and channels-last kernels both ask.
  static bool applies(const ir::Node& node, const std::vector<int64_t>& w_shape, int64_t group);
  // Does it run this geometry: 2-D, 3x3, stride 1, dilation 1, one group.
  static bool runs_geometry(const Geo3& g);
  // Is it worth it here: not on a few tiles (ResNet-50's 7x7 layers at batch 1: 16 tiles, of
  // which a quarter is past the edge, in products 16 columns wide).
  static bool pays(const Geo3& g);

  // w: the constant weights [M, C, 3, 3].
  WinogradConv(const float* w, int64_t out_channels, int64_t in_channels);

  // y [batch, M, OH, OW] = act(conv(x) + bias[m] + residual); bias and residual may be null.
  // Must not run concurrently with itself (the first run of narrow outputs adds the transposed
  // product's panels: PackedA::add_wide_panels).
  void run(const Geo3& g, const float* x, const float* bias, const float* residual, const Epilogue& act, float* y);

 private:
  int64_t m_ = 0, c_ = 0;
  std::vector<PackedA> u_;  // the 16 transformed filter matrices U_xi [M x C]
};

}  // namespace kiln::cpu
