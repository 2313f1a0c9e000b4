// A Gemm's C broadcasts to the product's [M, N] (a row of biases, a column, one value). The GPU
// engine's Gemm layer takes a constant C of any such shape (folded into its bias or expanded when
// it is built) but a runtime C only as a whole [M, N] matrix, which cuBLASLt adds in its epilogue.
// For that backend this pass puts an Expand to [M, N] in front of a runtime C of another shape,
// where M and N are known: the layer then adds it as it is.
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

int expand_gemm_c(ir::Graph& graph) {
  int expanded = 0;
  NodeNames names(graph);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    ir::Node& node = graph.nodes[n];
    if (node.op != "Gemm" || !node.domain.empty() || !node.has_input(2) || graph.constant(node.inputs[2])) continue;
    const ir::TensorType* c = type_of(graph, node.inputs[2]);
    const std::optional<std::vector<int64_t>> out = static_shape(graph, node.outputs[0]);
    if (!c || !c->shape || !out || out->size() != 2 || static_shape(graph, node.inputs[2]) == out) continue;
    const std::string shape = graph.add_constant(node.name + "/c_shape", Tensor::from_vector<int64_t>({2}, *out));
    ir::Value full;
    full.name = names.fresh(node.name + "/c_expanded");
    full.type.dtype = c->dtype;
    full.type.shape = ir::dims_of(*out);
    graph.set_value(full);
    ir::Node expand;
    expand.op = "Expand";
    expand.name = names.fresh(node.name + "/expand_c");
    expand.inputs = {node.inputs[2], shape};
    expand.outputs = {full.name};
    node.inputs[2] = full.name;
    graph.nodes.insert(graph.nodes.begin() + static_cast<std::ptrdiff_t>(n), std::move(expand));
    ++n;  // past the Expand, to the Gemm
    ++expanded;
  }
  return expanded;
}

}  // namespace kiln::passes
