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

#ifdef __CUDACC__
// The activation on the device; the same definitions as ir::Activation::apply.
__device__ __forceinline__ float activate(const DeviceActivation& a, float x) {
  switch (a.kind) {
    case 1: return x > 0.f ? x : 0.f;
    case 2: return fminf(fmaxf(x, a.alpha), a.beta);
    case 3: return 1.f / (1.f + __expf(-x));
    case 4: return x / (1.f + __expf(-x));
    case 5: return x * fminf(fmaxf(x / 6.f + 0.5f, 0.f), 1.f);
    case 6: return fminf(fmaxf(a.alpha * x + a.beta, 0.f), 1.f);
    case 7: return x >= 0.f ? x : a.alpha * x;
    case 8: return tanhf(x);
    case 9: return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
    case 10: return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
  return x;
}
#endif

// y has `n` elements of `dtype` (float32 or float16); element i belongs to channel
// (i / inner) % channels. bias (float32, may be null) has `channels` entries; z (may be
// null) has y's dtype and layout.
void launch_epilogue(void* y, const float* bias, const void* z, int64_t n, int64_t channels, int64_t inner,
                     DType dtype, DeviceActivation act, cudaStream_t stream);

// The same for float16 NHWC y [.., channels] written as float8e4m3fn y8 (another buffer):
// saturate(act(y + bias[channel]) * inv_y_scale), rounded to nearest even; n and channels
// multiples of 8.
void launch_epilogue_to_fp8(const void* y, void* y8, const float* bias, int64_t n, int64_t channels, DeviceActivation act,
                            float inv_y_scale, cudaStream_t stream);

// The same for a conv-like output whose channel is logical dim 1 (any layout).
void launch_channel_epilogue(void* y, const float* bias, const void* z, const TensorSpec& spec, DeviceActivation act,
                             cudaStream_t stream);

}  // namespace kiln::cuda
