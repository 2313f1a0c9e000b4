// kiln's own depthwise convolution (group = channels, one filter per channel) on float16
// channels-last data, with the epilogue fused: y = act(conv(x, w) + bias + z).
//
// Why our own: cuDNN's float16 NHWC depthwise kernels were slow (MobileNet-v2 ran at a fifth
// of torch.compile's speed). It is timed against cuDNN as one more tactic. A depthwise convolution does 2*R*S flops per output element and is bound by
// memory: each thread computes 2 to 8 channels (one 4- to 16-byte load or store) of a tile of
// neighbouring output pixels, keeping the input pixels they share in registers.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

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

// How a tile of output pixels is computed, and its size. Three paths:
// - kAny: any geometry; a thread computes `columns` neighbouring outputs of one row, 8 channels,
//   each tap loaded through the L1 cache.
// - kFixed: the filter's width and stride are compile-time constants (3, 5 or 7; stride 1 or 2;
//   no dilation); a thread computes `columns` x `rows` outputs of `channels` channels, and the
//   input columns a row of outputs shares are loaded once into registers (several rows need a
//   square filter; each input row loaded then serves every output row it reaches).
// - kStaged: square 3x3, 5x5 or 7x7 filters at stride 1: a block stages its input tile, halo
//   included, and its filters in shared memory with zeros for the padding, so that every input
//   pixel is read from global memory about once instead of once per tap; then each thread
//   computes `columns` x `rows` outputs of 2 channels from shared memory with no bounds checks.
//   `channels` is the block's slice of channels (8, 16 or 32: one to four 16-byte loads per
//   pixel), and the block's tile of outputs is 16x16 (8x2 per thread) or 8x8 (4x2).
// - kStagedFilterInRegisters: the same, with each thread's filters in its registers (2 * R * S
//   of them) instead of shared memory, which then serves the input alone.
// Larger tiles load and convert less per multiply-add but hold more registers, which lowers
// occupancy; small tiles give more threads at batch 1. No tile always wins: the build times
// every tile depthwise_tiles() lists (bench/depthwise_tiles.py shows them all on real models).
enum class DepthwisePath { kAny, kFixed, kStaged, kStagedFilterInRegisters };
struct DepthwiseTile {
  DepthwisePath path = DepthwisePath::kAny;
  int columns = 1;   // outputs of a row, per thread
  int rows = 1;      // output rows, per thread
  int channels = 8;  // per thread (kAny, kFixed), or per block (kStaged)
  std::string name() const {
    const char* kind = path == DepthwisePath::kAny     ? "/any"
                       : path == DepthwisePath::kFixed ? "/fixed"
                       : path == DepthwisePath::kStaged ? "/staged"
                                                        : "/staged-rf";
    return std::to_string(columns) + "x" + std::to_string(rows) + kind + "/c" + std::to_string(channels);
  }
};
bool depthwise_tile_supported(const DepthwiseGeometry& g, DepthwiseTile tile);
// Every tile the kernel has for this geometry, in the order the build times them.
std::vector<DepthwiseTile> depthwise_tiles(const DepthwiseGeometry& g);

// x, z, y: float16 NHWC; w: float32 [r*s][c] (tap-major, so 8 channels of one tap are one
// 32-byte load); bias: float32 [c] (may be null); z: same shape as y (may be null).
void launch_depthwise_nhwc(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                           const DepthwiseGeometry& g, ir::Activation act, DepthwiseTile tile, cudaStream_t stream);

}  // namespace kiln::cuda
