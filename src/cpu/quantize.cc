// CPU kernels of QuantizeLinear, DequantizeLinear (see ops/quantize.h) and DynamicQuantizeLinear: the reference
// arithmetic, in float32 with round-half-to-even, per tensor, per channel or per block.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "cpu/quantize.h"
#include "ir/small_types.h"
#include "ops/quantize.h"

namespace kiln::cpu {

namespace {

// y[i] = clamp(nearbyint(x[i] / scale) + zero_point, lo, hi) as int8 or uint8 bytes (NaN: 0),
// the per-element loop below with AVX2, 32 at a time: the same float32 quotient, rounded half to
// even, then an exact integer-valued sum (a quotient of 2^24 or more clamps either way).
void quantize_bytes(const float* x, int64_t n, float scale, float zero_point, float lo, float hi, bool is_unsigned,
                    int8_t* y) {
  const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zero_point);
  const __m256 low = _mm256_set1_ps(lo), high = _mm256_set1_ps(hi);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  auto quantize8 = [&](const float* p) {
    const __m256 v = _mm256_loadu_ps(p);
    __m256 q = _mm256_add_ps(_mm256_round_ps(_mm256_div_ps(v, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), z);
    q = _mm256_and_ps(q, _mm256_cmp_ps(q, q, _CMP_ORD_Q));  // NaN -> 0
    return _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(q, low), high));
  };
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i ab = _mm256_packs_epi32(quantize8(x + i), quantize8(x + i + 8));
    const __m256i cd = _mm256_packs_epi32(quantize8(x + i + 16), quantize8(x + i + 24));
    const __m256i bytes = is_unsigned ? _mm256_packus_epi16(ab, cd) : _mm256_packs_epi16(ab, cd);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm256_permutevar8x32_epi32(bytes, order));
  }
  for (; i < n; ++i) {
    double q = static_cast<double>(std::nearbyint(x[i] / scale)) + static_cast<double>(zero_point);
    if (std::isnan(q)) q = 0;
    const double v = std::min<double>(std::max<double>(q, lo), hi);
    y[i] = is_unsigned ? static_cast<int8_t>(static_cast<uint8_t>(v)) : static_cast<int8_t>(v);
  }
}

void quantize_bytes_parallel(const float* x, int64_t n, float scale, float zero_point, int64_t lo, int64_t hi,
                             bool is_unsigned, int8_t* y) {
  parallel_for(n, [&](int64_t first, int64_t last) {
    quantize_bytes(x + first, last - first, scale, zero_point, static_cast<float>(lo), static_cast<float>(hi), is_unsigned,
                   y + first);
  }, n > 65536);
}

// A zero point holds one value, or one per scale entry.
void check_zero_point(const ir::Node& node, const Tensor* zp, const Tensor& scale) {
  if (zp && zp->numel() > 1 && zp->numel() != scale.numel())
    throw node.error(ErrorKind::kInvalidArgument, "the zero point has " + std::to_string(zp->numel()) + " values, the scale " +
                                                      std::to_string(scale.numel()));
}

// The zero point of every scale entry as an integer (0 when absent), read once per run rather
// than per element.
std::vector<int64_t> zero_points(const Tensor* zp, int64_t entries) {
  std::vector<int64_t> z(static_cast<size_t>(entries), 0);
  if (zp && zp->numel() > 0)
    for (int64_t c = 0; c < entries; ++c) z[static_cast<size_t>(c)] = zp->value_as_int(zp->numel() == 1 ? 0 : c);
  return z;
}

template <class Q>
void quantize(const ir::Node& node, const Tensor& x, const Tensor& scale, const Tensor* zp, Tensor& y) {
  const ir::QuantizeAxis axis = ir::quantize_layout(node, x.shape(), scale.shape());
  check_zero_point(node, zp, scale);
  int64_t lo = 0, hi = 0;
  ir::quantized_range(y.dtype(), lo, hi);
  const float* in = x.data<float>();
  const float* s = scale.data<float>();
  Q* out = static_cast<Q*>(y.raw());
  const std::vector<int64_t> zero = zero_points(zp, scale.numel());
  const int64_t n = x.numel();
  if constexpr (std::is_same_v<Q, int8_t> || std::is_same_v<Q, uint8_t>) {
    if (scale.numel() == 1) {  // per tensor (an INT8 engine's activations): 32 at a time
      quantize_bytes_parallel(in, n, s[0], static_cast<float>(zero[0]), lo, hi, std::is_same_v<Q, uint8_t>,
                              reinterpret_cast<int8_t*>(out));
      return;
    }
  }
  parallel_for_each(n, n > 65536, [&](int64_t i) {
    const int64_t c = axis.scale_index(i);
    // The quotient in float32 (as ONNX's reference and ONNX Runtime compute it; in double a
    // quotient just off .5 can round the other way); nearbyint rounds half to even.
    double q = static_cast<double>(std::nearbyint(in[i] / s[c])) + static_cast<double>(zero[static_cast<size_t>(c)]);
    if (std::isnan(q)) q = 0;
    out[i] = static_cast<Q>(std::min<double>(std::max<double>(q, static_cast<double>(lo)), static_cast<double>(hi)));
  });
}

template <class Q>
void dequantize(const ir::Node& node, const Tensor& x, const Tensor& scale, const Tensor* zp, Tensor& y) {
  const ir::QuantizeAxis axis = ir::quantize_layout(node, x.shape(), scale.shape());
  check_zero_point(node, zp, scale);
  const Q* in = static_cast<const Q*>(x.raw());
  const float* s = scale.data<float>();
  float* out = y.data<float>();
  const std::vector<int64_t> zero = zero_points(zp, scale.numel());
  const int64_t n = x.numel();
  parallel_for_each(n, n > 65536, [&](int64_t i) {
    const int64_t c = axis.scale_index(i);
    out[i] = static_cast<float>(static_cast<int64_t>(in[i]) - zero[static_cast<size_t>(c)]) * s[c];
  });
}

// The float8 types and float4e2m1: y = small_float(x / scale + zero point), rounded to nearest
// even, saturating unless saturate = 0; and back, (float(x) - float(zero point)) * scale.
void quantize_small_float(const ir::Node& node, const Tensor& x, const Tensor& scale, const Tensor* zp, Tensor& y) {
  const ir::QuantizeAxis axis = ir::quantize_layout(node, x.shape(), scale.shape());
  check_zero_point(node, zp, scale);
  const bool saturate = node.attrs.get_int("saturate", 1) != 0;
  const float* in = x.data<float>();
  const float* s = scale.data<float>();
  uint8_t* out = static_cast<uint8_t*>(y.raw());
  const int64_t n = x.numel();
  parallel_for_each(n, n > 65536, [&](int64_t i) {
    const int64_t c = axis.scale_index(i);
    const float z = zp && zp->numel() ? static_cast<float>(zp->value_as_double(zp->numel() == 1 ? 0 : c)) : 0.f;
    out[i] = float_to_small_float(y.dtype(), in[i] / s[c] + z, saturate);
  });
}

void dequantize_small_float(const ir::Node& node, const Tensor& x, const Tensor& scale, const Tensor* zp, Tensor& y) {
  const ir::QuantizeAxis axis = ir::quantize_layout(node, x.shape(), scale.shape());
  check_zero_point(node, zp, scale);
  const uint8_t* in = static_cast<const uint8_t*>(x.raw());
  const float* s = scale.data<float>();
  float* out = y.data<float>();
  const int64_t n = x.numel();
  parallel_for_each(n, n > 65536, [&](int64_t i) {
    const int64_t c = axis.scale_index(i);
    const float z = zp && zp->numel() ? static_cast<float>(zp->value_as_double(zp->numel() == 1 ? 0 : c)) : 0.f;
    out[i] = (small_float_to_float(x.dtype(), in[i]) - z) * s[c];
  });
}

template <template <class> class Fn>
bool dispatch_quantized(DType dtype, const ir::Node& node, const Tensor& x, const Tensor& scale, const Tensor* zp,
                        Tensor& y) {
  switch (dtype) {
    // Sub-byte integers are stored a byte each; their range comes from the dtype.
    case DType::kInt8: case DType::kInt4: case DType::kInt2: Fn<int8_t>::run(node, x, scale, zp, y); return true;
    case DType::kUInt8: case DType::kUInt4: case DType::kUInt2: Fn<uint8_t>::run(node, x, scale, zp, y); return true;
    case DType::kInt16: Fn<int16_t>::run(node, x, scale, zp, y); return true;
    case DType::kUInt16: Fn<uint16_t>::run(node, x, scale, zp, y); return true;
    case DType::kInt32: Fn<int32_t>::run(node, x, scale, zp, y); return true;
    default: return false;
  }
}

template <class Q> struct QuantizeFn { static void run(const ir::Node& n, const Tensor& x, const Tensor& s, const Tensor* z, Tensor& y) { quantize<Q>(n, x, s, z, y); } };
template <class Q> struct DequantizeFn { static void run(const ir::Node& n, const Tensor& x, const Tensor& s, const Tensor* z, Tensor& y) { dequantize<Q>(n, x, s, z, y); } };

const Tensor* zero_point_input(const std::vector<const Tensor*>& in) { return in.size() > 2 ? in[2] : nullptr; }

}  // namespace

void quantize_per_tensor(const Tensor& x, float scale, const Tensor& zero_point, bool saturate, Tensor& y) {
  const float* in = x.data<float>();
  const int64_t n = x.numel();
  if (is_small_float(y.dtype())) {
    const float z = static_cast<float>(zero_point.value_as_double(0));
    uint8_t* out = static_cast<uint8_t*>(y.raw());
    parallel_for_each(n, n > 65536, [&](int64_t i) { out[i] = float_to_small_float(y.dtype(), in[i] / scale + z, saturate); });
    return;
  }
  int64_t lo = 0, hi = 0;
  if ((y.dtype() != DType::kInt8 && y.dtype() != DType::kUInt8) || !ir::quantized_range(y.dtype(), lo, hi))
    throw Error(ErrorKind::kUnsupported, "cannot quantize to " + to_string(y.dtype()) + " per tensor");
  quantize_bytes_parallel(in, n, scale, static_cast<float>(zero_point.value_as_int(0)), lo, hi, y.dtype() == DType::kUInt8,
                          static_cast<int8_t*>(y.raw()));
}

KILN_REGISTER_CPU_KERNELS(quantize) {
  {
    // DynamicQuantizeLinear as ONNX's reference computes it, in float32.
    KernelEntry e;
    e.op = "DynamicQuantizeLinear";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32 -> uint8";
    e.create = [](const KernelInit&) {
      return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        const float* x = in[0]->data<float>();
        const int64_t n = in[0]->numel();
        // The range, 8 at a time: max_ps(v, m) and min_ps(v, m) return m where v is NaN, as
        // std::max(m, v) and std::min(m, v) do; the largest and smallest are exact in any order.
        __m256 his = _mm256_setzero_ps(), los = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
          const __m256 v = _mm256_loadu_ps(x + i);
          his = _mm256_max_ps(v, his);
          los = _mm256_min_ps(v, los);
        }
        alignas(32) float lanes_hi[8], lanes_lo[8];
        _mm256_store_ps(lanes_hi, his);
        _mm256_store_ps(lanes_lo, los);
        float hi = 0.f, lo = 0.f;
        for (int k = 0; k < 8; ++k) hi = std::max(hi, lanes_hi[k]), lo = std::min(lo, lanes_lo[k]);
        for (; i < n; ++i) hi = std::max(hi, x[i]), lo = std::min(lo, x[i]);
        const float scale = (hi == lo ? 1.f : hi - lo) / 255.f;
        const float zero = std::nearbyint(std::min(255.f, std::max(0.f, 0.f - lo / scale)));
        // min(255, max(0, nearbyint(x / scale) + zero)), NaN giving 0: quantize_bytes' arithmetic.
        int8_t* y = reinterpret_cast<int8_t*>(out[0].data<uint8_t>());
        parallel_for(n, [&](int64_t first, int64_t last) {
          quantize_bytes(x + first, last - first, scale, zero, 0.f, 255.f, true, y + first);
        }, n > 65536);
        out[1].data<float>()[0] = scale;
        out[2].data<uint8_t>()[0] = static_cast<uint8_t>(zero);
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "QuantizeLinear";
    e.dtypes = "float32 -> int2..int16, uint2..uint16, the float8 types, float4e2m1";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (is_small_float(out[0].dtype())) quantize_small_float(*node, *in[0], *in[1], zero_point_input(in), out[0]);
        else if (!dispatch_quantized<QuantizeFn>(out[0].dtype(), *node, *in[0], *in[1], zero_point_input(in), out[0]))
          throw node->error(ErrorKind::kUnsupported, "cannot quantize to " + to_string(out[0].dtype()));
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "DequantizeLinear";
    e.dtypes = "int2..int32, uint2..uint16, the float8 types, float4e2m1 -> float32";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (is_small_float(in[0]->dtype())) dequantize_small_float(*node, *in[0], *in[1], zero_point_input(in), out[0]);
        else if (!dispatch_quantized<DequantizeFn>(in[0]->dtype(), *node, *in[0], *in[1], zero_point_input(in), out[0]))
          throw node->error(ErrorKind::kUnsupported, "cannot dequantize " + to_string(in[0]->dtype()));
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
