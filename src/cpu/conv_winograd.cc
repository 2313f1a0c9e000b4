// Winograd F(2x2, 3x3) convolutions on AVX-512 (see conv_winograd.h).
//
// With d the 4x4 input block of a tile, g a 3x3 filter and m the 4x4 channel sums:
//   V = B^T d B,  U = G g G^T,  m = sum over channels of U .* V,  Y = A^T m A (2x2), where
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1].
// Position xi = 4 i + j of the 4x4 values is GEMM xi. V is laid out [16][C][tiles] and the sums
// [16][M][tiles], tiles row-major over the output (ty * TW + tx), so both transforms handle 16
// tiles of a tile row per vector.

#include "cpu/conv_winograd.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "cpu/parallel.h"

#ifndef KILN_CPU_WINOGRAD
#define KILN_CPU_WINOGRAD 1
#endif

namespace kiln::cpu {

namespace {

constexpr int64_t kValues = 16;  // 4x4 transformed values per tile

// The 16-tile mask of the tile-row chunk starting at tile tx0 of a row of tw tiles.
inline __mmask16 tile_mask(int64_t tx0, int64_t tw) {
  const int64_t n = std::min<int64_t>(16, tw - tx0);
  return static_cast<__mmask16>((1u << n) - 1u);
}

// V of tile rows [ty0, ty1) for one input channel: the rows of the channel's plane under them
// copied into `pad` with their zero padding (columns [0, 2 TWv + 2), TWv = TW rounded up to 16,
// so that every vector load stays inside), then the input transform of every tile. Writes
// v[xi * xi_stride + (ty - ty0) * TW + tx].
__attribute__((target("avx512f"))) void input_transform_rows(const float* xc, int64_t h, int64_t w, int64_t pt,
                                                            int64_t pl, int64_t ty0, int64_t ty1, int64_t tw,
                                                            int64_t xi_stride, float* v, AlignedFloats& pad_buffer) {
  const int64_t twv = (tw + 15) / 16 * 16, pw = 2 * twv + 2, ph = 2 * (ty1 - ty0) + 2;
  float* pad = pad_buffer.reserve(ph * pw);
  for (int64_t r = 0; r < ph; ++r) {
    float* row = pad + r * pw;
    const int64_t ih = 2 * ty0 + r - pt;
    if (ih < 0 || ih >= h) {
      std::fill(row, row + pw, 0.f);
      continue;
    }
    // The plane fits: pw >= OW + 2 = W + pads, and ph likewise.
    std::fill(row, row + pl, 0.f);
    std::memcpy(row + pl, xc + ih * w, static_cast<size_t>(w) * sizeof(float));
    std::fill(row + pl + w, row + pw, 0.f);
  }
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int64_t ty = 0; ty < ty1 - ty0; ++ty)
    for (int64_t tx0 = 0; tx0 < tw; tx0 += 16) {
      const __mmask16 mask = tile_mask(tx0, tw);
      __m512 u[4][4];  // B^T d: along the rows of each tile's block
      __m512 d[4][4];
      for (int i = 0; i < 4; ++i) {
        // Columns 2 tx + {0, 1, 2, 3} of 16 tiles: the even and odd floats of two spans of 32.
        const float* row = pad + (2 * ty + i) * pw + 2 * tx0;
        const __m512 a = _mm512_loadu_ps(row), b = _mm512_loadu_ps(row + 16);
        const __m512 c = _mm512_loadu_ps(row + 2), e = _mm512_loadu_ps(row + 18);
        d[i][0] = _mm512_permutex2var_ps(a, even, b);
        d[i][1] = _mm512_permutex2var_ps(a, odd, b);
        d[i][2] = _mm512_permutex2var_ps(c, even, e);
        d[i][3] = _mm512_permutex2var_ps(c, odd, e);
      }
      for (int j = 0; j < 4; ++j) {
        u[0][j] = _mm512_sub_ps(d[0][j], d[2][j]);
        u[1][j] = _mm512_add_ps(d[1][j], d[2][j]);
        u[2][j] = _mm512_sub_ps(d[2][j], d[1][j]);
        u[3][j] = _mm512_sub_ps(d[1][j], d[3][j]);
      }
      float* out = v + ty * tw + tx0;
      for (int i = 0; i < 4; ++i) {  // (B^T d) B: along the columns
        _mm512_mask_storeu_ps(out + (4 * i + 0) * xi_stride, mask, _mm512_sub_ps(u[i][0], u[i][2]));
        _mm512_mask_storeu_ps(out + (4 * i + 1) * xi_stride, mask, _mm512_add_ps(u[i][1], u[i][2]));
        _mm512_mask_storeu_ps(out + (4 * i + 2) * xi_stride, mask, _mm512_sub_ps(u[i][2], u[i][1]));
        _mm512_mask_storeu_ps(out + (4 * i + 3) * xi_stride, mask, _mm512_sub_ps(u[i][1], u[i][3]));
      }
    }
}

// The 2x2 outputs of tile rows [ty0, ty1) of one output channel from their 16 sums
// m[xi * xi_stride + (ty - ty0) * TW + tx], into the plane y [OH x OW] (tiles past its edge store
// only their part inside).
__attribute__((target("avx512f"))) void output_transform_rows(const float* m, int64_t xi_stride, int64_t ty0,
                                                             int64_t ty1, int64_t tw, int64_t oh, int64_t ow,
                                                             float* y) {
  // Interleave the 16 left and 16 right outputs of a tile row's chunk into 32 columns.
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int64_t ty = ty0; ty < ty1; ++ty)
    for (int64_t tx0 = 0; tx0 < tw; tx0 += 16) {
      const __mmask16 mask = tile_mask(tx0, tw);
      const float* in = m + (ty - ty0) * tw + tx0;
      __m512 r[2][4];  // A^T m: along the rows
      for (int j = 0; j < 4; ++j) {
        const __m512 m0 = _mm512_maskz_loadu_ps(mask, in + (0 + j) * xi_stride);
        const __m512 m1 = _mm512_maskz_loadu_ps(mask, in + (4 + j) * xi_stride);
        const __m512 m2 = _mm512_maskz_loadu_ps(mask, in + (8 + j) * xi_stride);
        const __m512 m3 = _mm512_maskz_loadu_ps(mask, in + (12 + j) * xi_stride);
        r[0][j] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
        r[1][j] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
      }
      const int64_t cols = ow - 2 * tx0;  // outputs of this chunk's row inside the plane
      const __mmask16 lo_mask = static_cast<__mmask16>((1u << std::min<int64_t>(16, cols)) - 1u);
      const __mmask16 hi_mask =
          cols > 16 ? static_cast<__mmask16>((1u << std::min<int64_t>(16, cols - 16)) - 1u) : __mmask16{0};
      for (int a = 0; a < 2; ++a) {
        const int64_t oy = 2 * ty + a;
        if (oy >= oh) break;
        const __m512 left = _mm512_add_ps(_mm512_add_ps(r[a][0], r[a][1]), r[a][2]);  // (A^T m) A
        const __m512 right = _mm512_sub_ps(_mm512_sub_ps(r[a][1], r[a][2]), r[a][3]);
        float* row = y + oy * ow + 2 * tx0;
        _mm512_mask_storeu_ps(row, lo_mask, _mm512_permutex2var_ps(left, first, right));
        if (hi_mask) _mm512_mask_storeu_ps(row + 16, hi_mask, _mm512_permutex2var_ps(left, second, right));
      }
    }
}


// Fewer tiles than this in a run (images times tiles) go to the direct GEMM. ResNet-50's 7x7
// 512-channel layers at batch 1 (16 tiles, a quarter past the edge) showed no clear gain from
// Winograd in alternating `kiln bench --exportProfile` runs on a 2-core VM (slower in some pairs,
// faster in others), where its 14x14 ones (49 tiles) took 0.83-0.95 ms against 1.46-2.09 ms
// (docs/design/cpu-gemm.md, "Winograd F(2x2, 3x3) for 3x3 convolutions").
constexpr int64_t kMinTiles = 32;

// Blocks of tile rows per thread hold about this many bytes of transforms and sums: half of a
// core's L2 on current x86 server cores (1 to 2 MiB), leaving the rest to U's panels.
constexpr int64_t kBlockBytes = int64_t{512} << 10;

// Phases over whole images take as many images at once as fit this many bytes of transforms and
// sums (within a shared L3).
constexpr int64_t kGroupBytes = int64_t{8} << 20;

std::atomic<int> forced_schedule{static_cast<int>(WinogradSchedule::kAuto)};

// The transforms and sums of one run, on the calling thread's buffer (the phases' threads share it).
AlignedFloats& run_buffer() {
  thread_local AlignedFloats buffer;
  return buffer;
}

}  // namespace

bool WinogradConv::applies(const ir::Node& node, const std::vector<int64_t>& w_shape, int64_t group) {
#if KILN_CPU_WINOGRAD
  auto all_ones = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [](int64_t e) { return e == 1; });
  };
  return available(w_shape, group) && all_ones(node.attrs.get_ints("strides")) && all_ones(node.attrs.get_ints("dilations"));
#else
  (void)node, (void)w_shape, (void)group;
  return false;
#endif
}

bool WinogradConv::available(const std::vector<int64_t>& w_shape, int64_t group) {
  // Below 16 channels either way the transforms cost more than the products they save.
  return w_shape.size() == 4 && w_shape[2] == 3 && w_shape[3] == 3 && group == 1 && w_shape[0] >= 16 &&
         w_shape[1] >= 16 && sgemm_isa() == SgemmIsa::kAvx512;
}

bool WinogradConv::runs_geometry(const Geo3& g) {
  return g.group == 1 && g.in[0] == 1 && g.out[0] == 1 && g.k[0] == 1 && g.k[1] == 3 && g.k[2] == 3 &&
         g.s[1] == 1 && g.s[2] == 1 && g.d[1] == 1 && g.d[2] == 1 && g.out[1] >= 1 && g.out[2] >= 1;
}

std::vector<float> winograd_filters(const float* w, int64_t out_channels, int64_t in_channels) {
  const int64_t mc = out_channels * in_channels;
  std::vector<float> u(static_cast<size_t>(kValues * mc));
  for (int64_t f = 0; f < mc; ++f) {
    const float* g = w + f * 9;
    float t[4][3];  // G g
    for (int j = 0; j < 3; ++j) {
      t[0][j] = g[j];
      t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
      t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
      t[3][j] = g[6 + j];
    }
    for (int i = 0; i < 4; ++i) {  // (G g) G^T
      u[static_cast<size_t>((4 * i + 0) * mc + f)] = t[i][0];
      u[static_cast<size_t>((4 * i + 1) * mc + f)] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
      u[static_cast<size_t>((4 * i + 2) * mc + f)] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
      u[static_cast<size_t>((4 * i + 3) * mc + f)] = t[i][2];
    }
  }
  return u;
}

bool WinogradConv::pays(const Geo3& g) {
  const int64_t tiles = (g.out[1] + 1) / 2 * ((g.out[2] + 1) / 2);
  return g.batch * tiles >= kMinTiles;
}

WinogradConv::WinogradConv(const float* w, int64_t out_channels, int64_t in_channels)
    : m_(out_channels), c_(in_channels), u_(static_cast<size_t>(kValues)) {
  const std::vector<float> u = winograd_filters(w, m_, c_);
  for (int64_t xi = 0; xi < kValues; ++xi) u_[static_cast<size_t>(xi)].pack(u.data() + xi * m_ * c_, m_, c_, c_);
}

void winograd_set_schedule(WinogradSchedule schedule) { forced_schedule.store(static_cast<int>(schedule)); }

void WinogradConv::run(const Geo3& g, const float* x, const float* bias, const float* residual, const Epilogue& act,
                       float* y) {
  const int64_t h = g.in[1], wd = g.in[2], oh = g.out[1], ow = g.out[2];
  const int64_t th = (oh + 1) / 2, tw = (ow + 1) / 2;
  const int64_t plane = oh * ow;
  // Blocks of tile rows whose transforms and sums take about kBlockBytes.
  const int64_t row_bytes = kValues * (c_ + m_) * tw * static_cast<int64_t>(sizeof(float));
  const int64_t block_rows = std::clamp<int64_t>(kBlockBytes / row_bytes, 1, th);
  const int64_t blocks = (th + block_rows - 1) / block_rows;
  const int threads = thread_count();
  auto schedule = static_cast<WinogradSchedule>(forced_schedule.load());
  const int64_t u_bytes = kValues * m_ * c_ * static_cast<int64_t>(sizeof(float));
  if (schedule == WinogradSchedule::kAuto)
    // Blocks per thread pay when the whole image's transforms would not stay in a core's cache,
    // there are blocks enough to share, and U, which every block reads again, stays in the
    // core's cache too; otherwise phases over the images read U once (sgemm_bench: ResNet-50's
    // 512-channel layer at batch 8, U 16 MiB, runs at half the speed in blocks).
    schedule = blocks > 1 && g.batch * blocks >= 4 * threads && u_bytes <= kBlockBytes
                   ? WinogradSchedule::kThreadBlocks
                   : WinogradSchedule::kImagePhases;
  // Phases take several images at once, up to kGroupBytes of transforms and sums: one GEMM over
  // all their tiles reads U once for them. An image larger than that (a segmentation model's
  // input) goes in parts of tile rows, so the buffers stay bounded whatever the image's size.
  const int64_t part_rows = std::clamp<int64_t>(kGroupBytes / row_bytes, 1, th);
  const int64_t images = part_rows < th ? 1 : std::clamp<int64_t>(kGroupBytes / (row_bytes * th), 1, g.batch);
  const int64_t narrow_cols =
      schedule == WinogradSchedule::kThreadBlocks ? block_rows * tw : part_rows * tw * images;
  if (narrow_cols <= kNarrowN && !u_[0].has_wide_panels()) {
    // Narrow products run transposed on 32-row panels of U, made the first time they are needed.
    for (int64_t xi = 0; xi < kValues; ++xi) u_[static_cast<size_t>(xi)].add_wide_panels();
  }
  // Tile rows [ty0, ty1) of images [b0, b1), on buffers v (transforms) and sums, as one GEMM
  // per xi over all their tiles; `parallel`: the three steps each split over the threads.
  auto part = [&](int64_t b0, int64_t b1, int64_t ty0, int64_t ty1, float* v, float* sums, bool parallel) {
    const int64_t image_tiles = (ty1 - ty0) * tw, nt = (b1 - b0) * image_tiles;
    parallel_for_each((b1 - b0) * c_, parallel, [&](int64_t i) {
      const int64_t b = b0 + i / c_, c = i % c_;
      thread_local AlignedFloats pad;
      input_transform_rows(x + (b * c_ + c) * h * wd, h, wd, g.p[1], g.p[2], ty0, ty1, tw, c_ * nt,
                           v + c * nt + (b - b0) * image_tiles, pad);
    });
    parallel_for_each(kValues, parallel, [&](int64_t xi) {
      SgemmB vb;
      vb.data = v + xi * c_ * nt;
      vb.ld = nt;
      packed_sgemm(u_[static_cast<size_t>(xi)], nt, vb, sums + xi * m_ * nt, nt, SgemmEpilogue{}, 1);
    }, 1);
    const int64_t r0 = 2 * ty0, r1 = std::min(oh, 2 * ty1), span = (r1 - r0) * ow;
    parallel_for_each((b1 - b0) * m_, parallel, [&](int64_t i) {
      const int64_t b = b0 + i / m_, m = i % m_;
      float* ym = y + (b * m_ + m) * plane;
      output_transform_rows(sums + m * nt + (b - b0) * image_tiles, m_ * nt, ty0, ty1, tw, oh, ow, ym);
      // Rows [r0, r1) of the plane are contiguous: one row of `span` for the epilogue.
      act.apply(ym + r0 * ow, span, 1, span, bias ? bias + m : nullptr, nullptr,
                residual ? residual + (b * m_ + m) * plane + r0 * ow : nullptr, span);
    });
  };
  if (schedule == WinogradSchedule::kThreadBlocks) {
    parallel_for_each(g.batch * blocks, true, [&](int64_t job) {
      const int64_t b = job / blocks, ty0 = job % blocks * block_rows, ty1 = std::min(th, ty0 + block_rows);
      thread_local AlignedFloats block;
      float* v = block.reserve(kValues * (c_ + m_) * (ty1 - ty0) * tw);
      part(b, b + 1, ty0, ty1, v, v + kValues * c_ * (ty1 - ty0) * tw, false);
    }, 1);
    return;
  }
  // Parts of tile rows of one image past kGroupBytes, else groups of whole images.
  float* v = run_buffer().reserve(kValues * (c_ + m_) * part_rows * tw * images);
  for (int64_t b0 = 0; b0 < g.batch; b0 += images)
    for (int64_t ty0 = 0; ty0 < th; ty0 += part_rows) {
      const int64_t b1 = std::min(g.batch, b0 + images), ty1 = std::min(th, ty0 + part_rows);
      part(b0, b1, ty0, ty1, v, v + kValues * c_ * (ty1 - ty0) * tw * (b1 - b0), true);
    }
}

}  // namespace kiln::cpu
