// kiln's own depthwise convolution (group = channels, one filter per channel) on float16
// channels-last data, with the epilogue fused: y = act(conv(x, w) + bias + z).
//
// Why our own: cuDNN's float16 NHWC depthwise kernels were slow (MobileNet-v2 ran at a fifth
// of torch.compile's speed). It is timed against cuDNN as one more tactic. A depthwise convolution does 2*R*S flops per output element and is bound by
// memory: each thread computes 8 channels (one 16-byte load or store) of `outputs_per_thread`
// neighbouring output pixels of a row, keeping the input columns they share in registers.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

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

// x, z, y: float16 NHWC; w: float32 [r*s][c] (tap-major, so 8 channels of one tap are one
// 32-byte load); bias: float32 [c] (may be null); z: same shape as y (may be null).
// outputs_per_thread: 1, 2 or 4.
void launch_depthwise_nhwc(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                           const DepthwiseGeometry& g, ir::Activation act, int outputs_per_thread,
                           cudaStream_t stream);

}  // namespace kiln::cuda
