// CPU kernel of Unique (numeric types and bool; see ops/unique_params.h).
#include <cstring>

#include "cpu/kernel.h"
#include "ops/unique_params.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(unique) {
  KernelEntry e;
  e.op = "Unique";
  e.dtypes = "float32, float64, float16, bfloat16, integers, bool";
  e.check = [](const KernelInit& init) -> std::string {
    return init.dtype(0) == DType::kString ? "string tensors are not supported" : "";
  };
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      std::optional<int64_t> axis;
      if (node->attrs.has("axis")) axis = node->attrs.get_int("axis", 0);
      const ops::UniqueSlices u = ops::unique_slices(x, axis, node->attrs.get_int("sorted", 1) != 0);
      const int64_t count = static_cast<int64_t>(u.first.size());
      if (out[0].numel() != u.outer * count * u.inner) throw node->error(ErrorKind::kInternal, "Y has the wrong size");
      const size_t row = static_cast<size_t>(u.inner) * element_size(x.dtype());
      const auto* src = static_cast<const unsigned char*>(x.raw());
      auto* dst = static_cast<unsigned char*>(out[0].raw());
      for (int64_t o = 0; o < u.outer; ++o)
        for (int64_t k = 0; k < count; ++k)
          std::memcpy(dst + static_cast<size_t>(o * count + k) * row, src + static_cast<size_t>(o * u.along + u.first[static_cast<size_t>(k)]) * row, row);
      const std::vector<int64_t>* lists[] = {&u.first, &u.inverse, &u.counts};
      for (size_t o = 1; o < out.size(); ++o) {
        if (!out[o].defined()) continue;
        const std::vector<int64_t>& v = *lists[o - 1];
        if (out[o].numel() != static_cast<int64_t>(v.size())) throw node->error(ErrorKind::kInternal, "an index output has the wrong size");
        if (!v.empty()) std::memcpy(out[o].raw(), v.data(), v.size() * sizeof(int64_t));
      }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
