// The QConv epilogue on the GPU, shared by kiln's INT8 kernels (int8_conv.cu, int8_depthwise.cu):
// computed exactly as the CPU reference computes it (src/cpu/quantized_conv.cc), so every kernel
// that uses it gives the CPU engine's integers bit for bit.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/epilogue.h"

namespace kiln::cuda::int8_epilogue {

// The op's requantization: v * (1 / y_scale) rounded to nearest, ties to even, saturated to
// int8 (cvt.rni.sat: one instruction for nearbyint and the clamp); returned in the low byte.
__device__ __forceinline__ uint32_t quantize_int8(float v, float inv_y_scale) {
  int q;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(q) : "f"(__fmul_rn(v, inv_y_scale)));
  return static_cast<uint32_t>(q);
}

// Activations by template where the common ones cost nothing: 0 none, 1 Relu, 2 any other
// (ir::Activation's switch).
template <int kAct> __device__ __forceinline__ float activation(const ir::Activation& act, float v) {
  if constexpr (kAct == 0) return v;
  else if constexpr (kAct == 1) return fmaxf(v, 0.f);
  else return act.apply(v);
}

// The epilogue of two neighbouring output channels of one pixel: reads the residual pair from
// the residual tile and writes the output pair to the output tile (both in shared memory).
template <class YT, class ZT, int kAct>
__device__ __forceinline__ void epilogue_pair(int acc0, int acc1, const float2 mult, const float2 bias, const void* z_pair,
                                              float z_scale, void* y_pair, float inv_y_scale, const ir::Activation& act) {
  float v0 = __fmaf_rn(__int2float_rn(acc0), mult.x, bias.x);
  float v1 = __fmaf_rn(__int2float_rn(acc1), mult.y, bias.y);
  if constexpr (std::is_same_v<ZT, int8_t>) {
    const char2 z = *static_cast<const char2*>(z_pair);
    // Separate multiply and add, as the CPU reference rounds them (no contraction to fma).
    v0 = __fadd_rn(v0, __fmul_rn(static_cast<float>(z.x), z_scale));
    v1 = __fadd_rn(v1, __fmul_rn(static_cast<float>(z.y), z_scale));
  } else if constexpr (std::is_same_v<ZT, __half>) {
    const float2 z = __half22float2(*static_cast<const __half2*>(z_pair));
    v0 = __fadd_rn(v0, __fmul_rn(z.x, z_scale));
    v1 = __fadd_rn(v1, __fmul_rn(z.y, z_scale));
  }
  v0 = activation<kAct>(act, v0);
  v1 = activation<kAct>(act, v1);
  if constexpr (std::is_same_v<YT, int8_t>)
    *static_cast<uint16_t*>(y_pair) =
        static_cast<uint16_t>(__byte_perm(quantize_int8(v0, inv_y_scale), quantize_int8(v1, inv_y_scale), 0x0040));
  else
    *static_cast<__half2*>(y_pair) = __floats2half2_rn(v0, v1);
}

}  // namespace kiln::cuda::int8_epilogue
