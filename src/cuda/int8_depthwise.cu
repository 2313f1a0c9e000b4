// kiln's INT8 depthwise convolution (see int8_depthwise.h).
#include "cuda/int8_depthwise.h"

#include <cuda_fp16.h>

#include "cuda/check.h"
#include "cuda/int8_epilogue.cuh"

namespace kiln::cuda {

namespace {

using namespace int8_epilogue;

constexpr int kChannels = 16;  // per thread: one 16-byte load of activations and of weights
constexpr int kThreads = 256;

struct DepthwiseParams {
  Int8ConvGeometry g;
  Int8ConvArgs a;
  DeviceActivation act;
  float inv_y_scale;
  int64_t threads;  // output pixels * channel groups
};

template <class YT, class ZT, int kAct>
__global__ void __launch_bounds__(kThreads) depthwise_kernel(DepthwiseParams p) {
  const Int8ConvGeometry& g = p.g;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.threads) return;
  // Neighbouring threads take neighbouring channel groups of one pixel, then the next pixel:
  // a warp's loads of one tap are contiguous.
  const int groups = g.c / kChannels;
  const int c0 = static_cast<int>(t % groups) * kChannels;
  const int64_t pixel = t / groups;
  const int ow = static_cast<int>(pixel % g.ow), oh = static_cast<int>(pixel / g.ow % g.oh);
  const int64_t n = pixel / (static_cast<int64_t>(g.ow) * g.oh);
  int acc[kChannels] = {};
  for (int r = 0; r < g.r; ++r) {
    const int ih = oh * g.stride_h - g.pad_h + r * g.dil_h;
    if (ih < 0 || ih >= g.h) continue;
    for (int s = 0; s < g.s; ++s) {
      const int iw = ow * g.stride_w - g.pad_w + s * g.dil_w;
      if (iw < 0 || iw >= g.w) continue;
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(p.a.x + ((n * g.h + ih) * g.w + iw) * g.c + c0));
      const uint4 wv = __ldg(reinterpret_cast<const uint4*>(p.a.w + static_cast<int64_t>(r * g.s + s) * g.c + c0));
      const int8_t* xb = reinterpret_cast<const int8_t*>(&xv);
      const int8_t* wb = reinterpret_cast<const int8_t*>(&wv);
#pragma unroll
      for (int i = 0; i < kChannels; ++i) acc[i] += int{xb[i]} * int{wb[i]};
    }
  }
  // The epilogue, two channels at a time, into registers; then one or two 16-byte stores.
  constexpr int kOutBytes = kChannels * static_cast<int>(sizeof(YT));
  uint4 out[kOutBytes / 16];
  const int64_t at = pixel * g.k + c0;  // the output's (and residual's) first element
#pragma unroll
  for (int i = 0; i < kChannels; i += 2) {
    const float2 mult = __ldg(reinterpret_cast<const float2*>(p.a.mult + c0 + i));
    const float2 bias = p.a.bias ? __ldg(reinterpret_cast<const float2*>(p.a.bias + c0 + i)) : make_float2(0.f, 0.f);
    const void* z_pair = nullptr;
    if constexpr (!std::is_void_v<ZT>) z_pair = static_cast<const ZT*>(p.a.z) + at + i;
    epilogue_pair<YT, ZT, kAct>(acc[i], acc[i + 1], mult, bias, z_pair, p.a.z_scale,
                                reinterpret_cast<YT*>(out) + i, p.inv_y_scale, p.act);
  }
  uint4* y = reinterpret_cast<uint4*>(static_cast<YT*>(p.a.y) + at);
#pragma unroll
  for (int i = 0; i < kOutBytes / 16; ++i) y[i] = out[i];
}

template <class YT, class ZT>
void launch_act(const DepthwiseParams& p, int act, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((p.threads + kThreads - 1) / kThreads);
  if (act == 0) depthwise_kernel<YT, ZT, 0><<<blocks, kThreads, 0, stream>>>(p);
  else if (act == 1) depthwise_kernel<YT, ZT, 1><<<blocks, kThreads, 0, stream>>>(p);
  else depthwise_kernel<YT, ZT, 2><<<blocks, kThreads, 0, stream>>>(p);
  KILN_CUDA_CHECK_LAUNCH();
}

template <class YT>
void launch_z(const DepthwiseParams& p, int act, DType z_type, cudaStream_t stream) {
  if (z_type == DType::kInt8) launch_act<YT, int8_t>(p, act, stream);
  else if (z_type == DType::kFloat16) launch_act<YT, __half>(p, act, stream);
  else launch_act<YT, void>(p, act, stream);
}

}  // namespace

bool int8_depthwise_supported(const Int8ConvGeometry& g, DType y_type, DType z_type, std::string* why) {
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (g.c != g.k) return refuse("a depthwise convolution has as many output channels as input channels");
  if (g.c % kChannels != 0) return refuse("channels must be a multiple of 16");
  if (y_type != DType::kInt8 && y_type != DType::kFloat16) return refuse("the output must be int8 or float16");
  if (z_type != DType::kUndefined && z_type != DType::kInt8 && z_type != DType::kFloat16)
    return refuse("the residual must be int8 or float16");
  return true;
}

void launch_int8_depthwise(const Int8ConvGeometry& g, DType y_type, DType z_type, const Int8ConvArgs& args,
                           const ir::Activation& act, cudaStream_t stream) {
  std::string why;
  if (!int8_depthwise_supported(g, y_type, z_type, &why))
    throw Error(ErrorKind::kInternal, "kiln INT8 depthwise convolution: " + why);
  DepthwiseParams p;
  p.g = g;
  p.a = args;
  p.act = device_activation(act);
  p.inv_y_scale = args.y_scale > 0.f ? 1.f / args.y_scale : 0.f;
  p.threads = g.batch * g.oh * g.ow * (g.c / kChannels);
  if (p.threads == 0) return;
  const int act_kind = act.kind.empty() ? 0 : act.kind == "Relu" ? 1 : 2;
  if (y_type == DType::kInt8) launch_z<int8_t>(p, act_kind, z_type, stream);
  else launch_z<__half>(p, act_kind, z_type, stream);
}

std::vector<int8_t> depthwise_weights(const int8_t* w, int c, int r, int s) {
  std::vector<int8_t> taps(static_cast<size_t>(c) * r * s);
  for (int ch = 0; ch < c; ++ch)
    for (int i = 0; i < r * s; ++i) taps[static_cast<size_t>(i) * c + ch] = w[static_cast<size_t>(ch) * r * s + i];
  return taps;
}

}  // namespace kiln::cuda
