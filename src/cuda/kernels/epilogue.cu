#include "cuda/kernels/epilogue.h"

#include <cuda_fp8.h>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {


// channel of element i: (i / inner) % channels (inner = 1 for NHWC, H*W for NCHW).
template <class T>
__global__ void epilogue_kernel(T* __restrict__ y, const float* __restrict__ bias, const T* __restrict__ z,
                                int64_t n, int64_t channels, int64_t inner, ir::Activation act) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float v = load_float(y, i);
    if (bias) v += bias[(i / inner) % channels];
    if (z) v += load_float(z, i);
    store_float(y, i, act.apply(v));
  }
}

// NHWC float16 with channels % 8 == 0: 8 halves (16 bytes) per thread.
__global__ void epilogue_nhwc_half8_kernel(__half* __restrict__ y, const float* __restrict__ bias,
                                           const __half* __restrict__ z, int64_t n8, int64_t channels,
                                           ir::Activation act) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n8; i += int64_t{gridDim.x} * blockDim.x) {
    uint4 raw = reinterpret_cast<const uint4*>(y)[i];
    uint4 zraw = z ? reinterpret_cast<const uint4*>(z)[i] : uint4{0, 0, 0, 0};
    __half* h = reinterpret_cast<__half*>(&raw);
    const __half* zh = reinterpret_cast<const __half*>(&zraw);
    const int64_t c0 = (i * 8) % channels;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float v = __half2float(h[k]);
      if (bias) v += bias[c0 + k];
      if (z) v += __half2float(zh[k]);
      h[k] = __float2half_rn(act.apply(v));
    }
    reinterpret_cast<uint4*>(y)[i] = raw;
  }
}

// float8e4m3fn y = saturate(act(d + bias) * inv_y_scale), eight float16 values per thread
// (channels a multiple of 8, so a group never straddles a row).
__global__ void epilogue_to_fp8_kernel(const __half* __restrict__ y16, __nv_fp8_storage_t* __restrict__ y,
                                      const float* __restrict__ bias, int64_t groups, int64_t channels,
                                      ir::Activation act, float inv_y_scale) {
  for (int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; g < groups; g += int64_t{gridDim.x} * blockDim.x) {
    const uint4 raw = reinterpret_cast<const uint4*>(y16)[g];
    const __half* h = reinterpret_cast<const __half*>(&raw);
    const int64_t c0 = (g * 8) % channels;
    __nv_fp8_storage_t q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float v = __half2float(h[i]);
      if (bias) v += bias[c0 + i];
      q[i] = __nv_cvt_float_to_fp8(act.apply(v) * inv_y_scale, __NV_SATFINITE, __NV_E4M3);
    }
    reinterpret_cast<uint2*>(y)[g] = *reinterpret_cast<const uint2*>(q);
  }
}

}  // namespace

void launch_epilogue(void* y, const float* bias, const void* z, int64_t n, int64_t channels, int64_t inner,
                     DType dtype, ir::Activation act, cudaStream_t stream) {
  if (n == 0) return;
  if (dtype == DType::kFloat16 && inner == 1 && channels % 8 == 0) {
    epilogue_nhwc_half8_kernel<<<grid_for(n / 8, 256, 2), 256, 0, stream>>>(
        static_cast<__half*>(y), bias, static_cast<const __half*>(z), n / 8, channels, act);
  } else if (dtype == DType::kFloat16) {
    epilogue_kernel<__half><<<grid_for(n, 256, 4), 256, 0, stream>>>(static_cast<__half*>(y), bias,
                                                                      static_cast<const __half*>(z), n, channels, inner, act);
  } else {
    epilogue_kernel<float><<<grid_for(n, 256, 4), 256, 0, stream>>>(static_cast<float*>(y), bias,
                                                                     static_cast<const float*>(z), n, channels, inner, act);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_channel_epilogue(void* y, const float* bias, const void* z, const TensorSpec& spec, ir::Activation act,
                             cudaStream_t stream) {
  int64_t inner = 1;
  if (spec.format.layout != Layout::kNHWC)
    for (int i = 2; i < spec.rank(); ++i) inner *= spec.shape[i];
  launch_epilogue(y, bias, z, spec.elements(), spec.shape[1], inner, spec.format.dtype, act, stream);
}

void launch_epilogue_to_fp8(const void* y16, void* y8, const float* bias, int64_t n, int64_t channels, ir::Activation act,
                            float inv_y_scale, cudaStream_t stream) {
  if (n == 0) return;
  if (n % 8 != 0 || channels % 8 != 0)
    throw Error(ErrorKind::kInternal, "the FP8 epilogue takes rows of multiples of 8 channels");
  epilogue_to_fp8_kernel<<<grid_for(n / 8, 256, 2), 256, 0, stream>>>(static_cast<const __half*>(y16),
                                                                      static_cast<__nv_fp8_storage_t*>(y8), bias, n / 8,
                                                                      channels, act, inv_y_scale);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
