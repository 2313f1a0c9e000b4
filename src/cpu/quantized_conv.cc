// The CPU kernel of kiln::QConv (src/ops/quantized_conv.cc): the exact integer reference of
// kiln's INT8 convolutions. Products and sums are int32, as on the GPU's tensor cores, so a
// test can hold the GPU to this kernel's integers; only the epilogue is float32, in the order
// the op's definition gives (acc * scale + B as one fused multiply-add, so that the result does
// not depend on whether the compiler contracts it).
//
// Where the CPU has AVX2 (or AVX-512 VNNI, or AMX), int8 convolutions with at least 8 output
// channels per group run on kiln's int8 GEMM (cpu/int8_gemm.h): per image and group the window is
// unrolled into an int8 matrix col[K x OHW] (K = C/group * kernel size; padding reads 0, the
// real 0 of a symmetric scale; a 1x1 convolution of stride 1 reads X itself), packed in panels
// of 32 columns, and multiplied by the weights packed when the kernel was created; the
// epilogue runs on each tile of int32 sums with AVX-512 (AVX2 on the AVX2 GEMM), the same
// float32 operations in the same order as the portable loop, so all give the same bytes
// (tests/unit/quantized_conv_test.cc).
//
// Elsewhere (depthwise and narrow grouped convolutions, float8, a test forcing the GEMM off) the window is
// unrolled into an int16 (float32 for float8) matrix and each output channel accumulates
// W[m, k] * col[k, :] row by row: a loop the compiler vectorizes, the reference.
//
// The file is compiled with -ffp-contract=off: the epilogue's z * z_scale + v is a product and a
// sum, each rounded, as the op defines it and the GPU computes it, never contracted into one
// fused multiply-add.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/conv_shape.h"
#include "cpu/gemm_util.h"
#include "cpu/amx.h"
#include "cpu/int8_gemm.h"
#include "cpu/kernel.h"
#include "cpu/packed_weights.h"
#include "cpu/parallel.h"
#include "ir/activation.h"
#include "ir/sizes.h"

namespace kiln::cpu {

namespace {

class QConvKernel final : public Kernel {
 public:
  explicit QConvKernel(const KernelInit& init)
      : node_(init.node),
        act_(ir::Activation::from_node(init.node)),
        x_scale_(init.node.attrs.get_float("x_scale", 0.f)),
        z_scale_(init.node.attrs.get_float("z_scale", 0.f)),
        y_scale_(init.node.attrs.get_float("y_scale", 0.f)),
        w_scales_(init.node.attrs.get_floats("w_scales")) {
    inv_y_scale_ = y_scale_ > 0.f ? 1.f / y_scale_ : 0.f;
    multiplier_.resize(w_scales_.size());
    for (size_t m = 0; m < w_scales_.size(); ++m) multiplier_[m] = x_scale_ * w_scales_[m];
    pack_weights(init);
  }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    const int64_t channels = in[1]->rank() > 0 ? in[1]->dim(0) : 0;  // W's output channels
    if (static_cast<int64_t>(multiplier_.size()) != channels)
      throw node_.error(ErrorKind::kInvalidModel, "w_scales has " + std::to_string(multiplier_.size()) +
                                                      " entries for " + std::to_string(channels) + " output channels");
    if (in[0]->dtype() == DType::kFloat8E4M3FN) run_typed<uint8_t, float, float>(in, out);
    else if (!packed_.empty()) run_gemm(in, out);  // packed for the int8 GEMM this CPU had when the kernel was made
    else run_typed<int8_t, int16_t, int32_t>(in, out);
  }

  // int8 inputs run on the panels alone (float8 ones read W's bytes).
  std::vector<std::pair<size_t, ir::PackedConstant>> packed_constants() const override {
    if (packed_.empty() || !int8_input_) return {};
    return {{1, packed_constant(packed_)}};
  }

 private:
  // The weights in the int8 GEMM's panels, one packing per group, when they are a constant
  // int8 W whose groups have 8 output channels or more (fewer would leave most of each 8-row
  // tile empty) and whose sums stay in int32.
  // A loaded engine's panels are taken as they are; the groups' panels share one buffer (one pack).
  void pack_weights(const KernelInit& init) {
    const Tensor* w = init.constants.size() > 1 ? init.constants[1] : nullptr;
    const Int8GemmIsa isa = int8_gemm_isa();
    int8_input_ = init.dtype(0) == DType::kInt8;
    if (!w || w->dtype() != DType::kInt8 || w->shape().size() < 3 || isa == Int8GemmIsa::kNone) return;
    const int64_t group = init.node.attrs.get_int("group", 1);
    const int64_t m = w->shape()[0];
    if (group <= 0 || m % group != 0 || m / group < 8) return;
    const int64_t k = w->numel() / m;
    if (k <= 0 || k >= kInt8GemmMaxK) return;
    const ir::PackedConstant* pack = init.packed_input(1);
    if (pack && adopt_packed(*pack, w->shape(), group, isa, packed_)) return;
    const int64_t mg = m / group;
    const Tensor values = constant_values(*w, pack);
    const int8_t* data = values.data<int8_t>();
    for (int64_t g = 0; g < group; ++g) packed_.push_back(int8_pack_a(isa, data + g * mg * k, mg, k, k));
    if (group > 1) share_one_buffer(packed_);
  }

  // The int8 GEMM path (the class comment): per image and group, unroll, pack, multiply.
  void run_gemm(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
    const Tensor& xt = *in[0];
    const Geo3 g = make_geo3(node_, xt.shape(), in[1]->shape(), false);
    const int8_t* x = xt.data<int8_t>();
    const float* bias = in.size() > 2 && in[2] ? in[2]->data<float>() : nullptr;
    const Tensor* z = in.size() > 3 ? in[3] : nullptr;
    if (out[0].numel() == 0) return;
    const int64_t C = g.in_c, M = g.out_c, G = g.group, Cg = C / G, Mg = M / G;
    const int64_t K = Cg * g.kernel_size(), N = g.out_size();
    if (G == 1 && N == 1 && g.in_size() == 1 && g.kernel_size() == 1 && g.batch > 1)
      return run_rows(x, g.batch, K, M, bias, z, out[0]);
    const GemmOutput o = gemm_output(z, out[0]);
    const bool pointwise = g.kernel_size() == 1 && N == g.in_size() && g.s[0] == 1 && g.s[1] == 1 && g.s[2] == 1;
    // Scratch of the calling thread, kept between runs (fresh pages cost more than the work).
    thread_local AlignedVector<int8_t> col;
    if (!pointwise) col.resize(std::max(col.size(), static_cast<size_t>(checked_mul(K, N, "the im2col matrix"))));
    int8_t* col_data = col.data();
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t gi = 0; gi < G; ++gi) {
        const int8_t* xg = x + (n * C + gi * Cg) * g.in_size();
        const int8_t* b = xg;
        if (!pointwise) {
          parallel_for(Cg, [&](int64_t first, int64_t last) { unroll_int8(g, xg, first, last, col_data); });
          b = col_data;
        }
        multiply(packed_[static_cast<size_t>(gi)], b, N, false, K, N, gi * Mg, Mg, (n * M + gi * Mg) * N, N, bias, o);
      }
  }

  // Where the epilogue reads the residual and writes Y: each pointer at element 0 of its
  // matrix, null when absent (y_int8 null: Y is float32).
  struct GemmOutput {
    const float* z_float = nullptr;
    const int8_t* z_int8 = nullptr;
    int8_t* y_int8 = nullptr;
    float* y_float = nullptr;

    // The same matrices from element `at` on.
    GemmOutput from(int64_t at) const {
      return {z_float ? z_float + at : nullptr, z_int8 ? z_int8 + at : nullptr, y_int8 ? y_int8 + at : nullptr,
              y_float ? y_float + at : nullptr};
    }
  };

  GemmOutput gemm_output(const Tensor* z, Tensor& y) const {
    GemmOutput o;
    if (z && z->dtype() == DType::kFloat32) o.z_float = z->data<float>();
    if (z && z->dtype() == DType::kInt8) o.z_int8 = z->data<int8_t>();
    if (y_scale_ > 0.f) o.y_int8 = y.data<int8_t>();
    else o.y_float = y.data<float>();
    return o;
  }

  // B [K x columns] (row-major, ldb; or its transpose [columns x K] when b_transposed) packed
  // into panels, then every tile of A's panels against them through the epilogue; output
  // element (m, column) at m * stride + column.
  void multiply(const Int8PackedA& a, const int8_t* b, int64_t ldb, bool b_transposed, int64_t K, int64_t columns,
                int64_t m_first, int64_t m_count, int64_t at, int64_t stride, const float* bias,
                const GemmOutput& o) const {
    const int64_t panels = (columns + kInt8GemmCols - 1) / kInt8GemmCols;
    const int64_t panel_bytes = int8_b_panel_bytes(a);
    thread_local AlignedVector<uint8_t> packed;  // the calling thread's, kept between runs
    packed.resize(std::max(packed.size(), static_cast<size_t>(checked_mul(panels, panel_bytes, "the packed input"))));
    uint8_t* packed_data = packed.data();
    parallel_for(panels, [&](int64_t first, int64_t last) {
      for (int64_t p = first; p < last; ++p) {
        const int64_t cols = std::min<int64_t>(kInt8GemmCols, columns - p * kInt8GemmCols);
        if (b_transposed)
          int8_pack_b_panel_transposed(b, ldb, K, a.k_padded, p * kInt8GemmCols, cols, packed_data + p * panel_bytes);
        else
          int8_pack_b_panel(b, ldb, K, a.k_padded, p * kInt8GemmCols, cols, packed_data + p * panel_bytes);
      }
    });
    const int64_t a_panels = a.panel_count();
    // Consecutive tasks share a B panel, which stays in cache while the weights stream.
    parallel_for(panels * a_panels, [&](int64_t first, int64_t last) {
      alignas(64) int32_t tile[kInt8GemmMaxRows * kInt8GemmCols];
      AmxTileScope tiles(a.isa == Int8GemmIsa::kAmx);
      for (int64_t t = first; t < last; ++t) {
        const int64_t p = t / a_panels, ap = t % a_panels;
        int8_tile(a, ap, packed_data + p * panel_bytes, tile);
        const int64_t n0 = p * kInt8GemmCols, cols = std::min<int64_t>(kInt8GemmCols, columns - n0);
        const int64_t m0 = m_first + ap * a.rows;
        const int64_t rows = std::min<int64_t>(a.rows, m_count - ap * a.rows);
        const int32_t* shift = a.shift.data() + ap * a.rows;
        const int64_t tile_at = at + (m0 - m_first) * stride + n0;
        if (int8_gemm_on_ymm(a.isa)) epilogue_avx2(tile, shift, m0, rows, tile_at, stride, cols, bias, o);
        else epilogue_avx512(tile, shift, m0, rows, tile_at, stride, cols, bias, o);
      }
    });
  }

  // A product written as a 1x1 convolution of 1x1 images, one per row ([rows, K, 1, 1], as the
  // INT8 pass writes a transformer's MatMul): the rows are the GEMM's columns. X is B's
  // transpose, packed as it is; the residual is transposed into [M x rows], and Y back from
  // [M x rows].
  void run_rows(const int8_t* x, int64_t rows, int64_t K, int64_t M, const float* bias, const Tensor* z,
                Tensor& y) const {
    thread_local std::vector<unsigned char> z_t, y_t;
    GemmOutput o;
    if (z) {
      const size_t z_bytes = static_cast<size_t>(z->numel()) * element_size(z->dtype());
      z_t.resize(std::max(z_t.size(), z_bytes));
      if (z->dtype() == DType::kFloat32) {
        transpose_matrix(z->data<float>(), rows, M, reinterpret_cast<float*>(z_t.data()));
        o.z_float = reinterpret_cast<const float*>(z_t.data());
      } else {
        transpose_matrix(z->data<int8_t>(), rows, M, reinterpret_cast<int8_t*>(z_t.data()));
        o.z_int8 = reinterpret_cast<const int8_t*>(z_t.data());
      }
    }
    y_t.resize(std::max(y_t.size(), static_cast<size_t>(y.numel()) * element_size(y.dtype())));
    if (y_scale_ > 0.f) o.y_int8 = reinterpret_cast<int8_t*>(y_t.data());
    else o.y_float = reinterpret_cast<float*>(y_t.data());
    multiply(packed_[0], x, K, true, K, rows, 0, M, 0, rows, bias, o);
    if (o.y_int8) transpose_matrix(o.y_int8, M, rows, y.data<int8_t>());
    else transpose_matrix(o.y_float, M, rows, y.data<float>());
  }

  // dst [cols x rows] = src [rows x cols].
  template <class T>
  static void transpose_matrix(const T* src, int64_t rows, int64_t cols, T* dst) {
    if constexpr (std::is_same_v<T, float>) {
      transpose_floats(src, rows, cols, dst);
    } else {
      constexpr int64_t kBlock = 64;
      parallel_for_each((rows + kBlock - 1) / kBlock, rows * cols > 65536, [&](int64_t rb) {
        const int64_t r0 = rb * kBlock, r1 = std::min(rows, r0 + kBlock);
        for (int64_t c0 = 0; c0 < cols; c0 += kBlock)
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < std::min(cols, c0 + kBlock); ++c) dst[c * rows + r] = src[r * cols + c];
      });
    }
  }

  // Rows [c0 * kernel, c1 * kernel) of the int8 im2col matrix (unroll's layout, 0 outside),
  // copying runs of input rows, or whole shifted planes where the output is the input's size.
  static void unroll_int8(const Geo3& g, const int8_t* x, int64_t c0, int64_t c1, int8_t* col) {
    const int64_t N = g.out_size(), W = g.out[2];
    const bool same_size = g.k[0] == 1 && g.in[0] == 1 && g.out[0] == 1 && g.s[1] == 1 && g.s[2] == 1 &&
                           g.out[1] == g.in[1] && g.out[2] == g.in[2];
    if (same_size) return unroll_shifted_planes(g, x, c0, c1, col);
    for (int64_t c = c0; c < c1; ++c) {
      const int8_t* xc = x + c * g.in_size();
      for (int64_t k0 = 0; k0 < g.k[0]; ++k0)
        for (int64_t k1 = 0; k1 < g.k[1]; ++k1)
          for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
            int8_t* dst = col + (((c * g.k[0] + k0) * g.k[1] + k1) * g.k[2] + k2) * N;
            // Output columns [lo, hi) read inside the input row (input column rises with o2).
            const int64_t shift = k2 * g.d[2] - g.p[2];
            int64_t lo = 0, hi;
            while (lo < W && lo * g.s[2] + shift < 0) ++lo;
            hi = lo;
            while (hi < W && hi * g.s[2] + shift < g.in[2]) ++hi;
            for (int64_t o0 = 0; o0 < g.out[0]; ++o0) {
              const int64_t i0 = o0 * g.s[0] - g.p[0] + k0 * g.d[0];
              for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
                const int64_t i1 = o1 * g.s[1] - g.p[1] + k1 * g.d[1];
                int8_t* row = dst + (o0 * g.out[1] + o1) * W;
                if (i0 < 0 || i0 >= g.in[0] || i1 < 0 || i1 >= g.in[1]) {
                  std::memset(row, 0, static_cast<size_t>(W));
                  continue;
                }
                const int8_t* src = xc + (i0 * g.in[1] + i1) * g.in[2] + shift;
                std::memset(row, 0, static_cast<size_t>(lo));
                if (g.s[2] == 1) {
                  std::memcpy(row + lo, src + lo, static_cast<size_t>(hi - lo));
                } else {
                  for (int64_t o2 = lo; o2 < hi; ++o2) row[o2] = src[o2 * g.s[2]];
                }
                std::memset(row + hi, 0, static_cast<size_t>(W - hi));
              }
            }
          }
    }
  }

  // unroll_int8 for a 2-D stride-1 convolution whose output is its input's size (every 3x3
  // "same" convolution): the row of tap (kh, kw) is the input plane shifted by (kh * d - p) rows
  // and (kw * d - p) columns, one copy per tap, then zeros where the tap falls outside.
  static void unroll_shifted_planes(const Geo3& g, const int8_t* x, int64_t c0, int64_t c1, int8_t* col) {
    const int64_t H = g.in[1], W = g.in[2], N = H * W;
    for (int64_t c = c0; c < c1; ++c) {
      const int8_t* xc = x + c * N;
      for (int64_t kh = 0; kh < g.k[1]; ++kh)
        for (int64_t kw = 0; kw < g.k[2]; ++kw) {
          int8_t* dst = col + ((c * g.k[1] + kh) * g.k[2] + kw) * N;
          const int64_t dh = kh * g.d[1] - g.p[1], dw = kw * g.d[2] - g.p[2];
          // Rows [h0, h1) and columns [w0, w1) of the output read inside the input.
          const int64_t h0 = std::clamp<int64_t>(-dh, 0, H), h1 = std::clamp<int64_t>(H - dh, h0, H);
          const int64_t w0 = std::clamp<int64_t>(-dw, 0, W), w1 = std::clamp<int64_t>(W - dw, w0, W);
          std::memset(dst, 0, static_cast<size_t>(h0 * W));
          std::memset(dst + h1 * W, 0, static_cast<size_t>((H - h1) * W));
          if (h1 <= h0) continue;
          // dst[i] = xc[i + shift] for i in [h0 * W, h1 * W), the source clipped to the plane
          // (what it clips lies in the columns zeroed below).
          const int64_t shift = dh * W + dw;
          const int64_t first = std::max(h0 * W, -shift), last = std::min(h1 * W, N - shift);
          if (first > h0 * W) std::memset(dst + h0 * W, 0, static_cast<size_t>(first - h0 * W));
          if (last > first) std::memcpy(dst + first, xc + first + shift, static_cast<size_t>(last - first));
          if (h1 * W > last) std::memset(dst + std::max(last, first), 0, static_cast<size_t>(h1 * W - std::max(last, first)));
          if (w0 > 0 || w1 < W)
            for (int64_t h = h0; h < h1; ++h) {
              int8_t* row = dst + h * W;
              for (int64_t w = 0; w < w0; ++w) row[w] = 0;
              for (int64_t w = w1; w < W; ++w) row[w] = 0;
            }
        }
    }
  }

#pragma GCC diagnostic push
  // GCC 12's AVX-512 headers start some results from _mm512_undefined_*(), which it then
  // reports as maybe uninitialized once inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
  // epilogue() on a tile of the int8 GEMM (rows of kInt8GemmCols sums, less shift[r]: channels
  // m0.., written `stride` apart from element `at`) with AVX-512, 16 at a time: the same
  // operations in the same order, so the same bytes. Only int8 or float32 Y and residuals
  // (float8 runs run_typed).
  __attribute__((target("avx512f,avx512bw,avx512vl"))) void epilogue_avx512(
      const int32_t* tile, const int32_t* shift, int64_t m0, int64_t rows, int64_t at, int64_t stride, int64_t cols,
      const float* bias, const GemmOutput& o) const {
    const GemmOutput t = o.from(at);
    const float* zf = t.z_float;
    const int8_t* zq = t.z_int8;
    int8_t* yq = t.y_int8;
    float* yf = t.y_int8 ? nullptr : t.y_float;
    const ir::ActivationKind kind = act_.kind;
    const __m512 z_scale = _mm512_set1_ps(z_scale_);
    const __m512 inv = _mm512_set1_ps(inv_y_scale_);
    const __m512 zero = _mm512_setzero_ps();
    const __m512 lo = _mm512_set1_ps(act_.alpha), hi = _mm512_set1_ps(act_.beta);
    const __m512 qmin = _mm512_set1_ps(-128.f), qmax = _mm512_set1_ps(127.f);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t m = m0 + r, row = r * stride;
      const __m512 mult = _mm512_set1_ps(multiplier_[static_cast<size_t>(m)]);
      const __m512 b = _mm512_set1_ps(bias ? bias[m] : 0.f);
      const __m512i row_shift = _mm512_set1_epi32(shift[r]);
      for (int64_t p = 0; p < cols; p += 16) {
        const __mmask16 mask =
            cols - p >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (cols - p)) - 1);
        const int64_t e = row + p;
        const __m512i acc = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(mask, tile + r * kInt8GemmCols + p), row_shift);
        __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), mult, b);
        if (zf) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, zf + e));
        if (zq) {
          const __m512i zi = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, zq + e));
          v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_cvtepi32_ps(zi), z_scale));
        }
        if (kind == ir::ActivationKind::kRelu) {
          v = _mm512_max_ps(v, zero);  // v > 0 ? v : 0
        } else if (kind == ir::ActivationKind::kClip) {
          v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));  // NaN stays NaN
        } else if (kind != ir::ActivationKind::kNone) {
          alignas(64) float values[16];
          _mm512_store_ps(values, v);
          for (float& value : values) value = act_.apply(value);
          v = _mm512_load_ps(values);
        }
        if (yq) {
          // Clamped before the conversion (which would turn a large value into INT_MIN), then
          // rounded half to even as nearbyint() is in the default rounding mode.
          const __m512 q = _mm512_min_ps(qmax, _mm512_max_ps(qmin, _mm512_mul_ps(v, inv)));
          _mm512_mask_cvtsepi32_storeu_epi8(yq + e, mask, _mm512_cvtps_epi32(q));
        } else {
          _mm512_mask_storeu_ps(yf + e, mask, v);
        }
      }
    }
  }
#pragma GCC diagnostic pop

  // epilogue_avx512 for CPUs without AVX-512 (the AVX2 int8 GEMM's), 8 at a time: the same
  // operations in the same order (max and min with the same operand order, so NaN goes the same
  // way; the clamped value converted, then narrowed by saturating packs), so the same bytes.
  __attribute__((target("avx2,fma"))) void epilogue_avx2(const int32_t* tile, const int32_t* shift, int64_t m0,
                                                         int64_t rows, int64_t at, int64_t stride, int64_t cols,
                                                         const float* bias, const GemmOutput& o) const {
    const GemmOutput t = o.from(at);
    const float* zf = t.z_float;
    const int8_t* zq = t.z_int8;
    int8_t* yq = t.y_int8;
    float* yf = t.y_int8 ? nullptr : t.y_float;
    const ir::ActivationKind kind = act_.kind;
    const __m256 z_scale = _mm256_set1_ps(z_scale_);
    const __m256 inv = _mm256_set1_ps(inv_y_scale_);
    const __m256 zero = _mm256_setzero_ps();
    const __m256 lo = _mm256_set1_ps(act_.alpha), hi = _mm256_set1_ps(act_.beta);
    const __m256 qmin = _mm256_set1_ps(-128.f), qmax = _mm256_set1_ps(127.f);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t m = m0 + r, row = r * stride;
      const __m256 mult = _mm256_set1_ps(multiplier_[static_cast<size_t>(m)]);
      const __m256 b = _mm256_set1_ps(bias ? bias[m] : 0.f);
      const __m256i row_shift = _mm256_set1_epi32(shift[r]);
      for (int64_t p = 0; p < cols; p += 8) {
        const int64_t n = std::min<int64_t>(8, cols - p);
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lane);
        const int64_t e = row + p;
        // The tile's rows hold 32 sums whatever `cols` is: whole loads stay inside it.
        const __m256i acc = _mm256_sub_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + r * kInt8GemmCols + p)), row_shift);
        __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), mult, b);
        if (zf) v = _mm256_add_ps(v, _mm256_maskload_ps(zf + e, mask));
        if (zq) {
          int64_t eight = 0;  // n bytes, the rest zeros
          std::memcpy(&eight, zq + e, static_cast<size_t>(n));
          const __m256i zi = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(eight));
          v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_cvtepi32_ps(zi), z_scale));
        }
        if (kind == ir::ActivationKind::kRelu) {
          v = _mm256_max_ps(v, zero);
        } else if (kind == ir::ActivationKind::kClip) {
          v = _mm256_min_ps(hi, _mm256_max_ps(lo, v));
        } else if (kind != ir::ActivationKind::kNone) {
          alignas(32) float values[8];
          _mm256_store_ps(values, v);
          for (float& value : values) value = act_.apply(value);
          v = _mm256_load_ps(values);
        }
        if (yq) {
          const __m256i q = _mm256_cvtps_epi32(_mm256_min_ps(qmax, _mm256_max_ps(qmin, _mm256_mul_ps(v, inv))));
          const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
          const int64_t bytes = _mm_cvtsi128_si64(_mm_packs_epi16(words, words));
          std::memcpy(yq + e, &bytes, static_cast<size_t>(n));
        } else {
          _mm256_maskstore_ps(yf + e, mask, v);
        }
      }
    }
  }

  // X and W are int8 (unrolled to int16, summed in int32: exact) or float8e4m3fn bytes
  // (unrolled to their float32 values, summed in float32).
  template <class Q, class Col, class Acc>
  void run_typed(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
    const Tensor& xt = *in[0];
    const Tensor& wt = *in[1];
    const Geo3 g = make_geo3(node_, xt.shape(), wt.shape(), false);
    const Q* x = static_cast<const Q*>(xt.raw());
    const Q* w = static_cast<const Q*>(wt.raw());
    const float* bias = in.size() > 2 && in[2] ? in[2]->data<float>() : nullptr;
    const Tensor* z = in.size() > 3 ? in[3] : nullptr;
    if (out[0].numel() == 0) return;

    const int64_t C = g.in_c, M = g.out_c, G = g.group, Cg = C / G, Mg = M / G;
    const int64_t K = Cg * g.kernel_size(), N = g.out_size();
    const int64_t jobs = g.batch * G;
    const int threads = thread_count();
    // Each job (image, group) unrolls its window, then runs its output channels; with fewer
    // jobs than threads the channels of one job are split between the threads instead.
    auto run_job = [&](int64_t j, bool split_channels) {
      const int64_t n = j / G, gi = j % G;
      std::vector<Col> col(static_cast<size_t>(K * N));
      unroll(g, x + (n * C + gi * Cg) * g.in_size(), Cg, col.data());
      parallel_for(Mg, [&](int64_t first, int64_t last) {
        std::vector<Acc> acc(static_cast<size_t>(N));
        for (int64_t mi = first; mi < last; ++mi) {
          const int64_t m = gi * Mg + mi;
          std::fill(acc.begin(), acc.end(), Acc{0});
          const Q* wm = w + m * K;
          for (int64_t k = 0; k < K; ++k) {
            const Acc wk = value<Acc>(wm[k]);
            if (wk == Acc{0}) continue;
            const Col* c = col.data() + k * N;
            Acc* a = acc.data();
            for (int64_t p = 0; p < N; ++p) a[p] += wk * static_cast<Acc>(c[p]);
          }
          epilogue(acc.data(), m, (n * M + m) * N, N, bias, z, out[0]);
        }
      }, split_channels);
    };
    if (threads > 1 && jobs >= threads) {
      parallel_for_each(jobs, true, [&](int64_t j) {
        run_job(j, false);
      }, 1);
    } else {
      for (int64_t j = 0; j < jobs; ++j) run_job(j, threads > 1);
    }
  }

  // An element's value: int8 as an integer, float8e4m3fn (bytes) as its float.
  template <class T, class Q> static T value(Q q) {
    if constexpr (std::is_same_v<Q, uint8_t>) return static_cast<T>(float8e4m3fn_to_float(q));
    else return static_cast<T>(q);
  }

  // col[(c * kernel + tap) * N + p] = x at the tap's input position for output p, 0 outside.
  template <class Q, class Col>
  static void unroll(const Geo3& g, const Q* x, int64_t channels, Col* col) {
    const int64_t N = g.out_size();
    for (int64_t c = 0; c < channels; ++c) {
      const Q* xc = x + c * g.in_size();
      for (int64_t k0 = 0; k0 < g.k[0]; ++k0)
        for (int64_t k1 = 0; k1 < g.k[1]; ++k1)
          for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
            Col* dst = col + (((c * g.k[0] + k0) * g.k[1] + k1) * g.k[2] + k2) * N;
            for (int64_t o0 = 0; o0 < g.out[0]; ++o0) {
              const int64_t i0 = o0 * g.s[0] - g.p[0] + k0 * g.d[0];
              for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
                const int64_t i1 = o1 * g.s[1] - g.p[1] + k1 * g.d[1];
                Col* row = dst + (o0 * g.out[1] + o1) * g.out[2];
                const bool inside = i0 >= 0 && i0 < g.in[0] && i1 >= 0 && i1 < g.in[1];
                for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
                  const int64_t i2 = o2 * g.s[2] - g.p[2] + k2 * g.d[2];
                  row[o2] = inside && i2 >= 0 && i2 < g.in[2] ? value<Col>(xc[(i0 * g.in[1] + i1) * g.in[2] + i2]) : Col{0};
                }
              }
            }
          }
    }
  }

  // The op's epilogue for output channel m: n values from acc to Y at element offset `at`.
  template <class Acc>
  void epilogue(const Acc* acc, int64_t m, int64_t at, int64_t n, const float* bias, const Tensor* z, Tensor& y) const {
    const float mult = multiplier_[static_cast<size_t>(m)];
    const float b = bias ? bias[m] : 0.f;
    const float* zf = z && z->dtype() == DType::kFloat32 ? z->data<float>() + at : nullptr;
    const int8_t* zq = z && z->dtype() == DType::kInt8 ? z->data<int8_t>() + at : nullptr;
    const uint8_t* z8 = z && z->dtype() == DType::kFloat8E4M3FN ? static_cast<const uint8_t*>(z->raw()) + at : nullptr;
    auto value_at = [&](int64_t p) {
      float v = std::fma(static_cast<float>(acc[p]), mult, b);
      if (zf) v += zf[p];
      if (zq) v += static_cast<float>(zq[p]) * z_scale_;
      if (z8) v += float8e4m3fn_to_float(z8[p]) * z_scale_;
      return act_.apply(v);
    };
    if (y_scale_ > 0.f && y.dtype() == DType::kFloat8E4M3FN) {
      uint8_t* out = static_cast<uint8_t*>(y.raw()) + at;
      for (int64_t p = 0; p < n; ++p) out[p] = float_to_float8e4m3fn(value_at(p) * inv_y_scale_);
    } else if (y_scale_ > 0.f) {
      int8_t* out = y.data<int8_t>() + at;
      for (int64_t p = 0; p < n; ++p) out[p] = static_cast<int8_t>(std::clamp(std::nearbyint(value_at(p) * inv_y_scale_), -128.f, 127.f));
    } else {
      float* out = y.data<float>() + at;
      for (int64_t p = 0; p < n; ++p) out[p] = value_at(p);
    }
  }

  const ir::Node& node_;
  ir::Activation act_;
  float x_scale_, z_scale_, y_scale_;
  float inv_y_scale_;  // 1 / y_scale, the op's requantizing factor
  std::vector<float> w_scales_;
  std::vector<float> multiplier_;  // x_scale * w_scales[m]
  std::vector<Int8PackedA> packed_;  // per group, for the int8 GEMM (empty: the portable loop)
  bool int8_input_ = false;          // X is int8 (not float8e4m3fn, whose loop reads W)
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(quantized_conv) {
  KernelEntry e;
  e.op = "QConv";
  e.domain = "kiln";
  e.dtypes = "int8 -> int8, float32; float8e4m3fn -> float8e4m3fn, float32";
  e.create = [](const KernelInit& init) { return std::make_unique<QConvKernel>(init); };
  e.packed_inputs = {1};
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
