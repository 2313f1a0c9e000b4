#include "cpu/evaluate.h"

#include "cpu/kernel.h"
#include "ir/op_schema.h"

namespace kiln::cpu {

std::optional<std::vector<Tensor>> evaluate_node(const ir::Node& node, const std::vector<const Tensor*>& inputs) {
  const KernelEntry* entry = KernelRegistry::instance().find(node.op, node.domain);
  if (!entry) return std::nullopt;

  std::vector<ir::TensorType> types(inputs.size());
  std::vector<const ir::TensorType*> type_ptrs(inputs.size(), nullptr);
  std::vector<const ir::Dims*> no_symbolic(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) continue;
    types[i].dtype = inputs[i]->dtype();
    types[i].shape = ir::dims_of(inputs[i]->shape());
    type_ptrs[i] = &types[i];
  }
  // The same inference the engine runs: with every input concrete, every shape is known.
  ir::InferContext ctx = ir::infer_node(node, type_ptrs, inputs, no_symbolic);
  std::vector<const ir::TensorType*> out_types;
  for (const ir::TensorType& t : ctx.output_types) {
    if (!t.shape || !ir::all_known(*t.shape)) return std::nullopt;
    out_types.push_back(&t);
  }

  KernelInit init{node, type_ptrs, inputs, out_types};
  if (entry->check && !entry->check(init).empty()) return std::nullopt;
  try {
    std::unique_ptr<Kernel> kernel = entry->create(init);
    std::vector<Tensor> outputs;
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o].empty()) outputs.emplace_back();
      else outputs.emplace_back(ctx.output_types[o].dtype, ir::known_values(*ctx.output_types[o].shape));
    }
    kernel->run(inputs, outputs);
    return outputs;
  } catch (Error& e) {
    // A kernel that turns down an attribute value or layout cannot fold the node; the node
    // stays in the graph and the backend that runs it decides.
    if (e.kind() == ErrorKind::kUnsupported) return std::nullopt;
    if (e.node_name().empty()) e.node(node.name, node.op);
    throw;
  }
}

}  // namespace kiln::cpu
