// kiln's depthwise convolution for float16 NHWC (see depthwise.h).
#include "cuda/kernels/depthwise.h"

#include <algorithm>
#include <cstdint>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

// Whether the compile-time path takes this geometry at `rows_per_thread` output rows per thread.
bool fixed_filter_path(const DepthwiseGeometry& g, int rows_per_thread) {
  const bool width = (g.s == 3 || g.s == 5 || g.s == 7) && (g.stride_w == 1 || g.stride_w == 2) && g.dil_w == 1 &&
                     g.stride_w == g.stride_h;
  if (rows_per_thread == 1) return width;
  return width && g.r == g.s && g.dil_h == 1;
}

// One thread's work: 8 channels of TW neighbouring output pixels in each of TH neighbouring
// output rows.
// KS, STRIDE > 0: the filter width and stride are known at compile time (dilation 1, the same
// stride both ways), so the input columns the TW outputs of a row read are loaded once per
// input row and kept in registers; with TH > 1 the filter is also KS tall and each input row
// loaded serves every output row it reaches (a 7x7 filter at TH = 2 loads 8 input rows for 2
// output rows instead of 14). KS = STRIDE = 0 (TH = 1): any geometry, each tap loaded through
// the cache.
template <int TW, int TH, int KS, int STRIDE>
__device__ __forceinline__ void compute_rows(const __half* __restrict__ x, const float* __restrict__ w,
                                             const float* __restrict__ bias, const __half* __restrict__ z,
                                             __half* __restrict__ y, const DepthwiseGeometry& g,
                                             const ir::Activation& act, int n, int oh0, int ow0, int c) {
  static_assert(TH == 1 || KS > 0, "several output rows per thread need a compile-time filter");
  float acc[TH][TW][8];
  float b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (bias) load_float8(bias + c, b);
#pragma unroll
  for (int t = 0; t < TH; ++t)
#pragma unroll
    for (int j = 0; j < TW; ++j)
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[t][j][k] = b[k];

  const int stride_w = STRIDE > 0 ? STRIDE : g.stride_w;
  const int iw0 = ow0 * stride_w - g.pad_w;
  const __half* image = x + int64_t(n) * g.h * g.w * g.c + c;
  if constexpr (KS > 0) {
    constexpr int kSpan = (TW - 1) * STRIDE + KS;
    // TH = 1: the filter's rows (any height, any vertical dilation); TH > 1: the input rows
    // the TH output rows read, filter KS x KS.
    const int rows = TH == 1 ? g.r : (TH - 1) * STRIDE + KS;
    const int ih0 = oh0 * g.stride_h - g.pad_h;
    for (int q = 0; q < rows; ++q) {
      const int ih = ih0 + (TH == 1 ? q * g.dil_h : q);
      if (ih < 0 || ih >= g.h) continue;
      const __half* row = image + int64_t(ih) * g.w * g.c;
      float in[kSpan][8];
#pragma unroll
      for (int p = 0; p < kSpan; ++p) {
        const int iw = iw0 + p;
        if (iw >= 0 && iw < g.w) {
          load_float8(row + int64_t(iw) * g.c, in[p]);
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) in[p][k] = 0.f;
        }
      }
#pragma unroll
      for (int t = 0; t < TH; ++t) {
        const int r = q - t * STRIDE;  // the filter row output row t applies to this input row
        if (TH > 1 && (r < 0 || r >= KS)) continue;
        const float* wr = w + int64_t(r) * KS * g.c + c;
#pragma unroll
        for (int s = 0; s < KS; ++s) {
          float wv[8];
          load_float8(wr + s * g.c, wv);
#pragma unroll
          for (int j = 0; j < TW; ++j)
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[t][j][k] = fmaf(in[j * STRIDE + s][k], wv[k], acc[t][j][k]);
        }
      }
    }
  } else {
    for (int r = 0; r < g.r; ++r) {
      const int ih = oh0 * g.stride_h - g.pad_h + r * g.dil_h;
      if (ih < 0 || ih >= g.h) continue;
      const __half* row = image + int64_t(ih) * g.w * g.c;
      const float* wr = w + int64_t(r) * g.s * g.c + c;
      for (int s = 0; s < g.s; ++s) {
        float wv[8];
        load_float8(wr + s * g.c, wv);
#pragma unroll
        for (int j = 0; j < TW; ++j) {
          const int iw = iw0 + j * stride_w + s * g.dil_w;
          if (iw < 0 || iw >= g.w) continue;
          float v[8];
          load_float8(row + int64_t(iw) * g.c, v);
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[0][j][k] = fmaf(v[k], wv[k], acc[0][j][k]);
        }
      }
    }
  }

#pragma unroll
  for (int t = 0; t < TH; ++t) {
    const int oh = oh0 + t;
    if (oh >= g.oh) break;
#pragma unroll
    for (int j = 0; j < TW; ++j) {
      const int ow = ow0 + j;
      if (ow >= g.ow) break;
      const int64_t at = ((int64_t(n) * g.oh + oh) * g.ow + ow) * g.c + c;
      if (z) {
        float zv[8];
        load_float8(z + at, zv);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[t][j][k] += zv[k];
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[t][j][k] = act.apply(acc[t][j][k]);
      store_float8(y + at, acc[t][j]);
    }
  }
}

// The kernel: one thread per (8 channels, TW output pixels) of a band of TH output rows, for
// every band. x: 8-channel groups of TW-pixel blocks of one band (groups fastest, so a warp's
// loads and stores are contiguous); y (with a loop where N * bands exceeds the grid): the band.
template <int TW, int TH, int KS, int STRIDE>
__global__ void __launch_bounds__(256)
    depthwise_nhwc_kernel(const __half* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                          const __half* __restrict__ z, __half* __restrict__ y, DepthwiseGeometry g,
                          ir::Activation act) {
  const int groups = g.c >> 3;
  const int blocks_w = (g.ow + TW - 1) / TW;
  const int item = blockIdx.x * blockDim.x + threadIdx.x;
  if (item >= groups * blocks_w) return;
  const int c = (item % groups) * 8;
  const int ow0 = (item / groups) * TW;
  const int bands = (g.oh + TH - 1) / TH;
  for (int64_t band = blockIdx.y; band < int64_t(g.n) * bands; band += gridDim.y) {
    const int oh0 = static_cast<int>(band % bands) * TH;
    const int n = static_cast<int>(band / bands);
    compute_rows<TW, TH, KS, STRIDE>(x, w, bias, z, y, g, act, n, oh0, ow0, c);
  }
}

template <int TW, int TH, int KS, int STRIDE>
void launch(const __half* x, const float* w, const float* bias, const __half* z, __half* y, const DepthwiseGeometry& g,
            ir::Activation act, cudaStream_t stream) {
  const int row_items = ((g.ow + TW - 1) / TW) * (g.c / 8);
  const int threads = std::min(256, std::max(64, (row_items + 31) / 32 * 32));
  const int64_t bands = int64_t(g.n) * ((g.oh + TH - 1) / TH);
  const dim3 grid(static_cast<unsigned>((row_items + threads - 1) / threads),
                  static_cast<unsigned>(std::min<int64_t>(bands, 65535)));
  depthwise_nhwc_kernel<TW, TH, KS, STRIDE><<<grid, threads, 0, stream>>>(x, w, bias, z, y, g, act);
  KILN_CUDA_CHECK_LAUNCH();
}

// The filter widths with a compile-time path: 3, 5 and 7 at stride 1 or 2.
template <int TW, int TH>
bool launch_fixed(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                  const DepthwiseGeometry& g, ir::Activation act, cudaStream_t stream) {
  if (!fixed_filter_path(g, TH)) return false;
  const int code = g.s * 10 + g.stride_w;
  switch (code) {
    case 31: launch<TW, TH, 3, 1>(x, w, bias, z, y, g, act, stream); return true;
    case 32: launch<TW, TH, 3, 2>(x, w, bias, z, y, g, act, stream); return true;
    case 51: launch<TW, TH, 5, 1>(x, w, bias, z, y, g, act, stream); return true;
    case 52: launch<TW, TH, 5, 2>(x, w, bias, z, y, g, act, stream); return true;
    case 71: launch<TW, TH, 7, 1>(x, w, bias, z, y, g, act, stream); return true;
    case 72: launch<TW, TH, 7, 2>(x, w, bias, z, y, g, act, stream); return true;
  }
  return false;
}

template <int TW>
void launch_tw(const __half* x, const float* w, const float* bias, const __half* z, __half* y, const DepthwiseGeometry& g,
               DepthwiseTile tile, ir::Activation act, cudaStream_t stream) {
  if (!tile.fixed_filter) return launch<TW, 1, 0, 0>(x, w, bias, z, y, g, act, stream);
  bool launched = false;
  if (tile.rows == 1) {
    launched = launch_fixed<TW, 1>(x, w, bias, z, y, g, act, stream);
  } else if constexpr (TW > 1) {
    launched = launch_fixed<TW, 2>(x, w, bias, z, y, g, act, stream);
  }
  if (!launched) throw Error(ErrorKind::kInternal, "depthwise convolution: no " + tile.name() + " kernel for this geometry");
}

}  // namespace

bool depthwise_supported(const DepthwiseGeometry& g) {
  return g.c > 0 && g.c % 8 == 0 && g.n > 0 && g.oh > 0 && g.ow > 0 && g.r > 0 && g.s > 0 &&
         int64_t(g.ow) * (g.c / 8) < (int64_t{1} << 30);  // one row's items in the grid's x dimension
}

bool depthwise_tile_supported(const DepthwiseGeometry& g, DepthwiseTile tile) {
  if (!depthwise_supported(g)) return false;
  const bool columns = tile.columns == 1 || tile.columns == 2 || tile.columns == 4;
  if (!tile.fixed_filter) return columns && tile.rows == 1;
  if (tile.rows == 1) return columns && fixed_filter_path(g, 1);
  return tile.rows == 2 && (tile.columns == 2 || tile.columns == 4) && fixed_filter_path(g, 2);
}

void launch_depthwise_nhwc(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                           const DepthwiseGeometry& g, ir::Activation act, DepthwiseTile tile, cudaStream_t stream) {
  if (!depthwise_tile_supported(g, tile))
    throw Error(ErrorKind::kInternal, "depthwise convolution: no " + tile.name() + " kernel for this geometry");
  switch (tile.columns) {
    case 1: return launch_tw<1>(x, w, bias, z, y, g, tile, act, stream);
    case 2: return launch_tw<2>(x, w, bias, z, y, g, tile, act, stream);
    case 4: return launch_tw<4>(x, w, bias, z, y, g, tile, act, stream);
  }
}

}  // namespace kiln::cuda
