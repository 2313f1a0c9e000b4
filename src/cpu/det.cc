// CPU kernel of Det (float32, float64): Gaussian elimination with partial pivoting, in double.
#include <cmath>
#include <utility>
#include <vector>

#include "cpu/kernel.h"

namespace kiln::cpu {

namespace {

double determinant(std::vector<double>& a, int64_t n) {
  double det = 1.0;
  for (int64_t c = 0; c < n; ++c) {
    int64_t pivot = c;
    for (int64_t r = c + 1; r < n; ++r)
      if (std::fabs(a[static_cast<size_t>(r * n + c)]) > std::fabs(a[static_cast<size_t>(pivot * n + c)])) pivot = r;
    const double p = a[static_cast<size_t>(pivot * n + c)];
    if (p == 0.0) return 0.0;
    if (pivot != c) {
      for (int64_t k = 0; k < n; ++k) std::swap(a[static_cast<size_t>(pivot * n + k)], a[static_cast<size_t>(c * n + k)]);
      det = -det;
    }
    det *= p;
    for (int64_t r = c + 1; r < n; ++r) {
      const double f = a[static_cast<size_t>(r * n + c)] / p;
      for (int64_t k = c; k < n; ++k) a[static_cast<size_t>(r * n + k)] -= f * a[static_cast<size_t>(c * n + k)];
    }
  }
  return det;
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(det) {
  KernelEntry e;
  e.op = "Det";
  e.check = accept_dtypes({DType::kFloat32, DType::kFloat64});
  e.dtypes = "float32, float64";
  e.create = [](const KernelInit&) {
    return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      const int64_t n = x.dim(x.rank() - 1);
      std::vector<double> a(static_cast<size_t>(n * n));
      for (int64_t m = 0; m < out[0].numel(); ++m) {
        for (int64_t k = 0; k < n * n; ++k) a[static_cast<size_t>(k)] = x.value_as_double(m * n * n + k);
        const double d = determinant(a, n);
        if (out[0].dtype() == DType::kFloat64) out[0].data<double>()[m] = d;
        else out[0].data<float>()[m] = static_cast<float>(d);
      }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
