#include "cuda/epilogue.h"

#include "cuda/check.h"
#include "cuda/device_math.cuh"

namespace kiln::cuda {

DeviceActivation device_activation(const ir::Activation& a) {
  static const char* kinds[] = {"", "Relu", "Clip", "Sigmoid", "SiLU", "HardSwish", "HardSigmoid",
                                "LeakyRelu", "Tanh", "Gelu", "GeluTanh"};
  for (int i = 0; i < 11; ++i)
    if (a.kind == kinds[i]) return DeviceActivation{i, a.alpha, a.beta};
  throw Error(ErrorKind::kUnsupported, "unknown epilogue activation '" + a.kind + "'");
}

namespace {


// channel of element i: (i / inner) % channels (inner = 1 for NHWC, H*W for NCHW).
template <class T>
__global__ void epilogue_kernel(T* __restrict__ y, const float* __restrict__ bias, const T* __restrict__ z,
                                int64_t n, int64_t channels, int64_t inner, DeviceActivation act) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float v = load_float(y, i);
    if (bias) v += bias[(i / inner) % channels];
    if (z) v += load_float(z, i);
    store_float(y, i, activate(act, v));
  }
}

// NHWC float16 with channels % 8 == 0: 8 halves (16 bytes) per thread.
__global__ void epilogue_nhwc_half8_kernel(__half* __restrict__ y, const float* __restrict__ bias,
                                           const __half* __restrict__ z, int64_t n8, int64_t channels,
                                           DeviceActivation act) {
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
      h[k] = __float2half_rn(activate(act, v));
    }
    reinterpret_cast<uint4*>(y)[i] = raw;
  }
}

}  // namespace

void launch_epilogue(void* y, const float* bias, const void* z, int64_t n, int64_t channels, int64_t inner,
                     DType dtype, DeviceActivation act, cudaStream_t stream) {
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

void launch_channel_epilogue(void* y, const float* bias, const void* z, const TensorSpec& spec, DeviceActivation act,
                             cudaStream_t stream) {
  int64_t inner = 1;
  if (spec.format.layout != Layout::kNHWC)
    for (int i = 2; i < spec.rank(); ++i) inner *= spec.shape[i];
  launch_epilogue(y, bias, z, spec.elements(), spec.shape[1], inner, spec.format.dtype, act, stream);
}

}  // namespace kiln::cuda
