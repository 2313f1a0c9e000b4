// CPU kernels of pooling (MaxPool also on int8/uint8 and with its Indices output; the rest
// float32). 1-D, 2-D and 3-D pooling share one loop nest: fewer spatial dims are padded to
// three with size-1 dims. kiln::ChannelsLastMaxPool: 2-D MaxPool on [N, H, W, C], float32.
// GCC 12's AVX-512 intrinsics start from an "undefined" vector and trip -Wmaybe-uninitialized
// when inlined here; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/conv_channels_last.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"
#include "ops/pool.h"

namespace kiln::cpu {

namespace {

enum class PoolKind { kMax, kAverage, kLp };

// Geometry of one run, padded to three spatial dims.
struct Window3 {
  int64_t in[3], out[3], k[3], s[3], d[3], pb[3], pe[3];
  int64_t nc;  // N * C
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
};

// The window of X [N, C, spatial...], or of X [N, spatial..., C] where `channels_last`.
Window3 window_for(const ir::Node& node, const Tensor& x, const Tensor& y, bool channels_last = false) {
  const size_t spatial = static_cast<size_t>(x.rank() - 2);
  if (spatial > 3) throw node.error(ErrorKind::kUnsupported, "pooling over more than 3 spatial dims is not supported");
  const int first = channels_last ? 1 : 2;  // the first spatial axis
  ir::PoolGeometry g = ir::pool_geometry(node, spatial);
  Window3 w;
  w.nc = x.dim(0) * x.dim(channels_last ? x.rank() - 1 : 1);
  const size_t lead = 3 - spatial;
  for (size_t a = 0; a < 3; ++a) {
    if (a < lead) {
      w.in[a] = w.out[a] = w.k[a] = w.s[a] = w.d[a] = 1;
      w.pb[a] = w.pe[a] = 0;
      continue;
    }
    size_t i = a - lead;
    w.in[a] = x.dim(static_cast<int>(first + i));
    w.out[a] = ir::pool_output_size(node, g, i, w.in[a]);  // also resolves auto_pad
    w.k[a] = g.kernel[i];
    w.s[a] = g.strides[i];
    w.d[a] = g.dilations[i];
    w.pb[a] = g.pad_begin[i];
    w.pe[a] = g.pad_end[i];
    if (w.out[a] != y.dim(static_cast<int>(first + i))) throw node.error(ErrorKind::kInternal, "pool output size mismatch");
  }
  return w;
}

// The window taps of output position o on axis a that fall inside the input: k in [k0, k1).
// `padded` counts the taps inside input + pads (AveragePool's count_include_pad divisor).
struct Taps {
  int64_t start, k0, k1, padded;
};
Taps taps(const Window3& w, int a, int64_t o) {
  Taps t;
  t.start = o * w.s[a] - w.pb[a];
  auto ceil_div = [](int64_t n, int64_t d) { return n / d + (n % d > 0); };  // d > 0; no n + d to overflow
  t.k0 = t.start < 0 ? ceil_div(-t.start, w.d[a]) : 0;
  t.k1 = std::min(w.k[a], ceil_div(w.in[a] - t.start, w.d[a]));
  t.padded = std::min(w.k[a], ceil_div(w.in[a] + w.pe[a] - t.start, w.d[a]));
  if (t.k1 < t.k0) t.k1 = t.k0;
  return t;
}

template <class T>
void max_pool(const Window3& w, const T* x, T* y, int64_t* indices, bool column_major) {
  const int64_t in_size = w.in_size(), out_size = w.out_size();
  parallel_for_each(w.nc, w.nc * out_size > 4096, [&](int64_t c) {
    const T* xc = x + c * in_size;
    int64_t p = c * out_size;
    for (int64_t od = 0; od < w.out[0]; ++od) {
      Taps td = taps(w, 0, od);
      for (int64_t oh = 0; oh < w.out[1]; ++oh) {
        Taps th = taps(w, 1, oh);
        for (int64_t ow = 0; ow < w.out[2]; ++ow, ++p) {
          Taps tw = taps(w, 2, ow);
          T best = std::numeric_limits<T>::lowest();
          int64_t best_d = -1, best_h = -1, best_w = -1;
          for (int64_t kd = td.k0; kd < td.k1; ++kd) {
            int64_t id = td.start + kd * w.d[0];
            for (int64_t kh = th.k0; kh < th.k1; ++kh) {
              int64_t ih = th.start + kh * w.d[1];
              const T* row = xc + (id * w.in[1] + ih) * w.in[2];
              for (int64_t kw = tw.k0; kw < tw.k1; ++kw) {
                int64_t iw = tw.start + kw * w.d[2];
                if (row[iw] > best || best_d < 0) {
                  best = row[iw];
                  best_d = id, best_h = ih, best_w = iw;
                }
              }
            }
          }
          y[p] = best;
          if (indices) {
            int64_t flat = column_major ? best_d + w.in[0] * (best_h + w.in[1] * best_w)
                                        : (best_d * w.in[1] + best_h) * w.in[2] + best_w;
            indices[p] = best_d < 0 ? -1 : c * in_size + flat;
          }
        }
      }
    }
  });
}

// Tap kw of 16 neighbouring outputs of a float32 row: rm[base + stride * i + kw], stride 1 or 2
// (two loads and the even lanes of both).
__attribute__((target("avx512f"), always_inline)) inline __m512 column_taps(const float* base, int64_t stride,
                                                                           int64_t kw) {
  if (stride == 1) return _mm512_loadu_ps(base + kw);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return _mm512_permutex2var_ps(_mm512_loadu_ps(base + kw), even, _mm512_loadu_ps(base + kw + 16));
}

// The window's columns of `count` outputs whose taps all lie inside the row, 16 at a time:
// y[j] = max over kw < k of rm[start + stride * j + kw] (dilation 1), in the scalar loop's order
// (the first tap, then each greater one replacing it: _mm512_max_ps(v, best) keeps best unless v
// is greater, NaN included). rm holds at least 31 floats past the row.
__attribute__((target("avx512f"))) void max_columns_avx512(const float* rm, int64_t stride, int64_t k, int64_t start,
                                                          int64_t count, float* y) {
  for (int64_t j0 = 0; j0 < count; j0 += 16) {
    const uint32_t n = static_cast<uint32_t>(std::min<int64_t>(16, count - j0));
    const float* base = rm + start + stride * j0;
    __m512 best = column_taps(base, stride, 0);
    for (int64_t kw = 1; kw < k; ++kw) best = _mm512_max_ps(column_taps(base, stride, kw), best);
    _mm512_mask_storeu_ps(y + j0, static_cast<__mmask16>(n == 16 ? 0xFFFFu : (1u << n) - 1), best);
  }
}

// The same columns for int8 (INT8 ResNet's stem pool), 16 outputs at a time on AVX2: each
// output's taps are the low bytes of the 16-bit lanes of one unaligned load per tap (stride 2) or
// the bytes of one (stride 1), and the max of integers does not depend on the order. rm holds at
// least 47 bytes past the row.
__attribute__((target("avx2"))) void max_columns_int8_avx2(const int8_t* rm, int64_t stride, int64_t k, int64_t start,
                                                          int64_t count, int8_t* y) {
  const __m256i low_bytes = _mm256_set1_epi16(0x00FF);
  int64_t j0 = 0;
  for (; j0 + 16 <= count; j0 += 16) {
    const int8_t* base = rm + start + stride * j0;
    if (stride == 1) {
      __m128i best = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base));
      for (int64_t kw = 1; kw < k; ++kw) best = _mm_max_epi8(best, _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + kw)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + j0), best);
      continue;
    }
    __m256i best = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base));
    for (int64_t kw = 1; kw < k; ++kw) best = _mm256_max_epi8(best, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + kw)));
    // The low byte of each 16-bit lane, in order: packus of values 0..255 keeps them, and the
    // 64-bit permute puts the two 128-bit halves' 8 bytes side by side.
    const __m256i packed = _mm256_packus_epi16(_mm256_and_si256(best, low_bytes), _mm256_setzero_si256());
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + j0),
                     _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)));
  }
  for (; j0 < count; ++j0) {  // the last few, one at a time
    const int8_t* base = rm + start + stride * j0;
    int8_t best = base[0];
    for (int64_t kw = 1; kw < k; ++kw) best = base[kw] > best ? base[kw] : best;
    y[j0] = best;
  }
}

// MaxPool over 1-D/2-D windows without Indices (ResNet's stem, float32 or int8): per output row, the
// max over the window's rows of every input column (a loop that vectorizes), then the max
// over the window's columns of that, for float32 on AVX-512 16 outputs at a time where the
// window lies inside the row (stride 1 or 2, dilation 1: ResNet's 3x3 stride-2 pool ran its
// columns one output at a time, 0.40 ms against ONNX Runtime's 0.14 on two threads). Same result
// as max_pool, NaN included: both start from the window's first tap and only let a greater value
// replace it.
template <class T>
void max_pool_2d(const Window3& w, const T* x, T* y) {
  const int64_t H = w.in[1], W = w.in[2], OH = w.out[1], OW = w.out[2];
  std::vector<Taps> tw(static_cast<size_t>(OW));
  for (int64_t ow = 0; ow < OW; ++ow) tw[static_cast<size_t>(ow)] = taps(w, 2, ow);
  // Outputs [inner_lo, inner_hi) have every column tap inside the row (a contiguous range).
  int64_t inner_lo = OW, inner_hi = OW;
  const bool vector_columns = w.d[2] == 1 && (w.s[2] == 1 || w.s[2] == 2) &&
                              (std::is_same_v<T, int8_t> || (std::is_same_v<T, float> && sgemm_isa() == SgemmIsa::kAvx512));
  if (vector_columns) {
    for (int64_t ow = 0; ow < OW; ++ow) {
      const Taps& t = tw[static_cast<size_t>(ow)];
      if (t.k0 != 0 || t.k1 != w.k[2]) continue;
      if (inner_lo == OW) inner_lo = ow;
      inner_hi = ow + 1;
    }
  }
  const T lowest = std::numeric_limits<T>::lowest();
  parallel_for(w.nc, [&](int64_t first, int64_t last) {
    std::vector<T> rowmax(static_cast<size_t>(W + 64));  // the vector loads read up to 31 floats (47 bytes) past the row
    T* rm = rowmax.data();
    for (int64_t c = first; c < last; ++c) {
      const T* xc = x + c * H * W;
      T* yc = y + c * OH * OW;
      for (int64_t oh = 0; oh < OH; ++oh) {
        const Taps th = taps(w, 1, oh);
        T* yrow = yc + oh * OW;
        if (th.k1 <= th.k0) {  // the window lies in the padding
          std::fill(yrow, yrow + OW, lowest);
          continue;
        }
        const T* r0 = xc + (th.start + th.k0 * w.d[1]) * W;
        std::copy(r0, r0 + W, rm);
        for (int64_t kh = th.k0 + 1; kh < th.k1; ++kh) {
          const T* r = xc + (th.start + kh * w.d[1]) * W;
          for (int64_t i = 0; i < W; ++i) rm[i] = r[i] > rm[i] ? r[i] : rm[i];
        }
        if constexpr (std::is_same_v<T, float>)
          if (inner_lo < inner_hi)
            max_columns_avx512(rm, w.s[2], w.k[2], tw[static_cast<size_t>(inner_lo)].start, inner_hi - inner_lo,
                               yrow + inner_lo);
        if constexpr (std::is_same_v<T, int8_t>)
          if (inner_lo < inner_hi)
            max_columns_int8_avx2(rm, w.s[2], w.k[2], tw[static_cast<size_t>(inner_lo)].start, inner_hi - inner_lo,
                                  yrow + inner_lo);
        for (int64_t ow = 0; ow < OW; ++ow) {
          if (ow == inner_lo) ow = inner_hi;  // done above
          if (ow == OW) break;
          const Taps& t = tw[static_cast<size_t>(ow)];
          if (t.k1 <= t.k0) {
            yrow[ow] = lowest;
            continue;
          }
          T best = rm[t.start + t.k0 * w.d[2]];
          for (int64_t kw = t.k0 + 1; kw < t.k1; ++kw) {
            const T v = rm[t.start + kw * w.d[2]];
            best = v > best ? v : best;
          }
          yrow[ow] = best;
        }
      }
    }
  }, w.nc * OH * OW > 4096);
}

// The separable 2-D loop where it applies, else the general one.
template <class T>
void run_max_pool(const Window3& w, const T* x, T* y, int64_t* indices, bool column_major) {
  if (!indices && w.in[0] == 1 && w.out[0] == 1 && w.k[0] == 1) max_pool_2d(w, x, y);
  else max_pool(w, x, y, indices, column_major);
}

// AveragePool and LpPool.
void sum_pool(const Window3& w, const float* x, float* y, PoolKind kind, bool count_include_pad, float p_norm) {
  const int64_t in_size = w.in_size(), out_size = w.out_size();
  parallel_for_each(w.nc, w.nc * out_size > 4096, [&](int64_t c) {
    const float* xc = x + c * in_size;
    int64_t p = c * out_size;
    for (int64_t od = 0; od < w.out[0]; ++od) {
      Taps td = taps(w, 0, od);
      for (int64_t oh = 0; oh < w.out[1]; ++oh) {
        Taps th = taps(w, 1, oh);
        for (int64_t ow = 0; ow < w.out[2]; ++ow, ++p) {
          Taps tw = taps(w, 2, ow);
          float sum = 0.f;
          for (int64_t kd = td.k0; kd < td.k1; ++kd) {
            int64_t id = td.start + kd * w.d[0];
            for (int64_t kh = th.k0; kh < th.k1; ++kh) {
              const float* row = xc + (id * w.in[1] + th.start + kh * w.d[1]) * w.in[2];
              for (int64_t kw = tw.k0; kw < tw.k1; ++kw) {
                float v = row[tw.start + kw * w.d[2]];
                if (kind == PoolKind::kAverage) sum += v;
                else if (p_norm == 2.f) sum += v * v;
                else sum += std::pow(std::fabs(v), p_norm);
              }
            }
          }
          if (kind == PoolKind::kLp) {
            y[p] = p_norm == 2.f ? std::sqrt(sum) : std::pow(sum, 1.f / p_norm);
            continue;
          }
          int64_t count = count_include_pad ? td.padded * th.padded * tw.padded
                                            : (td.k1 - td.k0) * (th.k1 - th.k0) * (tw.k1 - tw.k0);
          y[p] = count > 0 ? sum / static_cast<float>(count) : 0.f;
        }
      }
    }
  });
}

// The sum of n values in float32. Floats add in 32 running sums (four vectors of eight), which
// a chain of one addition after another would keep waiting on the adder's latency (EfficientNet's
// squeeze-and-excitation averages over 112 x 112 planes: docs/design/cpu-gemm.md, "EfficientNet's
// activations and averages").
template <class T>
float sum_as_float(const T* v, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += static_cast<float>(v[i]);
  return s;
}

template <>
float sum_as_float<float>(const float* v, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int a = 0; a < 4; ++a) acc[a] = _mm256_add_ps(acc[a], _mm256_loadu_ps(v + i + 8 * a));
  const __m256 both = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, both);
  float s = 0.f;
  for (float lane : lanes) s += lane;
  for (; i < n; ++i) s += v[i];
  return s;
}

template <class T>
void global_pool(const Tensor& x, Tensor& y, PoolKind kind, float p_norm) {
  const int64_t nc = x.dim(0) * x.dim(1);
  const int64_t size = nc ? x.numel() / nc : 0;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  parallel_for_each(nc, x.numel() > 65536, [&](int64_t c) {
    const T* row = px + c * size;
    if (kind == PoolKind::kMax) {
      T m = std::numeric_limits<T>::lowest();
      for (int64_t i = 0; i < size; ++i) m = std::max(m, row[i]);
      py[c] = m;
    } else if (kind == PoolKind::kAverage) {
      const float s = sum_as_float(row, size);
      py[c] = static_cast<T>(size ? s / static_cast<float>(size) : 0.f);
    } else {
      float s = 0.f;
      for (int64_t i = 0; i < size; ++i) s += std::pow(std::fabs(static_cast<float>(row[i])), p_norm);
      py[c] = static_cast<T>(std::pow(s, 1.f / p_norm));
    }
  });
}

// One output pixel of a channels-last MaxPool: the max over the window's taps inside the image,
// `first` the first tap's pixel (null: no tap inside), rows row_step and taps w.d[2] * C apart.
__attribute__((target("avx512f"))) void max_pixel_avx512(const float* first, const Taps& th, const Taps& tw,
                                                         const Window3& w, int64_t row_step, int64_t C, float* y) {
  const __m512 lowest = _mm512_set1_ps(std::numeric_limits<float>::lowest());
  for (int64_t c0 = 0; c0 < C; c0 += 16) {
    const __mmask16 m = static_cast<__mmask16>(C - c0 >= 16 ? 0xFFFFu : (1u << (C - c0)) - 1);
    if (!first) {
      _mm512_mask_storeu_ps(y + c0, m, lowest);
      continue;
    }
    __m512 best = _mm512_maskz_loadu_ps(m, first + c0);
    for (int64_t kh = 0; kh < th.k1 - th.k0; ++kh)
      for (int64_t kw = kh == 0 ? 1 : 0; kw < tw.k1 - tw.k0; ++kw)
        best = _mm512_max_ps(_mm512_maskz_loadu_ps(m, first + kh * w.d[1] * row_step + kw * w.d[2] * C + c0), best);
    _mm512_mask_storeu_ps(y + c0, m, best);
  }
}

// kiln::ChannelsLastMaxPool: X [N, H, W, C] -> Y [N, OH, OW, C], per output pixel 16 channels
// at a time, the taps inside the image in MaxPool's order (the first, then each greater one:
// _mm512_max_ps(v, best) keeps best unless v is greater, NaN included, as max_pool's comparison).
// A window with no tap inside the image gives the lowest float, as max_pool's.
void max_pool_channels_last(const ir::Node& node, const Tensor& x, Tensor& y) {
  const int64_t N = x.dim(0), H = x.dim(1), W = x.dim(2), C = x.dim(3), OH = y.dim(1), OW = y.dim(2);
  const Window3 w = window_for(node, x, y, /*channels_last=*/true);  // axes 1 and 2: H and W
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
  parallel_for_each(N * OH, N * OH > 1 && N * OH * OW * C * w.k[1] * w.k[2] >= (int64_t{1} << 15), [&](int64_t row) {
    const int64_t n = row / OH, oy = row % OH;
    const Taps th = taps(w, 1, oy);
    const float* image = xp + n * H * W * C;
    float* out = yp + row * OW * C;
    for (int64_t ox = 0; ox < OW; ++ox) {
      const Taps tw = taps(w, 2, ox);
      float* yo = out + ox * C;
      const bool any = th.k1 > th.k0 && tw.k1 > tw.k0;
      auto at = [&](int64_t kh, int64_t kw) {
        return image + ((th.start + kh * w.d[1]) * W + tw.start + kw * w.d[2]) * C;
      };
      if (avx512) {
        max_pixel_avx512(any ? at(th.k0, tw.k0) : nullptr, th, tw, w, W * C, C, yo);
        continue;
      }
      for (int64_t c = 0; c < C; ++c) {
        float best = std::numeric_limits<float>::lowest();
        bool first = true;
        for (int64_t kh = th.k0; kh < th.k1; ++kh)
          for (int64_t kw = tw.k0; kw < tw.k1; ++kw) {
            const float v = at(kh, kw)[c];
            if (v > best || first) best = v;
            first = false;
          }
        yo[c] = best;
      }
    }
  });
}

// GlobalAveragePool of X [N, H, W, C] into Y [N, 1, 1, C]. The pixels go in bands of
// kGapBandPixels, each band's sum (pixel i of the band into running sum i % 8, one row of sums
// per running sum, then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))) a task of its own, the
// bands' sums added in order: the same bits on any number of threads. Bands, not blocks of
// channels, because the convolution before wrote its output in runs of rows, each thread its
// own: split by channels, each thread read half its input from the other core's cache, and
// EfficientNet-B0's first pool (112 x 112 x 32) took longer on two threads than on one.
constexpr int64_t kGapBandPixels = 512;

// s[0, n) += row[0, n) (the stores bound it: 16 channels a store).
__attribute__((target("avx512f"))) void add_row_avx512(float* __restrict s, const float* __restrict row, int64_t n) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) _mm512_storeu_ps(s + c, _mm512_add_ps(_mm512_loadu_ps(s + c), _mm512_loadu_ps(row + c)));
  if (c < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - c)) - 1);
    _mm512_mask_storeu_ps(s + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, s + c), _mm512_maskz_loadu_ps(m, row + c)));
  }
}

void add_row_plain(float* __restrict s, const float* __restrict row, int64_t n) {
  for (int64_t c = 0; c < n; ++c) s[c] += row[c];
}

void global_average_pool_channels_last(const Tensor& x, Tensor& y) {
  const int64_t N = x.dim(0), pixels = x.dim(1) * x.dim(2), C = x.dim(3);
  const int64_t bands = std::max<int64_t>(1, (pixels + kGapBandPixels - 1) / kGapBandPixels);
  // Blocks of channels where there are fewer bands than threads (a 7 x 7 layer at batch 1), in
  // multiples of 16 channels; at most 256 channels, the running sums' rows staying in L1.
  const int64_t per_band = N * bands < thread_count() ? std::min<int64_t>(thread_count(), (C + 15) / 16) : 1;
  const int64_t block = std::min<int64_t>(256, ((C + per_band - 1) / per_band + 15) / 16 * 16);
  const int64_t blocks = (C + block - 1) / block;
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  std::vector<float> band_sums(static_cast<size_t>(N * bands * C));
  const auto add_row = sgemm_isa() == SgemmIsa::kAvx512 ? add_row_avx512 : add_row_plain;
  parallel_for_each(N * bands * blocks, N * bands * blocks > 1 && x.numel() > 16384, [&](int64_t task) {
    const int64_t image = task / (bands * blocks), band = task / blocks % bands, c0 = task % blocks * block;
    const int64_t width = std::min(block, C - c0);
    const int64_t p0 = band * kGapBandPixels, p1 = std::min(pixels, p0 + kGapBandPixels);
    alignas(64) float sums[8][256] = {};
    const float* first = xp + (image * pixels + p0) * C + c0;
    for (int64_t i = 0; i < p1 - p0; ++i) add_row(sums[i % 8], first + i * C, width);
    float* out = band_sums.data() + (image * bands + band) * C + c0;
    for (int64_t c = 0; c < width; ++c)
      out[c] = ((sums[0][c] + sums[1][c]) + (sums[2][c] + sums[3][c])) + ((sums[4][c] + sums[5][c]) + (sums[6][c] + sums[7][c]));
  });
  for (int64_t image = 0; image < N; ++image) {
    float* out = yp + image * C;
    const float* first = band_sums.data() + image * bands * C;
    std::copy(first, first + C, out);
    for (int64_t band = 1; band < bands; ++band) add_row_plain(out, first + band * C, C);
    for (int64_t c = 0; c < C; ++c) out[c] = pixels ? out[c] / static_cast<float>(pixels) : 0.f;
  }
}

PoolKind kind_of(const std::string& op) {
  if (op == "MaxPool" || op == "GlobalMaxPool") return PoolKind::kMax;
  if (op == "LpPool" || op == "GlobalLpPool") return PoolKind::kLp;
  return PoolKind::kAverage;
}

}  // namespace

bool channels_last_pool_runs(const ir::Graph& graph, const ir::Node& pool) {
  if (sgemm_best_isa() != SgemmIsa::kAvx512 || !pool.domain.empty() || (pool.op != "MaxPool" && pool.op != "GlobalAveragePool"))
    return false;
  if (pool.inputs.size() != 1 || pool.outputs.empty() || (pool.outputs.size() > 1 && !pool.outputs[1].empty())) return false;
  const ir::Value* x = graph.find_value(pool.inputs[0]);
  return x && x->type.dtype == DType::kFloat32 && x->type.shape && x->type.shape->size() == 4;
}

KILN_REGISTER_CPU_KERNELS(pool) {
  {
    KernelEntry e;
    e.op = "MaxPool";
    e.check = accept_dtypes({DType::kFloat32, DType::kInt8, DType::kUInt8});
    e.dtypes = "float32, int8, uint8";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      bool column_major = node->attrs.get_int("storage_order", 0) == 1;
      return make_kernel([node, column_major](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        Window3 w = window_for(*node, *in[0], out[0]);
        int64_t* indices = out.size() > 1 && out[1].defined() ? out[1].data<int64_t>() : nullptr;
        switch (in[0]->dtype()) {
          case DType::kInt8: run_max_pool(w, in[0]->data<int8_t>(), out[0].data<int8_t>(), indices, column_major); break;
          case DType::kUInt8: run_max_pool(w, in[0]->data<uint8_t>(), out[0].data<uint8_t>(), indices, column_major); break;
          default: run_max_pool(w, in[0]->data<float>(), out[0].data<float>(), indices, column_major); break;
        }
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "ChannelsLastMaxPool";
    e.domain = "kiln";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (out[0].numel() > 0) max_pool_channels_last(*node, *in[0], out[0]);
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "ChannelsLastGlobalAveragePool";
    e.domain = "kiln";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit&) {
      return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (out[0].numel() > 0) global_average_pool_channels_last(*in[0], out[0]);
      });
    };
    registry.add(std::move(e));
  }
  for (const char* op : {"AveragePool", "LpPool"}) {
    KernelEntry e;
    e.op = op;
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      PoolKind kind = kind_of(node->op);
      bool include_pad = node->attrs.get_int("count_include_pad", 0) != 0;
      float p_norm = static_cast<float>(node->attrs.get_int("p", 2));
      if (kind == PoolKind::kLp && p_norm <= 0) throw node->error(ErrorKind::kInvalidModel, "p must be positive");
      return make_kernel([=](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        Window3 w = window_for(*node, *in[0], out[0]);
        sum_pool(w, in[0]->data<float>(), out[0].data<float>(), kind, include_pad, p_norm);
      });
    };
    registry.add(std::move(e));
  }
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}) {
    KernelEntry e;
    e.op = op;
    bool max = std::string(op) == "GlobalMaxPool";
    e.check = max ? accept_dtypes({DType::kFloat32, DType::kInt8, DType::kUInt8}) : accept_dtypes({DType::kFloat32});
    e.dtypes = max ? "float32, int8, uint8" : "float32";
    e.create = [](const KernelInit& init) {
      PoolKind kind = kind_of(init.node.op);
      float p_norm = static_cast<float>(init.node.attrs.get_int("p", 2));
      return make_kernel([=](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        switch (in[0]->dtype()) {
          case DType::kInt8: global_pool<int8_t>(*in[0], out[0], kind, p_norm); break;
          case DType::kUInt8: global_pool<uint8_t>(*in[0], out[0], kind, p_norm); break;
          default: global_pool<float>(*in[0], out[0], kind, p_norm); break;
        }
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
