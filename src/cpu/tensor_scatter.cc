// CPU kernel of TensorScatter (every dtype: rows are copied as bytes, sub-byte types being a
// byte per element in memory). A write index that is
// negative, or in linear mode runs the update past the cache's end, is refused naming the node.
#include <algorithm>
#include <cstring>
#include <string>

#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(tensor_scatter) {
  KernelEntry e;
  e.op = "TensorScatter";
  e.check = [](const KernelInit&) { return std::string(); };
  e.dtypes = "all";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& cache = *in[0];
      const Tensor& update = *in[1];
      const Tensor* indices = in.size() > 2 ? in[2] : nullptr;
      const int64_t rank = cache.rank();
      int64_t axis = node->attrs.get_int("axis", -2);
      if (axis < 0) axis += rank;
      const bool circular = node->attrs.get_string("mode", "linear") == "circular";
      int64_t outer = 1, inner = 1;
      for (int64_t d = 0; d < axis; ++d) outer *= cache.dim(d);
      for (int64_t d = axis + 1; d < rank; ++d) inner *= cache.dim(d);
      const int64_t length = cache.dim(axis), rows = update.dim(axis), per_batch = outer / std::max<int64_t>(cache.dim(0), 1);
      const size_t row_bytes = static_cast<size_t>(inner) * element_size(cache.dtype());
      if (cache.nbytes()) std::memcpy(out[0].raw(), cache.raw(), cache.nbytes());
      char* dst = static_cast<char*>(out[0].raw());
      const char* src = static_cast<const char*>(update.raw());
      for (int64_t o = 0; o < outer; ++o) {
        const int64_t start = indices ? indices->value_as_int(o / std::max<int64_t>(per_batch, 1)) : 0;
        if (start < 0 || (!circular && start > length - rows))
          throw Error(ErrorKind::kInvalidArgument, "write index " + std::to_string(start) + " puts " + std::to_string(rows) +
                                                       " rows outside a cache of " + std::to_string(length))
              .node(node->name, node->op);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t at = circular ? (start % length + r) % length : start + r;
          std::memcpy(dst + static_cast<size_t>(o * length + at) * row_bytes, src + static_cast<size_t>(o * rows + r) * row_bytes,
                      row_bytes);
        }
      }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
