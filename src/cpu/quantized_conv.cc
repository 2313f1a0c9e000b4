// The CPU kernel of kiln::QConv (src/ops/quantized_conv.cc): the exact integer reference of
// kiln's INT8 convolutions. Products and sums are int32, as on the GPU's tensor cores, so a
// test can hold the GPU to this kernel's integers; only the epilogue is float32, in the order
// the op's definition gives (acc * scale + B as one fused multiply-add, so that the result does
// not depend on whether the compiler contracts it).
//
// Per image and group, the window is unrolled once into an int16 matrix col[K x OHW]
// (K = C/group * kernel size; padding reads 0, which is the real 0 of a symmetric scale), and
// each output channel accumulates W[m, k] * col[k, :] row by row: a loop the compiler
// vectorizes, fast enough for CI's models without a hand-written integer GEMM.

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/conv_shape.h"
#include "cpu/gemm_util.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "ir/activation.h"

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
  }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    if (in[0]->dtype() == DType::kFloat8E4M3FN) run_typed<uint8_t, float, float>(in, out);
    else run_typed<int8_t, int16_t, int32_t>(in, out);
  }

 private:
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
    if (static_cast<int64_t>(multiplier_.size()) != g.out_c)
      throw node_.error(ErrorKind::kInvalidModel, "w_scales has " + std::to_string(multiplier_.size()) +
                                                      " entries for " + std::to_string(g.out_c) + " output channels");

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
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(quantized_conv) {
  KernelEntry e;
  e.op = "QConv";
  e.domain = "kiln";
  e.dtypes = "int8 -> int8, float32; float8e4m3fn -> float8e4m3fn, float32";
  e.create = [](const KernelInit& init) { return std::make_unique<QConvKernel>(init); };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
