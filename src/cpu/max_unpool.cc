// CPU kernel of MaxUnpool (float32, float64): zeros, then each X value at the flat index its
// indices element names. An index outside the unpooled tensor is refused, naming the node.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/kernel.h"
#include "ops/max_unpool.h"

namespace kiln::cpu {

namespace {

// Scatters X into `flat` (zeros of the sizes the indices refer to), then copies it into Y's
// leading corner (Y is larger in some dims when output_shape asks for it).
template <class T>
void max_unpool(const ir::Node& node, const Tensor& x, const Tensor& indices, Tensor& y) {
  std::vector<int64_t> in;
  for (int64_t d = 2; d < x.rank(); ++d) in.push_back(x.dim(d));
  std::vector<int64_t> shape = {x.dim(0), x.dim(1)};
  for (int64_t v : ir::max_unpool_sizes(node, in)) shape.push_back(v);
  std::vector<T> flat(static_cast<size_t>(shape_numel(shape)), T(0));
  const T* src = x.data<T>();
  const int64_t* at = indices.data<int64_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (at[i] < 0 || at[i] >= static_cast<int64_t>(flat.size()))
      throw Error(ErrorKind::kInvalidArgument, "index " + std::to_string(at[i]) + " is outside the unpooled tensor of " +
                                                   std::to_string(flat.size()) + " elements")
          .node(node.name, node.op);
    flat[static_cast<size_t>(at[i])] = src[i];
  }
  T* out = y.data<T>();
  if (y.nbytes()) std::memset(y.raw(), 0, y.nbytes());
  // Row by row of the last dim: the source row's coordinates are also the destination's.
  const int64_t rank = static_cast<int64_t>(shape.size()), row = shape.back();
  std::vector<int64_t> coord(static_cast<size_t>(rank), 0);
  for (int64_t r = 0; row > 0 && r < static_cast<int64_t>(flat.size()) / row; ++r) {
    int64_t dst = 0;
    for (int64_t d = 0; d < rank; ++d) dst = dst * y.dim(d) + coord[static_cast<size_t>(d)];
    std::copy(flat.begin() + r * row, flat.begin() + (r + 1) * row, out + dst);
    for (int64_t d = rank - 2; d >= 0 && ++coord[static_cast<size_t>(d)] == shape[static_cast<size_t>(d)]; --d)
      coord[static_cast<size_t>(d)] = 0;
  }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(max_unpool) {
  KernelEntry e;
  e.op = "MaxUnpool";
  e.check = accept_dtypes({DType::kFloat32, DType::kFloat64});
  e.dtypes = "float32, float64";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      if (in[0]->shape() != in[1]->shape())
        throw Error(ErrorKind::kInvalidArgument, "the indices' shape differs from X's").node(node->name, node->op);
      if (in[0]->dtype() == DType::kFloat64) max_unpool<double>(*node, *in[0], *in[1], out[0]);
      else max_unpool<float>(*node, *in[0], *in[1], out[0]);
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
