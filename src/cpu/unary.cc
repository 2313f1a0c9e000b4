// CPU kernels of the elementwise unary ops (src/ir/unary_ops.h: their table and float math):
// float32; Identity any type; Not bool; Abs/Neg/Sign also on signed integers.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"
#include "cpu/vector_exp.h"
#include "cpu/wrapping.h"
#include "ir/unary_ops.h"

namespace kiln::cpu {

namespace {

// y = the node's float math (ir::unary_float) of x, over n float32 elements.
using FloatMap = void (*)(const float* x, float* y, int64_t n, ir::UnaryParams p);

template <ir::UnaryOp kOp>
void map_float(const float* x, float* y, int64_t n, ir::UnaryParams p) {
  parallel_for_each(n, n > 32768, [&](int64_t i) {
    y[i] = ir::unary_float<kOp>(x[i], p);
  });
}

// Sigmoid, Tanh and Exp 16 at a time on AVX-512 (vector_exp.h: within a few ulp of libm's, as the
// GEMM epilogue and the recurrent layers compute them), where libm takes one value at a time: a
// Sigmoid over Mask R-CNN's 100 x 91 x 28 x 28 mask logits took 23 ms on two threads.
template <ir::UnaryOp kOp>
__attribute__((target("avx512f"))) __m512 map16(__m512 x) {
  if constexpr (kOp == ir::UnaryOp::kSigmoid) return sigmoid16(x);
  else if constexpr (kOp == ir::UnaryOp::kTanh) return tanh16(x);
  else return exp16(x);
}

template <ir::UnaryOp kOp>
__attribute__((target("avx512f"))) void map_range16(const float* x, float* y, int64_t begin, int64_t end, ir::UnaryParams p) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(y + i, map16<kOp>(v));
    if constexpr (kOp == ir::UnaryOp::kExp) {
      // exp16 gives +inf above 88.3 and 0 below -87, where e^x is still finite up to 88.72 and
      // a denormal down to -103.9: those values take libm's.
      const __mmask16 edge = _mm512_cmp_ps_mask(v, _mm512_set1_ps(88.3f), _CMP_GT_OQ) |
                             _mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.f), _CMP_LT_OQ);
      if (edge)
        for (int lane = 0; lane < 16; ++lane)
          if (edge >> lane & 1) y[i + lane] = ir::unary_float<kOp>(x[i + lane], p);
    }
  }
  for (; i < end; ++i) y[i] = ir::unary_float<kOp>(x[i], p);
}

template <ir::UnaryOp kOp>
void map_float16(const float* x, float* y, int64_t n, ir::UnaryParams p) {
  constexpr int64_t kChunk = 4096;  // elements a task maps (a multiple of 16)
  parallel_for((n + kChunk - 1) / kChunk, [&](int64_t begin, int64_t end) {
    map_range16<kOp>(x, y, begin * kChunk, std::min(n, end * kChunk), p);
  }, n > 32768);
}

// The node's map, with its attributes.
FloatMap float_map(const ir::Node& node, ir::UnaryParams& p) {
  const ir::UnaryOp op = ir::float_unary_op_of(node, p);
  if (sgemm_isa() == SgemmIsa::kAvx512) {
    if (op == ir::UnaryOp::kSigmoid) return &map_float16<ir::UnaryOp::kSigmoid>;
    if (op == ir::UnaryOp::kTanh) return &map_float16<ir::UnaryOp::kTanh>;
    if (op == ir::UnaryOp::kExp) return &map_float16<ir::UnaryOp::kExp>;
  }
  return ir::with_float_unary_op(op, [](auto k) -> FloatMap { return &map_float<decltype(k)::value>; });
}

template <class T>
void map_signed(const ir::Node& n, const Tensor& in, Tensor& out) {
  const T* x = in.data<T>();
  T* y = out.data<T>();
  int64_t count = in.numel();
  for (int64_t i = 0; i < count; ++i) {
    if (n.op == "Abs") y[i] = x[i] < 0 ? wrapping_neg(x[i]) : x[i];  // |lowest| wraps to lowest
    else if (n.op == "Neg") y[i] = wrapping_neg(x[i]);
    else y[i] = static_cast<T>(x[i] > 0 ? 1 : (x[i] < 0 ? -1 : 0));  // Sign
  }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(unary) {
  for (const ir::UnaryOpInfo& u : ir::kUnaryOps) {
    if (!ir::has_float_math(u.op) || ir::takes_signed_integers(u.op)) continue;
    KernelEntry e;
    e.op = u.name;
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      ir::UnaryParams p;
      const FloatMap map = float_map(init.node, p);
      return make_kernel([map, p](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        map(in[0]->data<float>(), out[0].data<float>(), in[0]->numel(), p);
      });
    };
    registry.add(std::move(e));
  }
  for (const ir::UnaryOpInfo& u : ir::kUnaryOps) {
    if (!ir::takes_signed_integers(u.op)) continue;
    KernelEntry e;
    e.op = u.name;
    e.check = accept_dtypes({DType::kFloat32, DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64});
    e.dtypes = "float32, int8, int16, int32, int64";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      ir::UnaryParams p;
      const FloatMap map = float_map(init.node, p);
      return make_kernel([node, map, p](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        switch (in[0]->dtype()) {
          case DType::kFloat32: map(in[0]->data<float>(), out[0].data<float>(), in[0]->numel(), p); break;
          case DType::kInt8: map_signed<int8_t>(*node, *in[0], out[0]); break;
          case DType::kInt16: map_signed<int16_t>(*node, *in[0], out[0]); break;
          case DType::kInt32: map_signed<int32_t>(*node, *in[0], out[0]); break;
          default: map_signed<int64_t>(*node, *in[0], out[0]); break;
        }
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Identity";
    e.dtypes = "all";
    e.create = [](const KernelInit&) {
      return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (in[0]->nbytes()) std::memcpy(out[0].raw(), in[0]->raw(), in[0]->nbytes());
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Not";
    e.check = accept_dtypes({DType::kBool});
    e.dtypes = "bool";
    e.create = [](const KernelInit&) {
      return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        const auto* x = static_cast<const uint8_t*>(in[0]->raw());
        auto* y = static_cast<uint8_t*>(out[0].raw());
        for (int64_t i = 0; i < in[0]->numel(); ++i) y[i] = x[i] ? 0 : 1;
      });
    };
    registry.add(std::move(e));
  }
  for (const char* op : {"IsNaN", "IsInf"}) {
    KernelEntry e;
    e.op = op;
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      bool is_nan = init.node.op == "IsNaN";
      int64_t detect_pos = init.node.attrs.get_int("detect_positive", 1);
      int64_t detect_neg = init.node.attrs.get_int("detect_negative", 1);
      return make_kernel([=](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        const float* x = in[0]->data<float>();
        auto* y = static_cast<uint8_t*>(out[0].raw());
        for (int64_t i = 0; i < in[0]->numel(); ++i) {
          if (is_nan) y[i] = std::isnan(x[i]);
          else y[i] = std::isinf(x[i]) && ((x[i] > 0 && detect_pos) || (x[i] < 0 && detect_neg));
        }
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
