// CPU kernel of BatchNormalization in inference mode (float32):
//   Y = X * s[c] + t[c],  s = scale / sqrt(var + epsilon),  t = B - mean * s.
// s and t are computed once at creation when the four parameters are constants (the usual
// case), else on every run.
#include <cmath>
#include <vector>

#include "cpu/gemm_util.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"

namespace kiln::cpu {

namespace {

class BatchNormKernel final : public Kernel {
 public:
  explicit BatchNormKernel(const KernelInit& init) : epsilon_(init.node.attrs.get_float("epsilon", 1e-5f)) {
    bool all_constant = true;
    for (size_t i = 1; i <= 4; ++i) all_constant = all_constant && i < init.constants.size() && init.constants[i];
    if (all_constant) {
      fold(*init.constants[1], *init.constants[2], *init.constants[3], *init.constants[4]);
      folded_ = true;
    }
  }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    if (!folded_) fold(*in[1], *in[2], *in[3], *in[4]);
    const Tensor& xt = *in[0];
    const int64_t n = xt.dim(0), c = xt.dim(1);
    const int64_t inner = c == 0 || n == 0 ? 0 : xt.numel() / (n * c);
    const float* x = xt.data<float>();
    float* y = out[0].data<float>();
    const float* s = scale_.data();
    const float* t = shift_.data();
    parallel_for_each(n * c, xt.numel() > 32768, [&](int64_t j) {
      const float sj = s[j % c], tj = t[j % c];
      const float* xj = x + j * inner;
      float* yj = y + j * inner;
      for (int64_t i = 0; i < inner; ++i) yj[i] = xj[i] * sj + tj;
    });
  }

 private:
  void fold(const Tensor& scale, const Tensor& bias, const Tensor& mean, const Tensor& var) {
    const int64_t c = scale.numel();
    scale_.resize(static_cast<size_t>(c));
    shift_.resize(static_cast<size_t>(c));
    // Parameters may be float16/64 since opset 15: read them as double.
    for (int64_t i = 0; i < c; ++i) {
      double s = scale.value_as_double(i) / std::sqrt(var.value_as_double(i) + static_cast<double>(epsilon_));
      scale_[static_cast<size_t>(i)] = static_cast<float>(s);
      shift_[static_cast<size_t>(i)] = static_cast<float>(bias.value_as_double(i) - mean.value_as_double(i) * s);
    }
  }

  float epsilon_;
  bool folded_ = false;
  std::vector<float> scale_, shift_;
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(batchnorm) {
  KernelEntry e;
  e.op = "BatchNormalization";
  e.check = accept_dtypes({DType::kFloat32});
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<BatchNormKernel>(init); };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
