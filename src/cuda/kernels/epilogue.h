// The epilogue that libraries do not fuse for us: y = act(y + bias[channel] + z), in place,
// one pass over y. Used after cuDNN convolutions and cuBLASLt matrix products whose
// activation the library has no epilogue for.
#pragma once

#include <cuda_runtime.h>

#include "cuda/runtime/layer.h"
#include "ir/activation.h"

namespace kiln::cuda {

// Kernels take ir::Activation by value and compute it with ir::Activation::apply.

// y has `n` elements of `dtype` (float32 or float16); element i belongs to channel
// (i / inner) % channels. bias (float32, may be null) has `channels` entries; z (may be
// null) has y's dtype and layout.
void launch_epilogue(void* y, const float* bias, const void* z, int64_t n, int64_t channels, int64_t inner,
                     DType dtype, ir::Activation act, cudaStream_t stream);

// The same for float16 NHWC y [.., channels] written as float8e4m3fn y8 (another buffer):
// saturate(act(y + bias[channel]) * inv_y_scale), rounded to nearest even; n and channels
// multiples of 8.
void launch_epilogue_to_fp8(const void* y, void* y8, const float* bias, int64_t n, int64_t channels, ir::Activation act,
                            float inv_y_scale, cudaStream_t stream);

// The same for a conv-like output whose channel is logical dim 1 (any layout).
void launch_channel_epilogue(void* y, const float* bias, const void* z, const TensorSpec& spec, ir::Activation act,
                             cudaStream_t stream);

}  // namespace kiln::cuda
