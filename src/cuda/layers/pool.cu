// CUDA layers of pooling: MaxPool (with its optional Indices output), AveragePool, LpPool
// (1-D to 3-D windows) and GlobalAveragePool, GlobalMaxPool, GlobalLpPool (any rank).
//
// Semantics follow the CPU kernels (src/cpu/pool.cc) exactly: windows are padded to three
// spatial dims with size-1 dims; MaxPool takes a window's first tap and only lets a greater
// value replace it (NaN included); an output whose window lies wholly in the padding is the
// dtype's lowest value (Indices -1); AveragePool divides by the taps inside the input, or by
// the taps inside input + pads with count_include_pad; GlobalMaxPool ignores NaNs. Values
// are computed in float32 (exact for int8/uint8), stored in the storage dtype.
//
// Kernels (32-bit index arithmetic where the tensors allow, 64-bit otherwise):
// - windowed, kLinear (NCHW, NCW, NCDHW): one thread per output element, coalesced over the
//   innermost output dim.
// - windowed, kNHWC (rank 4): one thread per output pixel and 16 bytes of channels (8 float16,
//   4 float32, 16 int8) where C allows, the buffers are 16-byte aligned and there is no
//   Indices output, else one channel; coalesced over C.
//   Square 2x2 and 3x3 windows of float storage get unrolled tap loops (all loads in flight).
// - global, kLinear: 8 threads (< 64 elements), a warp or a block (>= 1024) per (n, c) row.
// - global, kNHWC: a block per (n, channel chunk) reducing over H*W, coalesced over C; when
//   that gives too few blocks to fill the GPU, H*W is split over blocks and a second kernel
//   combines the splits (float32 partials in the layer's workspace).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ops/pool.h"

namespace kiln::cuda {

namespace {

enum class PoolKind : int { kMax, kAverage, kLp };

constexpr int kBlock = 256;

// Geometry of one node, padded to three spatial dims (as the CPU's Window3).
struct Geo {
  int64_t in[3] = {}, out[3] = {}, k[3] = {}, s[3] = {}, d[3] = {}, pb[3] = {}, pe[3] = {};
  int64_t n = 0, c = 0;
  int64_t in_size = 0, out_size = 0;  // products of in[] and out[]
  float p = 2.f;                      // LpPool's norm
  bool count_include_pad = false;
  bool column_major = false;          // MaxPool storage_order = 1
  // MaxPool without Indices over 1-D/2-D windows: the CPU's max_pool_2d order (per
  // window column, the max over its rows; then the max over those), which differs from the
  // tap order only where NaNs are.
  bool column_order = false;
};

// The window taps of output position o on axis a inside the input: k in [k0, k1); `padded`
// counts the taps inside input + pads. Same integer arithmetic as the CPU.
// S: the signed index type of the kernel (int32_t where every index of the node fits).
template <class S> struct Taps {
  S start, k0, k1, padded;
};

template <class S> __device__ __forceinline__ S ceil_div_c(S n, S d) { return (n + d - 1) / d; }

template <class S> __device__ __forceinline__ Taps<S> taps_of(const Geo& g, int a, S o) {
  Taps<S> t;
  const S d = static_cast<S>(g.d[a]), k = static_cast<S>(g.k[a]), in = static_cast<S>(g.in[a]);
  t.start = o * static_cast<S>(g.s[a]) - static_cast<S>(g.pb[a]);
  const S end_pad = in + static_cast<S>(g.pe[a]) - t.start;
  if (d == 1) {  // no divisions in the common case
    t.k0 = t.start < 0 ? -t.start : 0;
    t.k1 = min(k, in - t.start);
    t.padded = min(k, end_pad);
  } else {
    t.k0 = t.start < 0 ? ceil_div_c<S>(-t.start, d) : 0;
    t.k1 = min(k, ceil_div_c<S>(in - t.start, d));
    t.padded = min(k, ceil_div_c<S>(end_pad, d));
  }
  if (t.k1 < t.k0) t.k1 = t.k0;
  return t;
}

// The lowest value of a storage type, as float (the CPU starts maxima from it).
template <class T> __host__ __device__ constexpr float lowest_value() {
  if constexpr (std::is_same_v<T, int8_t>) return -128.f;
  else if constexpr (std::is_same_v<T, uint8_t>) return 0.f;
  else return -FLT_MAX;  // float32 lowest; float16 storage rounds it to -inf
}

// VEC consecutive elements moved as one aligned access.
template <class T, int VEC> struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <class T, int VEC>
__device__ __forceinline__ void load_pack(const T* p, float (&out)[VEC]) {
  if constexpr (VEC == 1) {
    out[0] = load_float(p, 0);
  } else {
    const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = load_float(pk.v, i);
  }
}

template <class T, int VEC>
__device__ __forceinline__ void store_pack(T* p, const float (&in)[VEC]) {
  if constexpr (VEC == 1) {
    store_float(p, 0, in[0]);
  } else {
    Pack<T, VEC> pk;
#pragma unroll
    for (int i = 0; i < VEC; ++i) store_float(pk.v, i, in[i]);
    *reinterpret_cast<Pack<T, VEC>*>(p) = pk;
  }
}

// One output position for VEC lanes stored contiguously at xb (channels in NHWC; VEC is 1
// for NCHW). sD, sH, sW: element strides of the three (padded) spatial dims. `flat` is the
// CPU's within-channel index of the max (-1 if none), for Indices.
//
// KS > 0: the window is KS x KS over H and W (the depth dim a single tap); the loops then
// unroll with per-tap bounds checks, so that a thread's loads are all in flight at once. The
// taps are visited in the same order either way.
template <class S, class T, int VEC, PoolKind K, bool IDX, int KS>
__device__ __forceinline__ void pool_window(const Geo& g, const T* __restrict__ xb, S sD, S sH, S sW, S od, S oh,
                                            S ow, float (&res)[VEC], int64_t (&flat)[VEC]) {
  const Taps<S> td = taps_of<S>(g, 0, od), th = taps_of<S>(g, 1, oh), tw = taps_of<S>(g, 2, ow);
  const S d0 = static_cast<S>(g.d[0]), d1 = static_cast<S>(g.d[1]), d2 = static_cast<S>(g.d[2]);
  // Tap loops: [k0, k1) at run time, or all KS taps unrolled and those outside [k0, k1) skipped.
  const S h_lo = KS ? 0 : th.k0, h_hi = KS ? KS : th.k1;
  const S w_lo = KS ? 0 : tw.k0, w_hi = KS ? KS : tw.k1;
#define KILN_POOL_SKIP(t, k) \
  if (KS && ((k) < (t).k0 || (k) >= (t).k1)) continue
  if constexpr (K == PoolKind::kMax && !IDX) {
    if (g.column_order) {  // 1-D/2-D: the depth dim is a single tap
      float best[VEC];
      if (th.k1 <= th.k0) {  // the window's rows lie in the padding
#pragma unroll
        for (int i = 0; i < VEC; ++i) res[i] = lowest_value<T>(), flat[i] = -1;
        return;
      }
      bool any = false;
#pragma unroll
      for (S kw = w_lo; kw < w_hi; ++kw) {
        KILN_POOL_SKIP(tw, kw);
        const T* col = xb + (tw.start + kw * d2) * sW;
        float colmax[VEC];
        bool any_row = false;
#pragma unroll
        for (S kh = h_lo; kh < h_hi; ++kh) {
          KILN_POOL_SKIP(th, kh);
          float v[VEC];
          load_pack<T, VEC>(col + (th.start + kh * d1) * sH, v);
#pragma unroll
          for (int i = 0; i < VEC; ++i)
            if (!any_row || v[i] > colmax[i]) colmax[i] = v[i];
          any_row = true;
        }
#pragma unroll
        for (int i = 0; i < VEC; ++i)
          if (!any || colmax[i] > best[i]) best[i] = colmax[i];
        any = true;
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        res[i] = any ? best[i] : lowest_value<T>();
        flat[i] = -1;
      }
      return;
    }
  }
  if constexpr (K == PoolKind::kMax) {
    float best[VEC];
    S bd[VEC], bh[VEC], bw[VEC];
    bool any = false;
    for (S kd = td.k0; kd < td.k1; ++kd) {
      const S id = td.start + kd * d0;
#pragma unroll
      for (S kh = h_lo; kh < h_hi; ++kh) {
        KILN_POOL_SKIP(th, kh);
        const S ih = th.start + kh * d1;
        const T* row = xb + id * sD + ih * sH;
#pragma unroll
        for (S kw = w_lo; kw < w_hi; ++kw) {
          KILN_POOL_SKIP(tw, kw);
          const S iw = tw.start + kw * d2;
          float v[VEC];
          load_pack<T, VEC>(row + iw * sW, v);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            if (!any || v[i] > best[i]) {
              best[i] = v[i];
              if constexpr (IDX) bd[i] = id, bh[i] = ih, bw[i] = iw;
            }
          }
          any = true;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      res[i] = any ? best[i] : lowest_value<T>();
      if constexpr (IDX) {
        const int64_t d = bd[i], h = bh[i], w = bw[i];
        flat[i] = !any ? -1 : g.column_major ? d + g.in[0] * (h + g.in[1] * w) : (d * g.in[1] + h) * g.in[2] + w;
      }
    }
  } else {
    float sum[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) sum[i] = 0.f;
    const float p = g.p;
    for (S kd = td.k0; kd < td.k1; ++kd) {
      const S id = td.start + kd * d0;
#pragma unroll
      for (S kh = h_lo; kh < h_hi; ++kh) {
        KILN_POOL_SKIP(th, kh);
        const T* row = xb + id * sD + (th.start + kh * d1) * sH;
#pragma unroll
        for (S kw = w_lo; kw < w_hi; ++kw) {
          KILN_POOL_SKIP(tw, kw);
          float v[VEC];
          load_pack<T, VEC>(row + (tw.start + kw * d2) * sW, v);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            if constexpr (K == PoolKind::kAverage) sum[i] += v[i];
            else sum[i] += p == 2.f ? v[i] * v[i] : powf(fabsf(v[i]), p);
          }
        }
      }
    }
    if constexpr (K == PoolKind::kLp) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) res[i] = p == 2.f ? sqrtf(sum[i]) : powf(sum[i], 1.f / p);
    } else {
      const S count = g.count_include_pad ? td.padded * th.padded * tw.padded
                                          : (td.k1 - td.k0) * (th.k1 - th.k0) * (tw.k1 - tw.k0);
#pragma unroll
      for (int i = 0; i < VEC; ++i) res[i] = count > 0 ? sum[i] / static_cast<float>(count) : 0.f;
    }
  }
#undef KILN_POOL_SKIP
}

// Index types: I (unsigned 32-bit or int64) for the linear output index, S its signed
// counterpart for everything else.
template <class I> using SignedOf = std::conditional_t<std::is_same_v<I, uint32_t>, int32_t, int64_t>;

// Windowed pooling over kLinear storage [N*C][D][H][W]: one thread per output element.
template <class I, class T, PoolKind K, bool IDX, int KS>
__global__ void __launch_bounds__(kBlock) pool_nchw_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                           int64_t* __restrict__ indices, Geo g, I total) {
  using S = SignedOf<I>;
  const I out2 = static_cast<I>(g.out[2]), out1 = static_cast<I>(g.out[1]), out0 = static_cast<I>(g.out[0]);
  const S in_size = static_cast<S>(g.in_size), sH = static_cast<S>(g.in[2]), sD = static_cast<S>(g.in[1] * g.in[2]);
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += static_cast<I>(gridDim.x) * blockDim.x) {
    I r = i;
    const I ow = r % out2;
    r /= out2;
    const I oh = r % out1;
    r /= out1;
    const I od = r % out0;
    const S c = static_cast<S>(r / out0);
    float res[1];
    int64_t flat[1];
    pool_window<S, T, 1, K, IDX, KS>(g, x + c * in_size, sD, sH, S{1}, static_cast<S>(od), static_cast<S>(oh),
                                     static_cast<S>(ow), res, flat);
    store_float(y, static_cast<int64_t>(i), res[0]);
    if constexpr (IDX) indices[i] = flat[0] < 0 ? -1 : int64_t{c} * g.in_size + flat[0];
  }
}

// Windowed 2-D pooling over kNHWC storage [N][H][W][C]: one thread per output pixel and VEC
// channels (C % VEC == 0; VEC > 1 needs 16-byte aligned buffers).
template <class I, class T, int VEC, PoolKind K, bool IDX, int KS>
__global__ void __launch_bounds__(kBlock) pool_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                           int64_t* __restrict__ indices, Geo g, I total) {
  using S = SignedOf<I>;
  const I cv = static_cast<I>(g.c / VEC), ow_n = static_cast<I>(g.out[2]), oh_n = static_cast<I>(g.out[1]);
  const S sW = static_cast<S>(g.c), sH = static_cast<S>(g.in[2] * g.c), image = static_cast<S>(g.in_size * g.c);
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += static_cast<I>(gridDim.x) * blockDim.x) {
    I r = i;
    const I q = r % cv;
    r /= cv;
    const I ow = r % ow_n;
    r /= ow_n;
    const I oh = r % oh_n;
    const S n = static_cast<S>(r / oh_n);
    const S c0 = static_cast<S>(q) * VEC;
    float res[VEC];
    int64_t flat[VEC];
    pool_window<S, T, VEC, K, IDX, KS>(g, x + n * image + c0, S{0}, sH, sW, S{0}, static_cast<S>(oh),
                                       static_cast<S>(ow), res, flat);
    const S o = static_cast<S>(i) * VEC;  // ((n*OH + oh)*OW + ow)*C + c0
    store_pack<T, VEC>(y + o, res);
    if constexpr (IDX) {
#pragma unroll
      for (int v = 0; v < VEC; ++v)
        indices[o + v] = flat[v] < 0 ? -1 : (int64_t{n} * g.c + c0 + v) * g.in_size + flat[v];
    }
  }
}

// MaxPool over int8 NHWC storage (an INT8 engine's pool between quantized convolutions), 16
// channels per thread: one 16-byte load per tap and four byte-wise maxima (__vmaxs4), where the
// generic kernel converts every byte to float (that ran ResNet-50's INT8 pool at batch 128 at
// 1.2 TB/s on an H100). Signed bytes compare exactly, so the result is the generic one's.
template <class I>
__global__ void __launch_bounds__(kBlock) max_pool_int8_nhwc_kernel(const int8_t* __restrict__ x, int8_t* __restrict__ y,
                                                                    Geo g, I total) {
  using S = SignedOf<I>;
  const I cv = static_cast<I>(g.c / 16), ow_n = static_cast<I>(g.out[2]), oh_n = static_cast<I>(g.out[1]);
  const S sW = static_cast<S>(g.c), sH = static_cast<S>(g.in[2] * g.c), image = static_cast<S>(g.in_size * g.c);
  const S dh = static_cast<S>(g.d[1]), dw = static_cast<S>(g.d[2]);
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += static_cast<I>(gridDim.x) * blockDim.x) {
    I r = i;
    const I q = r % cv;
    r /= cv;
    const I ow = r % ow_n;
    r /= ow_n;
    const I oh = r % oh_n;
    const S n = static_cast<S>(r / oh_n);
    const Taps<S> th = taps_of<S>(g, 1, static_cast<S>(oh)), tw = taps_of<S>(g, 2, static_cast<S>(ow));
    const int8_t* base = x + n * image + static_cast<S>(q) * 16;
    uint4 m = make_uint4(0x80808080u, 0x80808080u, 0x80808080u, 0x80808080u);  // -128 in every byte
    for (S kh = th.k0; kh < th.k1; ++kh) {
      const int8_t* row = base + (th.start + kh * dh) * sH;
      for (S kw = tw.k0; kw < tw.k1; ++kw) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + (tw.start + kw * dw) * sW));
        m.x = __vmaxs4(m.x, v.x), m.y = __vmaxs4(m.y, v.y), m.z = __vmaxs4(m.z, v.z), m.w = __vmaxs4(m.w, v.w);
      }
    }
    reinterpret_cast<uint4*>(y)[i] = m;
  }
}

// --- global pools -----------------------------------------------------------------------

template <class T, PoolKind K> __device__ __forceinline__ float global_init() {
  return K == PoolKind::kMax ? lowest_value<T>() : 0.f;
}
template <PoolKind K> __device__ __forceinline__ float global_term(float v, float p) {
  return K == PoolKind::kLp ? powf(fabsf(v), p) : v;
}
// Max as the CPU's std::max(m, v): a NaN never replaces m.
template <PoolKind K> __device__ __forceinline__ float global_combine(float a, float b) {
  if constexpr (K == PoolKind::kMax) return a < b ? b : a;
  else return a + b;
}
template <PoolKind K> __device__ __forceinline__ float global_finish(float acc, int64_t size, float p) {
  if constexpr (K == PoolKind::kMax) return acc;
  else if constexpr (K == PoolKind::kAverage) return size ? acc / static_cast<float>(size) : 0.f;
  else return powf(acc, 1.f / p);
}

// Combines the values of each aligned group of WIDTH lanes (WIDTH <= 32) of a full warp.
template <PoolKind K, int WIDTH> __device__ __forceinline__ float group_reduce(float v) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off /= 2) v = global_combine<K>(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Global pooling over kLinear storage: rows of `size` contiguous elements, TPR threads per row
// (8 or 32: part of a warp; kBlock: the whole block). Every thread of a block runs the same
// number of iterations (the shuffles and barriers need it).
template <class T, PoolKind K, int TPR>
__global__ void __launch_bounds__(kBlock) global_rows_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                             int64_t rows, int64_t size, float p) {
  constexpr int kRowsPerBlock = kBlock / TPR;
  constexpr int kWidth = TPR < 32 ? TPR : 32;
  __shared__ float partial[kBlock / 32];
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  const int sub = static_cast<int>(threadIdx.x) / TPR;
  for (int64_t first = int64_t{blockIdx.x} * kRowsPerBlock; first < rows; first += int64_t{gridDim.x} * kRowsPerBlock) {
    const int64_t row = first + sub;
    float acc = global_init<T, K>();
    if (row < rows) {
      const T* xr = x + row * size;
      for (int64_t j = lane; j < size; j += TPR) acc = global_combine<K>(acc, global_term<K>(load_float(xr, j), p));
    }
    acc = group_reduce<K, kWidth>(acc);
    if constexpr (TPR == kBlock) {
      if (lane % 32 == 0) partial[lane / 32] = acc;
      __syncthreads();
      if (lane == 0) {
        acc = partial[0];
        for (int w = 1; w < kBlock / 32; ++w) acc = global_combine<K>(acc, partial[w]);
        store_float(y, row, global_finish<K>(acc, size, p));
      }
      __syncthreads();
    } else {
      if (lane == 0 && row < rows) store_float(y, row, global_finish<K>(acc, size, p));
    }
  }
}

// Global pooling over kNHWC storage [N][HW][C]: a block of (TX, kBlock / TX) threads per
// (chunk of TX * VEC channels, n, split of the HW positions); threadIdx.y strides over the
// split's positions, then the block combines. With one split the block writes y; with more
// it writes its unfinished value to partial[n][c][split] and global_finish_kernel ends.
template <class T, int VEC, PoolKind K>
__global__ void __launch_bounds__(kBlock) global_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                             float* __restrict__ partial_out, int64_t n_count,
                                                             int64_t hw, int64_t channels, int64_t rows_per_split,
                                                             float p) {
  __shared__ float partial[kBlock * VEC];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int TX = static_cast<int>(blockDim.x), TY = static_cast<int>(blockDim.y);
  const int64_t c0 = (int64_t{blockIdx.x} * TX + tx) * VEC;
  const bool active = c0 < channels;
  const int64_t j0 = int64_t{blockIdx.z} * rows_per_split;
  const int64_t j1 = min(hw, j0 + rows_per_split);
  for (int64_t n = blockIdx.y; n < n_count; n += gridDim.y) {
    float acc[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = global_init<T, K>();
    if (active) {
      const T* xn = x + n * hw * channels + c0;
      for (int64_t j = j0 + ty; j < j1; j += TY) {
        float vals[VEC];
        load_pack<T, VEC>(xn + j * channels, vals);
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = global_combine<K>(acc[v], global_term<K>(vals[v], p));
      }
    }
#pragma unroll
    for (int v = 0; v < VEC; ++v) partial[(ty * TX + tx) * VEC + v] = acc[v];
    __syncthreads();
    if (ty == 0 && active) {
      for (int r = 1; r < TY; ++r)
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = global_combine<K>(acc[v], partial[(r * TX + tx) * VEC + v]);
      if (partial_out) {
        float* out = partial_out + (n * channels + c0) * gridDim.z + blockIdx.z;
#pragma unroll
        for (int v = 0; v < VEC; ++v) out[int64_t{v} * gridDim.z] = acc[v];
      } else {
        float out[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) out[v] = global_finish<K>(acc[v], hw, p);
        store_pack<T, VEC>(y + n * channels + c0, out);
      }
    }
    __syncthreads();
  }
}

// The second pass of a split global_nhwc_kernel: a warp per (n, c) combines its splits.
template <class T, PoolKind K>
__global__ void __launch_bounds__(kBlock) global_finish_kernel(const float* __restrict__ partial, T* __restrict__ y,
                                                               int64_t outputs, int64_t splits, int64_t hw, float p) {
  constexpr int kWarps = kBlock / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  for (int64_t first = int64_t{blockIdx.x} * kWarps; first < outputs; first += int64_t{gridDim.x} * kWarps) {
    const int64_t o = first + warp;
    float acc = global_init<T, K>();
    if (o < outputs)
      for (int64_t s = lane; s < splits; s += 32) acc = global_combine<K>(acc, partial[o * splits + s]);
    acc = group_reduce<K, 32>(acc);
    if (lane == 0 && o < outputs) store_float(y, o, global_finish<K>(acc, hw, p));
  }
}

// --- host side ----------------------------------------------------------------------------

bool is_global(const std::string& op) { return op.rfind("Global", 0) == 0; }

PoolKind kind_of(const std::string& op) {
  if (op == "MaxPool" || op == "GlobalMaxPool") return PoolKind::kMax;
  if (op == "LpPool" || op == "GlobalLpPool") return PoolKind::kLp;
  return PoolKind::kAverage;
}

const char* kind_name(PoolKind k) {
  return k == PoolKind::kMax ? "maxpool" : k == PoolKind::kAverage ? "avgpool" : "lppool";
}

// Elements of 16 bytes.
int full_vec(DType dtype) { return 16 / static_cast<int>(element_size(dtype)); }

std::string pool_check(const LayerRequest& r) {
  const std::string& op = r.node.op;
  const PoolKind kind = kind_of(op);
  if (!r.has_input(0)) return "input X is missing";
  const DType dt = r.input_dtypes[0];
  const bool int_ok = kind == PoolKind::kMax;
  if (dt != DType::kFloat32 && dt != DType::kFloat16 && !(int_ok && (dt == DType::kInt8 || dt == DType::kUInt8)))
    return "input type " + to_string(dt) + " is not supported (supported: float32, float16" +
           (int_ok ? std::string(", int8, uint8)") : std::string(")"));
  const int rank = r.inputs[0]->rank();
  if (rank < 3) return "input must have rank 3 or more";
  if (!is_global(op) && rank - 2 > 3) return "pooling over more than 3 spatial dims is not supported";
  if (r.output_shapes.empty()) return "the node has no output";
  return "";
}

LayerFormats pool_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs.resize(r.inputs.size());
  const bool nhwc = r.inputs[0]->rank() == 4 && !r.is_constant(0) && r.inputs[0]->format.layout == Layout::kNHWC;
  const Layout layout = nhwc ? Layout::kNHWC : Layout::kLinear;
  const DType storage = r.storage_of(r.input_dtypes[0]);
  // A constant X is uploaded (kLinear) by the builder.
  f.inputs[0] = Format{storage, layout};
  for (size_t i = 0; i < r.output_shapes.size(); ++i) {
    const Layout l = r.output_shapes[i].size() == 4 ? layout : Layout::kLinear;
    f.outputs.push_back(Format{i == 0 ? storage : DType::kInt64, l});
  }
  return f;
}

struct Plan {
  Geo g;
  PoolKind kind = PoolKind::kMax;
  DType dtype = DType::kFloat32;
  bool nhwc = false;
  bool global = false;
  bool indices = false;
  int vec = 1;           // channels per thread on the NHWC paths
  int64_t rows = 0;      // global pools: N * C
  int64_t size = 0;      // global pools: elements per (n, c)
  int64_t outputs = 0;   // elements of Y
  int64_t inputs = 0;    // elements of X
  int sms = 1;           // multiprocessors of the build GPU
};

// The launch of global_nhwc_kernel for `vec` channels per thread: TX threads across channels
// (at most 32, fewer while that leaves the GPU short of blocks; 8 x 16 bytes still fill a
// 128-byte line), and the HW positions split over several blocks when (chunks x N) blocks
// would still leave it short (a second pass then combines the splits).
struct GlobalNhwcLaunch {
  int tx = 32;
  int64_t chunks = 1, splits = 1, rows_per_split = 1;
};

GlobalNhwcLaunch global_nhwc_launch(const Plan& plan, int vec) {
  GlobalNhwcLaunch l;
  const int64_t lanes = (plan.g.c + vec - 1) / vec;
  const int64_t n = std::min<int64_t>(plan.g.n, 65535);
  const int64_t target = 2 * int64_t{plan.sms};
  l.tx = 1;
  while (l.tx < 32 && l.tx < lanes) l.tx *= 2;
  l.chunks = (lanes + l.tx - 1) / l.tx;
  while (l.tx > 8 && l.chunks * n < target) {
    l.tx /= 2;
    l.chunks = (lanes + l.tx - 1) / l.tx;
  }
  const int64_t ty = kBlock / l.tx, hw = std::max<int64_t>(plan.size, 1);
  const int64_t blocks = std::max<int64_t>(l.chunks * n, 1);
  if (blocks < target) {
    // Each thread keeps at least 4 positions of its split.
    l.splits = std::max<int64_t>(1, std::min<int64_t>((target + blocks - 1) / blocks, hw / (ty * 4)));
    l.splits = std::min<int64_t>(l.splits, 65535);
  }
  l.rows_per_split = (hw + l.splits - 1) / l.splits;
  l.splits = (hw + l.rows_per_split - 1) / l.rows_per_split;
  return l;
}

size_t global_nhwc_workspace(const Plan& plan) {
  if (!plan.global || !plan.nhwc || plan.outputs == 0) return 0;
  int64_t splits = global_nhwc_launch(plan, 1).splits;
  if (plan.vec > 1) splits = std::max(splits, global_nhwc_launch(plan, plan.vec).splits);
  return splits > 1 ? static_cast<size_t>(plan.rows * splits) * sizeof(float) : 0;
}

Plan make_plan(const LayerRequest& r, const LayerFormats& f) {
  const ir::Node& node = r.node;
  Plan plan;
  plan.kind = kind_of(node.op);
  plan.global = is_global(node.op);
  plan.dtype = f.inputs[0].dtype;
  plan.nhwc = f.inputs[0].layout == Layout::kNHWC && r.inputs[0]->rank() == 4;
  if (plan.nhwc && f.outputs[0].layout != Layout::kNHWC)
    throw node.error(ErrorKind::kInternal, "pool: NHWC input with a linear output");
  const std::vector<int64_t>& xs = r.input_shape(0);
  const size_t spatial = xs.size() - 2;
  Geo& g = plan.g;
  g.n = xs[0];
  g.c = xs[1];
  plan.outputs = shape_numel(r.output_shapes[0]);
  plan.inputs = shape_numel(xs);
  plan.indices = r.output_shapes.size() > 1;
  if (plan.indices && f.outputs[1].layout != f.outputs[0].layout)
    throw node.error(ErrorKind::kInternal, "pool: Y and Indices in different layouts");

  if (plan.global) {
    plan.rows = g.n * g.c;
    plan.size = 1;
    for (size_t i = 2; i < xs.size(); ++i) plan.size *= xs[i];
    g.p = static_cast<float>(node.attrs.get_int("p", 2));
    if (plan.nhwc && g.c % full_vec(plan.dtype) == 0) plan.vec = full_vec(plan.dtype);
    return plan;
  }

  if (spatial > 3) throw node.error(ErrorKind::kUnsupported, "pooling over more than 3 spatial dims is not supported");
  ir::PoolGeometry pg = ir::pool_geometry(node, spatial);
  const size_t lead = 3 - spatial;
  for (size_t a = 0; a < 3; ++a) {
    if (a < lead) {
      g.in[a] = g.out[a] = g.k[a] = g.s[a] = g.d[a] = 1;
      g.pb[a] = g.pe[a] = 0;
      continue;
    }
    const size_t i = a - lead;
    g.in[a] = xs[2 + i];
    g.out[a] = ir::pool_output_size(node, pg, i, g.in[a]);  // also resolves auto_pad
    g.k[a] = pg.kernel[i];
    g.s[a] = pg.strides[i];
    g.d[a] = pg.dilations[i];
    g.pb[a] = pg.pad_begin[i];
    g.pe[a] = pg.pad_end[i];
    if (g.out[a] != r.output_shapes[0][2 + i]) throw node.error(ErrorKind::kInternal, "pool output size mismatch");
  }
  g.in_size = g.in[0] * g.in[1] * g.in[2];
  g.out_size = g.out[0] * g.out[1] * g.out[2];
  g.count_include_pad = node.attrs.get_int("count_include_pad", 0) != 0;
  g.column_major = node.attrs.get_int("storage_order", 0) == 1;
  if (plan.kind == PoolKind::kLp) {
    g.p = static_cast<float>(node.attrs.get_int("p", 2));
    if (g.p <= 0) throw node.error(ErrorKind::kInvalidModel, "p must be positive");
  }
  if (plan.nhwc && !plan.indices && g.c % full_vec(plan.dtype) == 0) plan.vec = full_vec(plan.dtype);
  // The CPU's MaxPool of float32 without Indices over 1-D/2-D windows visits taps column by
  // column (see Geo::column_order); int8/uint8 take the tap order (no NaNs: same values).
  const bool float_storage = plan.dtype == DType::kFloat32 || plan.dtype == DType::kFloat16;
  g.column_order = plan.kind == PoolKind::kMax && !plan.indices && float_storage && g.in[0] == 1 && g.out[0] == 1 &&
                   g.k[0] == 1;
  return plan;
}

std::string plan_tactic(const Plan& plan) {
  std::string t = std::string("kernel:") + (plan.global ? "global_" : "") + kind_name(plan.kind);
  if (plan.global && !plan.nhwc)
    return t + (plan.size >= 1024 ? "_rows_block" : plan.size >= 64 ? "_rows_warp" : "_rows_8");
  t += plan.nhwc ? "_nhwc" : "_nchw";
  if (plan.vec > 1) t += "_vec" + std::to_string(plan.vec);
  if (!plan.global && plan.nhwc && plan.vec > 1 && plan.kind == PoolKind::kMax && plan.dtype == DType::kInt8) t += "_vmax";
  if (plan.global && plan.nhwc) {
    const GlobalNhwcLaunch l = global_nhwc_launch(plan, plan.vec);
    if (l.splits > 1) t += "_split" + std::to_string(l.splits);
  }
  return t;
}

// Launches of the windowed kernels for storage type T. Square 2x2 and 3x3 windows of float
// storage without Indices get kernels with unrolled tap loops.
template <class T, PoolKind K, bool IDX>
void launch_window(const Plan& plan, const T* x, T* y, int64_t* ind, cudaStream_t stream) {
  const Geo& g = plan.g;
  const bool vec_ok = plan.vec > 1 && aligned16(x) && aligned16(y);
  constexpr int kVec = 16 / sizeof(T);
  const int vec = plan.nhwc && vec_ok ? kVec : 1;
  const int64_t total = plan.outputs / vec;
  const unsigned grid = grid_for(total, kBlock);
  // 32-bit indices where every input and output offset fits.
  const bool small = std::max(plan.outputs, plan.inputs) < (int64_t{1} << 31) - 16;
  if constexpr (std::is_same_v<T, int8_t> && K == PoolKind::kMax && !IDX) {
    if (plan.nhwc && vec > 1) {
      if (small) max_pool_int8_nhwc_kernel<uint32_t><<<grid, kBlock, 0, stream>>>(x, y, g, static_cast<uint32_t>(total));
      else max_pool_int8_nhwc_kernel<int64_t><<<grid, kBlock, 0, stream>>>(x, y, g, total);
      KILN_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  auto launch = [&](auto ks_tag) {
    constexpr int KS = decltype(ks_tag)::value;
    if (plan.nhwc) {
      if (vec > 1) {
        if constexpr (!IDX) {
          if (small) pool_nhwc_kernel<uint32_t, T, kVec, K, false, KS><<<grid, kBlock, 0, stream>>>(x, y, ind, g, static_cast<uint32_t>(total));
          else pool_nhwc_kernel<int64_t, T, kVec, K, false, 0><<<grid, kBlock, 0, stream>>>(x, y, ind, g, total);
        }
      } else {
        if (small) pool_nhwc_kernel<uint32_t, T, 1, K, IDX, KS><<<grid, kBlock, 0, stream>>>(x, y, ind, g, static_cast<uint32_t>(total));
        else pool_nhwc_kernel<int64_t, T, 1, K, IDX, 0><<<grid, kBlock, 0, stream>>>(x, y, ind, g, total);
      }
    } else {
      if (small) pool_nchw_kernel<uint32_t, T, K, IDX, KS><<<grid, kBlock, 0, stream>>>(x, y, ind, g, static_cast<uint32_t>(total));
      else pool_nchw_kernel<int64_t, T, K, IDX, 0><<<grid, kBlock, 0, stream>>>(x, y, ind, g, total);
    }
  };
  constexpr bool kFixedOk = !IDX && (std::is_same_v<T, float> || std::is_same_v<T, __half>);
  if constexpr (kFixedOk) {
    if (g.k[1] == 3 && g.k[2] == 3) launch(std::integral_constant<int, 3>{});
    else if (g.k[1] == 2 && g.k[2] == 2) launch(std::integral_constant<int, 2>{});
    else launch(std::integral_constant<int, 0>{});
  } else {
    launch(std::integral_constant<int, 0>{});
  }
  KILN_CUDA_CHECK_LAUNCH();
}

template <class T, PoolKind K>
void launch_global(const Plan& plan, const T* x, T* y, void* workspace, cudaStream_t stream) {
  const float p = plan.g.p;
  if (plan.nhwc) {
    constexpr int kVec = 16 / sizeof(T);
    const bool vec_ok = plan.vec > 1 && aligned16(x) && aligned16(y);
    const GlobalNhwcLaunch l = global_nhwc_launch(plan, vec_ok ? kVec : 1);
    const dim3 block(static_cast<unsigned>(l.tx), static_cast<unsigned>(kBlock / l.tx));
    const dim3 grid(static_cast<unsigned>(l.chunks), static_cast<unsigned>(std::min<int64_t>(plan.g.n, 65535)),
                    static_cast<unsigned>(l.splits));
    float* partial = l.splits > 1 ? static_cast<float*>(workspace) : nullptr;
    if (l.splits > 1 && !partial) throw Error(ErrorKind::kInternal, "pool: no workspace for a split global pool");
    if (vec_ok)
      global_nhwc_kernel<T, kVec, K><<<grid, block, 0, stream>>>(x, y, partial, plan.g.n, plan.size, plan.g.c,
                                                                 l.rows_per_split, p);
    else
      global_nhwc_kernel<T, 1, K><<<grid, block, 0, stream>>>(x, y, partial, plan.g.n, plan.size, plan.g.c,
                                                              l.rows_per_split, p);
    KILN_CUDA_CHECK_LAUNCH();
    if (l.splits > 1) {
      global_finish_kernel<T, K><<<grid_for(plan.rows, kBlock / 32), kBlock, 0, stream>>>(partial, y, plan.rows, l.splits,
                                                                                          plan.size, p);
      KILN_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  if (plan.size >= 1024) {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(plan.rows, (int64_t{1} << 31) - 1));
    global_rows_kernel<T, K, kBlock><<<grid, kBlock, 0, stream>>>(x, y, plan.rows, plan.size, p);
  } else if (plan.size >= 64) {
    global_rows_kernel<T, K, 32><<<grid_for(plan.rows, kBlock / 32), kBlock, 0, stream>>>(x, y, plan.rows, plan.size, p);
  } else {
    global_rows_kernel<T, K, 8><<<grid_for(plan.rows, kBlock / 8), kBlock, 0, stream>>>(x, y, plan.rows, plan.size, p);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

template <class T>
void run_plan(const Plan& plan, const LayerIO& io, cudaStream_t stream) {
  const T* x = static_cast<const T*>(io.inputs[0]);
  T* y = static_cast<T*>(io.outputs[0]);
  constexpr bool kFloat = std::is_same_v<T, float> || std::is_same_v<T, __half>;
  if (plan.global) {
    switch (plan.kind) {
      case PoolKind::kMax: launch_global<T, PoolKind::kMax>(plan, x, y, io.workspace, stream); return;
      case PoolKind::kAverage: if constexpr (kFloat) { launch_global<T, PoolKind::kAverage>(plan, x, y, io.workspace, stream); return; } break;
      case PoolKind::kLp: if constexpr (kFloat) { launch_global<T, PoolKind::kLp>(plan, x, y, io.workspace, stream); return; } break;
    }
  } else {
    int64_t* ind = plan.indices && io.outputs.size() > 1 ? static_cast<int64_t*>(io.outputs[1]) : nullptr;
    switch (plan.kind) {
      case PoolKind::kMax:
        if (ind) launch_window<T, PoolKind::kMax, true>(plan, x, y, ind, stream);
        else launch_window<T, PoolKind::kMax, false>(plan, x, y, nullptr, stream);
        return;
      case PoolKind::kAverage: if constexpr (kFloat) { launch_window<T, PoolKind::kAverage, false>(plan, x, y, nullptr, stream); return; } break;
      case PoolKind::kLp: if constexpr (kFloat) { launch_window<T, PoolKind::kLp, false>(plan, x, y, nullptr, stream); return; } break;
    }
  }
  throw Error(ErrorKind::kInternal, std::string("pool: no kernel for ") + kind_name(plan.kind) + " on " +
                                        to_string(plan.dtype));
}

std::unique_ptr<Layer> pool_create(const LayerRequest& r, const LayerFormats& f, BuildServices& services) {
  Plan plan = make_plan(r, f);
  plan.sms = std::max(1, services.device().multiProcessorCount);
  switch (plan.dtype) {
    case DType::kFloat32: case DType::kFloat16: case DType::kInt8: case DType::kUInt8: break;
    default: throw r.node.error(ErrorKind::kUnsupported, "pool: storage type " + to_string(plan.dtype) + " has no kernel");
  }
  return make_layer(plan_tactic(plan), [plan](const LayerIO& io, cudaStream_t stream) {
    if (plan.outputs == 0) return;
    switch (plan.dtype) {
      case DType::kFloat32: run_plan<float>(plan, io, stream); break;
      case DType::kFloat16: run_plan<__half>(plan, io, stream); break;
      case DType::kInt8: run_plan<int8_t>(plan, io, stream); break;
      case DType::kUInt8: run_plan<uint8_t>(plan, io, stream); break;
      default: throw Error(ErrorKind::kInternal, "pool: unexpected storage type");
    }
  }, global_nhwc_workspace(plan));
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(pool) {
  for (const char* op : {"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}) {
    LayerEntry e;
    e.op = op;
    e.check = pool_check;
    e.formats = pool_formats;
    e.create = pool_create;
    const bool max = kind_of(op) == PoolKind::kMax;
    e.dtypes = max ? "float32, float16, int8, uint8 (NHWC for 2-D)" : "float32, float16 (NHWC for 2-D)";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
