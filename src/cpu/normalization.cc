// CPU kernels of Softmax, LogSoftmax, Hardmax, LpNormalization, LayerNormalization, RMSNormalization,
// InstanceNormalization, GroupNormalization and MeanVarianceNormalization (float32). The input is
// seen as [outer, axis, inner]; the common last-axis case (inner == 1) runs over contiguous rows.
// GCC 12's AVX-512 intrinsics start from an "undefined" vector (and a 256-bit cast to 512 bits
// leaves its upper half so) and trip -Wmaybe-uninitialized and -Wuninitialized when inlined here;
// the warnings are about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/broadcast.h"
#include "cpu/double_sums.h"
#include "cpu/gemm_util.h"
#include "ir/activation.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "cpu/quantize.h"
#include "cpu/sgemm.h"

namespace kiln::cpu {

namespace {

struct AxisSplit {
  int64_t outer = 1, axis = 1, inner = 1;
};

AxisSplit split_at(const std::vector<int64_t>& shape, int64_t axis) {
  AxisSplit s;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (axis < 0) axis += rank;
  for (int64_t i = 0; i < rank; ++i) {
    if (i < axis) s.outer *= shape[static_cast<size_t>(i)];
    else if (i == axis) s.axis = shape[static_cast<size_t>(i)];
    else s.inner *= shape[static_cast<size_t>(i)];
  }
  return s;
}

enum class Norm { kSoftmax, kLogSoftmax, kHardmax, kL1, kL2 };

// One strided row of `n` elements: softmax, log-softmax or Lp normalization in place of y.
inline void normalize_row(const float* x, float* y, int64_t n, int64_t stride, Norm kind) {
  if (kind == Norm::kL1 || kind == Norm::kL2) {
    float acc = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      float v = x[i * stride];
      acc += kind == Norm::kL1 ? std::fabs(v) : v * v;
    }
    float norm = kind == Norm::kL1 ? acc : std::sqrt(acc);
    // A zero vector stays zero (ONNX Runtime and the ONNX reference give 0, not 0/0 = NaN).
    const float inv = norm > 0.f ? 1.f / norm : 0.f;
    for (int64_t i = 0; i < n; ++i) y[i * stride] = x[i * stride] * inv;
    return;
  }
  if (kind == Norm::kHardmax) {
    // 1 at the first largest element, as numpy's argmax picks it (NaN counts as the largest).
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      const float v = x[i * stride], b = x[best * stride];
      if (!std::isnan(b) && (std::isnan(v) || v > b)) best = i;
    }
    for (int64_t i = 0; i < n; ++i) y[i * stride] = i == best ? 1.f : 0.f;
    return;
  }
  // Subtracting the max keeps exp() finite.
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i * stride]);
  float sum = 0.f;
  if (kind == Norm::kSoftmax) {
    for (int64_t i = 0; i < n; ++i) {
      float e = std::exp(x[i * stride] - m);
      y[i * stride] = e;
      sum += e;
    }
    float inv = 1.f / sum;
    for (int64_t i = 0; i < n; ++i) y[i * stride] *= inv;
  } else {
    for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i * stride] - m);
    float shift = m + std::log(sum);
    for (int64_t i = 0; i < n; ++i) y[i * stride] = x[i * stride] - shift;
  }
}

void softmax_like(const ir::Node& node, const Tensor& in, Tensor& out, Norm kind) {
  if (in.numel() == 0) return;
  AxisSplit s = split_at(in.shape(), node.attrs.get_int("axis", -1));
  const float* x = in.data<float>();
  float* y = out.data<float>();
  const int64_t lines = s.outer * s.inner;
  parallel_for_each(lines, in.numel() > 32768, [&](int64_t l) {
    int64_t o = l / s.inner, i = l % s.inner;
    int64_t base = o * s.axis * s.inner + i;
    normalize_row(x + base, y + base, s.axis, s.inner, kind);
  });
}

// `param` (Scale or B) broadcast to `target` dims, as a dense vector.
std::vector<float> expand_to(const Tensor& param, const std::vector<int64_t>& target) {
  int64_t n = shape_numel(target);
  std::vector<float> out(static_cast<size_t>(n));
  const float* p = param.data<float>();
  if (param.numel() == n) {
    std::copy(p, p + n, out.begin());
    return out;
  }
  BroadcastPlan plan = plan_broadcast(target, {&param.shape()});
  int64_t inner = plan.inner();
  for (int64_t r = 0; r < plan.rows(); ++r) {
    int64_t off;
    plan.row_offsets(r, &off);
    for (int64_t i = 0; i < inner; ++i) out[static_cast<size_t>(r * inner + i)] = p[off + i * plan.strides[0].back()];
  }
  return out;
}

// The sum of squared deviations from `mean`, x - mean in double.
__attribute__((target("avx512f"))) double row_squares_avx512(const float* x, int64_t n, double mean) {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  const __m512d m = _mm512_set1_pd(mean);
  for (int64_t i = 0; i < n; i += 32)
    for (int q = 0; q < 4; ++q) {
      const __mmask8 lanes = static_cast<__mmask8>((1u << std::clamp<int64_t>(n - i - 8 * q, 0, 8)) - 1);
      const __m512d d = _mm512_maskz_sub_pd(lanes, load8_as_double(x, i + 8 * q, n), m);
      acc[q] = _mm512_fmadd_pd(d, d, acc[q]);
    }
  return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3])));
}

// y = float((x - mean) * inv * scale + bias) over one channel of a group, 8 at a time in double.
__attribute__((target("avx512f"))) void group_normalize_avx512(const float* x, float* y, int64_t n, double mean,
                                                              double inv, double scale, double bias) {
  const __m512d m = _mm512_set1_pd(mean), v = _mm512_set1_pd(inv), s = _mm512_set1_pd(scale), b = _mm512_set1_pd(bias);
  for (int64_t i = 0; i < n; i += 8) {
    const __m512d d = _mm512_sub_pd(load8_as_double(x, i, n), m);
    const __m256 r = _mm512_cvtpd_ps(_mm512_add_pd(_mm512_mul_pd(_mm512_mul_pd(d, v), s), b));
    _mm512_mask_storeu_ps(y + i, static_cast<__mmask16>((1u << std::min<int64_t>(8, n - i)) - 1),
                          _mm512_castps256_ps512(r));
  }
}

// Normalizes `rows` rows of `cols` elements: y = (x - mean) / sqrt(var + eps) * scale + bias.
// scale/bias index by column, or (channel_scale) by row % channels for InstanceNormalization.
void normalize_rows(const float* x, float* y, int64_t rows, int64_t cols, float eps, const float* scale,
                    const float* bias, int64_t channels, float* mean_out, float* inv_out) {
  const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
  parallel_for_each(rows, rows * cols > 32768, [&](int64_t r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    double sum = 0.0;
    if (avx512) sum = row_sum_avx512(xr, cols);
    else
      for (int64_t i = 0; i < cols; ++i) sum += xr[i];
    const float mean = static_cast<float>(sum / static_cast<double>(cols));
    double sq = 0.0;
    if (avx512) sq = row_squares_avx512(xr, cols, mean);
    else
      for (int64_t i = 0; i < cols; ++i) {
        float d = xr[i] - mean;
        sq += static_cast<double>(d) * d;
      }
    const float inv = 1.f / std::sqrt(static_cast<float>(sq / static_cast<double>(cols)) + eps);
    if (mean_out) mean_out[r] = mean;
    if (inv_out) inv_out[r] = inv;
    if (channels > 0) {  // one scale and bias per row
      const float a = scale[r % channels] * inv, b = bias[r % channels];
      for (int64_t i = 0; i < cols; ++i) yr[i] = (xr[i] - mean) * a + b;
    } else if (bias) {
      for (int64_t i = 0; i < cols; ++i) yr[i] = (xr[i] - mean) * inv * scale[i] + bias[i];
    } else {
      for (int64_t i = 0; i < cols; ++i) yr[i] = (xr[i] - mean) * inv * scale[i];
    }
  });
}

void layer_norm(const ir::Node& node, const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
  const Tensor& x = *in[0];
  const int64_t rank = x.rank();
  int64_t axis = node.attrs.get_int("axis", -1);
  if (axis < 0) axis += rank;
  std::vector<int64_t> normalized(x.shape().begin() + axis, x.shape().end());
  const int64_t cols = shape_numel(normalized);
  const int64_t rows = cols ? x.numel() / cols : 0;
  std::vector<float> scale = expand_to(*in[1], normalized);
  std::vector<float> bias;
  if (in.size() > 2 && in[2]) bias = expand_to(*in[2], normalized);
  float eps = node.attrs.get_float("epsilon", 1e-5f);
  float* mean = out.size() > 1 && out[1].defined() ? out[1].data<float>() : nullptr;
  float* inv = out.size() > 2 && out[2].defined() ? out[2].data<float>() : nullptr;
  if (rows == 0 || cols == 0) return;
  normalize_rows(x.data<float>(), out[0].data<float>(), rows, cols, eps, scale.data(),
                 bias.empty() ? nullptr : bias.data(), 0, mean, inv);
}

// Each row over the normalized axes: x / sqrt(mean(x^2) + epsilon) * scale (scale broadcast to
// the normalized shape), the mean accumulated in double.
void rms_norm(const ir::Node& node, const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
  const Tensor& x = *in[0];
  int64_t axis = node.attrs.get_int("axis", -1);
  if (axis < 0) axis += x.rank();
  std::vector<int64_t> normalized(x.shape().begin() + axis, x.shape().end());
  const int64_t cols = shape_numel(normalized);
  const int64_t rows = cols ? x.numel() / cols : 0;
  const std::vector<float> scale = expand_to(*in[1], normalized);
  const float eps = node.attrs.get_float("epsilon", 1e-5f);
  const float* xp = x.data<float>();
  float* yp = out[0].data<float>();
  const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
  parallel_for_each(rows, rows * cols > 65536, [&](int64_t r) {
    const float* xr = xp + r * cols;
    float* yr = yp + r * cols;
    double squares = 0;
    if (avx512) squares = row_squares_avx512(xr, cols, 0.0);  // x - 0 is x: the same squares
    else
      for (int64_t i = 0; i < cols; ++i) squares += double(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(squares / double(cols) + eps));
    for (int64_t i = 0; i < cols; ++i) yr[i] = xr[i] * inv * scale[static_cast<size_t>(i)];
  });
}

// GroupNormalization (opset 21): statistics over each group of C / num_groups channels and the
// spatial dims, in double; scale and bias per channel; then `act` (kiln::FusedGroupNorm's).
void group_norm(const ir::Node& node, const std::vector<const Tensor*>& in, std::vector<Tensor>& out,
                const ir::Activation& act) {
  const Tensor& x = *in[0];
  const int64_t n = x.dim(0), c = x.dim(1), groups = node.attrs.get_int("num_groups", 1);
  if (groups < 1 || c % groups != 0)
    throw node.error(ErrorKind::kInvalidArgument,
                     std::to_string(c) + " channels do not split into " + std::to_string(groups) + " groups");
  if (in[1]->numel() != c || in[2]->numel() != c)
    throw node.error(ErrorKind::kInvalidArgument, "scale and bias must have C = " + std::to_string(c) + " elements");
  const float eps = node.attrs.get_float("epsilon", 1e-5f);
  const int64_t inner = n * c != 0 ? x.numel() / (n * c) : 0, per_group = c / groups * inner;
  const float* xp = x.data<float>();
  const float* scale = in[1]->data<float>();
  const float* bias = in[2]->data<float>();
  float* yp = out[0].data<float>();
  // On AVX-512 the statistics in partial double sums, the normalization 8 values a step (in
  // double), and the activation as a vector pass over the group: ResNet-50 with GroupNorm spent
  // half its CPU time in one chain of double additions per group and a scalar loop dividing each
  // index by the spatial size (docs/design/cpu-gemm.md, "Group normalization").
  const bool avx512 = sgemm_isa() == SgemmIsa::kAvx512;
  const Epilogue activation(act);
  const int64_t channels_per_group = c / groups;
  parallel_for_each(n * groups, x.numel() > 65536, [&](int64_t row) {
    const int64_t g = row % groups;
    const float* xr = xp + row * per_group;
    float* yr = yp + row * per_group;
    double sum = 0.0;
    if (avx512) sum = row_sum_avx512(xr, per_group);
    else
      for (int64_t i = 0; i < per_group; ++i) sum += xr[i];
    const double mean = per_group ? sum / static_cast<double>(per_group) : 0.0;
    double sq = 0.0;
    if (avx512) sq = row_squares_avx512(xr, per_group, mean);
    else
      for (int64_t i = 0; i < per_group; ++i) sq += (xr[i] - mean) * (xr[i] - mean);
    const double inv = 1.0 / std::sqrt((per_group ? sq / static_cast<double>(per_group) : 0.0) + eps);
    if (!avx512) {
      for (int64_t i = 0; i < per_group; ++i) {
        const int64_t ch = g * channels_per_group + i / inner;
        yr[i] = act.apply(static_cast<float>((xr[i] - mean) * inv * scale[ch] + bias[ch]));
      }
      return;
    }
    for (int64_t k = 0; k < channels_per_group; ++k) {
      const int64_t ch = g * channels_per_group + k;
      group_normalize_avx512(xr + k * inner, yr + k * inner, inner, mean, inv, scale[ch], bias[ch]);
    }
    if (!activation.is_identity()) activation.apply(yr, per_group, 1, per_group, nullptr, nullptr, nullptr, 0);
  });
}

// MeanVarianceNormalization: (x - mean) / (standard deviation + 1e-9) over `axes` (ONNX's
// function body), in double.
void mean_variance_norm(const ir::Node& node, const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
  const Tensor& x = *in[0];
  const int64_t rank = x.rank();
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  for (int64_t a : node.attrs.get_ints("axes", {0, 2, 3})) reduced[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
  int64_t groups = 1;
  for (int64_t d = 0; d < rank; ++d)
    if (!reduced[static_cast<size_t>(d)]) groups *= x.dim(d);
  // Calls fn(i, g) for every element i in order, g its group: its index with the reduced dims
  // left out.
  auto each = [&](auto&& fn) {
    std::vector<int64_t> coord(static_cast<size_t>(rank), 0);
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t g = 0;
      for (int64_t d = 0; d < rank; ++d)
        if (!reduced[static_cast<size_t>(d)]) g = g * x.dim(d) + coord[static_cast<size_t>(d)];
      fn(i, static_cast<size_t>(g));
      for (int64_t d = rank - 1; d >= 0 && ++coord[static_cast<size_t>(d)] == x.dim(d); --d) coord[static_cast<size_t>(d)] = 0;
    }
  };
  std::vector<double> mean(static_cast<size_t>(groups), 0.0), sq(static_cast<size_t>(groups), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(groups), 0);
  const float* xp = x.data<float>();
  each([&](int64_t i, size_t g) { mean[g] += xp[i], ++count[g]; });
  for (size_t g = 0; g < mean.size(); ++g)
    if (count[g]) mean[g] /= static_cast<double>(count[g]);
  each([&](int64_t i, size_t g) { sq[g] += (xp[i] - mean[g]) * (xp[i] - mean[g]); });
  float* yp = out[0].data<float>();
  each([&](int64_t i, size_t g) {
    yp[i] = static_cast<float>((xp[i] - mean[g]) / (std::sqrt(sq[g] / static_cast<double>(count[g])) + 1e-9));
  });
}

void instance_norm(const ir::Node& node, const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
  const Tensor& x = *in[0];
  const int64_t channels = x.dim(1);
  const int64_t rows = x.dim(0) * channels;
  if (rows == 0) return;
  const int64_t cols = x.numel() / rows;
  if (in[1]->numel() != channels || in[2]->numel() != channels)
    throw node.error(ErrorKind::kInvalidArgument, "scale and B must have C = " + std::to_string(channels) + " elements");
  normalize_rows(x.data<float>(), out[0].data<float>(), rows, cols, node.attrs.get_float("epsilon", 1e-5f),
                 in[1]->data<float>(), in[2]->data<float>(), channels, nullptr, nullptr);
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(normalization) {
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax", "LpNormalization"}) {
    KernelEntry e;
    e.op = op;
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      Norm kind = node->op == "Softmax" ? Norm::kSoftmax : node->op == "LogSoftmax" ? Norm::kLogSoftmax
                  : node->op == "Hardmax" ? Norm::kHardmax : node->attrs.get_int("p", 2) == 1 ? Norm::kL1 : Norm::kL2;
      return make_kernel([node, kind](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        softmax_like(*node, *in[0], out[0], kind);
      });
    };
    registry.add(std::move(e));
  }
  {
    // LayerNormalization into float32 (Y, or a scratch tensor when Y is absent), then
    // QuantizeLinear's reference arithmetic on it.
    KernelEntry e;
    e.op = "QuantizingLayerNorm";
    e.domain = "kiln";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32; Q int8 or float8e4m3fn";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        // The schema checks types; an engine file's inputs of unknown shape are checked here.
        if (!in[3] || !in[4] || in[3]->dtype() != DType::kFloat32 || in[3]->numel() != 1 || in[4]->numel() != 1 ||
            in[4]->dtype() != out[1].dtype())
          throw node->error(ErrorKind::kInvalidArgument, "y_scale must be one float32 value and y_zero_point one value of Q's type");
        std::vector<Tensor> y = {out[0].defined() ? out[0] : Tensor(DType::kFloat32, in[0]->shape())};
        layer_norm(*node, {in[0], in[1], in[2]}, y);
        quantize_per_tensor(y[0], in[3]->data<float>()[0], *in[4], node->attrs.get_int("saturate", 1) != 0, out[1]);
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "LayerNormalization";
    e.check = [](const KernelInit& init) -> std::string {
      if (init.dtype(0) != DType::kFloat32) return "input type " + to_string(init.dtype(0)) + " is not supported (supported: float32)";
      for (size_t o = 1; o < init.output_types.size(); ++o)
        if (init.output_types[o] && init.output_types[o]->dtype != DType::kFloat32)
          return "stash_type other than float32 is not supported";
      return "";
    };
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) { layer_norm(*node, in, out); });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "RMSNormalization";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) { rms_norm(*node, in, out); });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "InstanceNormalization";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) { instance_norm(*node, in, out); });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "GroupNormalization";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        group_norm(*node, in, out, ir::Activation{});
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "FusedGroupNorm";
    e.domain = "kiln";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      const ir::Activation act = ir::Activation::from_node(init.node);
      return make_kernel([node, act](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        group_norm(*node, in, out, act);
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "MeanVarianceNormalization";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel(
          [node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) { mean_variance_norm(*node, in, out); });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
