// CPU kernel of Split on raw bytes: the inverse of Concat's block copy.
#include <cstring>

#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(split) {
  KernelEntry e;
  e.op = "Split";
  e.dtypes = "all";
  e.create = [](const KernelInit& init) {
    int64_t axis_attr = init.node.attrs.get_int("axis", 0);
    return make_kernel([axis_attr](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const auto& shape = in[0]->shape();
      int64_t rank = static_cast<int64_t>(shape.size());
      size_t axis = static_cast<size_t>(axis_attr < 0 ? axis_attr + rank : axis_attr);
      size_t es = element_size(in[0]->dtype());
      int64_t outer = 1, inner = 1;
      for (size_t d = 0; d < axis; ++d) outer *= shape[d];
      for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
      size_t in_row = static_cast<size_t>(shape[axis] * inner) * es;
      const auto* x = static_cast<const unsigned char*>(in[0]->raw());
      // The part sizes, recomputed here because an output the model does not use arrives
      // undefined but its part still takes room in the input.
      std::vector<int64_t> sizes;
      int64_t k = static_cast<int64_t>(out.size());
      if (in.size() > 1 && in[1]) {
        sizes = in[1]->to_int_vector();
      } else {
        int64_t part = (shape[axis] + k - 1) / k;
        for (int64_t o = 0; o < k; ++o) sizes.push_back(o + 1 < k ? part : shape[axis] - part * (k - 1));
      }
      size_t pos = 0;
      for (size_t o = 0; o < out.size(); ++o) {
        Tensor& t = out[o];
        size_t block = static_cast<size_t>(sizes[o] * inner) * es;
        auto* y = static_cast<unsigned char*>(t.raw());
        if (block && t.defined())
          for (int64_t o = 0; o < outer; ++o) std::memcpy(y + o * block, x + o * in_row + pos, block);
        pos += block;
      }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
