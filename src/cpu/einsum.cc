// CPU kernel of Einsum (float32, float64, int32, int64): every combination of the labels' indices
// visited once, each operand read through its strides (0 for a broadcast ellipsis dim or a
// repeated label's diagonal), products summed into the output (in double for floats). Meant for
// the small contractions models write as Einsum; a large one is the MatMul it spells.
#include <vector>

#include "cpu/kernel.h"
#include "ops/einsum_params.h"

namespace kiln::cpu {

namespace {

template <class T>
void einsum(const ir::Node& node, const std::vector<const Tensor*>& in, Tensor& out) {
  std::vector<int64_t> ranks;
  for (const Tensor* t : in) ranks.push_back(t->rank());
  ops::EinsumEquation eq;
  const std::string why = ops::parse_einsum(node.attrs.get_string("equation", ""), ranks, eq);
  if (!why.empty()) throw node.error(ErrorKind::kInvalidModel, "equation: " + why);
  const size_t labels = static_cast<size_t>(eq.labels);
  std::vector<int64_t> size(labels, 1);
  for (size_t i = 0; i < in.size(); ++i)
    for (size_t a = 0; a < eq.inputs[i].size(); ++a) size[static_cast<size_t>(eq.inputs[i][a])] =
        std::max(size[static_cast<size_t>(eq.inputs[i][a])], in[i]->dim(static_cast<int>(a)));
  // Per operand and label: the stride in elements (a repeated label adds its axes' strides).
  std::vector<std::vector<int64_t>> stride(in.size(), std::vector<int64_t>(labels, 0));
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t s = 1;
    for (int a = in[i]->rank() - 1; a >= 0; --a) {
      const auto l = static_cast<size_t>(eq.inputs[i][static_cast<size_t>(a)]);
      const int64_t d = in[i]->dim(a);
      if (d != size[l] && d != 1)
        throw node.error(ErrorKind::kInvalidArgument, "operand " + std::to_string(i) + "'s dim " + std::to_string(a) +
                                                          " is " + std::to_string(d) + ", its label's size " + std::to_string(size[l]));
      if (d != 1) stride[i][l] += s;
      s *= d;
    }
  }
  std::vector<int64_t> out_stride(labels, 0);
  {
    int64_t s = 1;
    for (size_t a = eq.output.size(); a-- > 0;) {
      out_stride[static_cast<size_t>(eq.output[a])] = s;
      s *= size[static_cast<size_t>(eq.output[a])];
    }
  }
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;
  std::vector<Acc> acc(static_cast<size_t>(out.numel()), Acc(0));
  // Every combination of the labels is visited: refuse what this reference kernel would take
  // too long to visit (a large contraction is the MatMul it spells).
  constexpr int64_t kMaxVisits = int64_t{1} << 32;
  int64_t total = 1;
  for (int64_t s : size) {
    if (s == 0) total = 0;
    if (total != 0 && s > kMaxVisits / total)
      throw node.error(ErrorKind::kUnsupported, "the contraction visits more than 2^32 index combinations");
    total *= s;
  }
  std::vector<int64_t> index(labels, 0);
  for (int64_t n = 0; n < total; ++n) {
    Acc product = Acc(1);
    for (size_t i = 0; i < in.size(); ++i) {
      int64_t off = 0;
      for (size_t l = 0; l < labels; ++l) off += index[l] * stride[i][l];
      product *= static_cast<Acc>(in[i]->data<T>()[off]);
    }
    int64_t o = 0;
    for (size_t l = 0; l < labels; ++l) o += index[l] * out_stride[l];
    acc[static_cast<size_t>(o)] += product;
    for (size_t l = labels; l-- > 0;) {
      if (++index[l] < size[l]) break;
      index[l] = 0;
    }
  }
  T* y = out.data<T>();
  for (size_t k = 0; k < acc.size(); ++k) y[k] = static_cast<T>(acc[k]);
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(einsum) {
  KernelEntry e;
  e.op = "Einsum";
  e.check = accept_dtypes({DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64});
  e.dtypes = "float32, float64, int32, int64";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      switch (in[0]->dtype()) {
        case DType::kFloat32: einsum<float>(*node, in, out[0]); break;
        case DType::kFloat64: einsum<double>(*node, in, out[0]); break;
        case DType::kInt32: einsum<int32_t>(*node, in, out[0]); break;
        default: einsum<int64_t>(*node, in, out[0]); break;
      }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
