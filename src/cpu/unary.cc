// CPU kernels of elementwise unary ops (float32; Identity any type; Not bool; Abs/Neg/Sign
// also on signed integers).
#include <cmath>
#include <cstring>

#include "cpu/kernel.h"
#include "cpu/wrapping.h"

namespace kiln::cpu {

namespace {

using FloatFn = std::function<float(float)>;

// The float32 function of a node, with its attributes bound.
FloatFn float_function(const ir::Node& n) {
  const std::string& op = n.op;
  const ir::Attributes& a = n.attrs;
  if (op == "Relu") return [](float x) { return x > 0.f ? x : 0.f; };
  if (op == "Sigmoid") return [](float x) { return 1.f / (1.f + std::exp(-x)); };
  if (op == "Tanh") return [](float x) { return std::tanh(x); };
  if (op == "Exp") return [](float x) { return std::exp(x); };
  if (op == "Log") return [](float x) { return std::log(x); };
  if (op == "Sqrt") return [](float x) { return std::sqrt(x); };
  if (op == "Reciprocal") return [](float x) { return 1.f / x; };
  if (op == "Erf") return [](float x) { return std::erf(x); };
  if (op == "Abs") return [](float x) { return std::fabs(x); };
  if (op == "Neg") return [](float x) { return -x; };
  if (op == "Floor") return [](float x) { return std::floor(x); };
  if (op == "Ceil") return [](float x) { return std::ceil(x); };
  if (op == "Round") return [](float x) { return std::nearbyint(x); };  // half to even
  if (op == "Sin") return [](float x) { return std::sin(x); };
  if (op == "Cos") return [](float x) { return std::cos(x); };
  if (op == "Tan") return [](float x) { return std::tan(x); };
  if (op == "Asin") return [](float x) { return std::asin(x); };
  if (op == "Acos") return [](float x) { return std::acos(x); };
  if (op == "Atan") return [](float x) { return std::atan(x); };
  if (op == "Sinh") return [](float x) { return std::sinh(x); };
  if (op == "Cosh") return [](float x) { return std::cosh(x); };
  if (op == "Asinh") return [](float x) { return std::asinh(x); };
  if (op == "Acosh") return [](float x) { return std::acosh(x); };
  if (op == "Atanh") return [](float x) { return std::atanh(x); };
  if (op == "Sign") return [](float x) { return x > 0.f ? 1.f : (x < 0.f ? -1.f : 0.f); };
  if (op == "Softsign") return [](float x) { return x / (1.f + std::fabs(x)); };
  if (op == "Softplus") return [](float x) { return std::log1p(std::exp(-std::fabs(x))) + std::max(x, 0.f); };
  if (op == "Mish") return [](float x) { return x * std::tanh(std::log1p(std::exp(-std::fabs(x))) + std::max(x, 0.f)); };
  if (op == "Elu") {
    float alpha = a.get_float("alpha", 1.f);
    return [alpha](float x) { return x >= 0.f ? x : alpha * (std::exp(x) - 1.f); };
  }
  if (op == "Celu") {
    float alpha = a.get_float("alpha", 1.f);
    return [alpha](float x) { return std::max(0.f, x) + std::min(0.f, alpha * (std::exp(x / alpha) - 1.f)); };
  }
  if (op == "LeakyRelu") {
    float alpha = a.get_float("alpha", 0.01f);
    return [alpha](float x) { return x >= 0.f ? x : alpha * x; };
  }
  if (op == "ThresholdedRelu") {
    float alpha = a.get_float("alpha", 1.f);
    return [alpha](float x) { return x > alpha ? x : 0.f; };
  }
  if (op == "Selu") {
    float alpha = a.get_float("alpha", 1.67326319217681884765625f);
    float gamma = a.get_float("gamma", 1.05070102214813232421875f);
    return [alpha, gamma](float x) { return x > 0.f ? gamma * x : gamma * (alpha * std::exp(x) - alpha); };
  }
  if (op == "HardSigmoid") {
    float alpha = a.get_float("alpha", 0.2f), beta = a.get_float("beta", 0.5f);
    return [alpha, beta](float x) { return std::max(0.f, std::min(1.f, alpha * x + beta)); };
  }
  if (op == "HardSwish")
    return [](float x) { return x * std::max(0.f, std::min(1.f, x / 6.f + 0.5f)); };
  if (op == "Gelu") {
    if (a.get_string("approximate", "none") == "tanh")
      return [](float x) {
        return 0.5f * x * (1.f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
      };
    return [](float x) { return 0.5f * x * (1.f + std::erf(x * 0.7071067811865476f)); };
  }
  return nullptr;
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
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Erf",
                         "Floor", "Ceil", "Round", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
                         "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Softsign", "Softplus",
                         "Mish", "Elu", "Celu", "LeakyRelu", "ThresholdedRelu", "Selu",
                         "HardSigmoid", "HardSwish", "Gelu"}) {
    KernelEntry e;
    e.op = op;
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      FloatFn fn = float_function(init.node);
      if (!fn) throw init.node.error(ErrorKind::kInternal, "no CPU function");
      return make_kernel([fn](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        const float* x = in[0]->data<float>();
        float* y = out[0].data<float>();
        int64_t n = in[0]->numel();
#pragma omp parallel for if (n > 32768) schedule(static)
        for (int64_t i = 0; i < n; ++i) y[i] = fn(x[i]);
      });
    };
    registry.add(std::move(e));
  }
  for (const char* op : {"Abs", "Neg", "Sign"}) {
    KernelEntry e;
    e.op = op;
    e.check = accept_dtypes({DType::kFloat32, DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64});
    e.dtypes = "float32, int8, int16, int32, int64";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      FloatFn fn = float_function(init.node);
      return make_kernel([node, fn](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        switch (in[0]->dtype()) {
          case DType::kFloat32: {
            const float* x = in[0]->data<float>();
            float* y = out[0].data<float>();
            for (int64_t i = 0; i < in[0]->numel(); ++i) y[i] = fn(x[i]);
            break;
          }
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
