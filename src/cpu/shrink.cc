// CPU kernel of Shrink (float32, float64).
#include <cstdint>

#include "cpu/kernel.h"

namespace kiln::cpu {

namespace {

template <class T>
void shrink(const Tensor& x, Tensor& y, double lambd, double bias) {
  const T* in = x.data<T>();
  T* out = y.data<T>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = static_cast<double>(in[i]);
    out[i] = static_cast<T>(v < -lambd ? v + bias : v > lambd ? v - bias : 0.0);
  }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(shrink) {
  KernelEntry e;
  e.op = "Shrink";
  e.check = accept_dtypes({DType::kFloat32, DType::kFloat64});
  e.dtypes = "float32, float64";
  e.create = [](const KernelInit& init) {
    const double lambd = init.node.attrs.get_float("lambd", 0.5f), bias = init.node.attrs.get_float("bias", 0.f);
    return make_kernel([lambd, bias](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      if (x.dtype() == DType::kFloat64) shrink<double>(x, out[0], lambd, bias);
      else shrink<float>(x, out[0], lambd, bias);
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
