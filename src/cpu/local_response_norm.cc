// CPU kernel of LRN (float32): each position's sum of squares over the channel window, in
// double, then x / (bias + alpha / size * sum)^beta.
#include <algorithm>
#include <cmath>

#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(local_response_norm) {
  KernelEntry e;
  e.op = "LRN";
  e.check = accept_dtypes({DType::kFloat32});
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) {
    const ir::Attributes& a = init.node.attrs;
    const int64_t size = a.get_int("size", 1);
    const double alpha = a.get_float("alpha", 1e-4f), beta = a.get_float("beta", 0.75f), bias = a.get_float("bias", 1.f);
    return make_kernel([=](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      const int64_t n = x.dim(0), c = x.dim(1), inner = c ? x.numel() / std::max<int64_t>(n * c, 1) : 0;
      const float* xp = x.data<float>();
      float* yp = out[0].data<float>();
      const int64_t below = (size - 1) / 2, above = size - 1 - below;
      for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t i = 0; i < inner; ++i) {
            double sum = 0.0;
            for (int64_t k = std::max<int64_t>(0, ch - below); k <= std::min(c - 1, ch + above); ++k) {
              const double v = xp[(b * c + k) * inner + i];
              sum += v * v;
            }
            const int64_t at = (b * c + ch) * inner + i;
            yp[at] = static_cast<float>(xp[at] / std::pow(bias + alpha / static_cast<double>(size) * sum, beta));
          }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
