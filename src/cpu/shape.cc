// CPU kernels of Shape and Size: they read only the input's shape.
#include <algorithm>

#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(shape) {
  {
    KernelEntry e;
    e.op = "Shape";
    e.dtypes = "all";
    e.create = [](const KernelInit& init) {
      int64_t start_attr = init.node.attrs.get_int("start", 0);
      bool has_end = init.node.attrs.has("end");
      int64_t end_attr = init.node.attrs.get_int("end", 0);
      return make_kernel([=](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        int64_t rank = in[0]->rank();
        auto clamp = [rank](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
        int64_t start = clamp(start_attr), end = has_end ? clamp(end_attr) : rank;
        int64_t* y = out[0].data<int64_t>();
        for (int64_t i = start; i < end; ++i) y[i - start] = in[0]->shape()[static_cast<size_t>(i)];
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Size";
    e.dtypes = "all";
    e.create = [](const KernelInit&) {
      return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        out[0].data<int64_t>()[0] = in[0]->numel();
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
