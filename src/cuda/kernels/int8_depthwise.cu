// kiln's INT8 depthwise and grouped convolutions (see int8_depthwise.h).
#include "cuda/kernels/int8_depthwise.h"

#include <cuda_fp16.h>

#include "cuda/kernels/int8_epilogue.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

using namespace int8_epilogue;

constexpr int kChannels = 16;  // per thread: one 16-byte load of activations and of weights
constexpr int kThreads = 256;

struct DepthwiseParams {
  Int8ConvGeometry g;
  Int8ConvArgs a;
  ir::Activation act;
  float inv_y_scale;
  int64_t threads;  // output pixels * channel groups
};

// The epilogue of a thread's 16 channels of one output pixel, two at a time into registers,
// then one or two 16-byte stores.
template <class YT, class ZT, int kAct>
__device__ __forceinline__ void store_outputs(const int (&acc)[kChannels], int64_t pixel, int c0, const DepthwiseParams& p) {
  constexpr int kOutBytes = kChannels * static_cast<int>(sizeof(YT));
  uint4 out[kOutBytes / 16];
  const int64_t at = pixel * p.g.k + c0;  // the output's (and residual's) first element
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
  store_outputs<YT, ZT, kAct>(acc, pixel, c0, p);
}

// Grouped: kWidth input and output channels per group (4 to 64). A thread computes 16 output
// channels of one pixel; their inputs are the same 16 channels when groups are at most 16 wide
// (each output reads the kWidth of its own group among them), else the kWidth channels of their
// one group. Products four channels at a time (__dp4a: four int8 products summed into int32).
template <int kWidth, class YT, int kAct>
__global__ void __launch_bounds__(kThreads) grouped_kernel(DepthwiseParams p) {
  constexpr int kSpan = kWidth < kChannels ? kChannels : kWidth;  // input channels read per tap
  const Int8ConvGeometry& g = p.g;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.threads) return;
  const int groups = g.k / kChannels;
  const int c0 = static_cast<int>(t % groups) * kChannels;
  const int in0 = kWidth <= kChannels ? c0 : c0 / kWidth * kWidth;
  const int64_t pixel = t / groups;
  const int ow = static_cast<int>(pixel % g.ow), oh = static_cast<int>(pixel / g.ow % g.oh);
  const int64_t n = pixel / (static_cast<int64_t>(g.ow) * g.oh);
  // Weights [k / 16][tap][16][kWidth]: this thread's 16 outputs, tap by tap.
  const int8_t* w = p.a.w + static_cast<int64_t>(c0 / kChannels) * g.r * g.s * kChannels * kWidth;
  int acc[kChannels] = {};
  for (int r = 0; r < g.r; ++r) {
    const int ih = oh * g.stride_h - g.pad_h + r * g.dil_h;
    if (ih < 0 || ih >= g.h) continue;
    for (int s = 0; s < g.s; ++s) {
      const int iw = ow * g.stride_w - g.pad_w + s * g.dil_w;
      if (iw < 0 || iw >= g.w) continue;
      int xw[kSpan / 4];
      const uint4* xv = reinterpret_cast<const uint4*>(p.a.x + ((n * g.h + ih) * g.w + iw) * g.c + in0);
#pragma unroll
      for (int v = 0; v < kSpan / 16; ++v) *reinterpret_cast<uint4*>(xw + 4 * v) = __ldg(xv + v);
      const int* wt = reinterpret_cast<const int*>(w + (r * g.s + s) * kChannels * kWidth);
#pragma unroll
      for (int m = 0; m < kChannels; ++m) {
        const int first = kWidth < kChannels ? m / kWidth * (kWidth / 4) : 0;  // its group's first word
#pragma unroll
        for (int j = 0; j < kWidth / 4; ++j) acc[m] = __dp4a(xw[first + j], __ldg(wt + m * (kWidth / 4) + j), acc[m]);
      }
    }
  }
  store_outputs<YT, void, kAct>(acc, pixel, c0, p);
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

template <int kWidth, class YT>
void launch_grouped_act(const DepthwiseParams& p, int act, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((p.threads + kThreads - 1) / kThreads);
  if (act == 0) grouped_kernel<kWidth, YT, 0><<<blocks, kThreads, 0, stream>>>(p);
  else if (act == 1) grouped_kernel<kWidth, YT, 1><<<blocks, kThreads, 0, stream>>>(p);
  else grouped_kernel<kWidth, YT, 2><<<blocks, kThreads, 0, stream>>>(p);
  KILN_CUDA_CHECK_LAUNCH();
}

template <class YT>
void launch_grouped_width(const DepthwiseParams& p, int width, int act, cudaStream_t stream) {
  switch (width) {
    case 4: launch_grouped_act<4, YT>(p, act, stream); break;
    case 8: launch_grouped_act<8, YT>(p, act, stream); break;
    case 16: launch_grouped_act<16, YT>(p, act, stream); break;
    case 32: launch_grouped_act<32, YT>(p, act, stream); break;
    default: launch_grouped_act<64, YT>(p, act, stream); break;
  }
}

}  // namespace

bool int8_grouped_supported(const Int8ConvGeometry& g, int width, DType y_type, DType z_type, std::string* why) {
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (width != 4 && width != 8 && width != 16 && width != 32 && width != 64)
    return refuse("groups must be 4, 8, 16, 32 or 64 channels wide");
  if (g.c != g.k || g.c % width != 0) return refuse("groups must have as many output as input channels");
  if (g.c % kChannels != 0) return refuse("channels must be a multiple of 16");
  if (y_type != DType::kInt8 && y_type != DType::kFloat16) return refuse("the output must be int8 or float16");
  if (z_type != DType::kUndefined) return refuse("the grouped kernel has no residual input");
  return true;
}

void launch_int8_grouped(const Int8ConvGeometry& g, int width, DType y_type, const Int8ConvArgs& args, const ir::Activation& act,
                         cudaStream_t stream) {
  std::string why;
  if (!int8_grouped_supported(g, width, y_type, DType::kUndefined, &why))
    throw Error(ErrorKind::kInternal, "kiln INT8 grouped convolution: " + why);
  DepthwiseParams p;
  p.g = g;
  p.a = args;
  p.act = act;
  p.inv_y_scale = args.y_scale > 0.f ? 1.f / args.y_scale : 0.f;
  p.threads = g.batch * g.oh * g.ow * (g.k / kChannels);
  if (p.threads == 0) return;
  const int act_kind = act.none() ? 0 : act.kind == ir::ActivationKind::kRelu ? 1 : 2;
  if (y_type == DType::kInt8) launch_grouped_width<int8_t>(p, width, act_kind, stream);
  else launch_grouped_width<__half>(p, width, act_kind, stream);
}

std::vector<int8_t> grouped_weights(const int8_t* w, int k, int width, int r, int s) {
  std::vector<int8_t> out(static_cast<size_t>(k) * width * r * s);
  const int taps = r * s;
  for (int m = 0; m < k; ++m)
    for (int j = 0; j < width; ++j)
      for (int t = 0; t < taps; ++t)
        out[((static_cast<size_t>(m / kChannels) * taps + t) * kChannels + m % kChannels) * width + j] =
            w[(static_cast<size_t>(m) * width + j) * taps + t];
  return out;
}

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
  p.act = act;
  p.inv_y_scale = args.y_scale > 0.f ? 1.f / args.y_scale : 0.f;
  p.threads = g.batch * g.oh * g.ow * (g.c / kChannels);
  if (p.threads == 0) return;
  const int act_kind = act.none() ? 0 : act.kind == ir::ActivationKind::kRelu ? 1 : 2;
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
