// The epilogue that libraries do not fuse for us: y = act(y + bias[channel] + z), in place,
// one pass over y. Used after cuDNN convolutions and cuBLASLt matrix products whose
// activation the library has no epilogue for.
#pragma once

#include <cuda_runtime.h>

#include "cuda/layer.h"
#include "ir/activation.h"

namespace kiln::cuda {

// ir::Activation in a form a kernel can take by value.
struct DeviceActivation {
  int kind = 0;  // 0 none, 1 relu, 2 clip, 3 sigmoid, 4 silu, 5 hardswish, 6 hardsigmoid,
                 // 7 leakyrelu, 8 tanh, 9 gelu, 10 gelu-tanh
  float alpha = 0, beta = 0;
};
DeviceActivation device_activation(const ir::Activation& a);

// y has `n` elements of `dtype` (float32 or float16); element i belongs to channel
// (i / inner) % channels. bias (float32, may be null) has `channels` entries; z (may be
// null) has y's dtype and layout.
void launch_epilogue(void* y, const float* bias, const void* z, int64_t n, int64_t channels, int64_t inner,
                     DType dtype, DeviceActivation act, cudaStream_t stream);

// The same for a conv-like output whose channel is logical dim 1 (any layout).
void launch_channel_epilogue(void* y, const float* bias, const void* z, const TensorSpec& spec, DeviceActivation act,
                             cudaStream_t stream);

}  // namespace kiln::cuda
