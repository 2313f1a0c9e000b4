// CPU kernel of Concat on raw bytes: for each outer index, each input contributes one
// contiguous block of (its axis size x inner) elements.
#include <cstring>

#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(concat) {
  KernelEntry e;
  e.op = "Concat";
  e.dtypes = "all";
  e.create = [](const KernelInit& init) {
    int64_t axis_attr = init.node.attrs.require_int("axis");
    return make_kernel([axis_attr](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const auto& shape = out[0].shape();
      int64_t rank = static_cast<int64_t>(shape.size());
      size_t axis = static_cast<size_t>(axis_attr < 0 ? axis_attr + rank : axis_attr);
      size_t es = element_size(out[0].dtype());
      int64_t outer = 1, inner = 1;
      for (size_t d = 0; d < axis; ++d) outer *= shape[d];
      for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
      size_t out_row = static_cast<size_t>(shape[axis] * inner) * es;
      auto* y = static_cast<unsigned char*>(out[0].raw());
      size_t pos = 0;
      for (const Tensor* t : in) {
        size_t block = static_cast<size_t>(t->shape()[axis] * inner) * es;
        const auto* x = static_cast<const unsigned char*>(t->raw());
        if (block)
          for (int64_t o = 0; o < outer; ++o) std::memcpy(y + o * out_row + pos, x + o * block, block);
        pos += block;
      }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
