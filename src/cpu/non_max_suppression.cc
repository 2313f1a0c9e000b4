// CPU kernel of NonMaxSuppression (ops/non_max_suppression_params.h): the selection, written
// as [selected, 3] int64 rows into an output the kernel makes (KernelEntry::makes_outputs), so
// the selection runs once a run: the engine's shape inference would otherwise run it too, to
// size the output.
#include "cpu/kernel.h"
#include "ops/non_max_suppression_params.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(non_max_suppression) {
  KernelEntry e;
  e.op = "NonMaxSuppression";
  e.check = [](const KernelInit& init) -> std::string {
    if (init.dtype(0) != DType::kFloat32 || init.dtype(1) != DType::kFloat32)
      return "input types " + to_string(init.dtype(0)) + ", " + to_string(init.dtype(1)) + " are not supported (supported: float32)";
    return "";
  };
  e.dtypes = "float32";
  e.makes_outputs = true;
  e.create = [](const KernelInit& init) {
    const bool center = init.node.attrs.get_int("center_point_box", 0) != 0;
    const ir::Node* node = &init.node;
    return make_kernel([center, node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor &boxes = *in[0], &scores = *in[1];
      // The schema checked the types and shapes; the scalars' element counts are the kernel's.
      for (size_t i = 2; i < in.size(); ++i)
        if (in[i] && in[i]->numel() != 1)
          throw node->error(ErrorKind::kInvalidArgument,
                            "input " + std::to_string(i) + " must hold one value, not " + std::to_string(in[i]->numel()));
      ir::NmsParams p;
      p.center_point_box = center;
      if (in.size() > 2 && in[2]) p.max_per_class = in[2]->value_as_int(0);
      if (in.size() > 3 && in[3]) p.iou_threshold = static_cast<float>(in[3]->value_as_double(0));
      if (in.size() > 4 && in[4]) p.score_threshold = static_cast<float>(in[4]->value_as_double(0));
      const auto selected = ir::non_max_suppression(boxes.data<float>(), scores.data<float>(), boxes.dim(0),
                                                    scores.dim(1), boxes.dim(1), p);
      const int64_t rows = static_cast<int64_t>(selected.size());
      out[0] = Tensor(DType::kInt64, {rows, 3});
      int64_t* y = out[0].data<int64_t>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < 3; ++k) y[r * 3 + k] = selected[static_cast<size_t>(r)][static_cast<size_t>(k)];
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
