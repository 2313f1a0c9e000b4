// CPU kernel of Slice: a strided view of the input (negative steps walk backwards), copied
// on raw bytes.
#include "cpu/data_movement.h"
#include "cpu/kernel.h"
#include "ops/slice_params.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(slice) {
  KernelEntry e;
  e.op = "Slice";
  e.dtypes = "all";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      auto ints = [&](size_t i) -> std::optional<std::vector<int64_t>> {
        if (i < in.size() && in[i]) return in[i]->to_int_vector();
        return std::nullopt;
      };
      const auto& shape = in[0]->shape();
      std::vector<ir::SliceAxis> params =
          ir::slice_params(*node, ir::dims_of(shape), *ints(1), *ints(2), ints(3), ints(4));
      std::vector<int64_t> strides = contiguous_strides(shape);
      int64_t offset = 0;
      for (const ir::SliceAxis& p : params) {
        size_t a = static_cast<size_t>(p.axis);
        if (p.length.value > 0) offset += p.start * strides[a];
        // An axis of one element never steps: its step (any int64 from the file) is not used,
        // and multiplying by it could overflow. Longer axes step inside the input.
        if (p.length.value > 1) strides[a] *= p.step;
      }
      strided_copy(in[0]->raw(), offset, strides, out[0].raw(), out[0].shape(), element_size(in[0]->dtype()));
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
