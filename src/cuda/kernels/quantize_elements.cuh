// QuantizeLinear's arithmetic on the GPU, for the layers that quantize whole tensors: the
// QuantizeLinear layer (layers/quantize.cu) and the attention writing int8 (layers/attention.cu,
// and kiln's attention kernel's epilogue, kernels/flash_attention.cu).
// The quotient x / scale in float32, rounded half to even (nearbyintf), plus the zero point,
// saturated to [lo, hi]; NaN gives 0, as the CPU kernel (src/cpu/quantize.cc).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace kiln::cuda {

// One value quantized: the float32 quotient x / scale rounded half to even, plus the zero point,
// saturated to [lo, hi] in float (no integer overflow from a tiny scale); NaN gives 0.
__device__ __forceinline__ float quantized_value(float x, float scale, float zero, float lo, float hi) {
  float q = nearbyintf(x / scale) + zero;
  if (q != q) q = 0.f;  // NaN, as the CPU kernel
  return fminf(fmaxf(q, lo), hi);
}

template <class F, class Q>
__global__ void quantize_kernel(const F* __restrict__ x, Q* __restrict__ y, const float* __restrict__ scale,
                                const int32_t* __restrict__ zero, int64_t n, int64_t channels, int64_t inner, float lo,
                                float hi) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = channels == 1 ? 0 : (i / inner) % channels;
    y[i] = static_cast<Q>(quantized_value(static_cast<float>(x[i]), scale[c], static_cast<float>(zero[c]), lo, hi));
  }
}

// Eight consecutive float16 (one 16-byte load) or float32 (two) values, group g of x.
template <class F>
__device__ __forceinline__ void load8(const F* __restrict__ x, int64_t g, F (&v)[8]) {
  if constexpr (sizeof(F) == 2) {
    *reinterpret_cast<uint4*>(v) = reinterpret_cast<const uint4*>(x)[g];
  } else {
    reinterpret_cast<float4*>(v)[0] = reinterpret_cast<const float4*>(x)[2 * g];
    reinterpret_cast<float4*>(v)[1] = reinterpret_cast<const float4*>(x)[2 * g + 1];
  }
}

// Per-tensor quantization to an 8-bit type, eight elements per thread (16-byte loads of
// float16, 8-byte stores): the INT8 engine quantizes whole activations with it.
template <class F, class Q>
__global__ void quantize8_kernel(const F* __restrict__ x, Q* __restrict__ y, const float* __restrict__ scale,
                                 const int32_t* __restrict__ zero, int64_t groups, float lo, float hi) {
  const float inv = scale[0], zp = static_cast<float>(zero[0]);
  for (int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; g < groups; g += int64_t{gridDim.x} * blockDim.x) {
    F v[8];
    load8(x, g, v);
    Q q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = static_cast<Q>(quantized_value(static_cast<float>(v[i]), inv, zp, lo, hi));
    reinterpret_cast<uint2*>(y)[g] = *reinterpret_cast<const uint2*>(q);
  }
}

}  // namespace kiln::cuda
