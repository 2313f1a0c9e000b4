// CPU kernels of ops that only change the shape (Reshape, Flatten, Squeeze, Unsqueeze): the
// schema computed the output shape, so the kernel copies the bytes, or nothing where the engine
// gave it the input's own buffer (an input no one reads after it: Kernel::output_reshapes_input).
#include <cstring>

#include "cpu/kernel.h"

namespace kiln::cpu {

namespace {

class ReshapeKernel : public Kernel {
 public:
  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    if (in[0]->numel() != out[0].numel()) throw Error(ErrorKind::kInternal, "element count changed in a reshape");
    if (in[0]->nbytes() && out[0].raw() != in[0]->raw()) std::memcpy(out[0].raw(), in[0]->raw(), in[0]->nbytes());
  }
  int overwritable_input() const override { return 0; }
  bool output_reshapes_input() const override { return true; }
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(reshape) {
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) {
    KernelEntry e;
    e.op = op;
    e.dtypes = "all";
    e.create = [](const KernelInit&) { return std::make_unique<ReshapeKernel>(); };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
