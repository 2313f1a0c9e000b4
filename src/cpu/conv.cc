// CPU kernels of Conv, kiln::FusedConv and ConvTranspose (float32; 1-D, 2-D and 3-D).
//
// Conv runs as a GEMM per image and group on kiln's own packed sgemm (cpu/sgemm.h):
// Y_g[M/G x OHW] = W_g[M/G x K] @ col[K x OHW], with K = C/G * kernel size. W_g is packed once
// when the kernel is created (when W is a constant); col is never built as a whole: the GEMM
// packs its panels straight from X (im2col while packing), or from X itself for a 1x1 stride-1
// unpadded conv. The epilogue (bias, residual, activation) is applied on each output tile
// while it is in registers / L1. Constant 3x3 filters of stride 1 run Winograd's F(2x2, 3x3)
// instead on AVX-512 CPUs (conv_winograd.h): 16 GEMMs of transformed tiles. Depthwise convs (one
// input channel per group) run a direct loop: their GEMMs would be 1 x k x OHW, too thin for a
// GEMM.
//
// Every conv runs as a 3-D one: 1-D and 2-D inputs get leading spatial dims of size 1.

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu/aligned_vector.h"
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

// The range [lo, hi) of output positions o (0 <= o < out) whose input o * s + off is in
// [0, in).
inline void valid_range(int64_t off, int64_t s, int64_t in, int64_t out, int64_t& lo, int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + s - 1) / s;
  hi = (in - 1 - off) < 0 ? 0 : (in - 1 - off) / s + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
}

class ConvKernel final : public Kernel {
 public:
  ConvKernel(const KernelInit& init, bool fused)
      : node_(init.node), fused_(fused), epilogue_(fused ? ir::Activation::from_node(init.node) : ir::Activation{}) {
    // Constant weights are packed once, here, for every group (a loaded engine's panels taken as
    // they are), also where Winograd applies: its transformed filters are made from the panels
    // by the first run it pays on.
    const Tensor* w = init.constants.size() > 1 ? init.constants[1] : nullptr;
    const int64_t group = init.node.attrs.get_int("group", 1);
    if (w && w->dtype() == DType::kFloat32 && w->rank() >= 3 && group >= 1 && w->dim(0) > 0 &&
        w->dim(0) % group == 0 && !(w->dim(1) == 1 && group > 1)) {
      winograd_applies_ = WinogradConv::applies(init.node, w->shape(), group);
      const ir::PackedConstant* pack = init.packed_input(1);
      if (!(pack && adopt_packed(*pack, w->shape(), group, packed_))) {
        pack_weights(constant_values(*w, pack).data<float>(), w->dim(0), w->numel() / w->dim(0), group);
        if (group > 1) share_one_buffer(packed_);  // the groups' panels one after another: one pack
      }
      w_shape_ = w->shape();
      const_weights_ = true;
    }
  }

  std::vector<std::pair<size_t, ir::PackedConstant>> packed_constants() const override {
    if (!const_weights_) return {};
    return {{1, packed_constant(packed_)}};
  }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    const Tensor& xt = *in[0];
    const Tensor& wt = *in[1];
    const Geo3 g = make_geo3(node_, xt.shape(), wt.shape(), false);
    const float* x = xt.data<float>();
    const float* w = wt.data<float>();
    const float* bias = in.size() > 2 && in[2] ? in[2]->data<float>() : nullptr;
    const float* z = fused_ && in.size() > 3 && in[3] ? in[3]->data<float>() : nullptr;
    float* y = out[0].data<float>();
    if (out[0].numel() == 0) return;

    const int64_t C = g.in_c, M = g.out_c, G = g.group;
    const int64_t Cg = C / G, Mg = M / G;
    if (Cg == 1 && G > 1) {
      depthwise(g, x, w, bias, z, y);
      return;
    }
    if (winograd_applies_ && WinogradConv::runs_geometry(g) && WinogradConv::pays(g)) {
      // Runs are one at a time (CpuEngine::run): the first that pays makes the transformed filters.
      if (!winograd_)
        winograd_ = std::make_unique<WinogradConv>(unpack_constant(packed_constant(packed_), w_shape_).data<float>(), M, C);
      winograd_->run(g, x, bias, z, epilogue_, y);
      return;
    }
    const int64_t K = Cg * g.kernel_size(), Nin = g.in_size(), N = g.out_size();
    // X itself is the B matrix only when the output is X's grid: a 1x1 kernel, stride 1 and no
    // pads at either end (fuzz_graph: end pads [0, 1] made the output wider than X, and the
    // packing read past it).
    const bool direct = g.kernel_size() == 1 && g.s[0] == 1 && g.s[1] == 1 && g.s[2] == 1 && g.p[0] == 0 &&
                        g.p[1] == 0 && g.p[2] == 0 && N == Nin;
    if (!const_weights_) pack_weights(w, M, K, G);  // weights computed by the graph: packed every run
    if (N <= kNarrowN)  // the transposed product for narrow outputs reads A in 32-row panels
      for (int64_t gi = 0; gi < G; ++gi)
        if (!packed_[static_cast<size_t>(gi)].has_wide_panels()) packed_[static_cast<size_t>(gi)].add_wide_panels();
    const int threads = thread_count();
    const int64_t jobs = g.batch * G;

    Im2col geo;
    for (int i = 0; i < 3; ++i) {
      geo.in[i] = g.in[i];
      geo.out[i] = g.out[i];
      geo.k[i] = g.k[i];
      geo.s[i] = g.s[i];
      geo.d[i] = g.d[i];
      geo.p[i] = g.p[i];
    }
    // One (image, group) problem on `nthreads` threads.
    auto run_job = [&](int64_t j, int nthreads) {
      const float* xj = x + ((j / G) * C + (j % G) * Cg) * Nin;
      const int64_t y_off = ((j / G) * M + (j % G) * Mg) * N;
      Im2col im = geo;
      im.x = xj;
      SgemmB b;
      if (direct) {
        b.data = xj;
        b.ld = N;
      } else {
        b.conv = &im;
      }
      SgemmEpilogue ep;
      ep.row_bias = bias ? bias + (j % G) * Mg : nullptr;
      ep.residual = z ? z + y_off : nullptr;
      ep.ld_residual = N;
      ep.act = &epilogue_;
      packed_sgemm(packed_[static_cast<size_t>(j % G)], N, b, y + y_off, N, ep, nthreads);
    };
    if (threads > 1 && jobs >= threads) {
      // Enough independent problems: one per thread at a time.
      parallel_for_each(jobs, true, [&](int64_t j) {
        run_job(j, 1);
      }, 1);
    } else {
      for (int64_t j = 0; j < jobs; ++j) run_job(j, threads);
    }
  }

 private:
  // W [M, K] (K = C/G * kernel size) into one PackedA per group.
  void pack_weights(const float* w, int64_t m, int64_t k, int64_t group) {
    const int64_t mg = m / group;
    packed_.resize(static_cast<size_t>(group));
    for (int64_t gi = 0; gi < group; ++gi) packed_[static_cast<size_t>(gi)].pack(w + gi * mg * k, mg, k, k);
  }

  // One input channel per group: a direct loop per output channel, row by row.
  void depthwise(const Geo3& g, const float* x, const float* w, const float* bias, const float* z, float* y) const {
    const int64_t C = g.in_c, M = g.out_c, Mg = M / g.group;
    const int64_t Nin = g.in_size(), N = g.out_size(), kk = g.kernel_size();
    const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
    const int64_t D = g.in[0], H = g.in[1], W = g.in[2];
    const int64_t jobs = g.batch * M;
    const bool three_by_three = D == 1 && OD == 1 && g.k[0] == 1 && g.k[1] == 3 && g.k[2] == 3 && g.d[1] == 1 &&
                                g.d[2] == 1 && g.s[1] == g.s[2] && (g.s[1] == 1 || g.s[1] == 2);
    if (channel_vectors_apply(g, three_by_three)) {
      const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
      const int lanes_per_vector = avx512 ? kLanes : 8;
      const int64_t groups = (M + lanes_per_vector - 1) / lanes_per_vector;
      DepthwiseEpilogue ep;
      ep.clamp = epilogue_.clamp_mode(ep.lo, ep.hi);
      parallel_for_each(g.batch * groups, true, [&](int64_t j) {
        const int64_t b = j / groups, m0 = j % groups * lanes_per_vector;
        const int lanes = static_cast<int>(std::min<int64_t>(lanes_per_vector, M - m0));
        float* yc = y + (b * M + m0) * N;
        (avx512 ? depthwise_channel_vectors : depthwise_channel_vectors8)(
            g, x + (b * C + m0) * Nin, w + m0 * kk, bias ? bias + m0 : nullptr, z ? z + (b * M + m0) * N : nullptr,
            lanes, ep, yc);
        if (ep.clamp < 0) epilogue_.apply(yc, N, lanes, N, nullptr, nullptr, nullptr, N);
      });
      return;
    }
    parallel_for_each(jobs, true, [&](int64_t j) {
      const int64_t b = j / M, m = j % M;
      const float* xc = x + (b * C + m / Mg) * Nin;
      const float* wm = w + m * kk;
      float* yc = y + j * N;
      if (three_by_three) {
        // Bias, residual and Relu/Clip in registers; other activations in a pass after.
        DepthwiseEpilogue ep;
        ep.bias = bias ? bias[m] : 0.f;
        ep.residual = z ? z + j * N : nullptr;
        ep.clamp = epilogue_.clamp_mode(ep.lo, ep.hi);
        depthwise3x3_plane(g, xc, wm, ep, yc);
        if (ep.clamp < 0) epilogue_.apply(yc, N, 1, N, nullptr, nullptr, nullptr, N);
        return;
      }
      for (int64_t od = 0; od < OD; ++od)
        for (int64_t oh = 0; oh < OH; ++oh) {
          float* yrow = yc + (od * OH + oh) * OW;
          std::fill(yrow, yrow + OW, 0.f);
          for (int64_t kd = 0; kd < g.k[0]; ++kd) {
            const int64_t id = od * g.s[0] - g.p[0] + kd * g.d[0];
            if (id < 0 || id >= D) continue;
            for (int64_t kh = 0; kh < g.k[1]; ++kh) {
              const int64_t ih = oh * g.s[1] - g.p[1] + kh * g.d[1];
              if (ih < 0 || ih >= H) continue;
              const float* xrow = xc + (id * H + ih) * W;
              for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                const float wv = wm[(kd * g.k[1] + kh) * g.k[2] + kw];
                const int64_t off = kw * g.d[2] - g.p[2];
                int64_t lo, hi;
                valid_range(off, g.s[2], W, OW, lo, hi);
                if (g.s[2] == 1) {
                  const float* xs = xrow + off;
                  for (int64_t ow = lo; ow < hi; ++ow) yrow[ow] += wv * xs[ow];
                } else {
                  for (int64_t ow = lo; ow < hi; ++ow) yrow[ow] += wv * xrow[ow * g.s[2] + off];
                }
              }
            }
          }
        }
      epilogue_.apply(yc, N, 1, N, bias ? bias + m : nullptr, nullptr, z ? z + j * N : nullptr, N);
    });
  }

  // What a depthwise plane adds to its sums before storing them: y = clamp(sum + bias +
  // residual), in Epilogue::apply's order; clamp as Epilogue::clamp_mode (-1: none here).
  struct DepthwiseEpilogue {
    float bias = 0.f;
    const float* residual = nullptr;  // the plane's, or null
    int clamp = 0;
    float lo = 0.f, hi = 0.f;
  };

  static constexpr int kLanes = 16;  // channels per vector of depthwise_channel_vectors

  // Whether depthwise_channel_vectors (AVX-512) or depthwise_channel_vectors8 (AVX2) runs this
  // depthwise convolution: 2-D, one output channel per input channel, and either not the 3x3
  // kernel of the rows below (the general loop runs other kernels one scalar at a time) or, on
  // AVX-512, rows of fewer than 16 outputs, which leave most of the rows' vectors empty
  // (MobileNet's 7x7 and 14x14 planes: docs/design/cpu-gemm.md, "Depthwise convolutions across
  // channels"). Planes up to 256 x 256 padded (a 4 MB buffer).
  static bool channel_vectors_apply(const Geo3& g, bool three_by_three) {
    const SgemmIsa isa = sgemm_isa();
    if (isa == SgemmIsa::kPlain || g.in[0] != 1 || g.out[0] != 1 || g.k[0] != 1 || g.in_c != g.out_c) return false;
    const int64_t Hp = (g.out[1] - 1) * g.s[1] + (g.k[1] - 1) * g.d[1] + 1;
    const int64_t Wp = (g.out[2] - 1) * g.s[2] + (g.k[2] - 1) * g.d[2] + 1;
    if (Hp > 256 || Wp > 256) return false;
    if (isa == SgemmIsa::kAvx2) return !three_by_three;
    return !three_by_three || g.out[2] < 16;
  }

  // What depthwise_channel_vectors and depthwise_channel_vectors8 share: the plane's padded
  // extent, the input rows and columns inside it, and the calling thread's buffers for L channels
  // a vector, with the `lanes` channels' filters laid out a tap at a time. The copy writes the
  // same positions for every group of one geometry and nothing else writes the padded buffer, so
  // its padding is zeroed only when the geometry (or L) changes; lanes past `lanes` are written
  // as zeros, and their sums are never stored.
  struct ChannelVectorPlan {
    int64_t Hp, Wp, c0, c1, r0, r1;  // padded extent; columns [c0, c1) and rows [r0, r1) inside
    float* padded;                    // [Hp][Wp][L]
    float* sums;                      // [OH * OW][L]
    float* filters;                   // [taps][L]
  };
  static ChannelVectorPlan plan_channel_vectors(const Geo3& g, const float* w, int lanes, int L) {
    const int64_t OH = g.out[1], OW = g.out[2], N = OH * OW, taps = g.k[1] * g.k[2];
    ChannelVectorPlan plan;
    plan.Hp = (OH - 1) * g.s[1] + (g.k[1] - 1) * g.d[1] + 1;
    plan.Wp = (OW - 1) * g.s[2] + (g.k[2] - 1) * g.d[2] + 1;
    plan.c0 = std::max<int64_t>(0, g.p[2]);
    plan.c1 = std::min<int64_t>(plan.Wp, g.in[2] + g.p[2]);
    plan.r0 = std::max<int64_t>(0, g.p[1]);
    plan.r1 = std::min<int64_t>(plan.Hp, g.in[1] + g.p[1]);
    struct Buffers {
      std::vector<float> padded, sums, filters;
      std::array<int64_t, 7> geometry{};
    };
    thread_local Buffers buf;
    const std::array<int64_t, 7> geometry{plan.Hp, plan.Wp, plan.c0, plan.c1, plan.r0, plan.r1, L};
    if (buf.geometry != geometry || buf.padded.empty()) {
      buf.padded.assign(static_cast<size_t>(plan.Hp * plan.Wp * L), 0.f);
      buf.geometry = geometry;
    }
    if (static_cast<int64_t>(buf.sums.size()) < N * L) buf.sums.resize(static_cast<size_t>(N * L));
    buf.filters.assign(static_cast<size_t>(taps * L), 0.f);
    for (int l = 0; l < lanes; ++l)
      for (int64_t t = 0; t < taps; ++t) buf.filters[static_cast<size_t>(t * L + l)] = w[l * taps + t];
    plan.padded = buf.padded.data();
    plan.sums = buf.sums.data();
    plan.filters = buf.filters.data();
    return plan;
  }

  // A depthwise convolution of `lanes` (<= 16) channels at once, one channel per vector lane:
  // the planes are copied, transposed 16 x 16 in registers, into a zero-padded buffer (the
  // calling thread's) of 16 floats per position, and every output is one vector of 16 channels,
  // its taps added in the general loop's order (kh, then kw) with fused multiply-adds; the sums
  // are transposed back, 16 positions at a time, and the bias, the residual and Relu/Clip added
  // as depthwise3x3_stride2_rows_avx512 does. A tap in the padding adds w * 0 where the general
  // loop skips it: the same sums, up to the sign of a zero sum. xc, w, bias, z and yc point at
  // the first channel's plane, filter, bias, residual and output plane.
  __attribute__((target("avx512f"))) static void depthwise_channel_vectors(const Geo3& g, const float* xc,
                                                                            const float* w, const float* bias,
                                                                            const float* z, int lanes,
                                                                            const DepthwiseEpilogue& ep, float* yc) {
    const int64_t H = g.in[1], W = g.in[2], OH = g.out[1], OW = g.out[2], SH = g.s[1], SW = g.s[2];
    const int64_t top = g.p[1], left = g.p[2], plane = H * W, N = OH * OW;
    const ChannelVectorPlan plan = plan_channel_vectors(g, w, lanes, kLanes);
    const int64_t Wp = plan.Wp, c0 = plan.c0, c1 = plan.c1, r0 = plan.r0, r1 = plan.r1;
    float* padded = plan.padded;
    float* sums = plan.sums;
    const float* filters = plan.filters;

    // Input rows 16 columns at a time: a load per channel, transposed, a store per column.
    __m512 v[kLanes];
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t q = c0 - left; q < c1 - left; q += kLanes) {
        const int cols = static_cast<int>(std::min<int64_t>(kLanes, c1 - left - q));
        const __mmask16 inside = static_cast<__mmask16>((1u << cols) - 1);
        const float* src = xc + (r - top) * W + q;
        for (int l = 0; l < kLanes; ++l)
          v[l] = l < lanes ? _mm512_maskz_loadu_ps(inside, src + l * plane) : _mm512_setzero_ps();
        transpose16x16(v);
        float* dst = padded + (r * Wp + q + left) * kLanes;
        for (int c = 0; c < cols; ++c) _mm512_storeu_ps(dst + c * kLanes, v[c]);
      }

    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* at = padded + oh * SH * Wp * kLanes;
      float* out = sums + oh * OW * kLanes;
      int64_t ow = 0;
      for (; ow + 8 <= OW; ow += 8) channel_vector_outputs<8>(at + ow * SW * kLanes, filters, g, Wp, out + ow * kLanes);
      if (ow + 4 <= OW) {  // rows of 7 and 14 outputs: 4 + 2 + 1 and 8 + 4 + 2
        channel_vector_outputs<4>(at + ow * SW * kLanes, filters, g, Wp, out + ow * kLanes);
        ow += 4;
      }
      if (ow + 2 <= OW) {
        channel_vector_outputs<2>(at + ow * SW * kLanes, filters, g, Wp, out + ow * kLanes);
        ow += 2;
      }
      if (ow < OW) channel_vector_outputs<1>(at + ow * SW * kLanes, filters, g, Wp, out + ow * kLanes);
    }

    const __m512 zero = _mm512_setzero_ps(), lo = _mm512_set1_ps(ep.lo), hi = _mm512_set1_ps(ep.hi);
    for (int64_t p0 = 0; p0 < N; p0 += kLanes) {
      const int count = static_cast<int>(std::min<int64_t>(kLanes, N - p0));
      const __mmask16 stored = static_cast<__mmask16>((1u << count) - 1);
      for (int i = 0; i < kLanes; ++i) v[i] = i < count ? _mm512_loadu_ps(sums + (p0 + i) * kLanes) : zero;
      transpose16x16(v);
      for (int l = 0; l < lanes; ++l) {
        __m512 acc = _mm512_add_ps(v[l], _mm512_set1_ps(bias ? bias[l] : 0.f));
        if (z) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(stored, z + l * N + p0));
        if (ep.clamp == 1) acc = _mm512_max_ps(acc, zero);  // Relu: NaN becomes 0, as Epilogue::apply
        else if (ep.clamp == 2) acc = _mm512_min_ps(hi, _mm512_max_ps(lo, acc));  // Clip keeps NaN
        _mm512_mask_storeu_ps(yc + l * N + p0, stored, acc);
      }
    }
  }

  // U neighbouring outputs of a row (16 channels each) of depthwise_channel_vectors, from the
  // padded position of the first one's first tap: U independent sums, so the FMAs of one do not
  // wait on the last one's latency (one output at a time took 4 cycles a tap), each filter
  // vector loaded once for the U.
  template <int U>
  __attribute__((target("avx512f"), always_inline)) static inline void channel_vector_outputs(
      const float* at, const float* filters, const Geo3& g, int64_t Wp, float* out) {
    const int64_t KH = g.k[1], KW = g.k[2], SW = g.s[2] * kLanes, DH = g.d[1], DW = g.d[2] * kLanes;
    __m512 acc[U];
    for (int u = 0; u < U; ++u) acc[u] = _mm512_setzero_ps();
    for (int64_t kh = 0; kh < KH; ++kh) {
      const float* row = at + kh * DH * Wp * kLanes;
      const float* f = filters + kh * KW * kLanes;
      for (int64_t kw = 0; kw < KW; ++kw) {
        const __m512 fv = _mm512_loadu_ps(f + kw * kLanes);
        for (int u = 0; u < U; ++u) acc[u] = _mm512_fmadd_ps(fv, _mm512_loadu_ps(row + kw * DW + u * SW), acc[u]);
      }
    }
    for (int u = 0; u < U; ++u) _mm512_storeu_ps(out + u * kLanes, acc[u]);
  }

  // depthwise_channel_vectors on AVX2, 8 channels a vector (kernels other than 3x3 only, which
  // ran the general scalar loop there): the 8 x 8 blocks transposed by transpose_8x8, partial
  // blocks (fewer than 8 channels or columns) one float at a time; the epilogue added per channel
  // after the sums are transposed back, in Epilogue::apply's order.
  static void depthwise_channel_vectors8(const Geo3& g, const float* xc, const float* w, const float* bias,
                                         const float* z, int lanes, const DepthwiseEpilogue& ep, float* yc) {
    constexpr int L = 8;
    const int64_t H = g.in[1], W = g.in[2], OH = g.out[1], OW = g.out[2], SH = g.s[1], SW = g.s[2];
    const int64_t top = g.p[1], left = g.p[2], plane = H * W, N = OH * OW;
    const ChannelVectorPlan plan = plan_channel_vectors(g, w, lanes, L);
    const int64_t Wp = plan.Wp, c0 = plan.c0, c1 = plan.c1, r0 = plan.r0, r1 = plan.r1;
    float* padded = plan.padded;
    float* sums = plan.sums;
    const float* filters = plan.filters;

    for (int64_t r = r0; r < r1; ++r)
      for (int64_t q = c0 - left; q < c1 - left; q += L) {
        const int64_t cols = std::min<int64_t>(L, c1 - left - q);
        const float* src = xc + (r - top) * W + q;
        float* dst = padded + (r * Wp + q + left) * L;
        if (lanes == L && cols == L) {
          transpose_8x8(src, plane, dst, L);
        } else {
          for (int64_t c = 0; c < cols; ++c)
            for (int l = 0; l < L; ++l) dst[c * L + l] = l < lanes ? src[l * plane + c] : 0.f;
        }
      }

    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* at = padded + oh * SH * Wp * L;
      float* out = sums + oh * OW * L;
      int64_t ow = 0;
      for (; ow + 4 <= OW; ow += 4) channel_vector_outputs8<4>(at + ow * SW * L, filters, g, Wp, out + ow * L);
      for (; ow < OW; ++ow) channel_vector_outputs8<1>(at + ow * SW * L, filters, g, Wp, out + ow * L);
    }

    int64_t p0 = 0;
    if (lanes == L)
      for (; p0 + L <= N; p0 += L) transpose_8x8(sums + p0 * L, L, yc + p0, N);
    for (int l = 0; l < lanes; ++l) {
      for (int64_t p = p0; p < N; ++p) yc[l * N + p] = sums[p * L + l];
      const float b = bias ? bias[l] : 0.f;
      const float* zl = z ? z + l * N : nullptr;
      float* y = yc + l * N;
      for (int64_t p = 0; p < N; ++p) {
        float v = y[p] + b;
        if (zl) v += zl[p];
        if (ep.clamp == 1) {
          v = v > 0.f ? v : 0.f;  // NaN becomes 0, as Epilogue::apply
        } else if (ep.clamp == 2) {  // Clip keeps NaN
          if (v < ep.lo) v = ep.lo;
          if (v > ep.hi) v = ep.hi;
        }
        y[p] = v;
      }
    }
  }

  // channel_vector_outputs on AVX2: U outputs of 8 channels each.
  template <int U>
  __attribute__((always_inline)) static inline void channel_vector_outputs8(const float* at, const float* filters,
                                                                            const Geo3& g, int64_t Wp, float* out) {
    constexpr int L = 8;
    const int64_t KH = g.k[1], KW = g.k[2], SW = g.s[2] * L, DH = g.d[1], DW = g.d[2] * L;
    __m256 acc[U];
    for (int u = 0; u < U; ++u) acc[u] = _mm256_setzero_ps();
    for (int64_t kh = 0; kh < KH; ++kh) {
      const float* row = at + kh * DH * Wp * L;
      const float* f = filters + kh * KW * L;
      for (int64_t kw = 0; kw < KW; ++kw) {
        const __m256 fv = _mm256_loadu_ps(f + kw * L);
        for (int u = 0; u < U; ++u) acc[u] = _mm256_fmadd_ps(fv, _mm256_loadu_ps(row + kw * DW + u * SW), acc[u]);
      }
    }
    for (int u = 0; u < U; ++u) _mm256_storeu_ps(out + u * L, acc[u]);
  }

  // v[c] becomes column c of the 16 x 16 matrix whose rows were v[0..15]: unpacks of pairs of
  // floats, then of pairs of doubles, then two rounds of shuffles of 128-bit lanes.
  __attribute__((target("avx512f"))) static void transpose16x16(__m512* v) {
    __m512 t[kLanes];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
      const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
      const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
      v[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
      v[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
      v[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
      v[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j) {
        t[8 * i + j] = _mm512_shuffle_f32x4(v[8 * i + j], v[8 * i + 4 + j], 0x88);
        t[8 * i + 4 + j] = _mm512_shuffle_f32x4(v[8 * i + j], v[8 * i + 4 + j], 0xdd);
      }
    for (int j = 0; j < 8; ++j) {
      v[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
      v[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
  }

  // One channel of a 3x3 depthwise convolution (dilation 1, 2-D, stride 1 or 2), every output,
  // edges included, adding its nine taps in registers in the general loop's order (kh, then kw)
  // with the same fused multiply-adds. Both strides read the input in place on AVX-512
  // (depthwise3x3_stride{1,2}_rows_avx512); stride 2 also on AVX2 where most of a row's groups of
  // outputs read whole loads (depthwise3x3_stride2_rows_avx2); otherwise the input plane is copied into a
  // zero-padded buffer (the calling thread's) and the rows run 8 outputs at a time. A tap in the
  // padding adds w * 0, or is left out, where the general loop skips it: the sums are the same,
  // up to the sign of a zero sum.
  static void depthwise3x3_plane(const Geo3& g, const float* xc, const float* w9, const DepthwiseEpilogue& ep,
                                 float* yc) {
    const int64_t H = g.in[1], W = g.in[2], OH = g.out[1], OW = g.out[2], s = g.s[1];
    const int64_t top = g.p[1], left = g.p[2];
    if (s == 2 && sgemm_isa() == SgemmIsa::kAvx512) {
      depthwise3x3_stride2_rows_avx512(xc, H, W, top, left, OH, OW, w9, ep, yc);
      return;
    }
    if (s == 1 && sgemm_isa() == SgemmIsa::kAvx512) {
      depthwise3x3_stride1_rows_avx512(xc, H, W, top, left, OH, OW, w9, ep, yc);
      return;
    }
    if (s == 2 && mostly_whole_groups(W, left, OW)) {
      depthwise3x3_stride2_rows_avx2(xc, H, W, top, left, OH, OW, w9, ep, yc);
      return;
    }
    // Padded row r holds input row r - top, column c input column c - left. The loads of a
    // row's last group of outputs reach past its last tap, into kPlaneSlack at the plane's end.
    // The copy writes the same entries for every plane of one geometry and nothing else writes
    // the buffer, so the padding is zeroed only when the geometry changes (once per layer and
    // thread, not per channel: zeroing each plane cost a tenth of the layer).
    const int64_t Hp = (OH - 1) * s + 3, Wp = (OW - 1) * s + 3;
    const int64_t c0 = std::max<int64_t>(0, left), c1 = std::min<int64_t>(Wp, W + left);  // columns inside
    const int64_t r0 = std::max<int64_t>(0, top), r1 = std::min<int64_t>(Hp, H + top);     // rows inside
    struct PaddedPlane {
      std::vector<float> floats;
      std::array<int64_t, 6> geometry{};
    };
    thread_local PaddedPlane plane;
    const std::array<int64_t, 6> geometry{Hp, Wp, c0, c1, r0, r1};
    if (plane.geometry != geometry || plane.floats.empty()) {
      plane.floats.assign(static_cast<size_t>(Hp * Wp + kPlaneSlack), 0.f);
      plane.geometry = geometry;
    }
    float* padded = plane.floats.data();
    if (c1 > c0)
      for (int64_t r = r0; r < r1; ++r)
        std::memcpy(padded + r * Wp + c0, xc + (r - top) * W + (c0 - left), static_cast<size_t>(c1 - c0) * sizeof(float));
    __m256 w[9];
    for (int i = 0; i < 9; ++i) w[i] = _mm256_set1_ps(w9[i]);
    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* rows = padded + oh * s * Wp;
      for (int64_t ow = 0; ow < OW; ow += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int kh = 0; kh < 3; ++kh) {
          const float* x = rows + kh * Wp + ow * s;
          if (s == 1) {
            acc = _mm256_fmadd_ps(w[kh * 3], _mm256_loadu_ps(x), acc);
            acc = _mm256_fmadd_ps(w[kh * 3 + 1], _mm256_loadu_ps(x + 1), acc);
            acc = _mm256_fmadd_ps(w[kh * 3 + 2], _mm256_loadu_ps(x + 2), acc);
          } else {
            const __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
            acc = _mm256_fmadd_ps(w[kh * 3], evens8(a, b), acc);
            acc = _mm256_fmadd_ps(w[kh * 3 + 1], odds8(a, b), acc);
            acc = _mm256_fmadd_ps(w[kh * 3 + 2], evens8(_mm256_loadu_ps(x + 2), _mm256_loadu_ps(x + 10)), acc);
          }
        }
        store8(acc, ep, yc, oh, ow, OW);
      }
    }
  }

  // [a0 a2 a4 a6 b0 b2 b4 b6] and [a1 a3 a5 a7 b1 b3 b5 b7]: the even and odd inputs of two
  // loads, by two shuffles and a permute each (a loop over x[2 ow] makes GCC insert one value at
  // a time).
  static __m256 evens8(__m256 a, __m256 b) {
    const __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
  }
  static __m256 odds8(__m256 a, __m256 b) {
    const __m256 o = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
  }

  // Whether at least half of a stride-2 row's groups of 8 outputs read input columns c .. c + 17
  // (c = 16 g - left) all inside the row of W, so that their loads need no masks. Masked loads
  // cost more than the padded copy where most groups need them (MobileNet's 28 x 28 and 14 x 14
  // planes: docs/design/cpu-gemm.md, "On AVX2: stride 2 in place where rows are wide").
  static bool mostly_whole_groups(int64_t W, int64_t left, int64_t OW) {
    const int64_t groups = (OW + 7) / 8;
    int64_t whole = 0;
    for (int64_t g = 0; g < groups; ++g) whole += 16 * g - left >= 0 && 16 * g - left + 18 <= W;
    return 2 * whole >= groups;
  }

  // Adds the epilogue to 8 sums of outputs ow.. of row oh and stores those inside the row.
  static void store8(__m256 acc, const DepthwiseEpilogue& ep, float* yc, int64_t oh, int64_t ow, int64_t OW) {
    const __m256i inside =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(OW - ow)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    acc = _mm256_add_ps(acc, _mm256_set1_ps(ep.bias));
    if (ep.residual) acc = _mm256_add_ps(acc, _mm256_maskload_ps(ep.residual + oh * OW + ow, inside));
    if (ep.clamp == 1) {
      acc = _mm256_max_ps(acc, _mm256_setzero_ps());  // Relu: NaN becomes 0, as Epilogue::apply
    } else if (ep.clamp == 2) {
      acc = _mm256_min_ps(_mm256_set1_ps(ep.hi), _mm256_max_ps(_mm256_set1_ps(ep.lo), acc));  // Clip keeps NaN
    }
    float* y = yc + oh * OW + ow;
    if (ow + 8 <= OW) _mm256_storeu_ps(y, acc);
    else _mm256_maskstore_ps(y, inside, acc);
  }

  // The lanes of 8 floats at input column c of a row of W that lie inside the row [0, W).
  static __m256i lanes_inside(int64_t c, int64_t W) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int first = static_cast<int>(std::max<int64_t>(-9, -c - 1));
    const int end = static_cast<int>(std::min<int64_t>(9, W - c));
    const __m256i from_start = _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(first));
    const __m256i before_end = _mm256_cmpgt_epi32(_mm256_set1_epi32(end), lane);
    return _mm256_and_si256(from_start, before_end);
  }

  // The stride-2 rows of depthwise3x3_plane on AVX2, 8 outputs at a time, reading the input in
  // place as the AVX-512 rows below do (a copy into a padded plane, four times the output's size
  // at stride 2, cost a quarter of the layer on wide planes). Loads that reach past a row's ends
  // are masked (lanes outside read as zero, never touched), with the masks made once per group
  // of outputs: made per load, they cost more than the copy. Rows in order, as the copy read
  // them: walking the plane a column of groups at a time was twice as slow on MobileNet's
  // 112 x 112 planes, which do not fit in L1.
  static void depthwise3x3_stride2_rows_avx2(const float* xc, int64_t H, int64_t W, int64_t top, int64_t left,
                                             int64_t OH, int64_t OW, const float* w9, const DepthwiseEpilogue& ep,
                                             float* yc) {
    __m256 w[9];
    for (int i = 0; i < 9; ++i) w[i] = _mm256_set1_ps(w9[i]);
    constexpr int64_t kLoadAt[4] = {0, 8, 2, 10};  // the columns a group's four loads start at, past c
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ow += 8) {
        // Input columns c .. c + 17 feed these 8 outputs (the last lanes' past OW are not stored).
        const int64_t c = ow * 2 - left;
        const bool whole = c >= 0 && c + 18 <= W;
        __m256i mask[4];
        if (!whole)
          for (int i = 0; i < 4; ++i) mask[i] = lanes_inside(c + kLoadAt[i], W);
        const auto load = [&](const float* x, int i) {
          return whole ? _mm256_loadu_ps(x + kLoadAt[i]) : _mm256_maskload_ps(x + kLoadAt[i], mask[i]);
        };
        __m256 acc = _mm256_setzero_ps();
        for (int kh = 0; kh < 3; ++kh) {
          const int64_t ih = oh * 2 - top + kh;
          if (ih < 0 || ih >= H) continue;  // a row of padding: its taps add w * 0
          const float* x = xc + ih * W + c;
          const __m256 a = load(x, 0), b = load(x, 1);
          acc = _mm256_fmadd_ps(w[kh * 3], evens8(a, b), acc);
          acc = _mm256_fmadd_ps(w[kh * 3 + 1], odds8(a, b), acc);
          acc = _mm256_fmadd_ps(w[kh * 3 + 2], evens8(load(x, 2), load(x, 3)), acc);
        }
        store8(acc, ep, yc, oh, ow, OW);
      }
  }

  // Floats past the padded plane that the row loads may touch: a stride-2 group of 8 outputs
  // reads up to 15 floats past the last tap of its row, a stride-1 group up to 7.
  static constexpr int64_t kPlaneSlack = 16;

  // 16 floats at `x`, input column c of a row of W (`whole`: all inside it): the lanes outside
  // [0, W) are neither read nor faulted on, and read as zero, as the padding.
  // The lanes of 16 floats from input column c on that lie inside a row of W (masked-off lanes
  // are neither read nor faulted on, and read as zero).
  static __mmask16 row_mask16(int64_t c, int64_t W) {
    const int64_t first = std::max<int64_t>(0, -c), end = std::min<int64_t>(16, W - c);
    if (end <= first) return 0;
    return static_cast<__mmask16>(((1u << end) - 1) & ~((1u << first) - 1));
  }

  // The bias, residual and Relu/Clip of the 16 sums of a row's group of outputs (from ow), stored
  // without the lanes past OW.
  __attribute__((target("avx512f"), always_inline)) static inline void store_row_group(
      __m512 acc, const DepthwiseEpilogue& ep, int64_t oh, int64_t OW, int64_t ow, float* yrow) {
    const int64_t left_over = OW - ow;
    const __mmask16 stored =
        left_over >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left_over) - 1);
    acc = _mm512_add_ps(acc, _mm512_set1_ps(ep.bias));
    if (ep.residual) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(stored, ep.residual + oh * OW + ow));
    if (ep.clamp == 1) acc = _mm512_max_ps(acc, _mm512_setzero_ps());  // Relu: NaN becomes 0, as Epilogue::apply
    else if (ep.clamp == 2)  // Clip keeps NaN
      acc = _mm512_min_ps(_mm512_set1_ps(ep.hi), _mm512_max_ps(_mm512_set1_ps(ep.lo), acc));
    _mm512_mask_storeu_ps(yrow + ow, stored, acc);
  }

  // The stride-2 rows of depthwise3x3_plane on AVX-512, 16 outputs at a time: one permute of two
  // loads gives 16 even or odd inputs, where AVX2 takes two shuffles and a permute for 8 (the
  // shuffles, not the FMAs, bound that loop). The input is read in place, without a padded copy
  // (four times the output's size at stride 2: on MobileNet's small planes it cost as much as
  // the arithmetic): a row of padding is left out, and loads that reach past a row's ends are
  // masked, their lanes zero. The same FMAs in the same order as the AVX2 rows: the same sums,
  // up to the sign of a zero sum (the AVX2 rows of a padded copy add w * 0 for a row of padding).
  // (Stride 1 read in place 16 outputs at a time was slower than the AVX2 path with its copy
  // while each load made its own mask; with the masks made once per group it is faster:
  // docs/design/cpu-gemm.md, "Stride 2 read in place".)
  __attribute__((target("avx512f"))) static void depthwise3x3_stride2_rows_avx512(
      const float* xc, int64_t H, int64_t W, int64_t top, int64_t left, int64_t OH, int64_t OW, const float* w9,
      const DepthwiseEpilogue& ep, float* yc) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 w[9];
    for (int i = 0; i < 9; ++i) w[i] = _mm512_set1_ps(w9[i]);
    // A group of 16 outputs loads input columns c, c + 16, c + 2 and c + 18 of each of its rows
    // (c = 2 ow - left): the four masks are the same in every row, so they are made once per
    // group here, not per load (MobileNet's rows of 28 and 14 outputs mask every group, and the
    // masks cost more than the arithmetic).
    constexpr int64_t kMaxGroups = 64;
    const int64_t groups = (OW + 15) / 16;
    __mmask16 group_masks[kMaxGroups][4];
    const bool masks_made = groups <= kMaxGroups;
    if (masks_made)
      for (int64_t gi = 0; gi < groups; ++gi) {
        const int64_t c = gi * 32 - left;
        const int64_t offsets[4] = {0, 16, 2, 18};
        for (int i = 0; i < 4; ++i) group_masks[gi][i] = row_mask16(c + offsets[i], W);
      }
    for (int64_t oh = 0; oh < OH; ++oh) {
      float* yrow = yc + oh * OW;
      for (int64_t ow = 0; ow < OW; ow += 16) {
        // Input columns c .. c + 33 feed these 16 outputs (the last lanes' past OW are not stored).
        const int64_t c = ow * 2 - left;
        __mmask16 m[4];
        for (int i = 0; i < 4; ++i)
          m[i] = masks_made ? group_masks[ow / 16][i] : row_mask16(c + (i == 1 ? 16 : i == 2 ? 2 : i == 3 ? 18 : 0), W);
        __m512 acc = _mm512_setzero_ps();
        for (int kh = 0; kh < 3; ++kh) {
          const int64_t ih = oh * 2 - top + kh;
          if (ih < 0 || ih >= H) continue;  // a row of padding: its taps add w * 0
          const float* x = xc + ih * W + c;
          const __m512 a = _mm512_maskz_loadu_ps(m[0], x), b = _mm512_maskz_loadu_ps(m[1], x + 16);
          acc = _mm512_fmadd_ps(w[kh * 3], _mm512_permutex2var_ps(a, even, b), acc);
          acc = _mm512_fmadd_ps(w[kh * 3 + 1], _mm512_permutex2var_ps(a, odd, b), acc);
          const __m512 a2 = _mm512_maskz_loadu_ps(m[2], x + 2), b2 = _mm512_maskz_loadu_ps(m[3], x + 18);
          acc = _mm512_fmadd_ps(w[kh * 3 + 2], _mm512_permutex2var_ps(a2, even, b2), acc);
        }
        store_row_group(acc, ep, oh, OW, ow, yrow);
      }
    }
  }

  // The stride-1 rows on AVX-512, read in place the same way: a group of 16 outputs loads input
  // columns c, c + 1 and c + 2 of each of its rows (c = ow - left), with the three masks made
  // once per group and plane.
  __attribute__((target("avx512f"))) static void depthwise3x3_stride1_rows_avx512(
      const float* xc, int64_t H, int64_t W, int64_t top, int64_t left, int64_t OH, int64_t OW, const float* w9,
      const DepthwiseEpilogue& ep, float* yc) {
    __m512 w[9];
    for (int i = 0; i < 9; ++i) w[i] = _mm512_set1_ps(w9[i]);
    constexpr int64_t kMaxGroups = 64;
    const int64_t groups = (OW + 15) / 16;
    __mmask16 group_masks[kMaxGroups][3];
    const bool masks_made = groups <= kMaxGroups;
    if (masks_made)
      for (int64_t gi = 0; gi < groups; ++gi)
        for (int kw = 0; kw < 3; ++kw) group_masks[gi][kw] = row_mask16(gi * 16 - left + kw, W);
    for (int64_t oh = 0; oh < OH; ++oh) {
      float* yrow = yc + oh * OW;
      for (int64_t ow = 0; ow < OW; ow += 16) {
        const int64_t c = ow - left;
        __mmask16 m[3];
        for (int kw = 0; kw < 3; ++kw) m[kw] = masks_made ? group_masks[ow / 16][kw] : row_mask16(c + kw, W);
        __m512 acc = _mm512_setzero_ps();
        for (int kh = 0; kh < 3; ++kh) {
          const int64_t ih = oh - top + kh;
          if (ih < 0 || ih >= H) continue;  // a row of padding: its taps add w * 0
          const float* x = xc + ih * W + c;
          acc = _mm512_fmadd_ps(w[kh * 3], _mm512_maskz_loadu_ps(m[0], x), acc);
          acc = _mm512_fmadd_ps(w[kh * 3 + 1], _mm512_maskz_loadu_ps(m[1], x + 1), acc);
          acc = _mm512_fmadd_ps(w[kh * 3 + 2], _mm512_maskz_loadu_ps(m[2], x + 2), acc);
        }
        store_row_group(acc, ep, oh, OW, ow, yrow);
      }
    }
  }

  const ir::Node& node_;
  bool fused_;
  Epilogue epilogue_;
  std::vector<PackedA> packed_;  // W per group, MR-row panels
  bool const_weights_ = false;   // packed_ holds the constant W (else it is packed per run)
  std::vector<int64_t> w_shape_;  // the constant W's
  bool winograd_applies_ = false;  // constant 3x3 filters of stride 1
  std::unique_ptr<WinogradConv> winograd_;  // their transformed filters, made on the first run Winograd pays on
};

// ConvTranspose as GEMM + col2im: col[M/G * k x HWin] = W_g^T @ X_g, then every column entry
// is added to the output position it lands on.
class ConvTransposeKernel final : public Kernel {
 public:
  explicit ConvTransposeKernel(const ir::Node& node) : node_(node) { use_single_threaded_blas(); }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    const Tensor& xt = *in[0];
    const Tensor& wt = *in[1];
    const Geo3 g = make_geo3(node_, xt.shape(), wt.shape(), true);
    const float* x = xt.data<float>();
    const float* w = wt.data<float>();
    const float* bias = in.size() > 2 && in[2] ? in[2]->data<float>() : nullptr;
    float* y = out[0].data<float>();
    if (out[0].numel() == 0) return;
    const int64_t C = g.in_c, M = g.out_c, G = g.group, Cg = C / G, Mg = M / G;
    const int64_t kk = g.kernel_size(), Nin = g.in_size(), N = g.out_size(), R = Mg * kk;
    const int64_t ID = g.in[0], IH = g.in[1], IW = g.in[2];
    const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
    // Output channel m of image b, group gi: its bias, then every column entry of `col` (that
    // image and group's product) added where it lands, kernel positions in order.
    auto scatter = [&](int64_t b, int64_t gi, const float* col, int64_t m) {
      float* ym = y + (b * M + gi * Mg + m) * N;
      const float bv = bias ? bias[gi * Mg + m] : 0.f;
      std::fill(ym, ym + N, bv);
      for (int64_t kr = 0; kr < kk; ++kr) {
        const int64_t kd = kr / (g.k[1] * g.k[2]), kh = (kr / g.k[2]) % g.k[1], kw = kr % g.k[2];
        const float* crow = col + (m * kk + kr) * Nin;
        int64_t w_lo, w_hi;  // input columns iw that land inside the output
        // ow = iw * s - p + kw * d: valid for iw in a range.
        {
          const int64_t off = kw * g.d[2] - g.p[2];
          w_lo = off >= 0 ? 0 : (-off + g.s[2] - 1) / g.s[2];
          w_hi = (OW - 1 - off) < 0 ? 0 : (OW - 1 - off) / g.s[2] + 1;
          w_hi = std::min(w_hi, IW);
        }
        for (int64_t id = 0; id < ID; ++id) {
          const int64_t od = id * g.s[0] - g.p[0] + kd * g.d[0];
          if (od < 0 || od >= OD) continue;
          for (int64_t ih = 0; ih < IH; ++ih) {
            const int64_t oh = ih * g.s[1] - g.p[1] + kh * g.d[1];
            if (oh < 0 || oh >= OH) continue;
            float* yrow = ym + (od * OH + oh) * OW;
            const float* c = crow + (id * IH + ih) * IW;
            for (int64_t iw = w_lo; iw < w_hi; ++iw) yrow[iw * g.s[2] - g.p[2] + kw * g.d[2]] += c[iw];
          }
        }
      }
    };
    const int64_t tasks = g.batch * G;
    if (tasks >= 2 * thread_count()) {
      // Images enough for every thread: each (image, group) is a product and its scatter on one
      // thread, into a column buffer of that range's own (a Mask R-CNN mask head's 100 regions
      // of 14 x 14 ran as 100 products too small to split well, one after another).
      parallel_for(tasks, [&](int64_t begin, int64_t end) {
        // (Not zero-filled: the product overwrites every column.)
        const std::unique_ptr<float[]> own(new float[static_cast<size_t>(R * Nin)]);
        for (int64_t t = begin; t < end; ++t) {
          const int64_t b = t / G, gi = t % G;
          sgemm(true, false, R, Nin, Cg, 1.f, w + gi * Cg * R, R, x + (b * C + gi * Cg) * Nin, Nin, 0.f, own.get(), Nin);
          for (int64_t m = 0; m < Mg; ++m) scatter(b, gi, own.get(), m);
        }
      });
      return;
    }
    if (static_cast<int64_t>(col_.size()) < R * Nin) col_.resize(static_cast<size_t>(R * Nin));
    float* col = col_.data();
    for (int64_t b = 0; b < g.batch; ++b)
      for (int64_t gi = 0; gi < G; ++gi) {
        const float* xg = x + (b * C + gi * Cg) * Nin;
        const float* wg = w + gi * Cg * R;  // [Cg, Mg * kk]
        parallel_sgemm(true, false, R, Nin, Cg, 1.f, wg, R, xg, Nin, 0.f, col, Nin);
        parallel_for_each(Mg, true, [&](int64_t m) { scatter(b, gi, col, m); });
      }
  }

 private:
  const ir::Node& node_;
  AlignedVector<float> col_;
};

std::string check_conv(const KernelInit& init) {
  if (init.dtype(0) != DType::kFloat32 || init.dtype(1) != DType::kFloat32)
    return "input type " + to_string(init.dtype(0)) + " is not supported (supported: float32)";
  int rank = init.input_types[0]->rank();
  if (rank >= 0 && (rank < 3 || rank > 5))
    return "rank-" + std::to_string(rank) + " input: the CPU engine runs 1-D, 2-D and 3-D convolutions";
  return "";
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(conv) {
  for (const char* op : {"Conv", "FusedConv"}) {
    KernelEntry e;
    e.op = op;
    e.domain = std::string(op) == "FusedConv" ? "kiln" : "";
    e.check = check_conv;
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) -> std::unique_ptr<Kernel> {
      return std::make_unique<ConvKernel>(init, init.node.op == "FusedConv");
    };
    e.packed_inputs = {1};
    registry.add(std::move(e));
  }
  KernelEntry e;
  e.op = "ConvTranspose";
  e.check = check_conv;
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) -> std::unique_ptr<Kernel> {
    return std::make_unique<ConvTransposeKernel>(init.node);
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
