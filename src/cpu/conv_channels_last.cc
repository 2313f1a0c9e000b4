// kiln::ChannelsLastConv on the CPU: 2-D float32 convolutions on [N, H, W, C] tensors, the
// input read in place.
//
// Channels-first, every convolution packs its input side again (im2col panels) from activations
// that have left the caches; channels-last, a pixel's C channels lie next to each other, so the
// input needs no packing:
// - One group: an "indirect" GEMM (as XNNPACK's). A tile of 8 output pixels by 32 output channels
//   takes, for each tap of the kernel, a pointer to each pixel's C input channels (a row of zeros
//   for taps in the padding) and broadcasts them one channel at a time against a row of the
//   weights, packed once into 32-column panels of K = kH * kW * C rows (tap-major). Bias, residual
//   and Relu/Clip in registers; other activations on the finished tile.
// - Depthwise (one input channel per group): each output pixel's channels 16 at a time, the taps'
//   weights a vector each ([kH * kW, C], packed once).
// Sums run tap by tap, channel by channel within a tap: another order than the channels-first
// kernel's (channel, then tap), so the two agree to rounding, not bit for bit. The plain loops
// below (CPUs without AVX-512, which the layout pass does not convert for, but whose engine files
// may be loaded there) sum in the same order as the vector kernels.
#include "cpu/conv_channels_last.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "cpu/gemm_util.h"
#include "cpu/kernel.h"
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

Geometry make_geometry(const ir::Node& node, const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  const ir::ConvGeometry g = ir::conv_geometry(node, 2, {w[2], w[3]}, {x[1], x[2]}, false);
  Geometry r;
  r.batch = x[0];
  r.h = x[1];
  r.w = x[2];
  r.c = x[3];
  r.m = w[0];
  r.oh = ir::conv_output_size(node, g, 0, x[1], false);
  r.ow = ir::conv_output_size(node, g, 1, x[2], false);
  r.kh = g.kernel[0];
  r.kw = g.kernel[1];
  r.sh = g.strides[0];
  r.sw = g.strides[1];
  r.dh = g.dilations[0];
  r.dw = g.dilations[1];
  r.ph = g.pad_begin[0];
  r.pw = g.pad_begin[1];
  r.group = g.group;
  return r;
}

bool is_depthwise(int64_t group, const std::vector<int64_t>& w) { return group > 1 && w[1] == 1 && w[0] == group; }

constexpr int kTileRows = 8;   // output pixels per tile
constexpr int kPanelCols = 32; // output channels per weight panel

// Where the tile's outputs go and what is added to them.
struct TileOutput {
  float* y = nullptr;        // the tile's first pixel, first channel of the panel
  int64_t ldy = 0;           // M
  const float* z = nullptr;  // the residual at the same place, or null
  const float* bias = nullptr;  // the panel's first channel's bias, or null
  int rows = 0, cols = 0;    // pixels and channels of the tile that exist
  int clamp = 0;             // Epilogue::clamp_mode
  float lo = 0.f, hi = 0.f;
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

// One 8-pixel x 32-channel tile: rows[t * 8 + i] is pixel i's input at tap t (c floats).
__attribute__((target("avx512f,fma"))) void dense_tile_avx512(const float* const* rows, int64_t taps, int64_t c,
                                                              const float* panel, const TileOutput& o) {
  const unsigned nr = static_cast<unsigned>(o.cols);
  const __mmask16 m0 = nr >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : static_cast<__mmask16>((1u << (nr - 16)) - 1);
  const __m512 bias0 = o.bias ? _mm512_maskz_loadu_ps(m0, o.bias) : _mm512_setzero_ps();
  const __m512 bias1 = o.bias ? _mm512_maskz_loadu_ps(m1, o.bias + 16) : _mm512_setzero_ps();
  __m512 c0[kTileRows], c1[kTileRows];
#pragma GCC unroll 8
  for (int i = 0; i < kTileRows; ++i) {
    c0[i] = bias0;
    c1[i] = bias1;
  }
  const float* w = panel;
  for (int64_t t = 0; t < taps; ++t) {
    const float* r[kTileRows];
#pragma GCC unroll 8
    for (int i = 0; i < kTileRows; ++i) r[i] = rows[t * kTileRows + i];
    for (int64_t k = 0; k < c; ++k, w += kPanelCols) {
      const __m512 b0 = _mm512_loadu_ps(w), b1 = _mm512_loadu_ps(w + 16);
#pragma GCC unroll 8
      for (int i = 0; i < kTileRows; ++i) {
        const __m512 a = _mm512_set1_ps(r[i][k]);
        c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
        c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kTileRows; ++i) {
    if (i >= o.rows) break;
    const float* z = o.z ? o.z + i * o.ldy : nullptr;
    finish_avx512(c0[i], m0, z, o.y + i * o.ldy, o.clamp, o.lo, o.hi);
    finish_avx512(c1[i], m1, z ? z + 16 : nullptr, o.y + i * o.ldy + 16, o.clamp, o.lo, o.hi);
  }
}


// Two tiles' 16 pixels by at most 16 channels (a layer's last panel where M is 16 past a
// multiple of 32, such as 144: the 8 x 32 kernel would compute 16 zero columns there).
// rows_a and rows_b are the two tiles' input pointers; o.rows counts the 16 pixels.
__attribute__((target("avx512f,fma"))) void dense_tile_pair_narrow_avx512(const float* const* rows_a,
                                                                          const float* const* rows_b, int64_t taps,
                                                                          int64_t c, const float* panel,
                                                                          const TileOutput& o) {
  const unsigned nr = static_cast<unsigned>(o.cols);
  const __mmask16 m0 = nr >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << nr) - 1);
  const __m512 bias0 = o.bias ? _mm512_maskz_loadu_ps(m0, o.bias) : _mm512_setzero_ps();
  __m512 acc[2 * kTileRows];
#pragma GCC unroll 16
  for (int i = 0; i < 2 * kTileRows; ++i) acc[i] = bias0;
  const float* w = panel;
  for (int64_t t = 0; t < taps; ++t) {
    const float* r[2 * kTileRows];
#pragma GCC unroll 8
    for (int i = 0; i < kTileRows; ++i) {
      r[i] = rows_a[t * kTileRows + i];
      r[kTileRows + i] = rows_b[t * kTileRows + i];
    }
    for (int64_t k = 0; k < c; ++k, w += kPanelCols) {
      const __m512 b0 = _mm512_loadu_ps(w);
#pragma GCC unroll 16
      for (int i = 0; i < 2 * kTileRows; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(r[i][k]), b0, acc[i]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < 2 * kTileRows; ++i) {
    if (i >= o.rows) break;
    finish_avx512(acc[i], m0, o.z ? o.z + i * o.ldy : nullptr, o.y + i * o.ldy, o.clamp, o.lo, o.hi);
  }
}


// The same sums in the same order, one float at a time.
void dense_tile_plain(const float* const* rows, int64_t taps, int64_t c, const float* panel, const TileOutput& o) {
  for (int i = 0; i < o.rows; ++i)
    for (int j = 0; j < o.cols; ++j) {
      float acc = o.bias ? o.bias[j] : 0.f;
      for (int64_t t = 0; t < taps; ++t) {
        const float* r = rows[t * kTileRows + i];
        const float* w = panel + t * c * kPanelCols + j;
        for (int64_t k = 0; k < c; ++k) acc = std::fma(r[k], w[k * kPanelCols], acc);
      }
      if (o.z) acc += o.z[i * o.ldy + j];
      if (o.clamp == 1) acc = acc > 0.f ? acc : 0.f;
      else if (o.clamp == 2) acc = std::min(std::max(acc, o.lo), o.hi);
      o.y[i * o.ldy + j] = acc;
    }
}

// One output row of a depthwise convolution: y[ox][ch] = clamp(bias[ch] + the sum over the taps
// inside the image of x[tap][ch] * w[tap][ch] + z[ox][ch]).
struct DepthwiseRow {
  const float* x = nullptr;     // the image's input at (row of tap ky = 0, column 0)
  const float* w = nullptr;     // [kh * kw, C]
  const float* bias = nullptr;  // [C] or null
  const float* z = nullptr;     // the residual's row, or null
  float* y = nullptr;           // [ow, C]
  int64_t c = 0, ow = 0, in_w = 0, kw = 0, sw = 1, dw = 1, pw = 0;
  int64_t ky0 = 0, ky1 = 0;     // the kernel rows inside the image
  int64_t row_step = 0;         // floats between kernel rows' input rows (dh * W * C)
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

// One output pixel's channels [c0, c0 + 16), the taps inside the image only (the row's edges).
__attribute__((target("avx512f,fma"))) inline void depthwise_pixel_avx512(const DepthwiseRow& r, __mmask16 m, int64_t ox,
                                                                          int64_t c0) {
  const int64_t C = r.c, ix0 = ox * r.sw - r.pw;
  int64_t kx0 = 0, kx1 = 0;
  taps_inside(ix0, r.dw, r.kw, r.in_w, kx0, kx1);
  __m512 acc = r.bias ? _mm512_maskz_loadu_ps(m, r.bias + c0) : _mm512_setzero_ps();
  for (int64_t ky = r.ky0; ky < r.ky1; ++ky)
    for (int64_t kx = kx0; kx < kx1; ++kx)
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, r.x + ky * r.row_step + (ix0 + kx * r.dw) * C + c0),
                            _mm512_maskz_loadu_ps(m, r.w + (ky * r.kw + kx) * C + c0), acc);
  depthwise_store_avx512(r, acc, m, ox, c0);
}

// 16 channels at a time; inside the image (every tap of the pixels in it) four pixels at a time:
// four independent sums (one sum's chain of FMAs would wait on each one's latency), each tap's
// weights loaded once for the four.
__attribute__((target("avx512f,fma"))) void depthwise_row_avx512(const DepthwiseRow& r) {
  const int64_t C = r.c, kw = r.kw, sw = r.sw, row_step = r.row_step, dw_step = r.dw * r.c;
  const int64_t ky0 = r.ky0, ky1 = r.ky1, ow = r.ow;
  const float* const w = r.w;
  const float* const x = r.x;
  const __m512 zero = _mm512_setzero_ps();
  // Output columns [in0, in1) read only taps inside the row.
  const int64_t in0 = std::min(ow, (r.pw + sw - 1) / sw);
  const int64_t last_in = r.in_w - 1 - (kw - 1) * r.dw + r.pw;  // the largest ox * sw allowed
  const int64_t in1 = std::max(in0, std::min(ow, last_in < 0 ? 0 : last_in / sw + 1));
  auto mask_at = [C](int64_t c0) {
    const int64_t n = std::min<int64_t>(16, C - c0);
    return n == 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
  };
  int64_t ox = 0;
  for (; ox < in0; ++ox)
    for (int64_t c0 = 0; c0 < C; c0 += 16) depthwise_pixel_avx512(r, mask_at(c0), ox, c0);
  // Pixels outer, channels inner: each pixel's C inputs are used whole while they are in L1.
  const int64_t step = sw * C;
  for (; ox + 4 <= in1; ox += 4) {
    const float* xp = x + (ox * sw - r.pw) * C;
    for (int64_t c0 = 0; c0 < C; c0 += 16) {
      const __mmask16 m = mask_at(c0);
      const __m512 b = r.bias ? _mm512_maskz_loadu_ps(m, r.bias + c0) : zero;
      __m512 a0 = b, a1 = b, a2 = b, a3 = b;
      for (int64_t ky = ky0; ky < ky1; ++ky) {
        const float* xr = xp + ky * row_step + c0;
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
  for (; ox < ow; ++ox)
    for (int64_t c0 = 0; c0 < C; c0 += 16) depthwise_pixel_avx512(r, mask_at(c0), ox, c0);
}

void depthwise_row_plain(const DepthwiseRow& r) {
  for (int64_t ox = 0; ox < r.ow; ++ox) {
    const int64_t ix0 = ox * r.sw - r.pw;
    int64_t kx0 = 0, kx1 = 0;
    taps_inside(ix0, r.dw, r.kw, r.in_w, kx0, kx1);
    for (int64_t ch = 0; ch < r.c; ++ch) {
      float acc = r.bias ? r.bias[ch] : 0.f;
      for (int64_t ky = r.ky0; ky < r.ky1; ++ky)
        for (int64_t kx = kx0; kx < kx1; ++kx)
          acc = std::fma(r.x[ky * r.row_step + (ix0 + kx * r.dw) * r.c + ch], r.w[(ky * r.kw + kx) * r.c + ch], acc);
      if (r.z) acc += r.z[ox * r.c + ch];
      if (r.clamp == 1) acc = acc > 0.f ? acc : 0.f;
      else if (r.clamp == 2) acc = std::min(std::max(acc, r.lo), r.hi);
      r.y[ox * r.c + ch] = acc;
    }
  }
}

class ChannelsLastConvKernel final : public Kernel {
 public:
  explicit ChannelsLastConvKernel(const KernelInit& init)
      : node_(init.node), epilogue_(ir::Activation::from_node(init.node)) {
    const Tensor& w = *init.constants[1];
    w_shape_ = w.shape();
    const int64_t m = w_shape_[0], cg = w_shape_[1], taps = w_shape_[2] * w_shape_[3];
    depthwise_ = is_depthwise(init.node.attrs.get_int("group", 1), w_shape_);
    const float* src = w.data<float>();
    if (depthwise_) {
      // [M, 1, kH, kW] -> [taps, M]: a tap's weights for consecutive channels side by side.
      weights_.resize(static_cast<size_t>(taps * m));
      for (int64_t ch = 0; ch < m; ++ch)
        for (int64_t t = 0; t < taps; ++t) weights_[static_cast<size_t>(t * m + ch)] = src[ch * taps + t];
      return;
    }
    // [M, C, kH, kW] -> K x M with K = (tap, c), then 32-column panels.
    const int64_t k = taps * cg;
    std::vector<float> kxm(static_cast<size_t>(k * m));
    for (int64_t o = 0; o < m; ++o)
      for (int64_t ci = 0; ci < cg; ++ci)
        for (int64_t t = 0; t < taps; ++t) kxm[static_cast<size_t>((t * cg + ci) * m + o)] = src[(o * cg + ci) * taps + t];
    packed_.pack(kxm.data(), k, m, m);
    zeros_.assign(static_cast<size_t>(std::max<int64_t>(w_shape_[3] * cg, 1)), 0.f);  // a kernel row's worth
  }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    if (out[0].numel() == 0) return;
    const Geometry g = make_geometry(node_, in[0]->shape(), w_shape_);
    const float* x = in[0]->data<float>();
    const float* bias = in.size() > 2 && in[2] ? in[2]->data<float>() : nullptr;
    const float* z = in.size() > 3 && in[3] ? in[3]->data<float>() : nullptr;
    float* y = out[0].data<float>();
    if (depthwise_) depthwise(g, x, bias, z, y);
    else dense(g, x, bias, z, y);
  }

 private:
  void dense(const Geometry& g, const float* x, const float* bias, const float* z, float* y) const {
    const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
    float lo = 0.f, hi = 0.f;
    int clamp = epilogue_.clamp_mode(lo, hi);
    const bool act_after = clamp < 0;
    if (act_after) clamp = 0;
    const int64_t pixels = g.batch * g.oh * g.ow, taps = g.taps();
    const int64_t tiles = (pixels + kTileRows - 1) / kTileRows, panels = (g.m + kPanelCols - 1) / kPanelCols;
    const int threads = thread_count();
    // Tasks: runs of up to 8 tiles (64 pixels, whose inputs stay in L2 while every panel of
    // weights meets them), by runs of panels where there are too few runs for the threads (a 7x7
    // layer at batch 1 has 7 tiles): each panel is read from memory once, then from L1.
    const int64_t tile_run = std::min<int64_t>(tiles, 8);
    const int64_t tile_tasks = (tiles + tile_run - 1) / tile_run;
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
    parallel_for_each(tasks, threads > 1 && pixels * g.m * taps * g.c >= (int64_t{1} << 17), [&](int64_t task) {
      const int64_t t0 = task / panel_tasks * tile_run, t1 = std::min(tiles, t0 + tile_run);
      const int64_t pt = task % panel_tasks;
      const int64_t q0 = pt * panels / panel_tasks, q1 = (pt + 1) * panels / panel_tasks;
      // Each tile's input pointers, segment-major: rows[(tile * segments + s) * 8 + i].
      thread_local std::vector<const float*> rows;
      thread_local AlignedFloats edge_copies;
      rows.resize(static_cast<size_t>((t1 - t0) * segments * kTileRows));
      // The pixels of the task's tiles in order: image, row and column, one step at a time (no
      // division per pixel). `visit(slot, image, oy, ox)` per pixel that exists.
      auto for_each_pixel = [&](auto&& visit) {
        const int64_t p0 = t0 * kTileRows;
        int64_t n = p0 / (g.oh * g.ow), oy = p0 / g.ow % g.oh, ox = p0 % g.ow;
        for (int64_t p = p0; p < t1 * kTileRows; ++p) {
          const float** slot = rows.data() + (p / kTileRows - t0) * segments * kTileRows + p % kTileRows;
          if (p >= pixels) {
            for (int64_t t = 0; t < segments; ++t) slot[t * kTileRows] = zero_row;
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
        // Kernel rows that pass the image's left or right edge: counted, then copied.
        int64_t partial = 0;
        for_each_pixel([&](const float**, const float*, int64_t, int64_t ox) {
          const int64_t ix0 = ox * g.sw - g.pw;
          if (ix0 < 0 || ix0 + g.kw > g.w) partial += g.kh;
        });
        float* copy = edge_copies.reserve(std::max<int64_t>(1, partial * segment));
        for_each_pixel([&](const float** slot, const float* image, int64_t oy, int64_t ox) {
          const int64_t ix0 = ox * g.sw - g.pw;
          const bool whole = ix0 >= 0 && ix0 + g.kw <= g.w;
          for (int64_t ky = 0; ky < g.kh; ++ky) {
            const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
            const bool row_inside = iy >= 0 && iy < g.h;
            if (whole) {
              slot[ky * kTileRows] = row_inside ? image + (iy * g.w + ix0) * g.c : zero_row;
              continue;
            }
            for (int64_t kx = 0; kx < g.kw; ++kx) {
              const int64_t ix = ix0 + kx;
              float* to = copy + kx * g.c;
              if (row_inside && ix >= 0 && ix < g.w) std::copy_n(image + (iy * g.w + ix) * g.c, g.c, to);
              else std::fill_n(to, g.c, 0.f);
            }
            slot[ky * kTileRows] = copy;
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
              slot[(ky * g.kw + kx) * kTileRows] = row_inside && ix >= 0 && ix < g.w ? image + (iy * g.w + ix) * g.c : zero_row;
            }
          }
        });
      }
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t c0 = q * kPanelCols;
        const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, g.m - c0));
        const int64_t per_call = avx512 && cols <= 16 ? 2 : 1;  // two tiles at once on a narrow panel
        for (int64_t tile = t0; tile < t1; tile += per_call) {
          const int64_t p0 = tile * kTileRows;
          const bool pair = per_call == 2 && tile + 1 < t1;
          TileOutput o;
          o.y = y + p0 * g.m + c0;
          o.ldy = g.m;
          o.z = z ? z + p0 * g.m + c0 : nullptr;
          o.bias = bias ? bias + c0 : nullptr;
          o.rows = static_cast<int>(std::min<int64_t>((pair ? 2 : 1) * kTileRows, pixels - p0));
          o.cols = cols;
          o.clamp = clamp;
          o.lo = lo;
          o.hi = hi;
          const float* const* tile_rows = rows.data() + (tile - t0) * segments * kTileRows;
          if (pair) dense_tile_pair_narrow_avx512(tile_rows, tile_rows + segments * kTileRows, segments, segment, packed_.panel(q), o);
          else if (avx512) dense_tile_avx512(tile_rows, segments, segment, packed_.panel(q), o);
          else dense_tile_plain(tile_rows, segments, segment, packed_.panel(q), o);
          if (act_after) epilogue_.apply(o.y, g.m, o.rows, o.cols, nullptr, nullptr, nullptr, 0);
        }
      }
    }, 1);
  }

  void depthwise(const Geometry& g, const float* x, const float* bias, const float* z, float* y) const {
    const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
    float lo = 0.f, hi = 0.f;
    int clamp = epilogue_.clamp_mode(lo, hi);
    const bool act_after = clamp < 0;
    if (act_after) clamp = 0;
    const int64_t out_rows = g.batch * g.oh;
    parallel_for_each(out_rows, out_rows > 1 && out_rows * g.ow * g.m * g.taps() >= (int64_t{1} << 15), [&](int64_t row) {
      const int64_t n = row / g.oh, oy = row % g.oh, iy0 = oy * g.sh - g.ph;
      DepthwiseRow r;
      r.x = x + (n * g.h + iy0) * g.w * g.c;  // pointer arithmetic only, as above
      r.w = weights_.data();
      r.bias = bias;
      r.z = z ? z + row * g.ow * g.m : nullptr;
      r.y = y + row * g.ow * g.m;
      r.c = g.c;
      r.ow = g.ow;
      r.in_w = g.w;
      r.kw = g.kw;
      r.sw = g.sw;
      r.dw = g.dw;
      r.pw = g.pw;
      r.row_step = g.dh * g.w * g.c;
      taps_inside(iy0, g.dh, g.kh, g.h, r.ky0, r.ky1);
      r.clamp = clamp;
      r.lo = lo;
      r.hi = hi;
      if (avx512) depthwise_row_avx512(r);
      else depthwise_row_plain(r);
      if (act_after) epilogue_.apply(r.y, g.m, g.ow, g.m, nullptr, nullptr, nullptr, 0);
    });
  }

  const ir::Node& node_;
  Epilogue epilogue_;
  std::vector<int64_t> w_shape_;
  bool depthwise_ = false;
  std::vector<float> weights_;  // depthwise: [taps, M]
  PackedColumns packed_;        // one group: K x M in 32-column panels
  std::vector<float> zeros_;    // one group: kW * C zeros, the input of taps in the padding
};

std::string check_channels_last_conv(const KernelInit& init) {
  if (init.dtype(0) != DType::kFloat32 || init.dtype(1) != DType::kFloat32)
    return "input type " + to_string(init.dtype(0)) + " is not supported (supported: float32)";
  const Tensor* w = init.constants.size() > 1 ? init.constants[1] : nullptr;
  if (!w) return "its weights W are not a constant";
  if (w->rank() != 4 || init.input_types[0]->rank() > 0 && init.input_types[0]->rank() != 4)
    return "a channels-last convolution is 2-D: X [N, H, W, C] and W [M, C/group, kH, kW]";
  const int64_t group = init.node.attrs.get_int("group", 1);
  if (group != 1 && !is_depthwise(group, w->shape()))
    return "group " + std::to_string(group) + ": channels-last convolutions run one group or depthwise (one channel per group)";
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

KILN_REGISTER_CPU_KERNELS(channels_last_conv) {
  KernelEntry e;
  e.op = "ChannelsLastConv";
  e.domain = "kiln";
  e.check = check_channels_last_conv;
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<ChannelsLastConvKernel>(init); };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
