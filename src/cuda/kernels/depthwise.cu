// kiln's depthwise convolution for float16 NHWC (see depthwise.h).
#include "cuda/kernels/depthwise.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>

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

// The compile-time path's tiles (channels, columns, rows): every one is instantiated for each
// filter width and stride, and timed. These are the ones that won somewhere among 18 candidates
// (8 channels per thread at 1x1 to 4x2, 4 at 1x1 to 8x2, 2 at 2x1 to 8x4) on the depthwise layers
// of ConvNeXt-tiny, EfficientNet-B0 and MobileNet-v3 at batch 1 and 128 (H200,
// bench/results/convnext/depthwise_tiles_register_paths_h200_2026-11-29/); none with 8 channels
// per thread did (up to 255 registers).
struct TileShape {
  int channels, columns, rows;
};
constexpr TileShape kFixedShapes[] = {
    {4, 1, 1}, {4, 2, 1}, {4, 4, 1},             // 8-byte accesses
    {2, 2, 1}, {2, 2, 2}, {2, 4, 2}, {2, 4, 4},  // 4-byte accesses: room for taller tiles
};
constexpr int kAnyColumns[] = {1, 2, 4};  // the path for any geometry: 8 channels, one row

// One thread's work: CPT channels of TW neighbouring output pixels in each of TH neighbouring
// output rows.
// KS, STRIDE > 0: the filter width and stride are known at compile time (dilation 1, the same
// stride both ways), so the input columns the TW outputs of a row read are loaded once per
// input row and kept in registers; with TH > 1 the filter is also KS tall and each input row
// loaded serves every output row it reaches (a 7x7 filter at TH = 4 loads 10 input rows for 4
// output rows instead of 28). KS = STRIDE = 0 (TH = 1): any geometry, each tap loaded through
// the cache.
template <int CPT, int TW, int TH, int KS, int STRIDE>
__device__ __forceinline__ void compute_rows(const __half* __restrict__ x, const float* __restrict__ w,
                                             const float* __restrict__ bias, const __half* __restrict__ z,
                                             __half* __restrict__ y, const DepthwiseGeometry& g,
                                             const ir::Activation& act, int n, int oh0, int ow0, int c) {
  static_assert(TH == 1 || KS > 0, "several output rows per thread need a compile-time filter");
  float acc[TH][TW][CPT];
  float b[CPT];
#pragma unroll
  for (int k = 0; k < CPT; ++k) b[k] = 0.f;
  if (bias) load_floats<CPT>(bias + c, b);
#pragma unroll
  for (int t = 0; t < TH; ++t)
#pragma unroll
    for (int j = 0; j < TW; ++j)
#pragma unroll
      for (int k = 0; k < CPT; ++k) acc[t][j][k] = b[k];

  const int stride_w = STRIDE > 0 ? STRIDE : g.stride_w;
  const int iw0 = ow0 * stride_w - g.pad_w;
  const int ih0 = oh0 * g.stride_h - g.pad_h;
  const __half* image = x + int64_t(n) * g.h * g.w * g.c + c;
  if constexpr (KS > 0) {
    constexpr int kSpan = (TW - 1) * STRIDE + KS;
    // Input row q of the tile (filter row q when TH = 1, any height and vertical dilation):
    // its kSpan columns loaded once, then every output row t it reaches takes its taps.
    auto accumulate_row = [&](int q, int ih) {
      const __half* row = image + int64_t(ih) * g.w * g.c;
      float in[kSpan][CPT];
#pragma unroll
      for (int p = 0; p < kSpan; ++p) {
        const int iw = iw0 + p;
        if (iw >= 0 && iw < g.w) {
          load_floats<CPT>(row + int64_t(iw) * g.c, in[p]);
        } else {
#pragma unroll
          for (int k = 0; k < CPT; ++k) in[p][k] = 0.f;
        }
      }
#pragma unroll
      for (int t = 0; t < TH; ++t) {
        const int r = q - t * STRIDE;  // the filter row output row t applies to this input row
        if (TH > 1 && (r < 0 || r >= KS)) continue;
        const float* wr = w + int64_t(r) * KS * g.c + c;
#pragma unroll
        for (int s = 0; s < KS; ++s) {
          float wv[CPT];
          load_floats<CPT>(wr + s * g.c, wv);
#pragma unroll
          for (int j = 0; j < TW; ++j)
#pragma unroll
            for (int k = 0; k < CPT; ++k) acc[t][j][k] = fmaf(in[j * STRIDE + s][k], wv[k], acc[t][j][k]);
        }
      }
    };
    if constexpr (TH == 1) {
      for (int q = 0; q < g.r; ++q) {
        const int ih = ih0 + q * g.dil_h;
        if (ih >= 0 && ih < g.h) accumulate_row(q, ih);
      }
    } else {
      // Unrolled, so that which output rows an input row reaches is known at compile time.
#pragma unroll
      for (int q = 0; q < (TH - 1) * STRIDE + KS; ++q) {
        const int ih = ih0 + q;
        if (ih >= 0 && ih < g.h) accumulate_row(q, ih);
      }
    }
  } else {
    static_assert(CPT == 8, "the path for any geometry takes 8 channels");
    for (int r = 0; r < g.r; ++r) {
      const int ih = ih0 + r * g.dil_h;
      if (ih < 0 || ih >= g.h) continue;
      const __half* row = image + int64_t(ih) * g.w * g.c;
      const float* wr = w + int64_t(r) * g.s * g.c + c;
      for (int s = 0; s < g.s; ++s) {
        float wv[CPT];
        load_floats<CPT>(wr + s * g.c, wv);
#pragma unroll
        for (int j = 0; j < TW; ++j) {
          const int iw = iw0 + j * stride_w + s * g.dil_w;
          if (iw < 0 || iw >= g.w) continue;
          float v[CPT];
          load_floats<CPT>(row + int64_t(iw) * g.c, v);
#pragma unroll
          for (int k = 0; k < CPT; ++k) acc[0][j][k] = fmaf(v[k], wv[k], acc[0][j][k]);
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
        float zv[CPT];
        load_floats<CPT>(z + at, zv);
#pragma unroll
        for (int k = 0; k < CPT; ++k) acc[t][j][k] += zv[k];
      }
#pragma unroll
      for (int k = 0; k < CPT; ++k) acc[t][j][k] = act.apply(acc[t][j][k]);
      store_floats<CPT>(y + at, acc[t][j]);
    }
  }
}

// The kernel: one thread per (CPT channels, TW output pixels) of a band of TH output rows, for
// every band. x: channel groups of TW-pixel blocks of one band (groups fastest, so a warp's
// loads and stores are contiguous); y (with a loop where N * bands exceeds the grid): the band.
template <int CPT, int TW, int TH, int KS, int STRIDE>
__global__ void __launch_bounds__(256)
    depthwise_nhwc_kernel(const __half* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                          const __half* __restrict__ z, __half* __restrict__ y, DepthwiseGeometry g,
                          ir::Activation act) {
  const int groups = g.c / CPT;
  const int blocks_w = (g.ow + TW - 1) / TW;
  const int item = blockIdx.x * blockDim.x + threadIdx.x;
  if (item >= groups * blocks_w) return;
  const int c = (item % groups) * CPT;
  const int ow0 = (item / groups) * TW;
  const int bands = (g.oh + TH - 1) / TH;
  for (int64_t band = blockIdx.y; band < int64_t(g.n) * bands; band += gridDim.y) {
    const int oh0 = static_cast<int>(band % bands) * TH;
    const int n = static_cast<int>(band / bands);
    compute_rows<CPT, TW, TH, KS, STRIDE>(x, w, bias, z, y, g, act, n, oh0, ow0, c);
  }
}


template <int CPT, int TW, int TH, int KS, int STRIDE>
void launch(const __half* x, const float* w, const float* bias, const __half* z, __half* y, const DepthwiseGeometry& g,
            ir::Activation act, cudaStream_t stream) {
  // The items (threads) of one band of output rows: blocks of TW outputs times channel groups
  // (below 2^30: depthwise_supported).
  const int items = ((g.ow + TW - 1) / TW) * (g.c / CPT);
  const int threads = std::min(256, std::max(64, (items + 31) / 32 * 32));
  const int64_t bands = int64_t(g.n) * ((g.oh + TH - 1) / TH);
  const dim3 grid(static_cast<unsigned>((items + threads - 1) / threads),
                  static_cast<unsigned>(std::min<int64_t>(bands, 65535)));
  depthwise_nhwc_kernel<CPT, TW, TH, KS, STRIDE><<<grid, threads, 0, stream>>>(x, w, bias, z, y, g, act);
  KILN_CUDA_CHECK_LAUNCH();
}

// The filter widths with a compile-time path: 3, 5 and 7 at stride 1 or 2.
template <int CPT, int TW, int TH>
bool launch_fixed(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                  const DepthwiseGeometry& g, ir::Activation act, cudaStream_t stream) {
  if (!fixed_filter_path(g, TH)) return false;
  switch (g.s * 10 + g.stride_w) {
    case 31: launch<CPT, TW, TH, 3, 1>(x, w, bias, z, y, g, act, stream); return true;
    case 32: launch<CPT, TW, TH, 3, 2>(x, w, bias, z, y, g, act, stream); return true;
    case 51: launch<CPT, TW, TH, 5, 1>(x, w, bias, z, y, g, act, stream); return true;
    case 52: launch<CPT, TW, TH, 5, 2>(x, w, bias, z, y, g, act, stream); return true;
    case 71: launch<CPT, TW, TH, 7, 1>(x, w, bias, z, y, g, act, stream); return true;
    case 72: launch<CPT, TW, TH, 7, 2>(x, w, bias, z, y, g, act, stream); return true;
  }
  return false;
}

// The kFixedShapes entry that is `tile`, launched.
template <size_t... I>
bool launch_fixed_shape(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                        const DepthwiseGeometry& g, DepthwiseTile tile, ir::Activation act, cudaStream_t stream,
                        std::index_sequence<I...>) {
  return ((tile.channels == kFixedShapes[I].channels && tile.columns == kFixedShapes[I].columns &&
           tile.rows == kFixedShapes[I].rows &&
           launch_fixed<kFixedShapes[I].channels, kFixedShapes[I].columns, kFixedShapes[I].rows>(x, w, bias, z, y, g,
                                                                                                  act, stream)) ||
          ...);
}

// The staged path (square filter KS at stride 1). A block of (CB / 2) lanes x SH x SW threads
// computes an output tile of SH * TH rows by SW * TW columns for CB channels, for one image after
// another (blockIdx.z, then every gridDim.z-th): it copies the CB channels' filters into shared
// memory once, and each image's input tile (halo included, zeros outside the image) with
// cp.async, the next image's while it computes this one's. Each thread computes TH x TW outputs
// of 2 channels (one half2 word per pixel), keeping each input row's span in registers while it
// serves every output row it reaches.
template <int KS, int CB, int SH, int SW, int TH, int TW, bool FILTER_IN_REGISTERS>
struct StagedTile {
  static constexpr int kLanes = CB / 2;                  // threads across channels, 2 channels each
  static constexpr int kThreads = kLanes * SH * SW;
  static constexpr int kOutRows = SH * TH, kOutCols = SW * TW;
  static constexpr int kInRows = kOutRows + KS - 1, kInCols = kOutCols + KS - 1;
  // The words (half2) of one staged input row, padded so that the pixels one warp's threads read
  // together fall in as few shared-memory banks twice as possible (the pad, a multiple of 16
  // bytes for cp.async, that minimizes the worst bank's load for a warp's first read, computed
  // here at compile time).
  static constexpr int row_pad() {
    int best_pad = 0, best = 33;
    for (int pad = 0; pad < 32; pad += 4) {
      int count[32] = {};
      int worst = 0;
      for (int t = 0; t < 32; ++t) {
        const int lane = t % kLanes, spatial = t / kLanes, sy = spatial % SH, sx = spatial / SH;
        const int word = sy * TH * (kInCols * kLanes + pad) + sx * TW * kLanes + lane;
        worst = std::max(worst, ++count[word % 32]);
      }
      if (worst < best) best = worst, best_pad = pad;
    }
    return best_pad;
  }
  static constexpr int kRowWords = kInCols * kLanes + row_pad();
  static constexpr int kInputWords = kInRows * kRowWords;
  static constexpr size_t kFilterBytes = FILTER_IN_REGISTERS ? 0 : size_t(KS) * KS * CB * sizeof(float);
  static constexpr size_t kSharedBytes = kFilterBytes + 2 * size_t(kInputWords) * 4;  // two input buffers
};

template <int KS, int CB, int SH, int SW, int TH, int TW, bool FILTER_IN_REGISTERS>
__global__ void __launch_bounds__(StagedTile<KS, CB, SH, SW, TH, TW, FILTER_IN_REGISTERS>::kThreads)
    depthwise_staged_kernel(const __half* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                            const __half* __restrict__ z, __half* __restrict__ y, DepthwiseGeometry g,
                            ir::Activation act, int tiles_w) {
  using T = StagedTile<KS, CB, SH, SW, TH, TW, FILTER_IN_REGISTERS>;
  extern __shared__ __align__(16) unsigned char staged[];
  float* w_s = reinterpret_cast<float*>(staged);                                  // [KS * KS][CB]
  uint32_t* in_s = reinterpret_cast<uint32_t*>(staged + T::kFilterBytes);        // 2 x [kInRows][kRowWords] half2
  const int c0 = blockIdx.y * CB;
  const int oh0 = (blockIdx.x / tiles_w) * T::kOutRows, ow0 = (blockIdx.x % tiles_w) * T::kOutCols;
  const int ih0 = oh0 - g.pad_h, iw0 = ow0 - g.pad_w;

  // One image's input tile into `buffer`: 16-byte chunks (8 channels) of each pixel, zeros
  // outside the image.
  auto stage = [&](int n, uint32_t* buffer) {
    constexpr int kChunks = CB / 8;
    const __half* image = x + int64_t(n) * g.h * g.w * g.c + c0;
    for (int i = threadIdx.x; i < T::kInRows * T::kInCols * kChunks; i += T::kThreads) {
      const int chunk = i % kChunks, pixel = i / kChunks;
      const int py = pixel / T::kInCols, px = pixel % T::kInCols;
      const int ih = ih0 + py, iw = iw0 + px;
      const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
      cp_async16(buffer + py * T::kRowWords + px * T::kLanes + chunk * 4,
                 inside ? image + (int64_t(ih) * g.w + iw) * g.c + chunk * 8 : x, inside);
    }
    cp_async_commit();
  };
  if (blockIdx.z < g.n) stage(blockIdx.z, in_s);
  const int lane = threadIdx.x % T::kLanes, spatial = threadIdx.x / T::kLanes;
  const int sy = spatial % SH, sx = spatial / SH;
  const int c = c0 + 2 * lane;
  // The filters: in shared memory, each tap read by every output it serves (two words a
  // multiply-add pair per column of the tile), or, at the cost of 2 * KS * KS registers, in each
  // thread's registers for all its images, which leaves shared memory to the input alone.
  float2 filter[FILTER_IN_REGISTERS ? KS * KS : 1];
  if constexpr (FILTER_IN_REGISTERS) {
#pragma unroll
    for (int tap = 0; tap < KS * KS; ++tap) filter[tap] = __ldg(reinterpret_cast<const float2*>(w + int64_t(tap) * g.c + c));
  } else {
    for (int i = threadIdx.x; i < KS * KS * CB; i += T::kThreads) w_s[i] = w[int64_t(i / CB) * g.c + c0 + i % CB];
  }
  const float2 b = bias ? __ldg(reinterpret_cast<const float2*>(bias + c)) : make_float2(0.f, 0.f);
  int buffer = 0;
  for (int n = blockIdx.z; n < g.n; n += gridDim.z, buffer ^= 1) {
    if (n + int(gridDim.z) < g.n) {
      stage(n + gridDim.z, in_s + (buffer ^ 1) * T::kInputWords);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this image's tile (and, the first time, the filters) in place

    float acc[TH][TW][2];
#pragma unroll
    for (int t = 0; t < TH; ++t)
#pragma unroll
      for (int j = 0; j < TW; ++j) acc[t][j][0] = b.x, acc[t][j][1] = b.y;
    constexpr int kSpan = TW + KS - 1;
    const uint32_t* base = in_s + buffer * T::kInputWords + sy * TH * T::kRowWords + sx * TW * T::kLanes + lane;
#pragma unroll
    for (int q = 0; q < TH + KS - 1; ++q) {
      float2 in[kSpan];
#pragma unroll
      for (int p = 0; p < kSpan; ++p) {
        const uint32_t word = base[q * T::kRowWords + p * T::kLanes];
        in[p] = __half22float2(*reinterpret_cast<const __half2*>(&word));
      }
#pragma unroll
      for (int t = 0; t < TH; ++t) {
        const int r = q - t;  // the filter row output row t applies to this input row
        if (r < 0 || r >= KS) continue;
#pragma unroll
        for (int s = 0; s < KS; ++s) {
          const float2 wv = FILTER_IN_REGISTERS ? filter[r * KS + s]
                                                : *reinterpret_cast<const float2*>(w_s + (r * KS + s) * CB + 2 * lane);
#pragma unroll
          for (int j = 0; j < TW; ++j) {
            acc[t][j][0] = fmaf(in[j + s].x, wv.x, acc[t][j][0]);
            acc[t][j][1] = fmaf(in[j + s].y, wv.y, acc[t][j][1]);
          }
        }
      }
    }

#pragma unroll
    for (int t = 0; t < TH; ++t) {
      const int oh = oh0 + sy * TH + t;
      if (oh >= g.oh) break;
#pragma unroll
      for (int j = 0; j < TW; ++j) {
        const int ow = ow0 + sx * TW + j;
        if (ow >= g.ow) break;
        const int64_t at = ((int64_t(n) * g.oh + oh) * g.ow + ow) * g.c + c;
        float v[2] = {acc[t][j][0], acc[t][j][1]};
        if (z) {
          const float2 zv = __half22float2(*reinterpret_cast<const __half2*>(z + at));
          v[0] += zv.x, v[1] += zv.y;
        }
        *reinterpret_cast<__half2*>(y + at) = __floats2half2_rn(act.apply(v[0]), act.apply(v[1]));
      }
    }
    __syncthreads();  // every thread done with this buffer before the next image is staged into it
  }
}

// The staged path's tiles: per-thread columns x rows, the block's threads per column and row,
// and where the filters are; and its channel slices.
constexpr int kStagedSlices[] = {32, 16, 8};
struct StagedShape {
  int columns, rows, block_rows, block_cols;
  bool filter_in_registers;
};
constexpr StagedShape kStagedShapes[] = {{8, 2, 8, 2, false}, {4, 2, 4, 2, false}, {8, 2, 8, 2, true}, {4, 2, 4, 2, true}};

bool staged_path(const DepthwiseGeometry& g) {
  return (g.s == 3 || g.s == 5 || g.s == 7) && g.r == g.s && g.stride_h == 1 && g.stride_w == 1 && g.dil_h == 1 &&
         g.dil_w == 1 && g.c / 8 <= 65535 &&  // channel slices in the grid's y dimension
         (int64_t(g.oh) / 8 + 1) * (int64_t(g.ow) / 8 + 1) < (int64_t{1} << 31);  // tiles in its x dimension
}

template <int KS, int CB, int I>
void launch_staged(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                   const DepthwiseGeometry& g, ir::Activation act, cudaStream_t stream) {
  constexpr StagedShape kShape = kStagedShapes[I];
  using T = StagedTile<KS, CB, kShape.block_rows, kShape.block_cols, kShape.rows, kShape.columns, kShape.filter_in_registers>;
  auto kernel = depthwise_staged_kernel<KS, CB, kShape.block_rows, kShape.block_cols, kShape.rows, kShape.columns,
                                        kShape.filter_in_registers>;
  const KernelOccupancy occupancy =
      prepare_kernel(kernel, T::kThreads, int(T::kSharedBytes), /*all_shared=*/false, "kiln depthwise convolution");
  const int tiles_w = (g.ow + T::kOutCols - 1) / T::kOutCols, tiles_h = (g.oh + T::kOutRows - 1) / T::kOutRows;
  // Images per block: enough blocks for about 16 per multiprocessor, and beyond that each block
  // takes several images, which reuses its filters and overlaps its loads with its arithmetic.
  const int64_t blocks_per_image = int64_t(tiles_w) * tiles_h * (g.c / CB);
  const int64_t image_blocks = std::clamp<int64_t>((int64_t(occupancy.sms) * 16 + blocks_per_image - 1) / blocks_per_image, 1, g.n);
  const dim3 grid(static_cast<unsigned>(tiles_w * tiles_h), static_cast<unsigned>(g.c / CB), static_cast<unsigned>(image_blocks));
  kernel<<<grid, T::kThreads, T::kSharedBytes, stream>>>(x, w, bias, z, y, g, act, tiles_w);
  KILN_CUDA_CHECK_LAUNCH();
}

template <int CB, int I>
bool launch_staged_filter(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                          const DepthwiseGeometry& g, ir::Activation act, cudaStream_t stream) {
  switch (g.s) {
    case 3: launch_staged<3, CB, I>(x, w, bias, z, y, g, act, stream); return true;
    case 5: launch_staged<5, CB, I>(x, w, bias, z, y, g, act, stream); return true;
    case 7: launch_staged<7, CB, I>(x, w, bias, z, y, g, act, stream); return true;
  }
  return false;
}

template <int I>
bool launch_staged_slice(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                         const DepthwiseGeometry& g, int slice, ir::Activation act, cudaStream_t stream) {
  switch (slice) {
    case 32: return launch_staged_filter<32, I>(x, w, bias, z, y, g, act, stream);
    case 16: return launch_staged_filter<16, I>(x, w, bias, z, y, g, act, stream);
    case 8: return launch_staged_filter<8, I>(x, w, bias, z, y, g, act, stream);
  }
  return false;
}

bool staged_shape_is(const StagedShape& s, const DepthwiseTile& tile) {
  return s.columns == tile.columns && s.rows == tile.rows &&
         s.filter_in_registers == (tile.path == DepthwisePath::kStagedFilterInRegisters);
}

template <size_t... I>
bool launch_staged_shape(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                         const DepthwiseGeometry& g, DepthwiseTile tile, ir::Activation act, cudaStream_t stream,
                         std::index_sequence<I...>) {
  return ((staged_shape_is(kStagedShapes[I], tile) && launch_staged_slice<I>(x, w, bias, z, y, g, tile.channels, act, stream)) ||
          ...);
}

}  // namespace

bool depthwise_supported(const DepthwiseGeometry& g) {
  return g.c > 0 && g.c % 8 == 0 && g.n > 0 && g.oh > 0 && g.ow > 0 && g.r > 0 && g.s > 0 &&
         int64_t(g.ow) * (g.c / 2) < (int64_t{1} << 30);  // one row's items in the grid's x dimension
}

bool depthwise_tile_supported(const DepthwiseGeometry& g, DepthwiseTile tile) {
  if (!depthwise_supported(g)) return false;
  switch (tile.path) {
    case DepthwisePath::kAny:
      return std::find(std::begin(kAnyColumns), std::end(kAnyColumns), tile.columns) != std::end(kAnyColumns) &&
             tile.rows == 1 && tile.channels == 8;
    case DepthwisePath::kFixed:
      return std::any_of(std::begin(kFixedShapes), std::end(kFixedShapes),
                         [&](const TileShape& s) {
                           return s.channels == tile.channels && s.columns == tile.columns && s.rows == tile.rows;
                         }) &&
             fixed_filter_path(g, tile.rows);
    case DepthwisePath::kStaged:
    case DepthwisePath::kStagedFilterInRegisters:
      return std::any_of(std::begin(kStagedShapes), std::end(kStagedShapes),
                         [&](const StagedShape& s) { return staged_shape_is(s, tile); }) &&
             std::find(std::begin(kStagedSlices), std::end(kStagedSlices), tile.channels) != std::end(kStagedSlices) &&
             g.c % tile.channels == 0 && staged_path(g);
  }
  return false;
}

std::vector<DepthwiseTile> depthwise_tiles(const DepthwiseGeometry& g) {
  std::vector<DepthwiseTile> tiles;
  for (int columns : kAnyColumns) tiles.push_back(DepthwiseTile{DepthwisePath::kAny, columns, 1, 8});
  for (const TileShape& s : kFixedShapes) tiles.push_back(DepthwiseTile{DepthwisePath::kFixed, s.columns, s.rows, s.channels});
  for (const StagedShape& s : kStagedShapes)
    for (int slice : kStagedSlices)
      tiles.push_back(DepthwiseTile{s.filter_in_registers ? DepthwisePath::kStagedFilterInRegisters : DepthwisePath::kStaged,
                                    s.columns, s.rows, slice});
  tiles.erase(std::remove_if(tiles.begin(), tiles.end(), [&](const DepthwiseTile& t) { return !depthwise_tile_supported(g, t); }),
              tiles.end());
  return tiles;
}

void launch_depthwise_nhwc(const __half* x, const float* w, const float* bias, const __half* z, __half* y,
                           const DepthwiseGeometry& g, ir::Activation act, DepthwiseTile tile, cudaStream_t stream) {
  if (!depthwise_tile_supported(g, tile))
    throw Error(ErrorKind::kInternal, "depthwise convolution: no " + tile.name() + " kernel for this geometry");
  bool launched = false;
  switch (tile.path) {
    case DepthwisePath::kAny:
      switch (tile.columns) {
        case 1: launch<8, 1, 1, 0, 0>(x, w, bias, z, y, g, act, stream); return;
        case 2: launch<8, 2, 1, 0, 0>(x, w, bias, z, y, g, act, stream); return;
        case 4: launch<8, 4, 1, 0, 0>(x, w, bias, z, y, g, act, stream); return;
      }
      break;
    case DepthwisePath::kFixed:
      launched = launch_fixed_shape(x, w, bias, z, y, g, tile, act, stream, std::make_index_sequence<std::size(kFixedShapes)>{});
      break;
    case DepthwisePath::kStaged:
    case DepthwisePath::kStagedFilterInRegisters:
      launched = launch_staged_shape(x, w, bias, z, y, g, tile, act, stream, std::make_index_sequence<std::size(kStagedShapes)>{});
      break;
  }
  if (!launched) throw Error(ErrorKind::kInternal, "depthwise convolution: no " + tile.name() + " kernel for this geometry");
}

}  // namespace kiln::cuda
