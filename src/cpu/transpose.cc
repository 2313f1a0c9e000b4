// CPU kernels of Transpose, DepthToSpace and SpaceToDepth, all on raw bytes. DepthToSpace and
// SpaceToDepth are a 6-D transpose of a reshaped view.
#include "cpu/data_movement.h"
#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(transpose) {
  {
    KernelEntry e;
    e.op = "Transpose";
    e.dtypes = "all";
    e.create = [](const KernelInit& init) {
      std::vector<int64_t> perm_attr = init.node.attrs.get_ints("perm");
      return make_kernel([perm_attr](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        std::vector<int64_t> perm = perm_attr;
        if (perm.empty())
          for (int i = in[0]->rank(); i-- > 0;) perm.push_back(i);
        transpose_bytes(in[0]->raw(), in[0]->shape(), perm, out[0].raw(), element_size(in[0]->dtype()));
      });
    };
    registry.add(std::move(e));
  }
  for (const char* op : {"DepthToSpace", "SpaceToDepth"}) {
    KernelEntry e;
    e.op = op;
    e.dtypes = "all";
    e.create = [](const KernelInit& init) {
      bool to_space = init.node.op == "DepthToSpace";
      bool crd = init.node.attrs.get_string("mode", "DCR") == "CRD";
      int64_t b = init.node.attrs.require_int("blocksize");
      return make_kernel([=](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        const auto& s = in[0]->shape();
        int64_t n = s[0], c = s[1], h = s[2], w = s[3];
        std::vector<int64_t> view, perm;
        if (to_space && crd) {
          view = {n, c / (b * b), b, b, h, w};
          perm = {0, 1, 4, 2, 5, 3};
        } else if (to_space) {
          view = {n, b, b, c / (b * b), h, w};
          perm = {0, 3, 4, 1, 5, 2};
        } else if (crd) {  // SpaceToDepth CRD (opset 28): channel c*b*b + i*b + j
          view = {n, c, h / b, b, w / b, b};
          perm = {0, 1, 3, 5, 2, 4};
        } else {  // SpaceToDepth DCR: channel (i*b + j)*c + c0
          view = {n, c, h / b, b, w / b, b};
          perm = {0, 3, 5, 1, 2, 4};
        }
        transpose_bytes(in[0]->raw(), view, perm, out[0].raw(), element_size(in[0]->dtype()));
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
