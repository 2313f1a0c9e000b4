// CPU kernel of ReverseSequence (any dtype, moved as bytes).
#include <cstring>

#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(reverse_sequence) {
  KernelEntry e;
  e.op = "ReverseSequence";
  e.dtypes = "all";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    const bool batch_first = init.node.attrs.get_int("batch_axis", 1) == 0;
    return make_kernel([node, batch_first](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      const int64_t batch = x.dim(batch_first ? 0 : 1), time = x.dim(batch_first ? 1 : 0);
      int64_t inner = 1;
      for (int d = 2; d < x.rank(); ++d) inner *= x.dim(d);
      const size_t row = static_cast<size_t>(inner) * element_size(x.dtype());
      const auto* src = static_cast<const unsigned char*>(x.raw());
      auto* dst = static_cast<unsigned char*>(out[0].raw());
      // Element (b, t) of the [batch, time] grid starts at this row.
      auto at = [&](int64_t b, int64_t t) { return static_cast<size_t>(batch_first ? b * time + t : t * batch + b) * row; };
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t len = in[1]->value_as_int(b);
        if (len < 0 || len > time)
          throw node->error(ErrorKind::kInvalidArgument, "sequence_lens[" + std::to_string(b) + "] = " + std::to_string(len) +
                                                             " is outside [0, " + std::to_string(time) + "]");
        for (int64_t t = 0; t < time; ++t) std::memcpy(dst + at(b, t), src + at(b, t < len ? len - 1 - t : t), row);
      }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
