// kiln::ChannelsLastConv on the CPU: 2-D float32 convolutions on [N, H, W, C] tensors, the
// input read in place.
//
// Channels-first, every convolution packs its input side again (im2col panels) from activations
// that have left the caches; channels-last, a pixel's C channels lie next to each other, so the
// input needs no packing:
// - One group: an "indirect" GEMM (as XNNPACK's). A tile of 8 output pixels by 32 output channels
//   takes a pointer per pixel and kernel row to its kW * C consecutive inputs (per tap where the
//   kernel is dilated across the row; a zero-padded copy or a row of zeros past the image's edge)
//   and broadcasts them one at a time against a row of the weights, packed once into 32-column
//   panels of K = kH * kW * C rows (tap-major). K runs in blocks where a panel passes L1, the
//   panel's next block prefetched into L2. Bias, residual and Relu/Clip in registers; other
//   activations on the finished tile.
// - 3x3 of stride 1: Winograd F(2x2, 3x3) (conv_winograd.h's transforms, 16 channels a vector),
//   its 16 products on the same tile kernel, where a run has enough tiles; the transformed filters
//   are made from the direct product's panels by the first such run (a layer that never has
//   enough, as a 7 x 7 one at batch 1, keeps the panels alone).
// - Depthwise (one input channel per group): 16 channels by 4 pixels at a time, the taps'
//   weights a vector each ([kH * kW, C], packed once).
// - One group, in an engine of bfloat16 products (KernelInit::bfloat16_products) on a CPU that
//   has them: bf16_rows_gemm (cpu/bf16_gemm.h), output pixels as rows, each row's taps gathered
//   and rounded to bfloat16 as its block is made (an implicit im2col), the weights packed once
//   in bfloat16 in the same tap-major order.
// Sums run tap by tap, channel by channel within a tap: another order than the channels-first
// kernel's (channel, then tap), so the two agree to rounding, not bit for bit. The plain loops
// below (CPUs without AVX-512, which the layout pass does not convert for, but whose engine files
// may be loaded there) run the direct convolution in the vector kernels' order.
#include "cpu/conv_channels_last.h"

#include <immintrin.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "cpu/aligned_vector.h"
#include "cpu/bf16_gemm.h"
#include "cpu/conv_shape.h"
#include "cpu/conv_winograd.h"
#include "cpu/gemm_util.h"
#include "cpu/kernel.h"
#include "cpu/packed_weights.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"
#include "ops/conv_geometry.h"

namespace kiln::cpu {

namespace {

struct Geometry {
  int64_t batch = 0, h = 0, w = 0, c = 0;  // X [batch, h, w, c]
  int64_t oh = 0, ow = 0, m = 0;           // Y [batch, oh, ow, m]
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, ph = 0, pw = 0, group = 1;
  int64_t taps() const { return kh * kw; }
};

// conv_shape.h's geometry of the same convolution, channels-first, under the names used here.
Geometry make_geometry(const ir::Node& node, const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  const Geo3 g = make_geo3(node, {x[0], x[3], x[1], x[2]}, w, false);
  Geometry r;
  r.batch = g.batch;
  r.h = g.in[1];
  r.w = g.in[2];
  r.c = g.in_c;
  r.m = g.out_c;
  r.oh = g.out[1];
  r.ow = g.out[2];
  r.kh = g.k[1];
  r.kw = g.k[2];
  r.sh = g.s[1];
  r.sw = g.s[2];
  r.dh = g.d[1];
  r.dw = g.d[2];
  r.ph = g.p[1];
  r.pw = g.p[2];
  r.group = g.group;
  return r;
}

bool is_depthwise(int64_t group, const std::vector<int64_t>& w) { return group > 1 && w[1] == 1 && w[0] == group; }

// The first n of 16 lanes (n past 16: all).
inline __mmask16 lanes(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

constexpr int kTileRows = 8;   // output pixels per tile
constexpr int kPanelCols = 32; // output channels per weight panel

// Output pixels per tile of a direct convolution: 14, 8 or 7, the one that computes the fewest
// rows past the last pixel (a 7x7 layer at batch 1: 49 pixels fill 7 tiles of 7, but 7 tiles of 8
// compute 56 rows), 14 before 8 and 8 before 7 where they compute as many. A tile of 14 pixels
// by 32 channels keeps 28 sums in registers against 2 weight loads and 14 broadcasts a step:
// ResNet-50's 3x3 layers 2-3% faster than with 16 sums (docs/design/cpu-gemm.md, "Tiles of 14
// pixels").
int pixels_per_tile(int64_t pixels) {
  auto rows = [&](int64_t r) { return (pixels + r - 1) / r * r; };
  int best = 14;
  for (int r : {8, 7})
    if (rows(r) < rows(best)) best = r;
  return best;
}

// Tiles a direct convolution's task runs over: about 64 pixels, whose inputs stay in L2 while
// every panel of weights meets them.
int64_t tiles_per_run(int tr) { return tr > kTileRows ? 4 : 8; }

// Winograd tiles in a block of at most n: whole products of 14 rows where n holds one, else a
// multiple of 8 (at least 8).
int64_t whole_product_tiles(int64_t n) { return n >= 14 ? n / 14 * 14 : kTileRows; }

// A run of tiles of one weight panel: what they read, where their outputs go and what is added
// to them. Tile t of R pixels reads rows[t * rows_step + tap * R + i] + offset for its pixel i
// (the pixels' inputs at each tap or kernel row; offset > 0 where K runs in parts of one segment).
struct TileRun {
  const float* const* rows = nullptr;
  int64_t rows_step = 0, offset = 0, tiles = 1;
  float* y = nullptr;        // the first tile's first pixel, first channel of the panel
  int64_t ldy = 0;           // M
  const float* z = nullptr;  // the residual at the same place, or null
  const float* bias = nullptr;  // the panel's first channel's bias, or null
  int64_t pixels = 0;        // pixels from the run's first on: tile t has min(R, pixels - t * R)
  int cols = 0;              // channels of the panel that exist
  int clamp = 0;             // Epilogue::clamp_mode
  float lo = 0.f, hi = 0.f;
  // A product split into K blocks: later blocks start from y's partial sums (not the bias), and
  // only the last adds the residual and clamps.
  bool accumulate = false, last = true;
  // Lines to bring into L2 while the run goes, prefetch_per_tile per tile (up to two per K step)
  // until prefetch_lines: the panel's next block (weights that come from memory meet only a few
  // tiles at a 7 x 7 layer, too few to hide their reads).
  const char* prefetch = nullptr;
  int64_t prefetch_lines = 0, prefetch_per_tile = 0;
};

// Residual, Relu/Clip and the masked store of 16 outputs: the last step of every vector kernel
// below (z may be null; clamp as Epilogue::clamp_mode).
__attribute__((target("avx512f,fma"), always_inline)) inline void finish_avx512(__m512 v, __mmask16 m, const float* z,
                                                                              float* y, int clamp, float lo, float hi) {
  if (z) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, z));
  if (clamp == 1) v = _mm512_max_ps(v, _mm512_setzero_ps());
  else if (clamp == 2) v = _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), v));
  _mm512_mask_storeu_ps(y, m, v);
}

// A run of R-pixel x 32-channel tiles.
template <int R>
__attribute__((target("avx512f,fma"))) void dense_tiles_avx512(const float* panel, int64_t taps, int64_t c,
                                                               const TileRun& run) {
  const __mmask16 m0 = lanes(run.cols), m1 = lanes(run.cols - 16);
  const __m512 bias0 = run.bias ? _mm512_maskz_loadu_ps(m0, run.bias) : _mm512_setzero_ps();
  const __m512 bias1 = run.bias ? _mm512_maskz_loadu_ps(m1, run.bias + 16) : _mm512_setzero_ps();
  const int clamp = run.last ? run.clamp : 0;
  for (int64_t tile = 0; tile < run.tiles; ++tile) {
    const int64_t rows_here = std::min<int64_t>(R, run.pixels - tile * R);
    float* y = run.y + tile * R * run.ldy;
    const float* z = run.last && run.z ? run.z + tile * R * run.ldy : nullptr;
    const float* const* rows = run.rows + tile * run.rows_step;
    const char* prefetch = run.prefetch ? run.prefetch + tile * run.prefetch_per_tile * 64 : nullptr;
    const int64_t prefetch_lines = std::clamp<int64_t>(run.prefetch_lines - tile * run.prefetch_per_tile, 0, run.prefetch_per_tile);
    // The next tile's residual rows, M floats apart (a stride no hardware prefetcher follows),
    // while this tile computes ("The epilogue's residual, prefetched" in docs/design/cpu-gemm.md).
    if (run.last && tile + 1 < run.tiles) {
      const int64_t next_rows = std::min<int64_t>(R, run.pixels - (tile + 1) * R);
      for (int64_t i = 0; i < next_rows; ++i) {
        float* yi = y + (R + i) * run.ldy;
        __builtin_prefetch(yi, 1, 3);
        if (run.cols > 16) __builtin_prefetch(yi + 16, 1, 3);
        if (!z) continue;
        const float* zi = z + (R + i) * run.ldy;
        _mm_prefetch(reinterpret_cast<const char*>(zi), _MM_HINT_T0);
        if (run.cols > 16) _mm_prefetch(reinterpret_cast<const char*>(zi + 16), _MM_HINT_T0);
      }
    }
    __m512 c0[R], c1[R];
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const bool partial = run.accumulate && i < rows_here;
      c0[i] = partial ? _mm512_maskz_loadu_ps(m0, y + i * run.ldy) : bias0;
      c1[i] = partial ? _mm512_maskz_loadu_ps(m1, y + i * run.ldy + 16) : bias1;
    }
    const float* w = panel;
    for (int64_t t = 0; t < taps; ++t) {
      const float* r[R];
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) r[i] = rows[t * R + i] + run.offset;
      for (int64_t k = 0; k < c; ++k, w += kPanelCols) {
        if (k < prefetch_lines) _mm_prefetch(prefetch + k * 64, _MM_HINT_T1);
        if (k + c < prefetch_lines) _mm_prefetch(prefetch + (k + c) * 64, _MM_HINT_T1);  // up to 2 a k
        const __m512 b0 = _mm512_loadu_ps(w), b1 = _mm512_loadu_ps(w + 16);
#pragma GCC unroll 16
        for (int i = 0; i < R; ++i) {
          const __m512 a = _mm512_set1_ps(r[i][k]);
          c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
          c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
        }
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      if (i >= rows_here) break;
      const float* zi = z ? z + i * run.ldy : nullptr;
      finish_avx512(c0[i], m0, zi, y + i * run.ldy, clamp, run.lo, run.hi);
      finish_avx512(c1[i], m1, zi ? zi + 16 : nullptr, y + i * run.ldy + 16, clamp, run.lo, run.hi);
    }
  }
}

// A run of tiles two at a time, 2R pixels by at most 16 channels (a layer's last panel where M is
// 16 past a multiple of 32, such as 144: the R x 32 kernel would compute 16 zero columns there).
// An odd run's last tile runs alone on the R x 32 kernel.
template <int R>
__attribute__((target("avx512f,fma"))) void dense_tile_pairs_narrow_avx512(const float* panel, int64_t taps,
                                                                           int64_t c, const TileRun& run) {
  const __mmask16 m0 = lanes(run.cols);
  const __m512 bias0 = run.bias ? _mm512_maskz_loadu_ps(m0, run.bias) : _mm512_setzero_ps();
  const int clamp = run.last ? run.clamp : 0;
  for (int64_t pair = 0; pair < run.tiles / 2; ++pair) {
    const int64_t rows_here = std::min<int64_t>(2 * R, run.pixels - pair * 2 * R);
    float* y = run.y + pair * 2 * R * run.ldy;
    const float* z = run.last && run.z ? run.z + pair * 2 * R * run.ldy : nullptr;
    const float* const* rows_a = run.rows + 2 * pair * run.rows_step;
    const float* const* rows_b = rows_a + run.rows_step;
    __m512 acc[2 * R];
#pragma GCC unroll 32
    for (int i = 0; i < 2 * R; ++i) acc[i] = run.accumulate && i < rows_here ? _mm512_maskz_loadu_ps(m0, y + i * run.ldy) : bias0;
    const float* w = panel;
    for (int64_t t = 0; t < taps; ++t) {
      const float* r[2 * R];
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        r[i] = rows_a[t * R + i] + run.offset;
        r[R + i] = rows_b[t * R + i] + run.offset;
      }
      for (int64_t k = 0; k < c; ++k, w += kPanelCols) {
        const __m512 b0 = _mm512_loadu_ps(w);
#pragma GCC unroll 32
        for (int i = 0; i < 2 * R; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(r[i][k]), b0, acc[i]);
      }
    }
#pragma GCC unroll 32
    for (int i = 0; i < 2 * R; ++i) {
      if (i >= rows_here) break;
      finish_avx512(acc[i], m0, z ? z + i * run.ldy : nullptr, y + i * run.ldy, clamp, run.lo, run.hi);
    }
  }
  if (run.tiles % 2) {
    TileRun last = run;
    const int64_t skip = run.tiles - 1;
    last.rows = run.rows + skip * run.rows_step;
    last.tiles = 1;
    last.y = run.y + skip * R * run.ldy;
    last.z = run.z ? run.z + skip * R * run.ldy : nullptr;
    last.pixels = run.pixels - skip * R;
    last.prefetch_lines = 0;
    dense_tiles_avx512<R>(panel, taps, c, last);
  }
}

// The AVX2 kernels' finish of one pixel's `cols` sums, in finish_avx512's order: the residual
// (z + z_at, or none), the clamp (1: ReLU, 2: [lo, hi]; NaN as finish_avx512 leaves it), the store.
inline void finish_sums(const float* sums, int cols, const float* z, int64_t z_at, int clamp, float lo, float hi,
                        float* y) {
  for (int j = 0; j < cols; ++j) {
    float value = sums[j];
    if (z) value += z[z_at + j];
    if (clamp == 1) value = value > 0.f ? value : 0.f;
    else if (clamp == 2) value = std::min(std::max(value, lo), hi);
    y[j] = value;
  }
}

// The same sums in the same order (each output's over the taps and k ascending, one fused
// multiply-add at a time; tiles of R pixels) without AVX-512, on AVX2: two pixels' whole panel
// of columns at a time (8 ymm of sums, 4 of weights). An engine file built where AVX-512 chose
// these layers runs them here on a CPU without it.
__attribute__((target("avx2,fma"))) void dense_tiles_avx2(int tile_rows, const float* panel, int64_t taps, int64_t c,
                                                        const TileRun& run) {
  constexpr int kVectors = kPanelCols / 8;
  for (int64_t tile = 0; tile < run.tiles; ++tile) {
    const int64_t rows_here = std::min<int64_t>(tile_rows, run.pixels - tile * tile_rows);
    float* y = run.y + tile * tile_rows * run.ldy;
    const float* z = run.z ? run.z + tile * tile_rows * run.ldy : nullptr;
    const float* const* rows = run.rows + tile * run.rows_step;
    for (int64_t i0 = 0; i0 < rows_here; i0 += 2) {
      const int pair = rows_here - i0 >= 2 ? 2 : 1;
      alignas(32) float start[2][kPanelCols] = {};  // columns past run.cols: the panel's padding, not stored
      for (int i = 0; i < pair; ++i)
        for (int j = 0; j < run.cols; ++j)
          start[i][j] = run.accumulate ? y[(i0 + i) * run.ldy + j] : run.bias ? run.bias[j] : 0.f;
      __m256 acc[2][kVectors];
      for (int i = 0; i < 2; ++i)
        for (int v = 0; v < kVectors; ++v) acc[i][v] = _mm256_load_ps(start[i] + v * 8);
      for (int64_t t = 0; t < taps; ++t) {
        const float* r0 = rows[t * tile_rows + i0] + run.offset;
        const float* r1 = pair == 2 ? rows[t * tile_rows + i0 + 1] + run.offset : r0;
        const float* w = panel + t * c * kPanelCols;
        for (int64_t k = 0; k < c; ++k, w += kPanelCols) {
          const __m256 a0 = _mm256_broadcast_ss(r0 + k), a1 = _mm256_broadcast_ss(r1 + k);
          for (int v = 0; v < kVectors; ++v) {
            const __m256 b = _mm256_loadu_ps(w + v * 8);
            acc[0][v] = _mm256_fmadd_ps(a0, b, acc[0][v]);
            acc[1][v] = _mm256_fmadd_ps(a1, b, acc[1][v]);
          }
        }
      }
      for (int i = 0; i < pair; ++i) {
        for (int v = 0; v < kVectors; ++v) _mm256_store_ps(start[i] + v * 8, acc[i][v]);
        finish_sums(start[i], run.cols, run.last ? z : nullptr, (i0 + i) * run.ldy, run.last ? run.clamp : 0, run.lo,
                    run.hi, y + (i0 + i) * run.ldy);
      }
    }
  }
}

// Channels-first X: a network's first convolution, on an image of a few channels (kiln's layout
// pass leaves its input as it is, src/passes/channels_last_convs.cc). Channels-last, such an
// input needs a Transpose of its own (of 3-float pixels), and the direct kernel above a pointer
// per pixel and kernel row of each tile. Channels-first, a tile's output pixels lie along one
// output row: pixel i reads, at tap (c, ky, kx), segment (c, ky)'s input row at i * sw + kx * dw,
// so a tile needs one pointer per segment (a zero-padded copy where the tile passes the image's
// edge or the output row's end). The weights are OIHW's own order: K = (c, ky, kx). MobileNet-V2's
// stem with its Transpose 0.22 -> 0.16 ms on two threads (docs/design/cpu-gemm.md,
// "A first convolution reads its image channels-first").
struct ChannelsFirstTile {
  const float* const* segments = nullptr;  // [C * kH]: (c, ky)'s row at the tile's first pixel, null in the padding
  int64_t segment_count = 0, kw = 1, sw = 1, dw = 1;
  float* y = nullptr;        // the tile's first pixel, first channel of the panel
  int64_t ldy = 0;           // M
  const float* z = nullptr;  // the residual at the same place, or null
  const float* bias = nullptr;
  int64_t pixels = 0;        // pixels of the tile that exist (at most R)
  int cols = 0;              // channels of the panel that exist
  int clamp = 0;             // Epilogue::clamp_mode
  float lo = 0.f, hi = 0.f;
};

// R pixels by V vectors of 16 channels (R * V = 16 sums); SW > 0 fixes the stride, so pixel i's
// input is a constant offset from the tap's.
template <int R, int V, int SW>
__attribute__((target("avx512f,fma"))) void channels_first_tile_avx512(const float* panel, const ChannelsFirstTile& t) {
  const int64_t sw = SW > 0 ? SW : t.sw;
  __mmask16 m[V];
  __m512 acc[R][V];
#pragma GCC unroll 2
  for (int v = 0; v < V; ++v) {
    m[v] = lanes(t.cols - 16 * v);
    const __m512 b = t.bias ? _mm512_maskz_loadu_ps(m[v], t.bias + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) acc[i][v] = b;
  }
  const float* w = panel;
  for (int64_t s = 0; s < t.segment_count; ++s) {
    const float* row = t.segments[s];
    if (!row) {
      w += t.kw * kPanelCols;
      continue;
    }
    for (int64_t kx = 0; kx < t.kw; ++kx, w += kPanelCols) {
      const float* tap = row + kx * t.dw;
      __m512 b[V];
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_ps(w + 16 * v);
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        const __m512 a = _mm512_set1_ps(tap[i * sw]);
#pragma GCC unroll 2
        for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    if (i >= t.pixels) break;
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v)
      finish_avx512(acc[i][v], m[v], t.z ? t.z + i * t.ldy + 16 * v : nullptr, t.y + i * t.ldy + 16 * v, t.clamp, t.lo, t.hi);
  }
}

template <int R, int V>
void channels_first_tile_by_stride(const float* panel, const ChannelsFirstTile& t) {
  switch (t.sw) {
    case 1: channels_first_tile_avx512<R, V, 1>(panel, t); break;
    case 2: channels_first_tile_avx512<R, V, 2>(panel, t); break;
    case 4: channels_first_tile_avx512<R, V, 4>(panel, t); break;
    default: channels_first_tile_avx512<R, V, 0>(panel, t); break;
  }
}

// The same sums in the same order on AVX2, a pixel's whole panel of columns at a time (an engine
// file built where AVX-512 chose this layer, run on a CPU without it).
__attribute__((target("avx2,fma"))) void channels_first_tile_avx2(const float* panel, const ChannelsFirstTile& t) {
  constexpr int kVectors = kPanelCols / 8;
  for (int64_t i = 0; i < t.pixels; ++i) {
    alignas(32) float sums[kPanelCols] = {};  // columns past t.cols: the panel's padding, not stored
    for (int j = 0; j < t.cols; ++j) sums[j] = t.bias ? t.bias[j] : 0.f;
    __m256 acc[kVectors];
    for (int v = 0; v < kVectors; ++v) acc[v] = _mm256_load_ps(sums + v * 8);
    for (int64_t s = 0; s < t.segment_count; ++s) {
      const float* row = t.segments[s];
      if (!row) continue;
      for (int64_t kx = 0; kx < t.kw; ++kx) {
        const __m256 a = _mm256_broadcast_ss(row + i * t.sw + kx * t.dw);
        const float* w = panel + (s * t.kw + kx) * kPanelCols;
        for (int v = 0; v < kVectors; ++v) acc[v] = _mm256_fmadd_ps(a, _mm256_loadu_ps(w + v * 8), acc[v]);
      }
    }
    for (int v = 0; v < kVectors; ++v) _mm256_store_ps(sums + v * 8, acc[v]);
    finish_sums(sums, t.cols, t.z, i * t.ldy, t.clamp, t.lo, t.hi, t.y + i * t.ldy);
  }
}

// One output row of a depthwise convolution: y[ox][ch] = clamp(bias[ch] + the sum over the taps
// inside the image of x[tap][ch] * w[tap][ch] + z[ox][ch]).
struct DepthwiseRow {
  const float* const* rows = nullptr;  // rows[ky]: kernel row ky's input row (column 0), ky in [ky0, ky1)
  const float* w = nullptr;     // [kh * kw, C]
  const float* bias = nullptr;  // [C] or null
  const float* z = nullptr;     // the residual's row, or null
  float* y = nullptr;           // [ow, C]
  int64_t c = 0, ow = 0, in_w = 0, kw = 0, sw = 1, dw = 1, pw = 0;
  int64_t ky0 = 0, ky1 = 0;     // the kernel rows inside the image
  int clamp = 0;
  float lo = 0.f, hi = 0.f;
};

// Taps [k0, k1) of a kernel dimension whose input index start + k * step lies in [0, size).
inline void taps_inside(int64_t start, int64_t step, int64_t taps, int64_t size, int64_t& k0, int64_t& k1) {
  k0 = 0;
  while (k0 < taps && start + k0 * step < 0) ++k0;
  k1 = taps;
  while (k1 > k0 && start + (k1 - 1) * step >= size) --k1;
}

// Output pixel ox's channels [c0, c0 + 16) under mask m: residual, clamp, store.
__attribute__((target("avx512f,fma"), always_inline)) inline void depthwise_store_avx512(const DepthwiseRow& r, __m512 v,
                                                                                       __mmask16 m, int64_t ox, int64_t c0) {
  finish_avx512(v, m, r.z ? r.z + ox * r.c + c0 : nullptr, r.y + ox * r.c + c0, r.clamp, r.lo, r.hi);
}

// One output pixel, the taps inside the image only (the row's edges, and rows too narrow for
// four pixels inside: a 5x5 kernel on a 7-pixel row has three), 64 channels at a time: four
// independent sums (one sum's chain of FMAs waits on each one's latency: MnasNet's 5x5 layers at
// 7 x 7 ran 3.7x ONNX Runtime's time with one).
__attribute__((target("avx512f,fma"))) inline void depthwise_pixel_avx512(const DepthwiseRow& r, int64_t ox, int64_t c_begin,
                                                                          int64_t c_end) {
  const int64_t C = r.c, ix0 = ox * r.sw - r.pw;
  int64_t kx0 = 0, kx1 = 0;
  taps_inside(ix0, r.dw, r.kw, r.in_w, kx0, kx1);
  for (int64_t c0 = c_begin; c0 < c_end; c0 += 64) {
    __mmask16 m[4];
    __m512 acc[4];
    for (int j = 0; j < 4; ++j) {
      m[j] = lanes(c_end - c0 - 16 * j);
      acc[j] = r.bias ? _mm512_maskz_loadu_ps(m[j], r.bias + c0 + 16 * j) : _mm512_setzero_ps();
    }
    for (int64_t ky = r.ky0; ky < r.ky1; ++ky)
      for (int64_t kx = kx0; kx < kx1; ++kx) {
        const float* xp = r.rows[ky] + (ix0 + kx * r.dw) * C + c0;
        const float* wp = r.w + (ky * r.kw + kx) * C + c0;
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
          acc[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[j], xp + 16 * j), _mm512_maskz_loadu_ps(m[j], wp + 16 * j), acc[j]);
      }
    for (int j = 0; j < 4; ++j) depthwise_store_avx512(r, acc[j], m[j], ox, c0 + 16 * j);
  }
}

// Eight output pixels [ox, ox + 8) of an undilated row of stride S whose taps all lie inside it,
// 16 channels at a time: each kernel row's 7 S + KW input pixels are loaded once and each serves
// every tap that reads it (four pixels at a time loaded each input once per tap, and the loads,
// not the FMAs, bound the 5x5 layers). The sums in the same order as depthwise_pixel_avx512's,
// so the same bits.
template <int KW, int S>
__attribute__((target("avx512f,fma"))) void depthwise_eight_avx512(const DepthwiseRow& r, int64_t ox, int64_t c_begin,
                                                                   int64_t c_end) {
  const int64_t C = r.c, ix0 = ox * S - r.pw;
  for (int64_t c0 = c_begin; c0 < c_end; c0 += 16) {
    const __mmask16 m = lanes(c_end - c0);
    const __m512 b = r.bias ? _mm512_maskz_loadu_ps(m, r.bias + c0) : _mm512_setzero_ps();
    __m512 acc[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) acc[p] = b;
    for (int64_t ky = r.ky0; ky < r.ky1; ++ky) {
      const float* xr = r.rows[ky] + ix0 * C + c0;
      const float* wr = r.w + ky * KW * C + c0;
      __m512 in[7 * S + KW];
#pragma GCC unroll 20
      for (int j = 0; j < 7 * S + KW; ++j) in[j] = _mm512_maskz_loadu_ps(m, xr + j * C);
#pragma GCC unroll 5
      for (int kx = 0; kx < KW; ++kx) {
        const __m512 wv = _mm512_maskz_loadu_ps(m, wr + kx * C);
#pragma GCC unroll 8
        for (int p = 0; p < 8; ++p) acc[p] = _mm512_fmadd_ps(in[S * p + kx], wv, acc[p]);
      }
    }
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) depthwise_store_avx512(r, acc[p], m, ox + p, c0);
  }
}

// 16 channels at a time; inside the image (every tap of the pixels in it) four pixels at a time:
// four independent sums (one sum's chain of FMAs would wait on each one's latency), each tap's
// weights loaded once for the four. Pixels outer, channels inner, so each pixel's inputs are used
// whole while they are in L1, where the weights fit in L1 beside them; otherwise in runs of
// channels whose weights fit (MnasNet's 5x5 layers of 1152 channels have 115 KB of weights: read
// from L2 for every pixel, they took 2x ONNX Runtime's time).
__attribute__((target("avx512f,fma"))) void depthwise_row_avx512(const DepthwiseRow& r) {
  const int64_t C = r.c, kw = r.kw, sw = r.sw, dw_step = r.dw * r.c;
  const int64_t ky0 = r.ky0, ky1 = r.ky1, ow = r.ow;
  const float* const w = r.w;
  const __m512 zero = _mm512_setzero_ps();
  // Output columns [in0, in1) read only taps inside the row.
  const int64_t in0 = std::min(ow, (r.pw + sw - 1) / sw);
  const int64_t last_in = r.in_w - 1 - (kw - 1) * r.dw + r.pw;  // the largest ox * sw allowed
  const int64_t in1 = std::max(in0, std::min(ow, last_in < 0 ? 0 : last_in / sw + 1));
  const int64_t step = sw * C;
  const int64_t weight_bytes_per_channel = (ky1 - ky0) * kw * 4;
  const int64_t run = std::max<int64_t>(64, (int64_t{16} << 10) / std::max<int64_t>(1, weight_bytes_per_channel) / 64 * 64);
  for (int64_t c_begin = 0; c_begin < C; c_begin += run) {
    const int64_t c_end = std::min(C, c_begin + run);
    int64_t ox = 0;
    for (; ox < in0; ++ox) depthwise_pixel_avx512(r, ox, c_begin, c_end);
    void (*eight)(const DepthwiseRow&, int64_t, int64_t, int64_t) = nullptr;
    if (r.dw == 1 && sw == 1) eight = kw == 3 ? depthwise_eight_avx512<3, 1> : kw == 5 ? depthwise_eight_avx512<5, 1> : nullptr;
    if (r.dw == 1 && sw == 2) eight = kw == 3 ? depthwise_eight_avx512<3, 2> : kw == 5 ? depthwise_eight_avx512<5, 2> : nullptr;
    if (eight)
      for (; ox + 8 <= in1; ox += 8) eight(r, ox, c_begin, c_end);
    for (; ox + 4 <= in1; ox += 4) {
      const int64_t xp = (ox * sw - r.pw) * C;
      for (int64_t c0 = c_begin; c0 < c_end; c0 += 16) {
        const __mmask16 m = lanes(c_end - c0);
        const __m512 b = r.bias ? _mm512_maskz_loadu_ps(m, r.bias + c0) : zero;
        __m512 a0 = b, a1 = b, a2 = b, a3 = b;
        for (int64_t ky = ky0; ky < ky1; ++ky) {
          const float* xr = r.rows[ky] + xp + c0;
          const float* wr = w + ky * kw * C + c0;
          for (int64_t kx = 0; kx < kw; ++kx, xr += dw_step, wr += C) {
            const __m512 wv = _mm512_maskz_loadu_ps(m, wr);
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xr), wv, a0);
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xr + step), wv, a1);
            a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xr + 2 * step), wv, a2);
            a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xr + 3 * step), wv, a3);
          }
        }
        depthwise_store_avx512(r, a0, m, ox, c0);
        depthwise_store_avx512(r, a1, m, ox + 1, c0);
        depthwise_store_avx512(r, a2, m, ox + 2, c0);
        depthwise_store_avx512(r, a3, m, ox + 3, c0);
      }
    }
    for (; ox < ow; ++ox) depthwise_pixel_avx512(r, ox, c_begin, c_end);
  }
}

// The same sums in the same order (each channel's over ky, then kx, ascending) without AVX-512,
// on AVX2: 8 channels a vector (an engine file built where AVX-512 chose this layer, run on a
// CPU without it).
__attribute__((target("avx2,fma"))) void depthwise_row_avx2(const DepthwiseRow& r) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 zero = _mm256_setzero_ps(), lo = _mm256_set1_ps(r.lo), hi = _mm256_set1_ps(r.hi);
  for (int64_t ox = 0; ox < r.ow; ++ox) {
    const int64_t ix0 = ox * r.sw - r.pw;
    int64_t kx0 = 0, kx1 = 0;
    taps_inside(ix0, r.dw, r.kw, r.in_w, kx0, kx1);
    for (int64_t c0 = 0; c0 < r.c; c0 += 8) {
      const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(8, r.c - c0))), lane);
      __m256 acc = r.bias ? _mm256_maskload_ps(r.bias + c0, m) : zero;
      for (int64_t ky = r.ky0; ky < r.ky1; ++ky)
        for (int64_t kx = kx0; kx < kx1; ++kx)
          acc = _mm256_fmadd_ps(_mm256_maskload_ps(r.rows[ky] + (ix0 + kx * r.dw) * r.c + c0, m),
                                _mm256_maskload_ps(r.w + (ky * r.kw + kx) * r.c + c0, m), acc);
      if (r.z) acc = _mm256_add_ps(acc, _mm256_maskload_ps(r.z + ox * r.c + c0, m));
      if (r.clamp == 1) acc = _mm256_max_ps(acc, zero);  // acc > 0 ? acc : 0
      else if (r.clamp == 2) acc = _mm256_min_ps(hi, _mm256_max_ps(lo, acc));  // NaN stays NaN, as finish_avx512
      _mm256_maskstore_ps(r.y + ox * r.c + c0, m, acc);
    }
  }
}

// Winograd F(2x2, 3x3) channels-last (the transforms of conv_winograd.cc, 16 channels per
// vector instead of 16 tiles): V_xi [tiles x C] = (B^T d B)_xi of each tile's 4x4 input block,
// S_xi [tiles x M] = V_xi U_xi on the 8 x 32 tile kernel (U_xi [C x M] packed once), and each
// tile's 2x2 outputs (A^T S A). Positions outside the image read 0.
__attribute__((target("avx512f"))) void winograd_input_tile(const float* image, int64_t h, int64_t w, int64_t c,
                                                           int64_t iy0, int64_t ix0, float* v, int64_t xi_stride) {
  for (int64_t c0 = 0; c0 < c; c0 += 16) {
    const __mmask16 m = lanes(c - c0);
    __m512 d[4][4], u[4][4];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        const int64_t iy = iy0 + i, ix = ix0 + j;
        d[i][j] = iy >= 0 && iy < h && ix >= 0 && ix < w ? _mm512_maskz_loadu_ps(m, image + (iy * w + ix) * c + c0)
                                                         : _mm512_setzero_ps();
      }
    for (int j = 0; j < 4; ++j) {  // B^T d
      u[0][j] = _mm512_sub_ps(d[0][j], d[2][j]);
      u[1][j] = _mm512_add_ps(d[1][j], d[2][j]);
      u[2][j] = _mm512_sub_ps(d[2][j], d[1][j]);
      u[3][j] = _mm512_sub_ps(d[1][j], d[3][j]);
    }
    float* out = v + c0;
    for (int i = 0; i < 4; ++i) {  // (B^T d) B
      _mm512_mask_storeu_ps(out + (4 * i + 0) * xi_stride, m, _mm512_sub_ps(u[i][0], u[i][2]));
      _mm512_mask_storeu_ps(out + (4 * i + 1) * xi_stride, m, _mm512_add_ps(u[i][1], u[i][2]));
      _mm512_mask_storeu_ps(out + (4 * i + 2) * xi_stride, m, _mm512_sub_ps(u[i][2], u[i][1]));
      _mm512_mask_storeu_ps(out + (4 * i + 3) * xi_stride, m, _mm512_sub_ps(u[i][1], u[i][3]));
    }
  }
}

// One tile's 2x2 outputs (pixel (oy0 + a, ox0 + b) of y, those inside [oh, ow]) from its sums
// s[xi * xi_stride + channel], with bias, residual and Relu/Clip.
__attribute__((target("avx512f,fma"))) void winograd_output_tile(const float* s, int64_t xi_stride, int64_t m_channels,
                                                                const float* bias, const float* z, float* y,
                                                                int64_t oy0, int64_t ox0, int64_t oh, int64_t ow,
                                                                int clamp, float lo, float hi) {
  for (int64_t c0 = 0; c0 < m_channels; c0 += 16) {
    const __mmask16 m = lanes(m_channels - c0);
    __m512 r[2][4];  // A^T S
    for (int j = 0; j < 4; ++j) {
      const __m512 m0 = _mm512_maskz_loadu_ps(m, s + (0 + j) * xi_stride + c0);
      const __m512 m1 = _mm512_maskz_loadu_ps(m, s + (4 + j) * xi_stride + c0);
      const __m512 m2 = _mm512_maskz_loadu_ps(m, s + (8 + j) * xi_stride + c0);
      const __m512 m3 = _mm512_maskz_loadu_ps(m, s + (12 + j) * xi_stride + c0);
      r[0][j] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
      r[1][j] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
    }
    const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + c0) : _mm512_setzero_ps();
    for (int a = 0; a < 2; ++a) {
      if (oy0 + a >= oh) break;
      const __m512 out[2] = {_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(r[a][0], r[a][1]), r[a][2]), b),
                             _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(r[a][1], r[a][2]), r[a][3]), b)};
      for (int bx = 0; bx < 2; ++bx) {
        if (ox0 + bx >= ow) break;
        const int64_t at = ((oy0 + a) * ow + ox0 + bx) * m_channels + c0;
        finish_avx512(out[bx], m, z ? z + at : nullptr, y + at, clamp, lo, hi);
      }
    }
  }
}

// One group's direct product: the weights packed K x M in 32-column panels, K = segments x
// segment (kernel rows or taps, each a pointer's run of consecutive inputs), and K's blocks.
// K runs in blocks of about 256 rows (a panel's block, 32 KB, stays in L1 while every tile of a
// run uses it) where a panel is larger than 512 rows: a 7x7 layer's few tiles read a 3x3
// 512-channel panel (590 KB) once from memory instead of once per tile from L2. A block is whole
// segments (one kernel call over them), or a part of one segment longer than 256.
struct KBlock {
  int64_t s0, count, off, len;  // segments [s0, s0 + count) from offset off, len rows of each
};

constexpr int64_t kOneBlockK = 512;  // K up to this runs as one block

struct DirectProduct {
  const PackedColumns* packed = nullptr;
  int64_t segments = 0, segment = 0, k_total = 0;
  std::vector<KBlock> kblocks;
};

DirectProduct direct_product(const PackedColumns& packed, int64_t segments, int64_t segment) {
  DirectProduct p;
  p.packed = &packed;
  p.segments = segments;
  p.segment = segment;
  p.k_total = segments * segment;
  if (p.k_total <= kOneBlockK) {
    p.kblocks.push_back({0, segments, 0, segment});
  } else if (segment <= 256) {
    const int64_t per = 256 / segment;
    for (int64_t s0 = 0; s0 < segments; s0 += per) p.kblocks.push_back({s0, std::min(per, segments - s0), 0, segment});
  } else {
    for (int64_t s0 = 0; s0 < segments; ++s0)
      for (int64_t off = 0; off < segment; off += 256) p.kblocks.push_back({s0, 1, off, std::min<int64_t>(256, segment - off)});
  }
  return p;
}

// [M, C, kH, kW] -> K x M with K = (tap, c), then 32-column panels.
void pack_direct(const float* src, const std::vector<int64_t>& w_shape, PackedColumns& packed) {
  const int64_t m = w_shape[0], k = w_shape[1] * w_shape[2] * w_shape[3];
  packed.pack(pack_matrix(PackView::kConvTaps, src, w_shape).data(), k, m, m);
}

// Panels [q0, q1) of the product over a run of tiles of tr pixels: rows holds each tile's
// pointers (segments x tr), y and z the run's first pixel (channel 0, M apart), pixels the
// pixels from the run's first on. Each K block meets every tile of the run while its panel
// block stays in L1, the next block prefetched into L2 a slice per tile.
void multiply_tiles(const DirectProduct& p, const float* const* rows, int64_t tiles, int tr, int64_t pixels, int64_t q0,
                    int64_t q1, float* y, const float* z, const float* bias, const Epilogue& epilogue, bool avx512) {
  float lo = 0.f, hi = 0.f;
  int clamp = epilogue.clamp_mode(lo, hi);
  const bool act_after = clamp < 0;
  if (act_after) clamp = 0;
  const int64_t m = p.packed->cols();
  for (int64_t q = q0; q < q1; ++q) {
    const int64_t c0 = q * kPanelCols;
    const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, m - c0));
    const bool narrow = avx512 && cols <= 16;  // two tiles at once on a narrow panel
    for (size_t bi = 0; bi < p.kblocks.size(); ++bi) {
      const KBlock& kb = p.kblocks[bi];
      const int64_t k0 = kb.s0 * p.segment + kb.off, k1 = k0 + (kb.count - 1) * p.segment + kb.len;
      // The next K block of this panel (or the next panel's first), a slice per call.
      const float* next = k1 < p.k_total ? p.packed->panel(q) + k1 * kPanelCols : q + 1 < q1 ? p.packed->panel(q + 1) : nullptr;
      const KBlock& next_block = p.kblocks[bi + 1 < p.kblocks.size() ? bi + 1 : 0];
      const int64_t next_rows = (next_block.count - 1) * p.segment + next_block.len;
      const int64_t next_lines = next ? next_rows * kPanelCols * 4 / 64 : 0;
      const int64_t calls = narrow ? (tiles + 1) / 2 : tiles;
      TileRun run;
      run.rows = rows + kb.s0 * tr;
      run.rows_step = p.segments * tr;
      run.offset = kb.off;
      run.tiles = tiles;
      run.y = y + c0;
      run.ldy = m;
      run.z = z ? z + c0 : nullptr;
      run.bias = bias ? bias + c0 : nullptr;
      run.pixels = pixels;
      run.cols = cols;
      run.clamp = clamp;
      run.lo = lo;
      run.hi = hi;
      run.accumulate = k0 > 0;
      run.last = k1 == p.k_total;
      run.prefetch = next ? reinterpret_cast<const char*>(next) : nullptr;
      run.prefetch_lines = next_lines;
      run.prefetch_per_tile = (next_lines + calls - 1) / calls;
      const float* panel = p.packed->panel(q) + k0 * kPanelCols;
      if (narrow && tr == 7) dense_tile_pairs_narrow_avx512<7>(panel, kb.count, kb.len, run);
      else if (narrow && tr == 14) dense_tile_pairs_narrow_avx512<14>(panel, kb.count, kb.len, run);
      else if (narrow) dense_tile_pairs_narrow_avx512<kTileRows>(panel, kb.count, kb.len, run);
      else if (avx512 && tr == 7) dense_tiles_avx512<7>(panel, kb.count, kb.len, run);
      else if (avx512 && tr == 14) dense_tiles_avx512<14>(panel, kb.count, kb.len, run);
      else if (avx512) dense_tiles_avx512<kTileRows>(panel, kb.count, kb.len, run);
      else dense_tiles_avx2(tr, panel, kb.count, kb.len, run);
      if (act_after && run.last) epilogue.apply(run.y, m, std::min(pixels, tiles * tr), cols, nullptr, nullptr, nullptr, 0);
    }
  }
}

// A depthwise convolution's output rows: the fields every row shares (rows, ky0, ky1, z and y
// are the row's own).
DepthwiseRow depthwise_row_shape(const Geometry& g, const float* weights, const float* bias, const Epilogue& epilogue) {
  DepthwiseRow r;
  r.w = weights;
  r.bias = bias;
  r.c = g.c;
  r.ow = g.ow;
  r.in_w = g.w;
  r.kw = g.kw;
  r.sw = g.sw;
  r.dw = g.dw;
  r.pw = g.pw;
  r.clamp = epilogue.clamp_mode(r.lo, r.hi);
  if (r.clamp < 0) r.clamp = 0;  // applied after the row
  return r;
}

void depthwise_output_row(const DepthwiseRow& r, bool avx512, const Epilogue& epilogue) {
  if (avx512) depthwise_row_avx512(r);
  else depthwise_row_avx2(r);
  float lo = 0.f, hi = 0.f;
  if (epilogue.clamp_mode(lo, hi) < 0) epilogue.apply(r.y, r.c, r.ow, r.c, nullptr, nullptr, nullptr, 0);
}

class ChannelsLastConvKernel final : public Kernel {
 public:
  explicit ChannelsLastConvKernel(const KernelInit& init)
      : node_(init.node), epilogue_(ir::Activation::from_node(init.node)) {
    w_shape_ = init.constants[1]->shape();
    const int64_t m = w_shape_[0], cg = w_shape_[1], taps = w_shape_[2] * w_shape_[3];
    depthwise_ = is_depthwise(init.node.attrs.get_int("group", 1), w_shape_);
    channels_first_ = init.node.attrs.get_int("input_channels_first", 0) != 0;
    // A loaded engine's panels are taken as they are; otherwise (or packed for another path,
    // another CPU) the filters' values.
    const ir::PackedConstant* pack = init.packed_input(1);
    Tensor values;
    auto filters = [&]() -> const float* {
      if (!values.defined()) values = constant_values(*init.constants[1], pack);
      return values.data<float>();
    };
    if (channels_first_) {
      // [M, K] with K = (c, ky, kx), OIHW's own order -> K x M, then 32-column panels.
      if (!(pack && adopt_packed(*pack, PackView::kTransposed, w_shape_, packed_)))
        packed_.pack(pack_matrix(PackView::kTransposed, filters(), w_shape_).data(), cg * taps, m, m);
      pack_view_ = PackView::kTransposed;
      return;
    }
    const Bf16GemmIsa bf16_isa = bf16_products_isa(init.bfloat16_products);
    if (!depthwise_ && bf16_isa != Bf16GemmIsa::kNone && init.node.attrs.get_int("group", 1) == 1) {
      // [M, C, kH, kW] -> K x M with K = (ky, kx, c), the order a row's taps are gathered in.
      if (!(pack && adopt_packed(*pack, PackView::kConvTaps, w_shape_, bf16_isa, bf16_)))
        bf16_.pack(bf16_isa, pack_matrix(PackView::kConvTaps, filters(), w_shape_).data(), cg * taps, m, m);
      return;
    }
    winograd_ = !depthwise_ && WinogradConv::applies(init.node, w_shape_, init.node.attrs.get_int("group", 1));
    if (depthwise_) {
      // [M, 1, kH, kW] -> [taps, M]: a tap's weights for consecutive channels side by side.
      const float* src = filters();
      weights_.resize(static_cast<size_t>(taps * m));
      for (int64_t ch = 0; ch < m; ++ch)
        for (int64_t t = 0; t < taps; ++t) weights_[static_cast<size_t>(t * m + ch)] = src[ch * taps + t];
      return;
    }
    zeros_.assign(static_cast<size_t>(std::max<int64_t>(w_shape_[3] * cg, 1)), 0.f);  // a kernel row's worth
    // The direct product's panels, also where Winograd applies: its transformed filters are made
    // from them when a run first has enough tiles for it (at batch 1, a 7 x 7 layer never has).
    if (!(pack && adopt_packed(*pack, PackView::kConvTaps, w_shape_, packed_))) pack_direct(filters(), w_shape_, packed_);
    pack_view_ = PackView::kConvTaps;
  }

  // The residual Z, where every path reads each of its elements only when it writes Y's element
  // there: the depthwise rows, Winograd's output tiles, the channels-first tiles, and the direct
  // product when K is one block (with several, the first blocks' partial sums go to Y before the
  // last adds Z).
  int overwritable_input() const override {
    const int64_t k_total = w_shape_[1] * w_shape_[2] * w_shape_[3];
    return depthwise_ || channels_first_ || k_total <= kOneBlockK ? 3 : -1;
  }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    if (out[0].numel() == 0) return;
    const std::vector<int64_t>& xs = in[0]->shape();
    const Geometry g = make_geometry(node_, channels_first_ ? std::vector<int64_t>{xs[0], xs[2], xs[3], xs[1]} : xs, w_shape_);
    const float* x = in[0]->data<float>();
    const float* bias = in.size() > 2 && in[2] ? in[2]->data<float>() : nullptr;
    const float* z = in.size() > 3 && in[3] ? in[3]->data<float>() : nullptr;
    float* y = out[0].data<float>();
    if (channels_first_) {
      channels_first(g, x, bias, z, y);
      return;
    }
    if (depthwise_) {
      depthwise(g, x, bias, z, y);
      return;
    }
    if (!bf16_.empty()) {
      bfloat16_products(g, x, bias, z, y);
      return;
    }
    if (winograd_ && sgemm_isa() == SgemmIsa::kAvx512) {
      Geo3 tiles;
      tiles.batch = g.batch;
      tiles.out[1] = g.oh;
      tiles.out[2] = g.ow;
      if (WinogradConv::pays(tiles)) {
        if (winograd_u_.empty()) transform_filters();
        winograd(g, x, bias, z, y);
        return;
      }
    }
    dense(g, x, bias, z, y);
  }

  std::string tactic() const override {
    return bf16_tactic(bf16_.isa());
  }

  std::vector<std::pair<size_t, ir::PackedConstant>> packed_constants() const override {
    if (!bf16_.empty()) return {{1, packed_constant(bf16_, PackView::kConvTaps)}};
    if (pack_view_) return {{1, packed_constant(packed_, *pack_view_)}};
    return {};
  }

 private:
  // Y [pixels x M] = act(gathered taps [pixels x K] @ W + bias + Z) on bf16_rows_gemm; taps past
  // the image's edge are zeros. Undilated taps of a kernel row inside the image are kW * C
  // consecutive floats, rounded in one pass.
  void bfloat16_products(const Geometry& g, const float* x, const float* bias, const float* z, float* y) const {
    const int64_t k = g.taps() * g.c, kp = bf16_.depth_padded(), image_pixels = g.oh * g.ow;
    auto gather = [&](int64_t first, int64_t count, uint16_t* dst) {
      for (int64_t row = first; row < first + count; ++row, dst += kp) {
        const int64_t n = row / image_pixels, oy = row % image_pixels / g.ow, ox = row % g.ow;
        const float* image = x + n * g.h * g.w * g.c;
        const int64_t ix0 = ox * g.sw - g.pw;
        const bool row_inside = g.dw == 1 && ix0 >= 0 && ix0 + g.kw <= g.w;
        for (int64_t ky = 0; ky < g.kh; ++ky) {
          const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
          uint16_t* taps = dst + ky * g.kw * g.c;
          if (iy < 0 || iy >= g.h) {
            std::fill(taps, taps + g.kw * g.c, uint16_t{0});
          } else if (row_inside) {
            bf16_round_floats(image + (iy * g.w + ix0) * g.c, g.kw * g.c, taps);
          } else {
            for (int64_t kx = 0; kx < g.kw; ++kx) {
              const int64_t ix = ix0 + kx * g.dw;
              if (ix < 0 || ix >= g.w) std::fill(taps + kx * g.c, taps + (kx + 1) * g.c, uint16_t{0});
              else bf16_round_floats(image + (iy * g.w + ix) * g.c, g.c, taps + kx * g.c);
            }
          }
        }
        std::fill(dst + k, dst + kp, uint16_t{0});
      }
    };
    bf16_rows_gemm(bf16_, g.batch * image_pixels, gather, y, g.m, bias, z, g.m, &epilogue_, thread_count());
  }

  // Winograd's transformed filters U_xi [C x M] from the direct product's panels (the filters'
  // exact values): runs are one at a time (CpuEngine::run), so the first that needs them makes them.
  void transform_filters() {
    const int64_t m = w_shape_[0], cg = w_shape_[1];
    const Tensor filters = unpack_constant(packed_constant(packed_, PackView::kConvTaps), w_shape_);
    const std::vector<float> u = winograd_filters(filters.data<float>(), m, cg);  // [16][M][C]
    std::vector<float> cxm(static_cast<size_t>(cg * m));
    std::vector<PackedColumns> transformed(16);
    for (int64_t xi = 0; xi < 16; ++xi) {
      for (int64_t o = 0; o < m; ++o)
        for (int64_t ci = 0; ci < cg; ++ci) cxm[static_cast<size_t>(ci * m + o)] = u[static_cast<size_t>((xi * m + o) * cg + ci)];
      transformed[static_cast<size_t>(xi)].pack(cxm.data(), cg, m, m);
    }
    winograd_u_ = std::move(transformed);
  }

  // Two schedules, as the channels-first kernel's (conv_winograd.h). Where U (16 x C x M floats)
  // is smaller than the tiles' V and S (16 x tiles x (C + M)): blocks of tiles, each transformed,
  // multiplied and transformed back by one thread while its V and S (at most 512 KiB) stay in that
  // core's L2, U read once per block. Otherwise (few tiles: a 14 x 14 layer of 256 channels at
  // batch 1 has 49 tiles and 4 MiB of U): three loops over all the tiles (up to 8 MiB of V and S
  // at a time), the products split by U's panels, so each panel is read once.
  void winograd(const Geometry& g, const float* x, const float* bias, const float* z, float* y) const {
    float lo = 0.f, hi = 0.f;
    int clamp = epilogue_.clamp_mode(lo, hi);
    const bool act_after = clamp < 0;
    if (act_after) clamp = 0;
    const int64_t th = (g.oh + 1) / 2, tw = (g.ow + 1) / 2, image_tiles = th * tw, tiles = g.batch * image_tiles;
    const int64_t panels = (g.m + kPanelCols - 1) / kPanelCols;
    const int threads = thread_count();
    const float* zero_row = zeros_.data();
    // Tiles [t0, t0 + n) of the batch, their V and S at v and sums (xi_stride tiles apart).
    auto transform_in = [&](int64_t t0, int64_t t, float* v, int64_t stride) {
      const int64_t tile = t0 + t, n = tile / image_tiles, ty = tile % image_tiles / tw, tx = tile % tw;
      winograd_input_tile(x + n * g.h * g.w * g.c, g.h, g.w, g.c, 2 * ty - g.ph, 2 * tx - g.pw, v + t * g.c, stride * g.c);
    };
    // S_xi's panel q over nt tiles, bringing `next` (the panel a task multiplies after this one, or
    // null) into L2 a slice per tile row.
    auto multiply = [&](int64_t xi, int64_t q, int64_t nt, const float* v, float* sums, int64_t stride, const float* next) {
      const float* vx = v + xi * stride * g.c;
      const int tr = pixels_per_tile(nt);
      const int64_t next_lines = next ? g.c * kPanelCols * 4 / 64 : 0, calls = (nt + tr - 1) / tr;
      thread_local std::vector<const float*> rows;
      rows.resize(static_cast<size_t>(calls * tr));
      for (int64_t t = 0; t < calls * tr; ++t) rows[static_cast<size_t>(t)] = t < nt ? vx + t * g.c : zero_row;
      TileRun run;
      run.rows = rows.data();
      run.rows_step = tr;
      run.tiles = calls;
      run.y = sums + xi * stride * g.m + q * kPanelCols;
      run.ldy = g.m;
      run.pixels = nt;
      run.cols = static_cast<int>(std::min<int64_t>(kPanelCols, g.m - q * kPanelCols));
      run.prefetch = next ? reinterpret_cast<const char*>(next) : nullptr;
      run.prefetch_lines = next_lines;
      run.prefetch_per_tile = (next_lines + calls - 1) / calls;
      const float* panel = winograd_u_[static_cast<size_t>(xi)].panel(q);
      if (tr == 14) dense_tiles_avx512<14>(panel, 1, g.c, run);
      else if (tr == 7) dense_tiles_avx512<7>(panel, 1, g.c, run);
      else dense_tiles_avx512<kTileRows>(panel, 1, g.c, run);
    };
    auto transform_out = [&](int64_t t0, int64_t t, const float* sums, int64_t stride) {
      const int64_t tile = t0 + t, n = tile / image_tiles, ty = tile % image_tiles / tw, tx = tile % tw;
      const int64_t image = n * g.oh * g.ow * g.m;
      winograd_output_tile(sums + t * g.m, stride * g.m, g.m, bias, z ? z + image : nullptr, y + image, 2 * ty, 2 * tx, g.oh,
                           g.ow, clamp, lo, hi);
      if (act_after)
        for (int64_t a = 0; a < 2 && 2 * ty + a < g.oh; ++a)
          epilogue_.apply(y + image + ((2 * ty + a) * g.ow + 2 * tx) * g.m, g.m, std::min<int64_t>(2, g.ow - 2 * tx), g.m,
                          nullptr, nullptr, nullptr, 0);
    };

    const int64_t per_tile = 16 * (g.c + g.m);
    if (16 * g.c * g.m > tiles * per_tile) {
      const int64_t chunk = whole_product_tiles((int64_t{2} << 20) / per_tile);
      for (int64_t t0 = 0; t0 < tiles; t0 += chunk) {
        const int64_t nt = std::min(chunk, tiles - t0);
        float* v = run_v_.reserve(16 * chunk * g.c);
        float* sums = run_s_.reserve(16 * chunk * g.m);
        parallel_for_each(nt, threads > 1, [&](int64_t t) { transform_in(t0, t, v, chunk); });
        // Runs of (xi, panel) pairs, each reading its panels of U once, the next one brought
        // into L2 while the current one meets the tiles.
        const int64_t pairs = 16 * panels, tasks = std::min<int64_t>(pairs, 4 * threads);
        parallel_for_each(tasks, threads > 1, [&](int64_t task) {
          const int64_t p0 = task * pairs / tasks, p1 = (task + 1) * pairs / tasks;
          for (int64_t p = p0; p < p1; ++p) {
            const float* next = p + 1 < p1 ? winograd_u_[static_cast<size_t>((p + 1) / panels)].panel((p + 1) % panels) : nullptr;
            multiply(p / panels, p % panels, nt, v, sums, chunk, next);
          }
        }, 1);
        parallel_for_each(nt, threads > 1, [&](int64_t t) { transform_out(t0, t, sums, chunk); });
      }
      return;
    }
    const int64_t fit = whole_product_tiles((int64_t{128} << 10) / per_tile);
    const int64_t share = (tiles + 4 * threads - 1) / (4 * threads);
    const int64_t block = std::min(fit, std::max<int64_t>(kTileRows, (share + 13) / 14 * 14));
    const int64_t blocks = (tiles + block - 1) / block;
    parallel_for_each(blocks, threads > 1 && blocks > 1, [&](int64_t bi) {
      const int64_t t0 = bi * block, nt = std::min(block, tiles - t0);
      thread_local AlignedFloats v_buffer, s_buffer;
      float* v = v_buffer.reserve(16 * block * g.c);
      float* sums = s_buffer.reserve(16 * block * g.m);
      for (int64_t t = 0; t < nt; ++t) transform_in(t0, t, v, block);
      for (int64_t xi = 0; xi < 16; ++xi)
        for (int64_t q = 0; q < panels; ++q) multiply(xi, q, nt, v, sums, block, nullptr);
      for (int64_t t = 0; t < nt; ++t) transform_out(t0, t, sums, block);
    }, 1);
  }

  void dense(const Geometry& g, const float* x, const float* bias, const float* z, float* y) const {
    const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
    const int64_t pixels = g.batch * g.oh * g.ow, taps = g.taps();
    const int tr = pixels_per_tile(pixels);
    const int64_t tiles = (pixels + tr - 1) / tr, panels = (g.m + kPanelCols - 1) / kPanelCols;
    const int threads = thread_count();
    // Tasks: runs of tiles (tiles_per_run: about 64 pixels, whose inputs stay in L2 while every panel of
    // weights meets them), by runs of panels where there are too few runs for the threads (a 7x7
    // layer at batch 1 has 7 tiles): each panel is read from memory once, then from L1.
    // One run of tiles whose panels do not divide among the threads (a 7x7 layer of 160 channels
    // at batch 1: 5 panels, 3 for one thread and 2 for the other) splits its tiles too, each
    // thread reading the panels its tiles need: MobileNet-V2's such layers 0.067 -> 0.061 ms on
    // two threads (docs/design/cpu-gemm.md, "Narrow outputs on two threads").
    const int64_t run_tiles = tiles_per_run(tr), runs = (tiles + run_tiles - 1) / run_tiles;
    const bool split_tiles = runs == 1 && threads > 1 && panels < 4 * threads && panels % threads != 0 && tiles >= threads;
    const int64_t tile_tasks = split_tiles ? threads : runs;  // runs of run_tiles tiles or fewer, all of about one length
    const int64_t panel_tasks = std::min<int64_t>(panels, std::max<int64_t>(1, (4 * threads + tile_tasks - 1) / tile_tasks));
    const int64_t tasks = tile_tasks * panel_tasks;
    const float* zero_row = zeros_.data();
    // A 1x1 kernel of stride 1 without padding reads each output pixel's own input pixel.
    const bool pointwise = taps == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0 && g.oh == g.h && g.ow == g.w;
    // Without dilation across the row a kernel row's taps read kW * C consecutive floats: one
    // pointer per kernel row (a copy, zero-padded, where the row passes the image's edge), so the
    // sums run over kW * C at a time (a 3-channel stem: 21, not 3).
    const bool by_rows = g.dw == 1;
    const int64_t segments = by_rows ? g.kh : taps, segment = by_rows ? g.kw * g.c : g.c;
    const DirectProduct product = direct_product(packed_, segments, segment);
    // In parallel where the arithmetic or the weights are large enough: a squeeze-and-excitation
    // block's 1x1 convolutions on one pixel stream 100s of KB of weights for little arithmetic,
    // and each thread reads the panels of its own tasks.
    const bool parallel = pixels * g.m * taps * g.c >= (int64_t{1} << 17) || g.m * taps * g.c >= (int64_t{1} << 15);
    parallel_for_each(tasks, threads > 1 && parallel, [&](int64_t task) {
      const int64_t t0 = task / panel_tasks * tiles / tile_tasks, t1 = (task / panel_tasks + 1) * tiles / tile_tasks;
      const int64_t pt = task % panel_tasks;
      const int64_t q0 = pt * panels / panel_tasks, q1 = (pt + 1) * panels / panel_tasks;
      // Each tile's input pointers, segment-major: rows[(tile * segments + s) * tr + i].
      thread_local std::vector<const float*> rows;
      thread_local AlignedFloats edge_copies;
      rows.resize(static_cast<size_t>((t1 - t0) * segments * tr));
      // The pixels of the task's tiles in order: image, row and column, one step at a time (no
      // division per pixel). `visit(slot, image, oy, ox)` per pixel that exists.
      auto for_each_pixel = [&](auto&& visit) {
        const int64_t p0 = t0 * tr;
        int64_t n = p0 / (g.oh * g.ow), oy = p0 / g.ow % g.oh, ox = p0 % g.ow;
        const float** tile_slots = rows.data();  // the pixel's tile's first pointer
        int i = 0;                               // the pixel in its tile
        for (int64_t p = p0; p < t1 * tr; ++p, ++i) {
          if (i == tr) {
            i = 0;
            tile_slots += segments * tr;
          }
          const float** slot = tile_slots + i;
          if (p >= pixels) {
            for (int64_t t = 0; t < segments; ++t) slot[t * tr] = zero_row;
            continue;
          }
          visit(slot, x + n * g.h * g.w * g.c, oy, ox);
          if (++ox == g.ow) {
            ox = 0;
            if (++oy == g.oh) {
              oy = 0;
              ++n;
            }
          }
        }
      };
      if (pointwise) {
        for_each_pixel([&](const float** slot, const float* image, int64_t oy, int64_t ox) { slot[0] = image + (oy * g.w + ox) * g.c; });
      } else if (by_rows) {
        // Kernel rows that pass the image's left or right edge get a zero-padded copy: the first
        // `left` pixels of an output row and those from `right` on, in the rows the task spans.
        const int64_t left = std::min(g.ow, (g.pw + g.sw - 1) / g.sw);
        const int64_t last_whole = g.w - g.kw + g.pw;  // the largest ox * sw whose kernel row is inside
        const int64_t right = std::max(left, last_whole < 0 ? int64_t{0} : std::min(g.ow, last_whole / g.sw + 1));
        const int64_t rows_spanned = ((t1 - t0) * tr + g.ow - 1) / g.ow + 1;
        float* copy = edge_copies.reserve(std::max<int64_t>(1, rows_spanned * (left + g.ow - right) * g.kh * segment));
        // The kernel rows' input rows (null: in the padding) of the output row last visited.
        thread_local std::vector<const float*> row_starts;
        row_starts.resize(static_cast<size_t>(g.kh));
        const float* starts_image = nullptr;
        int64_t starts_oy = -1;
        for_each_pixel([&](const float** slot, const float* image, int64_t oy, int64_t ox) {
          if (image != starts_image || oy != starts_oy) {
            for (int64_t ky = 0; ky < g.kh; ++ky) {
              const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
              row_starts[static_cast<size_t>(ky)] = iy >= 0 && iy < g.h ? image + iy * g.w * g.c : nullptr;
            }
            starts_image = image;
            starts_oy = oy;
          }
          const int64_t ix0 = ox * g.sw - g.pw;
          if (ox >= left && ox < right) {
            for (int64_t ky = 0; ky < g.kh; ++ky) {
              const float* start = row_starts[static_cast<size_t>(ky)];
              slot[ky * tr] = start ? start + ix0 * g.c : zero_row;
            }
            return;
          }
          for (int64_t ky = 0; ky < g.kh; ++ky) {
            const float* start = row_starts[static_cast<size_t>(ky)];
            for (int64_t kx = 0; kx < g.kw; ++kx) {
              const int64_t ix = ix0 + kx;
              float* to = copy + kx * g.c;
              if (start && ix >= 0 && ix < g.w) std::copy_n(start + ix * g.c, g.c, to);
              else std::fill_n(to, g.c, 0.f);
            }
            slot[ky * tr] = copy;
            copy += segment;
          }
        });
      } else {
        for_each_pixel([&](const float** slot, const float* image, int64_t oy, int64_t ox) {
          for (int64_t ky = 0; ky < g.kh; ++ky) {
            const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
            const bool row_inside = iy >= 0 && iy < g.h;
            for (int64_t kx = 0; kx < g.kw; ++kx) {
              const int64_t ix = ox * g.sw - g.pw + kx * g.dw;
              slot[(ky * g.kw + kx) * tr] = row_inside && ix >= 0 && ix < g.w ? image + (iy * g.w + ix) * g.c : zero_row;
            }
          }
        });
      }
      multiply_tiles(product, rows.data(), t1 - t0, tr, pixels - t0 * tr, q0, q1, y + t0 * tr * g.m, z ? z + t0 * tr * g.m : nullptr,
                     bias, epilogue_, avx512);
    }, 1);
  }

  // X [N, C, H, W]: tiles of R pixels along each output row (16 where M fits one vector, 8
  // otherwise), every panel of weights on a tile while its inputs stay in L1; tasks are output rows.
  void channels_first(const Geometry& g, const float* x, const float* bias, const float* z, float* y) const {
    const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
    float lo = 0.f, hi = 0.f;
    int clamp = epilogue_.clamp_mode(lo, hi);
    const bool act_after = clamp < 0;
    if (act_after) clamp = 0;
    const bool narrow = g.m <= 16;
    const int64_t r = narrow ? 16 : 8, tiles = (g.ow + r - 1) / r, panels = (g.m + kPanelCols - 1) / kPanelCols;
    const int64_t segment_count = g.c * g.kh;
    const int64_t span = (r - 1) * g.sw + (g.kw - 1) * g.dw + 1;  // input floats a tile reads of a segment
    const int64_t out_rows = g.batch * g.oh;
    const bool parallel = out_rows > 1 && out_rows * g.ow * g.m * segment_count * g.kw >= (int64_t{1} << 17);
    parallel_for_each(out_rows, parallel, [&](int64_t row) {
      const int64_t n = row / g.oh, oy = row % g.oh;
      thread_local std::vector<const float*> row_starts, segments;
      thread_local AlignedFloats edge_copies;
      row_starts.resize(static_cast<size_t>(segment_count));
      segments.resize(static_cast<size_t>(segment_count));
      float* copies = edge_copies.reserve(segment_count * span);
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t ky = 0; ky < g.kh; ++ky) {
          const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
          row_starts[static_cast<size_t>(c * g.kh + ky)] = iy >= 0 && iy < g.h ? x + ((n * g.c + c) * g.h + iy) * g.w : nullptr;
        }
      ChannelsFirstTile t;
      t.segments = segments.data();
      t.segment_count = segment_count;
      t.kw = g.kw;
      t.sw = g.sw;
      t.dw = g.dw;
      t.ldy = g.m;
      t.clamp = clamp;
      t.lo = lo;
      t.hi = hi;
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const int64_t ox0 = tile * r, ix0 = ox0 * g.sw - g.pw;
        t.pixels = std::min(r, g.ow - ox0);
        const bool inside = t.pixels == r && ix0 >= 0 && ix0 + span <= g.w;
        for (int64_t s = 0; s < segment_count; ++s) {
          const float* start = row_starts[static_cast<size_t>(s)];
          if (!start || inside) {
            segments[static_cast<size_t>(s)] = start ? start + ix0 : nullptr;
            continue;
          }
          // [0, first_inside) and [end_inside, span) lie past the row's ends.
          float* copy = copies + s * span;
          const int64_t first_inside = std::clamp<int64_t>(-ix0, 0, span);
          const int64_t end_inside = std::clamp<int64_t>(g.w - ix0, first_inside, span);
          std::fill(copy, copy + span, 0.f);
          if (end_inside > first_inside) std::copy(start + ix0 + first_inside, start + ix0 + end_inside, copy + first_inside);
          segments[static_cast<size_t>(s)] = copy;
        }
        const int64_t first = row * g.ow + ox0;
        for (int64_t q = 0; q < panels; ++q) {
          t.y = y + first * g.m + q * kPanelCols;
          t.z = z ? z + first * g.m + q * kPanelCols : nullptr;
          t.bias = bias ? bias + q * kPanelCols : nullptr;
          t.cols = static_cast<int>(std::min<int64_t>(kPanelCols, g.m - q * kPanelCols));
          const float* panel = packed_.panel(q);
          if (!avx512) channels_first_tile_avx2(panel, t);
          else if (narrow) channels_first_tile_by_stride<16, 1>(panel, t);
          else channels_first_tile_by_stride<8, 2>(panel, t);
        }
        if (act_after) epilogue_.apply(y + first * g.m, g.m, t.pixels, g.m, nullptr, nullptr, nullptr, 0);
      }
    }, 1);
  }

  void depthwise(const Geometry& g, const float* x, const float* bias, const float* z, float* y) const {
    const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
    const DepthwiseRow shape = depthwise_row_shape(g, weights_.data(), bias, epilogue_);
    const int64_t out_rows = g.batch * g.oh;
    parallel_for_each(out_rows, out_rows > 1 && out_rows * g.ow * g.m * g.taps() >= (int64_t{1} << 15), [&](int64_t row) {
      const int64_t n = row / g.oh, oy = row % g.oh, iy0 = oy * g.sh - g.ph;
      thread_local std::vector<const float*> rows;
      rows.assign(static_cast<size_t>(g.kh), nullptr);
      DepthwiseRow r = shape;
      taps_inside(iy0, g.dh, g.kh, g.h, r.ky0, r.ky1);
      for (int64_t ky = r.ky0; ky < r.ky1; ++ky) rows[static_cast<size_t>(ky)] = x + ((n * g.h + iy0 + ky * g.dh) * g.w) * g.c;
      r.rows = rows.data();
      r.z = z ? z + row * g.ow * g.m : nullptr;
      r.y = y + row * g.ow * g.m;
      depthwise_output_row(r, avx512, epilogue_);
    });
  }

  const ir::Node& node_;
  Epilogue epilogue_;
  std::vector<int64_t> w_shape_;
  bool depthwise_ = false;
  bool channels_first_ = false;  // X [N, C, H, W] (attribute input_channels_first)
  AlignedVector<float> weights_;  // depthwise: [taps, M]
  PackedColumns packed_;        // one group: K x M in 32-column panels
  std::optional<PackView> pack_view_;  // how packed_ reads the filters, where they are only there
  bool winograd_ = false;              // 3x3 of stride 1: Winograd where a run has enough tiles
  std::vector<PackedColumns> winograd_u_;  // U_xi [C x M], the 16 transformed filters, made on first need
  Bf16PackedColumns bf16_;  // one group, bfloat16 products: K x M in bfloat16 panels, in place of the others
  mutable AlignedFloats run_v_, run_s_;    // Winograd over all tiles: V and S, shared by the threads
  std::vector<float> zeros_;    // one group: kW * C zeros, the input of taps in the padding
};

// kiln::ChannelsLastSeparableConv: the block streamed one output row at a time. Each task is a
// band of an image's output rows; for each row it expands the input rows the depthwise kernel
// reads (each once, into a ring of the kernel's rows, unless the band's previous row made it),
// runs the depthwise row into a buffer and projects that row into Y. The expanded rows and the
// depthwise row stay in L2 (a 112-pixel row of 96 channels is 43 KB): unfused, the 6x wider
// tensors between the convolutions went to memory and back (docs/design/cpu-gemm.md,
// "Depthwise-separable blocks in one pass"). Every element is summed in the unfused kernels'
// order, so the outputs are the three ChannelsLastConv's bits.
class SeparableConvKernel final : public Kernel {
 public:
  explicit SeparableConvKernel(const KernelInit& init)
      : node_(init.node),
        expand_act_(ir::Activation::from_node(init.node, "expand_")),
        depthwise_act_(ir::Activation::from_node(init.node, "depthwise_")),
        project_act_(ir::Activation::from_node(init.node)) {
    // A loaded engine's panels are taken as they are.
    auto pack_filters = [&](size_t input, PackedColumns& panels) {
      const Tensor& w = *init.constants[input];
      const ir::PackedConstant* pack = init.packed_input(input);
      if (!(pack && adopt_packed(*pack, PackView::kConvTaps, w.shape(), panels)))
        pack_direct(constant_values(w, pack).data<float>(), w.shape(), panels);
    };
    if (init.constants[kWe]) pack_filters(kWe, expand_);
    const Tensor& wd = *init.constants[kWd];
    wd_shape_ = wd.shape();
    const int64_t e = wd_shape_[0], taps = wd_shape_[2] * wd_shape_[3];
    depthwise_weights_.resize(static_cast<size_t>(taps * e));  // [taps, E], as ChannelsLastConvKernel's
    for (int64_t ch = 0; ch < e; ++ch)
      for (int64_t t = 0; t < taps; ++t) depthwise_weights_[static_cast<size_t>(t * e + ch)] = wd.data<float>()[ch * taps + t];
    pack_filters(kWp, project_);
    zeros_.assign(static_cast<size_t>(std::max(e, expand_.empty() ? e : expand_.depth())), 0.f);
  }

  std::vector<std::pair<size_t, ir::PackedConstant>> packed_constants() const override {
    std::vector<std::pair<size_t, ir::PackedConstant>> packs = {{kWp, packed_constant(project_, PackView::kConvTaps)}};
    if (!expand_.empty()) packs.emplace_back(kWe, packed_constant(expand_, PackView::kConvTaps));
    return packs;
  }

  static constexpr size_t kWe = 1, kBe = 2, kWd = 3, kBd = 4, kWp = 5, kBp = 6, kZ = 7;

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    if (out[0].numel() == 0) return;
    const std::vector<int64_t>& xs = in[0]->shape();
    const int64_t e = wd_shape_[0];
    const Geometry g = make_geometry(node_, {xs[0], xs[1], xs[2], e}, wd_shape_);  // the depthwise convolution's
    const bool expands = !expand_.empty();
    const int64_t c_in = xs[3], m = project_.cols();
    auto data = [&](size_t i) { return i < in.size() && in[i] ? in[i]->data<float>() : nullptr; };
    const float* x = in[0]->data<float>();
    const float *be = data(kBe), *bd = data(kBd), *bp = data(kBp), *z = data(kZ);
    float* y = out[0].data<float>();
    const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
    const DirectProduct expand = expands ? direct_product(expand_, 1, c_in) : DirectProduct();
    const DirectProduct project = direct_product(project_, 1, e);
    const DepthwiseRow row_shape = depthwise_row_shape(g, depthwise_weights_.data(), bd, depthwise_act_);
    // The ring's rows: the input rows one output row's kernel covers (all of them where the kernel
    // is taller than the image), slot iy % ring_rows.
    const int64_t ring_rows = std::min((g.kh - 1) * g.dh + 1, g.h);
    const int in_tr = pixels_per_tile(g.w), out_tr = pixels_per_tile(g.ow);
    const int64_t in_tiles = (g.w + in_tr - 1) / in_tr, out_tiles = (g.ow + out_tr - 1) / out_tr;
    // Bands of output rows: about two per thread, at least 8 rows each (a band's first row
    // expands the kernel's span of rows; the rest one or two each).
    const int threads = thread_count();
    int64_t bands = std::clamp<int64_t>((2 * threads + g.batch - 1) / g.batch, 1, std::max<int64_t>(1, g.oh / 8));
    // One image's few bands are a whole number per thread, even where that makes them shorter
    // than 8 rows: 28 rows in 3 bands left one of two threads the last band alone (1.46 times
    // one thread's speed where 2 bands give about 1.9), 14 rows in 1 band left it idle.
    if (g.batch == 1 && threads > 1 && bands % threads != 0)
      bands = std::min<int64_t>(g.oh, std::max<int64_t>(threads, bands / threads * threads));
    parallel_for_each(g.batch * bands, threads > 1, [&](int64_t task) {
      const int64_t n = task / bands, band = task % bands;
      const int64_t oy0 = band * g.oh / bands, oy1 = (band + 1) * g.oh / bands;
      thread_local AlignedFloats ring_buffer, depthwise_buffer;
      thread_local std::vector<const float*> pointers, kernel_rows;
      thread_local std::vector<int64_t> held;  // the input row each ring slot holds, or -1
      float* ring = expands ? ring_buffer.reserve(ring_rows * g.w * e) : nullptr;
      float* depthwise_row = depthwise_buffer.reserve(g.ow * e);
      held.assign(static_cast<size_t>(ring_rows), -1);
      kernel_rows.assign(static_cast<size_t>(g.kh), nullptr);
      pointers.resize(static_cast<size_t>(std::max(in_tiles * in_tr, out_tiles * out_tr)));
      // Pixel pointers of a row of `count` pixels `stride` floats apart, padded to whole tiles.
      auto point_at = [&](const float* first, int64_t count, int64_t stride, int64_t padded) {
        for (int64_t i = 0; i < padded; ++i) pointers[static_cast<size_t>(i)] = i < count ? first + i * stride : zeros_.data();
      };
      const float* image = x + n * g.h * g.w * c_in;
      for (int64_t oy = oy0; oy < oy1; ++oy) {
        const int64_t iy0 = oy * g.sh - g.ph;
        DepthwiseRow r = row_shape;
        taps_inside(iy0, g.dh, g.kh, g.h, r.ky0, r.ky1);
        for (int64_t ky = r.ky0; ky < r.ky1; ++ky) {
          const int64_t iy = iy0 + ky * g.dh;
          if (!expands) {
            kernel_rows[static_cast<size_t>(ky)] = image + iy * g.w * c_in;
            continue;
          }
          const size_t slot = static_cast<size_t>(iy % ring_rows);
          float* expanded = ring + static_cast<int64_t>(slot) * g.w * e;
          if (held[slot] != iy) {
            point_at(image + iy * g.w * c_in, g.w, c_in, in_tiles * in_tr);
            multiply_tiles(expand, pointers.data(), in_tiles, in_tr, g.w, 0, (e + kPanelCols - 1) / kPanelCols, expanded,
                           nullptr, be, expand_act_, avx512);
            held[slot] = iy;
          }
          kernel_rows[static_cast<size_t>(ky)] = expanded;
        }
        r.rows = kernel_rows.data();
        r.y = depthwise_row;
        depthwise_output_row(r, avx512, depthwise_act_);
        const int64_t out_row = (n * g.oh + oy) * g.ow * m;
        point_at(depthwise_row, g.ow, e, out_tiles * out_tr);
        multiply_tiles(project, pointers.data(), out_tiles, out_tr, g.ow, 0, (m + kPanelCols - 1) / kPanelCols, y + out_row,
                       z ? z + out_row : nullptr, bp, project_act_, avx512);
      }
    }, 1);
  }

 private:
  const ir::Node& node_;
  Epilogue expand_act_, depthwise_act_, project_act_;
  PackedColumns expand_;           // We: C x E in 32-column panels (empty: no expansion)
  std::vector<int64_t> wd_shape_;  // [E, 1, kH, kW]
  AlignedVector<float> depthwise_weights_;  // [kH * kW, E]
  PackedColumns project_;          // Wp: E x M in 32-column panels
  std::vector<float> zeros_;       // the input of pixels past a row's last tile
};

std::string check_separable_conv(const KernelInit& init) {
  for (size_t i = 0; i < init.input_types.size(); ++i)
    if (init.has_input(i) && init.dtype(i) != DType::kFloat32)
      return "input type " + to_string(init.dtype(i)) + " is not supported (supported: float32)";
  for (size_t i : {SeparableConvKernel::kWe, SeparableConvKernel::kWd, SeparableConvKernel::kWp})
    if (init.has_input(i) && !(i < init.constants.size() && init.constants[i]))
      return "its weights (input " + std::to_string(i) + ") are not a constant";
  if (init.input_types[0]->rank() > 0 && init.input_types[0]->rank() != 4) return "X is not N x H x W x C";
  return "";
}

// Why a channels-first X cannot take this convolution's strides or dilations, or "": a tile's
// zero-padded copy of a segment is (pixels - 1) * stride + (kW - 1) * dilation + 1 floats.
std::string channels_first_steps_refused(const ir::Node& conv) {
  for (const char* attr : {"strides", "dilations"})
    for (int64_t v : conv.attrs.get_ints(attr))
      if (v > kChannelsFirstMaxStep)
        return std::string(attr) + " of " + std::to_string(v) + ": a channels-first input takes at most " +
               std::to_string(kChannelsFirstMaxStep);
  return "";
}

std::string check_channels_last_conv(const KernelInit& init) {
  if (init.dtype(0) != DType::kFloat32 || init.dtype(1) != DType::kFloat32)
    return "input type " + to_string(init.dtype(0)) + " is not supported (supported: float32)";
  const Tensor* w = init.constants.size() > 1 ? init.constants[1] : nullptr;
  if (!w) return "its weights W are not a constant";
  if (w->rank() != 4 || (init.input_types[0]->rank() > 0 && init.input_types[0]->rank() != 4))
    return "a channels-last convolution is 2-D: X [N, H, W, C] and W [M, C/group, kH, kW]";
  const int64_t group = init.node.attrs.get_int("group", 1);
  if (group != 1 && !is_depthwise(group, w->shape()))
    return "group " + std::to_string(group) + ": channels-last convolutions run one group or depthwise (one channel per group)";
  if (init.node.attrs.get_int("input_channels_first", 0) != 0) {
    if (group != 1) return "group " + std::to_string(group) + ": a channels-first input runs one group only";
    return channels_first_steps_refused(init.node);
  }
  return "";
}

}  // namespace

bool channels_last_conv_runs(const ir::Graph& graph, const ir::Node& conv) {
  if (sgemm_best_isa() != SgemmIsa::kAvx512) return false;
  if (conv.domain != (conv.op == "FusedConv" ? "kiln" : "") || (conv.op != "Conv" && conv.op != "FusedConv")) return false;
  if (conv.inputs.size() < 2) return false;
  const ir::Value* x = graph.find_value(conv.inputs[0]);
  const ir::Value* w = graph.find_value(conv.inputs[1]);
  if (!x || !w || !w->constant || x->type.dtype != DType::kFloat32 || w->constant->dtype() != DType::kFloat32) return false;
  if (!x->type.shape || x->type.shape->size() != 4 || w->constant->rank() != 4) return false;
  const int64_t group = conv.attrs.get_int("group", 1);
  return group == 1 || is_depthwise(group, w->constant->shape());
}

bool channels_last_conv_reads_channels_first(const ir::Graph& graph, const ir::Node& conv) {
  if (!channels_last_conv_runs(graph, conv) || conv.attrs.get_int("group", 1) != 1) return false;
  if (!channels_first_steps_refused(conv).empty()) return false;
  return graph.constant(conv.inputs[1])->dim(1) <= kChannelsFirstMaxChannels;
}

bool channels_last_elementwise_runs(const ir::Graph& graph, const ir::Node& node) {
  const ir::Value* y = node.outputs.size() == 1 ? graph.find_value(node.outputs[0]) : nullptr;
  return sgemm_best_isa() == SgemmIsa::kAvx512 && y && y->type.dtype == DType::kFloat32;
}

KILN_REGISTER_CPU_KERNELS(channels_last_conv) {
  KernelEntry e;
  e.op = "ChannelsLastConv";
  e.domain = "kiln";
  e.check = check_channels_last_conv;
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<ChannelsLastConvKernel>(init); };
  e.packed_inputs = {1};
  registry.add(std::move(e));
  KernelEntry separable;
  separable.op = "ChannelsLastSeparableConv";
  separable.domain = "kiln";
  separable.check = check_separable_conv;
  separable.dtypes = "float32";
  separable.create = [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<SeparableConvKernel>(init); };
  separable.packed_inputs = {1, 5};  // SeparableConvKernel::kWe, kWp
  registry.add(std::move(separable));
}

}  // namespace kiln::cpu
