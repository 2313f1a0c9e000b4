#include "cpu/kernel.h"

namespace kiln::cpu {

namespace {
class LambdaKernel : public Kernel {
 public:
  explicit LambdaKernel(RunFn fn) : fn_(std::move(fn)) {}
  void run(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) override {
    fn_(inputs, outputs);
  }

 private:
  RunFn fn_;
};
}  // namespace

std::unique_ptr<Kernel> make_kernel(RunFn fn) { return std::make_unique<LambdaKernel>(std::move(fn)); }

std::function<std::string(const KernelInit&)> accept_dtypes(std::vector<DType> dtypes) {
  return [dtypes](const KernelInit& init) -> std::string {
    DType d = init.dtype(0);
    for (DType ok : dtypes)
      if (d == ok) return "";
    std::string list;
    for (DType ok : dtypes) list += (list.empty() ? "" : ", ") + to_string(ok);
    return "input type " + to_string(d) + " is not supported (supported: " + list + ")";
  };
}

}  // namespace kiln::cpu
