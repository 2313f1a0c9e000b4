#include "cpu/sgemm.h"

// GCC 12's own AVX-512 intrinsics (_mm512_max_ps and friends start from an "undefined" vector)
// trip -Wmaybe-uninitialized when inlined here; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "cpu/parallel.h"

namespace kiln::cpu {

namespace {

// One micro-tile: C[mr x nr] (+)= A panel [kc x MR] @ B panel [kc x NR], where mr <= MR and
// nr <= NR are the rows and columns that exist in C (the panels are zero-padded past them).
struct Tile {
  int64_t kc = 0;
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  int64_t ldc = 0;
  int mr = 0, nr = 0;
  bool first = false;           // start from bias (or 0), not from C: the first K block
  const float* bias = nullptr;  // the tile's rows' bias, or null
  const float* col_bias = nullptr;  // the tile's columns' bias, or null (tile_avx512 only)
  bool last = false;            // the last K block: add the residual and clamp
  const float* z = nullptr;     // the tile's residual, or null
  int64_t ldz = 0;
  int clamp = 0;  // 0 none, 1 Relu, 2 Clip to [lo, hi] (Epilogue::clamp_mode)
  float lo = 0.f, hi = 0.f;
  const char* prefetch = nullptr;  // tile_avx512: lines to bring into L2 while it runs (at most 2 kc)
  int64_t prefetch_lines = 0;
  // One line every kc / prefetch_lines steps instead of one a step from the first: for lines
  // needed only after several more tiles (rows_sgemm's next panel), which then arrive without
  // filling the core's queue of misses at once.
  bool prefetch_spread = false;
};

using TileFn = void (*)(const Tile&);

// Relu and Clip with the NaN behaviour of Epilogue::apply: Relu maps NaN to 0, Clip keeps it.
inline float clamp_scalar(float v, int mode, float lo, float hi) {
  if (mode == 1) return v > 0.f ? v : 0.f;
  if (mode == 2) return std::min(std::max(v, lo), hi);
  return v;
}

// The portable kernel (and the reference the vector ones are tested against).
template <int MR, int NR>
void tile_plain(const Tile& t) {
  float acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      if (t.first) acc[i][j] = t.bias && i < t.mr ? t.bias[i] : 0.f;
      else acc[i][j] = i < t.mr && j < t.nr ? t.c[i * t.ldc + j] : 0.f;
    }
  const float* a = t.a;
  const float* b = t.b;
  for (int64_t k = 0; k < t.kc; ++k, a += MR, b += NR)
    for (int i = 0; i < MR; ++i) {
      const float ai = a[i];
      for (int j = 0; j < NR; ++j) acc[i][j] += ai * b[j];
    }
  for (int i = 0; i < t.mr; ++i)
    for (int j = 0; j < t.nr; ++j) {
      float v = acc[i][j];
      if (t.last) {
        if (t.z) v += t.z[i * t.ldz + j];
        v = clamp_scalar(v, t.clamp, t.lo, t.hi);
      }
      t.c[i * t.ldc + j] = v;
    }
}

// 6 x 16: twelve ymm accumulators, two B loads and six broadcasts per k. Tiles of the full
// 16 columns load and store C (and the residual) unmasked: AMD's Zen cores run a masked store
// (vmaskmovps) as a microcoded sequence of about a dozen cycles, which in products of small K
// (MobileNet's 1x1 convolutions of 16 input channels) cost more than the FMAs.
__attribute__((target("avx2,fma"))) void tile_avx2(const Tile& t) {
  constexpr int MR = 6;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(t.nr), lane);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(t.nr - 8), lane);
  const bool full = t.nr >= 16;
  const auto load = [&](const float* p, __m256i mask) {
    return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
  };
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    if (t.first) {
      c0[i] = c1[i] = _mm256_set1_ps(t.bias && i < t.mr ? t.bias[i] : 0.f);
    } else if (i < t.mr) {
      c0[i] = load(t.c + i * t.ldc, m0);
      c1[i] = load(t.c + i * t.ldc + 8, m1);
    } else {
      c0[i] = c1[i] = _mm256_setzero_ps();
    }
  }
  const float* a = t.a;
  const float* b = t.b;
  for (int64_t k = 0; k < t.kc; ++k, a += MR, b += 16) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      c0[i] = _mm256_fmadd_ps(ai, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(ai, b1, c1[i]);
    }
  }
  const __m256 zero = _mm256_setzero_ps(), lo = _mm256_set1_ps(t.lo), hi = _mm256_set1_ps(t.hi);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    if (i >= t.mr) break;
    __m256 v0 = c0[i], v1 = c1[i];
    if (t.last) {
      if (t.z) {
        v0 = _mm256_add_ps(v0, load(t.z + i * t.ldz, m0));
        v1 = _mm256_add_ps(v1, load(t.z + i * t.ldz + 8, m1));
      }
      if (t.clamp == 1) {  // max(v, 0) returns 0 for NaN, like Epilogue's Relu
        v0 = _mm256_max_ps(v0, zero);
        v1 = _mm256_max_ps(v1, zero);
      } else if (t.clamp == 2) {  // (bound, v) order keeps NaN, like std::min/std::max
        v0 = _mm256_min_ps(hi, _mm256_max_ps(lo, v0));
        v1 = _mm256_min_ps(hi, _mm256_max_ps(lo, v1));
      }
    }
    if (full) {
      _mm256_storeu_ps(t.c + i * t.ldc, v0);
      _mm256_storeu_ps(t.c + i * t.ldc + 8, v1);
    } else {
      _mm256_maskstore_ps(t.c + i * t.ldc, m0, v0);
      _mm256_maskstore_ps(t.c + i * t.ldc + 8, m1, v1);
    }
  }
}

// MR x 32: 2*MR zmm accumulators, two B loads and MR broadcasts per k. Column edges use
// AVX-512 masks, so edge tiles need no staging. MR = 8 is the main kernel; MR = 7 serves the
// transposed product of narrow outputs (see packed_sgemm).
template <int MR>
__attribute__((target("avx512f,fma"))) void tile_avx512(const Tile& t) {
  const unsigned nr = static_cast<unsigned>(t.nr);
  const __mmask16 m0 = nr >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : static_cast<__mmask16>((1u << (nr - 16)) - 1);
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (t.first && t.col_bias) {
      c0[i] = _mm512_maskz_loadu_ps(m0, t.col_bias);
      c1[i] = _mm512_maskz_loadu_ps(m1, t.col_bias + 16);
    } else if (t.first) {
      c0[i] = c1[i] = _mm512_set1_ps(t.bias && i < t.mr ? t.bias[i] : 0.f);
    } else if (i < t.mr) {
      c0[i] = _mm512_maskz_loadu_ps(m0, t.c + i * t.ldc);
      c1[i] = _mm512_maskz_loadu_ps(m1, t.c + i * t.ldc + 16);
    } else {
      c0[i] = c1[i] = _mm512_setzero_ps();
    }
  }
  const float* a = t.a;
  const float* b = t.b;
  const int64_t spread = t.prefetch_spread && t.prefetch_lines > 0 && t.prefetch_lines < t.kc ? t.kc / t.prefetch_lines : 1;
  int64_t next_prefetch = 0, line = 0;
  for (int64_t k = 0; k < t.kc; ++k, a += MR, b += 32) {
    if (spread > 1) {
      if (k == next_prefetch && line < t.prefetch_lines) {
        _mm_prefetch(t.prefetch + line * 64, _MM_HINT_T1);
        ++line;
        next_prefetch += spread;
      }
    } else {
      if (k < t.prefetch_lines) _mm_prefetch(t.prefetch + k * 64, _MM_HINT_T1);
      if (k + t.kc < t.prefetch_lines) _mm_prefetch(t.prefetch + (k + t.kc) * 64, _MM_HINT_T1);  // up to 2 a k
    }
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i]);
      c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
    }
  }
  const __m512 zero = _mm512_setzero_ps(), lo = _mm512_set1_ps(t.lo), hi = _mm512_set1_ps(t.hi);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (i >= t.mr) break;
    __m512 v0 = c0[i], v1 = c1[i];
    if (t.last) {
      if (t.z) {
        v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, t.z + i * t.ldz));
        v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, t.z + i * t.ldz + 16));
      }
      if (t.clamp == 1) {
        v0 = _mm512_max_ps(v0, zero);
        v1 = _mm512_max_ps(v1, zero);
      } else if (t.clamp == 2) {
        v0 = _mm512_min_ps(hi, _mm512_max_ps(lo, v0));
        v1 = _mm512_min_ps(hi, _mm512_max_ps(lo, v1));
      }
    }
    _mm512_mask_storeu_ps(t.c + i * t.ldc, m0, v0);
    _mm512_mask_storeu_ps(t.c + i * t.ldc + 16, m1, v1);
  }
}

struct MicroKernel {
  int mr, nr;
  TileFn fn;
};

MicroKernel micro_kernel(SgemmIsa isa) {
  switch (isa) {
    case SgemmIsa::kAvx512: return {8, 32, tile_avx512<8>};
    case SgemmIsa::kAvx2: return {6, 16, tile_avx2};
    case SgemmIsa::kPlain: break;
  }
  return {4, 16, tile_plain<4, 16>};
}

std::atomic<int> forced_isa{-1};
std::atomic<int> narrow_policy{0};  // NarrowPolicy

// One run of im2col columns that read one input row: out[e] = src[e * sw] for e in [lo, hi)
// (the taps inside the row), 0 for the rest of [0, seg).
struct CopyTapsScalar {
  static inline void run(float* out, const float* src, int64_t sw, int64_t lo, int64_t hi, int64_t seg) {
    for (int64_t e = 0; e < lo; ++e) out[e] = 0.f;
    if (sw == 1) {
      for (int64_t e = lo; e < hi; ++e) out[e] = src[e];
    } else if (sw == 2) {
      for (int64_t e = lo; e < hi; ++e) out[e] = src[2 * e];
    } else {
      for (int64_t e = lo; e < hi; ++e) out[e] = src[e * sw];
    }
    for (int64_t e = hi; e < seg; ++e) out[e] = 0.f;
  }
};

// The same with AVX-512 masks for strides 1 and 2: a masked load of the taps (masked-off lanes
// read nothing, so src may point before the row) and a masked store of the run, 16 at a time.
// Stride 2 loads the 32 floats under 16 taps and keeps the even ones with one permute, where
// the scalar loop copied one float at a time (ResNet's 7x7 stem, its stride-2 3x3s and the 1x1
// downsamples that halve the image pack this way).
struct CopyTapsAvx512 {
  __attribute__((target("avx512f,bmi2"))) static inline void run(float* out, const float* src, int64_t sw,
                                                                 int64_t lo, int64_t hi, int64_t seg) {
    if (sw == 2) {
      const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      for (int64_t e0 = 0; e0 < seg; e0 += 16) {
        const int64_t n = std::min<int64_t>(16, seg - e0);
        const int64_t vlo = std::clamp<int64_t>(lo - e0, 0, 16), vhi = std::clamp<int64_t>(hi - e0, vlo, 16);
        const __mmask16 store = static_cast<__mmask16>((1u << n) - 1);
        // Tap e reads lane 2e of the 32 floats from src + 2 * e0.
        const uint32_t taps = ((1u << vhi) - 1) & ~((1u << vlo) - 1);
        const uint32_t lanes = _pdep_u32(taps, 0x55555555u);
        const __m512 a = _mm512_maskz_loadu_ps(static_cast<__mmask16>(lanes), src + 2 * e0);
        const __m512 b = _mm512_maskz_loadu_ps(static_cast<__mmask16>(lanes >> 16), src + 2 * e0 + 16);
        _mm512_mask_storeu_ps(out + e0, store, _mm512_permutex2var_ps(a, even, b));
      }
      return;
    }
    if (sw != 1) {
      CopyTapsScalar::run(out, src, sw, lo, hi, seg);
      return;
    }
    for (int64_t e0 = 0; e0 < seg; e0 += 16) {
      const int64_t n = std::min<int64_t>(16, seg - e0);
      const int64_t vlo = std::clamp<int64_t>(lo - e0, 0, 16), vhi = std::clamp<int64_t>(hi - e0, vlo, 16);
      const __mmask16 store = static_cast<__mmask16>((1u << n) - 1);
      const __mmask16 load = static_cast<__mmask16>(((1u << vhi) - 1) & ~((1u << vlo) - 1));
      const __m512 v = _mm512_maskz_loadu_ps(load, src + e0);
      _mm512_mask_storeu_ps(out + e0, store, v);
    }
  }
};

// Packs rows [k0, k1) and columns [n0, n1) of an im2col B (see pack_b).
template <class CopyTaps>
__attribute__((always_inline)) inline void pack_im2col(const Im2col& g, int nr, int64_t k0, int64_t k1, int64_t n0,
                                                       int64_t n1, float* dst, int64_t panel_stride) {
  const int64_t width = n1 - n0, full = width / nr, tail = width % nr;
  const int64_t OH = g.out[1], OW = g.out[2];
  const int64_t D = g.in[0], H = g.in[1], W = g.in[2];
  const int64_t kk = g.k[0] * g.k[1] * g.k[2], sw = g.s[2];
  // The runs of columns that share an output row and a panel (so read one input row with
  // consecutive taps) are the same for every row of B: list them once.
  struct Run {
    int64_t dst, len, id, ih, iw;  // offset in a row of panels; input position of tap (0, 0, 0)
  };
  thread_local std::vector<Run> runs;
  runs.clear();
  {
    int64_t od = n0 / (OH * OW), oh = (n0 / OW) % OH, ow = n0 % OW;
    int64_t j = 0, q = 0, jj = 0;  // column within [n0, n1); its panel and place in it
    while (j < width) {
      const int64_t len = std::min({width - j, OW - ow, nr - jj});
      runs.push_back({q * panel_stride + jj, len, od * g.s[0], oh * g.s[1], ow * sw});
      j += len;
      jj += len;
      if (jj == nr) {
        jj = 0;
        ++q;
      }
      ow += len;
      if (ow == OW) {
        ow = 0;
        if (++oh == OH) {
          oh = 0;
          ++od;
        }
      }
    }
  }
  // (c, kd, kh, kw) of row k0, stepped along with r (no divisions per row).
  int64_t c = k0 / kk, kd = (k0 % kk) / (g.k[1] * g.k[2]), kh = (k0 / g.k[2]) % g.k[1], kw = k0 % g.k[2];
  for (int64_t r = k0; r < k1; ++r) {
    const float* xc = g.x + c * D * H * W;
    float* drow = dst + (r - k0) * nr;
    const int64_t off_d = kd * g.d[0] - g.p[0], off_h = kh * g.d[1] - g.p[1], off_w = kw * g.d[2] - g.p[2];
    for (const Run& run : runs) {
      float* out = drow + run.dst;
      const int64_t seg = run.len, id = run.id + off_d, ih = run.ih + off_h;
      if (id < 0 || id >= D || ih < 0 || ih >= H) {
        for (int64_t e = 0; e < seg; ++e) out[e] = 0.f;
        continue;
      }
      const int64_t iw0 = run.iw + off_w;
      // Taps e in [lo, hi) fall inside the row.
      int64_t lo, hi;
      if (sw == 1) {
        lo = std::clamp<int64_t>(-iw0, 0, seg);
        hi = std::clamp<int64_t>(W - iw0, lo, seg);
      } else {
        lo = std::min<int64_t>(seg, iw0 >= 0 ? 0 : (-iw0 + sw - 1) / sw);
        hi = std::clamp<int64_t>(W - 1 - iw0 < 0 ? 0 : (W - 1 - iw0) / sw + 1, lo, seg);
      }
      CopyTaps::run(out, xc + (id * H + ih) * W + iw0, sw, lo, hi, seg);
    }
    if (tail) std::memset(drow + full * panel_stride + tail, 0, static_cast<size_t>(nr - tail) * sizeof(float));
    if (++kw == g.k[2]) {
      kw = 0;
      if (++kh == g.k[1]) {
        kh = 0;
        if (++kd == g.k[0]) {
          kd = 0;
          ++c;
        }
      }
    }
  }
}

void pack_im2col_scalar(const Im2col& g, int nr, int64_t k0, int64_t k1, int64_t n0, int64_t n1, float* dst,
                        int64_t panel_stride) {
  pack_im2col<CopyTapsScalar>(g, nr, k0, k1, n0, n1, dst, panel_stride);
}

__attribute__((target("avx512f,bmi2"))) void pack_im2col_avx512(const Im2col& g, int nr, int64_t k0, int64_t k1,
                                                          int64_t n0, int64_t n1, float* dst, int64_t panel_stride) {
  pack_im2col<CopyTapsAvx512>(g, nr, k0, k1, n0, n1, dst, panel_stride);
}

// Column p's place in a row of 7-column panels, and its output row and column, for the
// flat im2col packer below.
struct FlatIm2colTables {
  std::vector<int32_t> dst, oh, ow;
};

// Is the im2col B of a conv a shifted copy of each input plane? With stride 1 in a 2-D conv
// whose output rows are as wide as its input rows, column p = oh * W + ow of row (c, kh, kw)
// reads x[c][p + off_h * W + off_w] wherever that tap is inside the image.
bool flat_im2col_applies(const Im2col& g, int64_t n, int64_t panel_stride) {
  return g.in[0] == 1 && g.out[0] == 1 && g.k[0] == 1 && g.s[1] == 1 && g.s[2] == 1 && g.out[2] == g.in[2] &&
         (n / 7 + 1) * panel_stride < (int64_t{1} << 30);
}

// Packs rows [k0, k1) of such a B, all n columns, into 7-column panels (the narrow path's
// layout): 16 columns at a time, a masked load of the taps inside the image and a scatter into
// the panels.
__attribute__((target("avx512f"))) void pack_im2col_flat7(const Im2col& g, const FlatIm2colTables& t, int64_t k0,
                                                         int64_t k1, int64_t n, float* dst, int64_t panel_stride) {
  const int64_t H = g.in[1], W = g.in[2], OH = g.out[1], OW = g.out[2];
  const int64_t kk = g.k[1] * g.k[2];
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t r = k0; r < k1; ++r) {
    const int64_t c = r / kk, kh = (r % kk) / g.k[2], kw = r % g.k[2];
    const int64_t off_h = kh * g.d[1] - g.p[1], off_w = kw * g.d[2] - g.p[2];
    // Output rows and columns whose tap is inside the image.
    const __m512i oh_lo = _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(-off_h, 0, OH)));
    const __m512i oh_hi = _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(H - off_h, 0, OH)));
    const __m512i ow_lo = _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(-off_w, 0, OW)));
    const __m512i ow_hi = _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(W - off_w, 0, OW)));
    const float* xs = g.x + c * H * W + off_h * W + off_w;  // column p reads xs[p]
    float* drow = dst + (r - k0) * 7;
    for (int64_t p0 = 0; p0 < n; p0 += 16) {
      const __mmask16 in_n = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(static_cast<int>(n - p0)));
      const __m512i oh = _mm512_maskz_loadu_epi32(in_n, t.oh.data() + p0);
      const __m512i ow = _mm512_maskz_loadu_epi32(in_n, t.ow.data() + p0);
      __mmask16 inside = _mm512_mask_cmpge_epi32_mask(in_n, oh, oh_lo);
      inside = _mm512_mask_cmplt_epi32_mask(inside, oh, oh_hi);
      inside = _mm512_mask_cmpge_epi32_mask(inside, ow, ow_lo);
      inside = _mm512_mask_cmplt_epi32_mask(inside, ow, ow_hi);
      const __m512 v = _mm512_maskz_loadu_ps(inside, xs + p0);
      _mm512_mask_i32scatter_ps(drow, in_n, _mm512_maskz_loadu_epi32(in_n, t.dst.data() + p0), v, 4);
    }
    if (n % 7) std::memset(drow + (n / 7) * panel_stride + n % 7, 0, static_cast<size_t>(7 - n % 7) * sizeof(float));
  }
}

// The same for the 32-column panels of the main path, columns [n0, n1) with n0 on a panel
// boundary: 16 columns never straddle a panel, so the store is a plain masked store.
__attribute__((target("avx512f"))) void pack_im2col_flat32(const Im2col& g, int64_t k0, int64_t k1, int64_t n0,
                                                          int64_t n1, float* dst, int64_t panel_stride) {
  const int64_t H = g.in[1], W = g.in[2], OH = g.out[1], OW = g.out[2];
  const int64_t kk = g.k[1] * g.k[2], width = n1 - n0;
  thread_local std::vector<int32_t> oh_of, ow_of;
  oh_of.resize(static_cast<size_t>(width));
  ow_of.resize(static_cast<size_t>(width));
  for (int64_t j = 0; j < width; ++j) {
    oh_of[static_cast<size_t>(j)] = static_cast<int32_t>((n0 + j) / OW);
    ow_of[static_cast<size_t>(j)] = static_cast<int32_t>((n0 + j) % OW);
  }
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t r = k0; r < k1; ++r) {
    const int64_t c = r / kk, kh = (r % kk) / g.k[2], kw = r % g.k[2];
    const int64_t off_h = kh * g.d[1] - g.p[1], off_w = kw * g.d[2] - g.p[2];
    const __m512i oh_lo = _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(-off_h, 0, OH)));
    const __m512i oh_hi = _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(H - off_h, 0, OH)));
    const __m512i ow_lo = _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(-off_w, 0, OW)));
    const __m512i ow_hi = _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(W - off_w, 0, OW)));
    const float* xs = g.x + c * H * W + off_h * W + off_w + n0;  // column n0 + j reads xs[j]
    float* drow = dst + (r - k0) * 32;
    for (int64_t j = 0; j < width; j += 16) {
      const __mmask16 in_n = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(static_cast<int>(width - j)));
      const __m512i oh = _mm512_maskz_loadu_epi32(in_n, oh_of.data() + j);
      const __m512i ow = _mm512_maskz_loadu_epi32(in_n, ow_of.data() + j);
      __mmask16 inside = _mm512_mask_cmpge_epi32_mask(in_n, oh, oh_lo);
      inside = _mm512_mask_cmplt_epi32_mask(inside, oh, oh_hi);
      inside = _mm512_mask_cmpge_epi32_mask(inside, ow, ow_lo);
      inside = _mm512_mask_cmplt_epi32_mask(inside, ow, ow_hi);
      // Past n1 in the last panel: zeros (the masked load gives 0 there).
      _mm512_storeu_ps(drow + (j / 32) * panel_stride + j % 32, _mm512_maskz_loadu_ps(inside, xs + j));
    }
    if (width % 32 && width % 32 <= 16)  // the last panel's upper half got no store above
      std::memset(drow + (width / 32) * panel_stride + 16, 0, 16 * sizeof(float));
  }
}

// Row-major B: whole panels are fixed-size copies the compiler turns into vector moves.
template <int NR>
void pack_rows_fixed(const float* data, int64_t ld, int64_t k0, int64_t k1, int64_t n0, int64_t full, float* dst,
                     int64_t panel_stride) {
  for (int64_t r = k0; r < k1; ++r) {
    const float* src = data + r * ld + n0;
    float* d = dst + (r - k0) * NR;
    for (int64_t q = 0; q < full; ++q, src += NR, d += panel_stride) std::memcpy(d, src, NR * sizeof(float));
  }
}

// Packs rows [k0, k1) and columns [n0, n1) of B into NR-column panels: row r of panel q goes
// to dst + q * panel_stride + (r - k0) * nr. Columns past n1 in the last panel are zeroed.
// `avx512`: the CPU has AVX-512 (for the im2col copies).
void pack_b(const SgemmB& b, int nr, bool avx512, int64_t k0, int64_t k1, int64_t n0, int64_t n1, float* dst,
            int64_t panel_stride) {
  const int64_t width = n1 - n0, full = width / nr, tail = width % nr;
  if (b.conv) {
    if (avx512 && nr == 32 && n0 % 32 == 0 && flat_im2col_applies(*b.conv, n1, panel_stride))
      pack_im2col_flat32(*b.conv, k0, k1, n0, n1, dst, panel_stride);
    else if (avx512) pack_im2col_avx512(*b.conv, nr, k0, k1, n0, n1, dst, panel_stride);
    else pack_im2col_scalar(*b.conv, nr, k0, k1, n0, n1, dst, panel_stride);
    return;
  }
  if (nr == 32) {
    pack_rows_fixed<32>(b.data, b.ld, k0, k1, n0, full, dst, panel_stride);
  } else if (nr == 16) {
    pack_rows_fixed<16>(b.data, b.ld, k0, k1, n0, full, dst, panel_stride);
  } else {
    for (int64_t r = k0; r < k1; ++r)
      for (int64_t q = 0; q < full; ++q)
        std::memcpy(dst + q * panel_stride + (r - k0) * nr, b.data + r * b.ld + n0 + q * nr,
                    static_cast<size_t>(nr) * sizeof(float));
  }
  if (tail)
    for (int64_t r = k0; r < k1; ++r) {
      float* d = dst + full * panel_stride + (r - k0) * nr;
      std::memcpy(d, b.data + r * b.ld + n0 + full * nr, static_cast<size_t>(tail) * sizeof(float));
      std::memset(d + tail, 0, static_cast<size_t>(nr - tail) * sizeof(float));
    }
}

// Everything one product needs, shared by its threads.
struct Problem {
  const PackedA& a;
  MicroKernel mk;
  int64_t n;
  float* c;
  int64_t ldc;
  const SgemmEpilogue& ep;
  int clamp;
  float lo, hi;
  bool act_after;  // an activation the micro-kernel does not apply
};

// K blocks up to this depth run row tile by row tile, each sweeping its columns, rather than
// column panel by panel: a short K leaves the tiles' stores to C (and epilogue loads of the
// residual) waiting on memory, and the panel order spreads them over every row of C at once,
// more streams than the hardware prefetchers follow, while the row order writes mr rows
// front to back. sgemm_bench --only on one thread, cold: M 96 N 12544 K 16 0.89-2.28 ->
// 0.68-0.69 ms, M 256 N 3136 K 64 + residual 3.10-3.37 -> 1.23-1.67 ms; at K 288 the panel
// order, which keeps each B panel in L1, is ahead (docs/design/cpu-gemm.md, "Short K: row tiles
// sweep the columns").
constexpr int64_t kRowsOuterMaxKc = 160;

// Multiplies rows [m0, m1) (m0 a multiple of MR) of A's K block [k0, k0 + kc) with packed B
// panels covering columns [n0, n1); panel q at b + q * panel_stride.
void compute_block(const Problem& p, const float* b, int64_t panel_stride, int64_t k0, int64_t kc, int64_t n0,
                   int64_t n1, int64_t m0, int64_t m1, bool first, bool last) {
  const int mr = p.mk.mr, nr = p.mk.nr;
  Tile t;
  t.kc = kc;
  t.ldc = p.ldc;
  t.first = first;
  t.last = last;
  t.ldz = p.ep.ld_residual;
  t.clamp = p.clamp;
  t.lo = p.lo;
  t.hi = p.hi;
  auto run_tile = [&](int64_t i, int64_t j, int64_t q, bool prefetch_residual) {
    t.b = b + q * panel_stride;
    t.nr = static_cast<int>(std::min<int64_t>(nr, n1 - j));
    t.mr = static_cast<int>(std::min<int64_t>(mr, m1 - i));
    t.a = p.a.panel(i / mr) + k0 * mr;
    t.c = p.c + i * p.ldc + j;
    t.bias = p.ep.row_bias ? p.ep.row_bias + i : nullptr;
    t.z = p.ep.residual ? p.ep.residual + i * p.ep.ld_residual + j : nullptr;
    if (prefetch_residual && last && t.z) {
      // The next tile's residual rows, while this tile computes: each row's 32 floats lie a
      // whole row of C away from the next, which no hardware prefetcher follows, and a short K
      // leaves the epilogue's loads waiting on memory (ResNet-50's 1x1 expansions, K = 64:
      // 61-81 -> 92-102 GFLOP/s on one thread in sgemm_bench's epilogue row, 94-106 without a
      // residual; docs/design/cpu-gemm.md, "The epilogue's residual, prefetched").
      const bool down = i + mr < m1;
      const float* zn = p.ep.residual + (down ? i + mr : m0) * p.ep.ld_residual + (down ? j : j + nr);
      if (down || j + nr < n1)
        for (int r = 0; r < mr; ++r) {
          __builtin_prefetch(zn + r * p.ep.ld_residual);
          __builtin_prefetch(zn + r * p.ep.ld_residual + 16);
        }
    }
    p.mk.fn(t);
    if (last && p.act_after) p.ep.act->apply(t.c, p.ldc, t.mr, t.nr, nullptr, nullptr, nullptr, 0);
  };
  if (kc <= kRowsOuterMaxKc) {
    for (int64_t i = m0; i < m1; i += mr)
      for (int64_t j = n0, q = 0; j < n1; j += nr, ++q) run_tile(i, j, q, false);
  } else {
    for (int64_t j = n0, q = 0; j < n1; j += nr, ++q)
      for (int64_t i = m0; i < m1; i += mr) run_tile(i, j, q, true);
  }
}

// Per-thread packing buffers, kept between calls (the pool's threads live as long as the process).
AlignedFloats& thread_buffer() {
  thread_local AlignedFloats buf;
  return buf;
}

// K blocks of at most about 320 rows, so a B micro-panel (kc x NR) stays in L1 while it meets
// every A panel.
constexpr int64_t kMaxKc = 320;
// Columns per task when wide outputs are split: a KC x 512 B block (about 640 KB) stays in L2.
constexpr int64_t kMaxNc = 512;

// The transposed product of narrow outputs stores its C^T tiles ([nt][32]: row j holds the
// 32 rows m0.. of column n0 + j) into C with the epilogue: bias is a vector along m, the
// residual and C are read and written 16 rows at a time with gathers/scatters. An activation
// the clamp does not cover (`act`: SiLU, Sigmoid, ...) runs on the tile itself, between the sums
// and the scatter: its rows are 32 contiguous floats, where C's are the tile's nt <= 7 columns,
// which left 9 of each 16-lane vector idle (EfficientNet-B0's 1x1 convolutions at 14x14 and
// 7x7 spent more in SiLU than in their products; docs/design/cpu-gemm.md, "Activations on
// narrow outputs").
__attribute__((target("avx512f"))) void store_transposed(float* tile, int nt, int mv, float* c, int64_t ldc,
                                                        const float* bias, const float* z, int64_t ldz, int clamp,
                                                        float lo_v, float hi_v, const Epilogue* act) {
  const unsigned m = static_cast<unsigned>(mv);
  const __mmask16 m0 = m >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << m) - 1);
  const __mmask16 m1 = m >= 32 ? 0xFFFF : m <= 16 ? 0 : static_cast<__mmask16>((1u << (m - 16)) - 1);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i idx_c = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(ldc)));
  const __m512i idx_z = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(ldz)));
  const __m512 zero = _mm512_setzero_ps(), lo = _mm512_set1_ps(lo_v), hi = _mm512_set1_ps(hi_v);
  const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : zero;
  const __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : zero;
  for (int j = 0; j < nt; ++j) {
    __m512 v0 = _mm512_add_ps(_mm512_loadu_ps(tile + j * 32), b0);
    __m512 v1 = _mm512_add_ps(_mm512_loadu_ps(tile + j * 32 + 16), b1);
    if (z) {
      v0 = _mm512_add_ps(v0, _mm512_mask_i32gather_ps(zero, m0, idx_z, z + j, 4));
      if (m1) v1 = _mm512_add_ps(v1, _mm512_mask_i32gather_ps(zero, m1, idx_z, z + 16 * ldz + j, 4));
    }
    if (act) {  // the sums back into the tile, for the activation below
      _mm512_storeu_ps(tile + j * 32, v0);
      _mm512_storeu_ps(tile + j * 32 + 16, v1);
      continue;
    }
    if (clamp == 1) {
      v0 = _mm512_max_ps(v0, zero);
      v1 = _mm512_max_ps(v1, zero);
    } else if (clamp == 2) {
      v0 = _mm512_min_ps(hi, _mm512_max_ps(lo, v0));
      v1 = _mm512_min_ps(hi, _mm512_max_ps(lo, v1));
    }
    _mm512_mask_i32scatter_ps(c + j, m0, idx_c, v0, 4);
    if (m1) _mm512_mask_i32scatter_ps(c + 16 * ldc + j, m1, idx_c, v1, 4);
  }
  if (!act) return;
  act->apply(tile, 32, nt, mv, nullptr, nullptr, nullptr, 0);
  for (int j = 0; j < nt; ++j) {
    _mm512_mask_i32scatter_ps(c + j, m0, idx_c, _mm512_loadu_ps(tile + j * 32), 4);
    if (m1) _mm512_mask_i32scatter_ps(c + 16 * ldc + j, m1, idx_c, _mm512_loadu_ps(tile + j * 32 + 16), 4);
  }
}

AlignedFloats& thread_tile_buffer() {
  thread_local AlignedFloats buf;
  return buf;
}

// Narrow outputs (the 7x7 and 14x14 ResNet layers) with AVX-512: C^T [N x M] = B^T @ A^T on the
// 7 x 32 kernel. B's columns are the broadcast side, in 7-column panels, so N = 49 and
// N = 196 fill every tile (32-column panels would compute 64 and 224 columns); A's wide
// 32-row panels are the vector side. Partial sums stay in a per-task buffer of C^T tiles across
// K blocks. Threads share the work one of two ways:
// - A at least as large as B (ResNet's 256 to 2048 rows): B is packed once, by all threads, and
//   the tasks split A's rows.
// - A smaller than B (a mobile network's projections, 24 to 160 rows by 49 or 196 columns): each
//   task packs its own columns of B and runs all of A over them, as the 32-column path does
//   (packed_sgemm). Packing B together and then reading it all from every core moved B between
//   the cores' caches, and A's one to five row panels left threads idle (M 96 N 196 K 576 on two
//   threads: 0.117 to 0.130 ms that way, 0.082 this way; docs/design/cpu-gemm.md, "Narrow
//   outputs on two threads").
void narrow_transposed(const Problem& p, const SgemmB& b, int threads) {
  constexpr int NT = 7, MV = 32;
  constexpr int64_t kKc = 256;  // a 32 x kc A panel (32 KB) stays in L1 across B's panels
  const PackedA& a = p.a;
  const int64_t M = a.rows(), K = a.depth(), n = p.n;
  const int64_t n_panels = (n + NT - 1) / NT, m_panels = (M + MV - 1) / MV;
  const int64_t kblocks = (K + kKc - 1) / kKc, kc_max = (K + kblocks - 1) / kblocks;

  // Row panels [mp0, mp1) of A against B's column panels [q0, q1), which lie in `panels`
  // (panel q at panels + (q - q0) * K * NT): computed, then stored with the epilogue.
  auto run_tiles = [&](int64_t mp0, int64_t mp1, int64_t q0, int64_t q1, const float* panels) {
    const int64_t nq = q1 - q0;
    float* acc = thread_tile_buffer().reserve((mp1 - mp0) * nq * NT * MV);
    Tile t;
    t.ldc = MV;
    for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
      t.kc = std::min(kc_max, K - k0);
      t.first = k0 == 0;
      for (int64_t mp = mp0; mp < mp1; ++mp) {
        t.b = a.wide_panel(mp) + k0 * MV;
        t.nr = static_cast<int>(std::min<int64_t>(MV, M - mp * MV));
        // The A block after this one, brought into L2 a slice per tile while this one meets B's
        // panels: at N = 49 each A block (the weights, from L3 or memory at batch 1) meets
        // only seven tiles, too few to hide its first read behind their arithmetic
        // (docs/design/cpu-gemm.md, "Weights brought into L2 ahead").
        const int64_t next_k0 = mp + 1 < mp1 ? k0 : k0 + t.kc;
        const float* next = next_k0 < K ? a.wide_panel(mp + 1 < mp1 ? mp + 1 : mp0) + next_k0 * MV : nullptr;
        const int64_t next_lines = next ? std::min(kc_max, K - next_k0) * MV * 4 / 64 : 0;
        const int64_t lines_per_tile = (next_lines + nq - 1) / nq;
        for (int64_t q = q0; q < q1; ++q) {
          const int64_t first_line = (q - q0) * lines_per_tile;
          t.prefetch = next ? reinterpret_cast<const char*>(next) + first_line * 64 : nullptr;
          t.prefetch_lines = std::clamp<int64_t>(next_lines - first_line, 0, lines_per_tile);
          t.a = panels + (q - q0) * K * NT + k0 * NT;
          t.mr = static_cast<int>(std::min<int64_t>(NT, n - q * NT));
          t.c = acc + ((mp - mp0) * nq + (q - q0)) * NT * MV;
          tile_avx512<NT>(t);
        }
      }
    }
    for (int64_t mp = mp0; mp < mp1; ++mp)
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t m0 = mp * MV, n0 = q * NT;
        const int nt = static_cast<int>(std::min<int64_t>(NT, n - n0));
        const int mv = static_cast<int>(std::min<int64_t>(MV, M - m0));
        float* cb = p.c + m0 * p.ldc + n0;
        store_transposed(acc + ((mp - mp0) * nq + (q - q0)) * NT * MV, nt, mv, cb, p.ldc,
                         p.ep.row_bias ? p.ep.row_bias + m0 : nullptr,
                         p.ep.residual ? p.ep.residual + m0 * p.ep.ld_residual + n0 : nullptr, p.ep.ld_residual,
                         p.clamp, p.lo, p.hi, p.act_after ? p.ep.act : nullptr);
      }
  };

  if (threads > 1 && M < n) {
    const int64_t tasks = std::min<int64_t>(n_panels, 2 * threads);
    parallel_for_each(tasks, true, [&](int64_t ti) {
      const int64_t q0 = ti * n_panels / tasks, q1 = (ti + 1) * n_panels / tasks;
      float* panels = thread_buffer().reserve(K * (q1 - q0) * NT);
      pack_b(b, NT, true, 0, K, q0 * NT, std::min(n, q1 * NT), panels, K * NT);
      run_tiles(0, m_panels, q0, q1, panels);
    }, 1);
    return;
  }

  float* bbuf = thread_buffer().reserve(K * n_panels * NT);
  const int64_t m_chunk = std::max<int64_t>(1, (m_panels + 4 * threads - 1) / (4 * threads));
  const int64_t tasks = (m_panels + m_chunk - 1) / m_chunk;
  constexpr int64_t kPackRows = 16;
  const int64_t pack_tasks = (K + kPackRows - 1) / kPackRows;
  const bool flat = b.conv && flat_im2col_applies(*b.conv, n, K * NT);
  thread_local FlatIm2colTables tables;
  if (flat) {
    const int64_t OW = b.conv->out[2];
    tables.dst.resize(static_cast<size_t>(n));
    tables.oh.resize(static_cast<size_t>(n));
    tables.ow.resize(static_cast<size_t>(n));
    for (int64_t p = 0; p < n; ++p) {
      tables.dst[static_cast<size_t>(p)] = static_cast<int32_t>(p / NT * K * NT + p % NT);
      tables.oh[static_cast<size_t>(p)] = static_cast<int32_t>(p / OW);
      tables.ow[static_cast<size_t>(p)] = static_cast<int32_t>(p % OW);
    }
  }
  const FlatIm2colTables& flat_tables = tables;  // the calling thread's, read by all
  parallel_for_each(pack_tasks, threads > 1, [&](int64_t ti) {
    const int64_t r0 = ti * kPackRows, r1 = std::min(K, r0 + kPackRows);
    if (flat) pack_im2col_flat7(*b.conv, flat_tables, r0, r1, n, bbuf + r0 * NT, K * NT);
    else pack_b(b, NT, true, r0, r1, 0, n, bbuf + r0 * NT, K * NT);
  });
  parallel_for_each(tasks, threads > 1, [&](int64_t ti) {
    const int64_t mp0 = ti * m_chunk, mp1 = std::min(m_panels, mp0 + m_chunk);
    run_tiles(mp0, mp1, 0, n_panels, bbuf);
  }, 1);
}

}  // namespace

const char* sgemm_isa_name(SgemmIsa isa) {
  switch (isa) {
    case SgemmIsa::kAvx512: return "avx512";
    case SgemmIsa::kAvx2: return "avx2";
    case SgemmIsa::kPlain: break;
  }
  return "plain";
}

SgemmIsa sgemm_best_isa() {
  static const SgemmIsa best = [] {
    __builtin_cpu_init();
    // BMI2 for the stride-2 im2col copies' pdep; every AVX-512 CPU has it.
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
      return SgemmIsa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SgemmIsa::kAvx2;
    return SgemmIsa::kPlain;
  }();
  return best;
}

SgemmIsa sgemm_isa() {
  const int f = forced_isa.load();
  const SgemmIsa best = sgemm_best_isa();
  if (f < 0) return best;
  return static_cast<SgemmIsa>(std::min(f, static_cast<int>(best)));
}

void sgemm_force_isa(SgemmIsa isa) { forced_isa = static_cast<int>(isa); }
void sgemm_set_narrow_policy(NarrowPolicy policy) { narrow_policy = static_cast<int>(policy); }
void sgemm_reset_isa() { forced_isa = -1; }

float* AlignedFloats::reserve(int64_t n) {
  if (n > size_) {
    // Round up to whole cache lines; aligned_alloc wants a multiple of the alignment.
    const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
    float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!p) throw std::bad_alloc();
    p_.reset(p);
    size_ = n;
  }
  return p_.get();
}

int sgemm_mr(SgemmIsa isa) { return micro_kernel(isa).mr; }

void PackedA::pack(const float* a, int64_t m, int64_t k, int64_t lda) {
  has_wide_ = false;
  isa_ = sgemm_isa();
  mr_ = micro_kernel(isa_).mr;
  m_ = m;
  k_ = k;
  const int64_t panels = (m + mr_ - 1) / mr_;
  buf_ = Tensor::uninitialized(DType::kFloat32, {std::max<int64_t>(1, panels * k * mr_)});
  offset_ = 0;
  float* d = buf_.data<float>();
  data_ = d;
  for (int64_t pi = 0; pi < panels; ++pi)
    for (int64_t kk = 0; kk < k; ++kk)
      for (int i = 0; i < mr_; ++i) {
        const int64_t row = pi * mr_ + i;
        *d++ = row < m ? a[row * lda + kk] : 0.f;
      }
}

void PackedA::adopt(Tensor storage, int64_t offset, int64_t m, int64_t k, SgemmIsa isa) {
  const int mr = micro_kernel(isa).mr;
  if (m < 0 || k < 0 || offset < 0 ||
      (offset + floats_for(m, k, mr)) * static_cast<int64_t>(sizeof(float)) > static_cast<int64_t>(storage.nbytes()))
    throw Error(ErrorKind::kInvalidArgument, "packed panels of " + std::to_string(storage.nbytes()) + " bytes from float " +
                                                 std::to_string(offset) + " for a " + std::to_string(m) + " x " +
                                                 std::to_string(k) + " matrix in rows of " + std::to_string(mr));
  has_wide_ = false;
  isa_ = isa;
  mr_ = mr;
  m_ = m;
  k_ = k;
  buf_ = std::move(storage);
  offset_ = offset;
  data_ = static_cast<const float*>(buf_.raw()) + offset;
}

void PackedA::add_wide_panels() {
  if (isa_ != SgemmIsa::kAvx512) return;
  const int64_t panels = (m_ + 31) / 32;
  float* d = wide_.reserve(std::max<int64_t>(1, panels * k_ * 32));
  for (int64_t pi = 0; pi < panels; ++pi)
    for (int64_t kk = 0; kk < k_; ++kk)
      for (int i = 0; i < 32; ++i) {
        const int64_t row = pi * 32 + i;
        *d++ = row < m_ ? panel(row / mr_)[kk * mr_ + row % mr_] : 0.f;
      }
  has_wide_ = true;
}

void PackedColumns::pack(const float* w, int64_t k, int64_t n, int64_t ldw) {
  k_ = k;
  n_ = n;
  const int64_t panels = (n + 31) / 32;
  // A buffer of the exact size, so storage() is the panels and nothing more (packed once per layer).
  buf_ = Tensor::uninitialized(DType::kFloat32, {std::max<int64_t>(1, panels * k * 32)});
  float* d = buf_.data<float>();
  data_ = d;
  for (int64_t q = 0; q < panels; ++q) {
    const int64_t width = std::min<int64_t>(32, n - q * 32);
    for (int64_t kk = 0; kk < k; ++kk, d += 32) {
      std::memcpy(d, w + kk * ldw + q * 32, static_cast<size_t>(width) * sizeof(float));
      std::fill(d + width, d + 32, 0.f);
    }
  }
}

void PackedColumns::adopt(Tensor panels, int64_t k, int64_t n) {
  if (k < 0 || n < 0 || static_cast<int64_t>(panels.nbytes()) < bytes_for(k, n))
    throw Error(ErrorKind::kInvalidArgument, "packed panels of " + std::to_string(panels.nbytes()) + " bytes for a " +
                                                 std::to_string(k) + " x " + std::to_string(n) + " matrix, which needs " +
                                                 std::to_string(bytes_for(k, n)));
  buf_ = std::move(panels);
  data_ = static_cast<const float*>(buf_.raw());
  k_ = k;
  n_ = n;
}

void rows_sgemm(const PackedColumns& w, int64_t rows, const float* x, int64_t ldx, float* y, int64_t ldy,
                const float* col_bias, const float* residual, int64_t ld_residual, const Epilogue* act, int threads) {
  const int64_t K = w.depth(), N = w.cols();
  if (rows <= 0 || N <= 0) return;
  const Epilogue none;
  const Epilogue& ep = act ? *act : none;
  if (K == 0) {  // an empty sum: the epilogue alone
    for (int64_t r = 0; r < rows; ++r) std::fill(y + r * ldy, y + r * ldy + N, 0.f);
    ep.apply(y, ldy, rows, N, nullptr, col_bias, residual, ld_residual);
    return;
  }
  constexpr int NV = 32;
  Tile base;
  base.ldc = ldy;
  base.ldz = ld_residual;
  base.clamp = ep.clamp_mode(base.lo, base.hi);
  const bool act_after = base.clamp < 0;  // the micro-kernel applies Relu/Clip itself
  if (act_after) base.clamp = 0;
  const int64_t kblocks = (K + kMaxKc - 1) / kMaxKc, kc_max = (K + kblocks - 1) / kblocks;
  const int64_t col_panels = (N + NV - 1) / NV;
  if (rows * N * K < (int64_t{1} << 17)) threads = 1;  // not worth waking threads
  // Panels of MR rows and the kernel of that height: 8, or 1, 2 or 4 for fewer than five rows (a
  // classifier at batch 1, a pooler), whose weights the 8-row kernel streamed at the pace of 16
  // FMAs a k step, 14 of them on zero rows (docs/design/cpu-gemm.md, "Weights brought into L2
  // ahead").
  auto run = [&](auto mr_tag) {
    constexpr int MR = decltype(mr_tag)::value;
    const int64_t row_panels = (rows + MR - 1) / MR;
    // X in MR-row panels, K-major (panel p, row k: X[p*MR + i][k] for i < MR; rows past `rows`
    // zero), transposed 8 x 8 at a time. The calling thread's buffer, read by every task.
    float* const xp = thread_buffer().reserve(row_panels * K * MR);
    parallel_for_each(row_panels, threads > 1, [&](int64_t p) {
      float* dst = xp + p * K * MR;
      const int64_t r0 = p * MR, height = std::min<int64_t>(MR, rows - r0);
      int64_t k = 0;
      if constexpr (MR == 8)
        if (height == MR)
          for (; k + 8 <= K; k += 8) transpose_8x8(x + r0 * ldx + k, ldx, dst + k * MR, MR);
      for (; k < K; ++k)
        for (int i = 0; i < MR; ++i) dst[k * MR + i] = i < height ? x[(r0 + i) * ldx + k] : 0.f;
    });
    // A column panel's K-block (32 x kc floats) stays in L1 while every row panel meets it, and
    // the tiles bring the next block into L2 meanwhile. sgemm_bench, which repeats one product,
    // showed no gain from that; in a model, where each product's weights were last read a whole
    // run ago, BERT-base at batch 1 runs 8% faster with it (docs/design/cpu-gemm.md, "Weights
    // brought into L2 ahead"). Tasks are runs of up to 4 column panels (about four runs per
    // thread), K-blocks outer: a K-block of X's panels (131 KB for 128 rows and blocks of 256)
    // meets every panel of the run while it is in L2 (with one panel a task, X was read whole for
    // each panel). BERT-base at batch 1 runs 3-5% faster on two threads with runs; sgemm_bench's
    // products alone, their operands last used one product ago, differ within their noise
    // (docs/design/cpu-gemm.md, "Depthwise-separable blocks in one pass").
    const int64_t group = std::clamp<int64_t>(col_panels / (4 * std::max(1, threads)), 1, 4);
    const int64_t tasks = (col_panels + group - 1) / group;
    parallel_for_each(tasks, threads > 1, [&](int64_t task) {
      const int64_t q_begin = task * group, q_end = std::min(col_panels, q_begin + group);
      for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
        const int64_t kc = std::min(kc_max, K - k0);
        for (int64_t q = q_begin; q < q_end; ++q) {
          Tile t = base;
          t.prefetch_spread = true;
          t.nr = static_cast<int>(std::min<int64_t>(NV, N - q * NV));
          t.col_bias = col_bias ? col_bias + q * NV : nullptr;
          t.kc = kc;
          t.first = k0 == 0;
          t.last = k0 + t.kc == K;
          t.b = w.panel(q) + k0 * NV;
          // What this task multiplies next: the next panel's block, or the first panel's next
          // block, or the next task's first, into L2 a slice per row panel.
          const float* next = q + 1 < q_end                  ? w.panel(q + 1) + k0 * NV
                              : k0 + kc < K                  ? w.panel(q_begin) + (k0 + kc) * NV
                              : q_end < col_panels           ? w.panel(q_end)
                                                             : nullptr;
          const int64_t next_kc = q + 1 < q_end ? kc : k0 + kc < K ? std::min(kc_max, K - k0 - kc) : kc_max;
          const int64_t next_lines = next ? std::min(next_kc, K) * NV * 4 / 64 : 0;
          const int64_t lines_per_tile = (next_lines + row_panels - 1) / row_panels;
          for (int64_t p = 0; p < row_panels; ++p) {
            t.prefetch = next ? reinterpret_cast<const char*>(next) + p * lines_per_tile * 64 : nullptr;
            t.prefetch_lines = std::clamp<int64_t>(next_lines - p * lines_per_tile, 0, lines_per_tile);
            t.mr = static_cast<int>(std::min<int64_t>(MR, rows - p * MR));
            t.a = xp + p * K * MR + k0 * MR;
            t.c = y + p * MR * ldy + q * NV;
            t.z = residual ? residual + p * MR * ld_residual + q * NV : nullptr;
            tile_avx512<MR>(t);
            if (t.last && act_after) ep.apply(t.c, ldy, t.mr, t.nr, nullptr, nullptr, nullptr, 0);
          }
        }
      }
    }, 1);
  };
  if (rows == 1) run(std::integral_constant<int, 1>{});
  else if (rows == 2) run(std::integral_constant<int, 2>{});
  else if (rows <= 4) run(std::integral_constant<int, 4>{});
  else run(std::integral_constant<int, 8>{});
}

void packed_sgemm(const PackedA& a, int64_t n, const SgemmB& b, float* c, int64_t ldc, const SgemmEpilogue& ep,
                  int threads) {
  const int64_t M = a.rows(), K = a.depth();
  if (M <= 0 || n <= 0) return;
  const Epilogue none;
  const Epilogue& act = ep.act ? *ep.act : none;
  if (K == 0) {  // an empty sum: the epilogue alone
    for (int64_t i = 0; i < M; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.f);
    act.apply(c, ldc, M, n, ep.row_bias, nullptr, ep.residual, ep.ld_residual);
    return;
  }
  // The micro-kernel applies Relu/Clip itself; other activations run on each finished tile.
  SgemmEpilogue ep_local = ep;
  ep_local.act = &act;
  Problem pr{a, micro_kernel(a.isa()), n, c, ldc, ep_local, 0, 0.f, 0.f, false};
  pr.clamp = act.clamp_mode(pr.lo, pr.hi);
  if (pr.clamp < 0) {
    pr.clamp = 0;
    pr.act_after = true;
  }

  const int mr = pr.mk.mr, nr = pr.mk.nr;
  const bool avx512 = a.isa() == SgemmIsa::kAvx512;
  const int64_t kblocks = (K + kMaxKc - 1) / kMaxKc, kc_max = (K + kblocks - 1) / kblocks;
  const int64_t panels = (n + nr - 1) / nr;
  if (M * n * K < (int64_t{1} << 17)) threads = 1;  // not worth waking threads
  threads = std::max(1, threads);

  // Narrow outputs that 32-column panels would pad by more than a few percent.
  const bool ld_fits = ldc < (int64_t{1} << 25) && ep.ld_residual < (int64_t{1} << 25);  // 32-bit scatter offsets
  // Cost model (sgemm_bench): the 32-column path computes panels * 32 columns; the transposed
  // one computes n rounded up to 7, plus its transposed stores (about 48/K of the work).
  const auto policy = static_cast<NarrowPolicy>(narrow_policy.load());
  const double normal_cost = static_cast<double>(panels * 32);
  const double narrow_cost = static_cast<double>((n + 6) / 7 * 7) * (1.0 + 48.0 / static_cast<double>(K));
  if (a.has_wide_panels() && a.isa() == SgemmIsa::kAvx512 && n <= kNarrowN && ld_fits &&
      policy != NarrowPolicy::kNever && (policy == NarrowPolicy::kAlways || narrow_cost < normal_cost)) {
    narrow_transposed(pr, b, threads);
    return;
  }

  // Column chunks also where the output is narrow but A is smaller than B (a mobile network's
  // projections at 14x14): packing B together and reading it from every core, with A's few row
  // tiles split, made two threads slower than one (M 32 N 196 K 192: 0.031 ms against 0.020;
  // docs/design/cpu-gemm.md, "Narrow outputs on two threads").
  if (threads == 1 || panels >= 4 * threads || (M < n && panels >= threads)) {
    // Wide: tasks are column chunks; each packs its own B, K block by K block, and runs every
    // row of A against it. Several chunks per thread let a thread that got ahead take more.
    // Tasks get floor or ceil of panels / tasks panels each, and their number is a multiple of
    // the threads, so an even split stays even (25 panels on 2 threads: 16 tasks, not 7 + 6).
    const int64_t max_chunk = std::max<int64_t>(1, kMaxNc / nr);
    int64_t tasks = (panels + max_chunk - 1) / max_chunk;
    if (threads > 1) {
      tasks = std::max(tasks, std::min<int64_t>(panels, 8 * threads));
      tasks = std::min(panels, (tasks + threads - 1) / threads * threads);
    }
    const int64_t chunk = (panels + tasks - 1) / tasks;  // the most panels one task gets
    auto task = [&](int64_t ti) {
      const int64_t n0 = ti * panels / tasks * nr, n1 = std::min(n, (ti + 1) * panels / tasks * nr);
      float* buf = thread_buffer().reserve(kc_max * chunk * nr);
      for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
        const int64_t kc = std::min(kc_max, K - k0);
        pack_b(b, nr, avx512, k0, k0 + kc, n0, n1, buf, kc * nr);
        compute_block(pr, buf, kc * nr, k0, kc, n0, n1, 0, M, k0 == 0, k0 + kc == K);
      }
    };
    if (threads == 1 || tasks == 1) {
      for (int64_t ti = 0; ti < tasks; ++ti) task(ti);
    } else {
      parallel_for_each(tasks, true, [&](int64_t ti) {
        task(ti);
      }, 1);
    }
    return;
  }

  // Narrow, A the larger (or fewer column panels than threads): pack all of B once, the threads
  // sharing the rows, then split the rows of A.
  float* buf = thread_buffer().reserve(K * panels * nr);
  const int64_t panel_stride = K * nr;
  const int64_t m_panels = (M + mr - 1) / mr;
  const int64_t m_chunk = std::max<int64_t>(1, (m_panels + 4 * threads - 1) / (4 * threads));
  const int64_t m_tasks = (m_panels + m_chunk - 1) / m_chunk;
  constexpr int64_t kPackRows = 16;
  const int64_t pack_tasks = (K + kPackRows - 1) / kPackRows;
  parallel_for_each(pack_tasks, threads > 1, [&](int64_t ti) {
    const int64_t r0 = ti * kPackRows, r1 = std::min(K, r0 + kPackRows);
    pack_b(b, nr, avx512, r0, r1, 0, n, buf + r0 * nr, panel_stride);
  });
  parallel_for_each(m_tasks, threads > 1, [&](int64_t ti) {
    const int64_t m0 = ti * m_chunk * mr, m1 = std::min(M, m0 + m_chunk * mr);
    for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
      const int64_t kc = std::min(kc_max, K - k0);
      compute_block(pr, buf + k0 * nr, panel_stride, k0, kc, 0, n, m0, m1, k0 == 0, k0 + kc == K);
    }
  }, 1);
}

}  // namespace kiln::cpu
