// kiln's depthwise convolution for float16 NHWC (see depthwise.h).
#include "cuda/kernels/depthwise.h"

#include <algorithm>
#include <cstdint>

#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

__device__ __forceinline__ void load8(const __half* p, float (&v)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __half22float2(h[k]);
    v[2 * k] = f.x;
    v[2 * k + 1] = f.y;
  }
}

__device__ __forceinline__ void store8(__half* p, const float (&v)[8]) {
  uint4 raw;
  __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// One thread's work: 8 channels of TW neighbouring output pixels of one output row.
template <int TW, int KS, int STRIDE>
__device__ __forceinline__ void compute_row(const __half* __restrict__ x, const float* __restrict__ w,
                                            const float* __restrict__ bias, const __half* __restrict__ z,
                                            __half* __restrict__ y, const DepthwiseGeometry& g,
                                            const ir::Activation& act, int n, int oh, int ow0, int c) {
  float acc[TW][8];
  float b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (bias) load8(bias + c, b);
#pragma unroll
  for (int j = 0; j < TW; ++j)
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[j][k] = b[k];

  const int stride_w = STRIDE > 0 ? STRIDE : g.stride_w;
  const int iw0 = ow0 * stride_w - g.pad_w;
  for (int r = 0; r < g.r; ++r) {
    const int ih = oh * g.stride_h - g.pad_h + r * g.dil_h;
    if (ih < 0 || ih >= g.h) continue;
    const __half* row = x + (int64_t(n) * g.h + ih) * g.w * g.c + c;
    const float* wr = w + int64_t(r) * g.s * g.c + c;
    if constexpr (KS > 0) {
      constexpr int kSpan = (TW - 1) * STRIDE + KS;
      float in[kSpan][8];
#pragma unroll
      for (int q = 0; q < kSpan; ++q) {
        const int iw = iw0 + q;
        if (iw >= 0 && iw < g.w) {
          load8(row + int64_t(iw) * g.c, in[q]);
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) in[q][k] = 0.f;
        }
      }
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        float wv[8];
        load8(wr + s * g.c, wv);
#pragma unroll
        for (int j = 0; j < TW; ++j)
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[j][k] = fmaf(in[j * STRIDE + s][k], wv[k], acc[j][k]);
      }
    } else {
      for (int s = 0; s < g.s; ++s) {
        float wv[8];
        load8(wr + s * g.c, wv);
#pragma unroll
        for (int j = 0; j < TW; ++j) {
          const int iw = iw0 + j * stride_w + s * g.dil_w;
          if (iw < 0 || iw >= g.w) continue;
          float v[8];
          load8(row + int64_t(iw) * g.c, v);
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[j][k] = fmaf(v[k], wv[k], acc[j][k]);
        }
      }
    }
  }

#pragma unroll
  for (int j = 0; j < TW; ++j) {
    const int ow = ow0 + j;
    if (ow >= g.ow) break;
    const int64_t at = ((int64_t(n) * g.oh + oh) * g.ow + ow) * g.c + c;
    if (z) {
      float zv[8];
      load8(z + at, zv);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[j][k] += zv[k];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[j][k] = act.apply(acc[j][k]);
    store8(y + at, acc[j]);
  }
}

// The kernel: one thread per (8 channels, TW output pixels) of a row, for every row.
// KS, STRIDE > 0: the filter width and horizontal stride are known at compile time (dilation
// 1), so the SPAN input columns the TW outputs read are loaded once per filter row and kept
// in registers. KS = STRIDE = 0: any geometry, each tap loaded through the cache.
template <int TW, int KS, int STRIDE>
__global__ void __launch_bounds__(256)
    depthwise_nhwc_kernel(const __half* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                          const __half* __restrict__ z, __half* __restrict__ y, DepthwiseGeometry g,
                          ir::Activation act) {
  // x: 8-channel groups of TW-pixel blocks of one output row (groups fastest, so a warp's
  // loads and stores are contiguous); y (with a loop where N*OH exceeds the grid): the row.
  const int groups = g.c >> 3;
  const int blocks_w = (g.ow + TW - 1) / TW;
  const int item = blockIdx.x * blockDim.x + threadIdx.x;
  if (item >= groups * blocks_w) return;
  const int c = (item % groups) * 8;
  const int ow0 = (item / groups) * TW;
  for (int64_t out_row = blockIdx.y; out_row < int64_t(g.n) * g.oh; out_row += gridDim.y) {
    const int oh = static_cast<int>(out_row % g.oh);
    const int n = static_cast<int>(out_row / g.oh);
    compute_row<TW, KS, STRIDE>(x, w, bias, z, y, g, act, n, oh, ow0, c);
  }
}

template <int TW, int KS, int STRIDE>
void launch(const __half* x, const float* w, const float* bias, const __half* z, __half* y, const DepthwiseGeometry& g,
            ir::Activation act, cudaStream_t stream) {
  const int row_items = ((g.ow + TW - 1) / TW) * (g.c / 8);
  const int threads = std::min(256, std::max(64, (row_items + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned>((row_items + threads - 1) / threads),
                  static_cast<unsigned>(std::min<int64_t>(int64_t(g.n) * g.oh, 65535)));
  depthwise_nhwc_kernel<TW, KS, STRIDE><<<grid, threads, 0, stream>>>(x, w, bias, z, y, g, act);
  KILN_CUDA_CHECK_LAUNCH();
}

template <int TW>
void launch_tw(const __half* x, const float* w, const float* bias, const __half* z, __half* y, const DepthwiseGeometry& g,
               ir::Activation act, cudaStream_t stream) {
  const bool plain = g.dil_w == 1 && g.stride_w == g.stride_h;
  if (plain && g.s == 3 && g.stride_w == 1) return launch<TW, 3, 1>(x, w, bias, z, y, g, act, stream);
  if (plain && g.s == 3 && g.stride_w == 2) return launch<TW, 3, 2>(x, w, bias, z, y, g, act, stream);
  if (plain && g.s == 5 && g.stride_w == 1) return launch<TW, 5, 1>(x, w, bias, z, y, g, act, stream);
  if (plain && g.s == 5 && g.stride_w == 2) return launch<TW, 5, 2>(x, w, bias, z, y, g, act, stream);
  launch<TW, 0, 0>(x, w, bias, z, y, g, act, stream);
}

}  // namespace

bool depthwise_supported(const DepthwiseGeometry& g) {
  return g.c > 0 && g.c % 8 == 0 && g.n > 0 && g.oh > 0 && g.ow > 0 && g.r > 0 && g.s > 0 &&
         int64_t(g.ow) * (g.c / 8) < (int64_t{1} << 30);  // one row's items in the grid's x dimension
}

void launch_depthwise_nhwc(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                           const DepthwiseGeometry& g, ir::Activation act, int outputs_per_thread,
                           cudaStream_t stream) {
  switch (outputs_per_thread) {
    case 1: return launch_tw<1>(x, w, bias, z, y, g, act, stream);
    case 2: return launch_tw<2>(x, w, bias, z, y, g, act, stream);
    case 4: return launch_tw<4>(x, w, bias, z, y, g, act, stream);
  }
  throw Error(ErrorKind::kInternal, "depthwise convolution: outputs_per_thread must be 1, 2 or 4");
}

}  // namespace kiln::cuda
