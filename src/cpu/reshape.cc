// CPU kernels of ops that only change the shape (Reshape, Flatten, Squeeze, Unsqueeze): the
// schema computed the output shape, so the kernel copies the bytes.
#include <cstring>

#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(reshape) {
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) {
    KernelEntry e;
    e.op = op;
    e.dtypes = "all";
    e.create = [](const KernelInit&) {
      return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (in[0]->numel() != out[0].numel())
          throw Error(ErrorKind::kInternal, "element count changed in a reshape");
        if (in[0]->nbytes()) std::memcpy(out[0].raw(), in[0]->raw(), in[0]->nbytes());
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
