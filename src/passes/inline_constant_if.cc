// An If whose condition is a constant runs the same branch every time: its nodes take the If's
// place. The branch (a self-contained model: src/onnx/control_flow.cc) is imported with the
// node's inputs' types; its values get fresh names, its inputs become the node's inputs, its
// outputs the node's outputs (through Identity where a branch output is an input, a constant or
// another output too). Passes after it then see through the branch, and a backend without If
// (the GPU engine) can run the model.
#include "onnx/importer.h"
#include "passes/inline_subgraph.h"
#include "passes/passes.h"

namespace kiln::passes {

int inline_constant_if(ir::Graph& graph) {
  int inlined = 0;
  NodeNames names(graph);
  for (size_t n = 0; n < graph.nodes.size();) {
    const ir::Node node = graph.nodes[n++];
    if (node.op != "If" || !node.domain.empty() || node.inputs.empty()) continue;
    const Tensor* cond = graph.constant(node.inputs[0]);
    if (!cond || cond->numel() != 1) continue;
    std::vector<ir::TensorType> types;
    for (size_t i = 1; i < node.inputs.size(); ++i) {
      const ir::Value* v = graph.find_value(node.inputs[i]);
      if (!v || !v->type.shape) break;
      types.push_back(v->type);
    }
    if (types.size() + 1 != node.inputs.size()) continue;  // a rank not known yet: a later round
    const std::string attr = cond->value_as_double(0) != 0 ? "then_model" : "else_model";
    ir::Graph branch;
    try {
      branch = onnx_import::import_subgraph(node.attrs.get_string(attr, ""), types, attr);
    } catch (Error& e) {
      if (e.node_name().empty()) e.node(node.name, node.op);
      throw;
    }
    if (branch.outputs.size() != node.outputs.size())
      throw node.error(ErrorKind::kInvalidModel, attr + " gives " + std::to_string(branch.outputs.size()) + " outputs; the node has " +
                                                     std::to_string(node.outputs.size()));
    std::vector<std::string> inputs(node.inputs.begin() + 1, node.inputs.end()), outputs;
    std::vector<ir::Node> nodes = inline_subgraph(graph, names, node.name, branch, inputs, node.outputs, outputs);
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (node.outputs[o].empty() || outputs[o] == node.outputs[o]) continue;
      ir::Node copy;  // an output that is an input, a constant or another output too
      copy.op = "Identity";
      copy.name = names.fresh(node.name + "/output" + std::to_string(o));
      copy.inputs = {outputs[o]};
      copy.outputs = {node.outputs[o]};
      nodes.push_back(std::move(copy));
    }
    const auto at = graph.nodes.begin() + static_cast<std::ptrdiff_t>(n - 1);
    graph.nodes.insert(graph.nodes.erase(at), nodes.begin(), nodes.end());
    n += nodes.size() - 1;  // past the branch's nodes (an If among them: a later round)
    ++inlined;
  }
  return inlined;
}

}  // namespace kiln::passes
