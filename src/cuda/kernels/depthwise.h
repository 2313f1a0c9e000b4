// kiln's own depthwise convolution (group = channels, one filter per channel) on float16
// channels-last data, with the epilogue fused: y = act(conv(x, w) + bias + z).
//
// Why our own: cuDNN's float16 NHWC depthwise kernels were slow (MobileNet-v2 ran at a fifth
// of torch.compile's speed). It is timed against cuDNN as one more tactic. A depthwise convolution does 2*R*S flops per output element and is bound by
// memory: each thread computes 8 channels (one 16-byte load or store) of a tile of neighbouring
// output pixels, keeping the input pixels they share in registers.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/kernels/epilogue.h"

namespace kiln::cuda {

struct DepthwiseGeometry {
  int n, c, h, w;   // input (NHWC); output has c channels too
  int oh, ow;       // output spatial size
  int r, s;         // filter height and width
  int pad_h, pad_w, stride_h, stride_w, dil_h, dil_w;
};

// Whether the kernel runs this geometry (channels a multiple of 8 for 16-byte accesses).
bool depthwise_supported(const DepthwiseGeometry& g);

// The output pixels one thread computes (8 channels each): `columns` neighbours in a row, in
// `rows` neighbouring rows, and whether the filter's size is a compile-time constant. With it,
// the input columns a row of outputs shares are loaded once into registers (3x3, 5x5 and 7x7
// at stride 1 or 2, dilation 1; two rows need a square filter); without it, any geometry, each
// tap loaded through the L1 cache. Larger tiles and compile-time filters load less but hold
// more registers, which lowers occupancy (a 4-column 7x7 tile takes 182 registers, the generic
// one 62), so neither always wins: the build times every tile depthwise_tile_supported() takes.
struct DepthwiseTile {
  int columns = 1;             // 1, 2 or 4
  int rows = 1;                // 1, or 2 (2 or 4 columns, compile-time square filter)
  bool fixed_filter = false;   // the compile-time filter path
  std::string name() const {
    return std::to_string(columns) + "x" + std::to_string(rows) + (fixed_filter ? "/fixed" : "/any");
  }
};
bool depthwise_tile_supported(const DepthwiseGeometry& g, DepthwiseTile tile);

// x, z, y: float16 NHWC; w: float32 [r*s][c] (tap-major, so 8 channels of one tap are one
// 32-byte load); bias: float32 [c] (may be null); z: same shape as y (may be null).
void launch_depthwise_nhwc(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                           const DepthwiseGeometry& g, ir::Activation act, DepthwiseTile tile, cudaStream_t stream);

}  // namespace kiln::cuda
