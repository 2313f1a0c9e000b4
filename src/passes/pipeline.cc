#include "passes/pipeline.h"

#include "cpu/evaluate.h"
#include "ir/op_schema.h"

namespace kiln::passes {

void optimize(ir::Graph& graph, const PassOptions& options) {
  NodeEvaluator evaluate = [](const ir::Node& node, const std::vector<const Tensor*>& inputs) {
    return cpu::evaluate_node(node, inputs);
  };
  // Cleanup and folding feed each other (a folded Shape makes a Reshape's shape constant,
  // whose chain then dies), so they run to a fixed point; BatchNorm folding needs constant
  // weights, so it runs in the same loop; epilogue fusion runs last, on the settled graph.
  for (int round = 0; round < 16; ++round) {
    int changes = 0;
    changes += remove_identity_and_dropout(graph);
    if (options.fold_constants) changes += fold_constants(graph, evaluate);
    // Once folding has done what it can, learn what symbolic arithmetic missed.
    if (options.fold_constants && round == 0) changes += probe_symbolic_values(graph, evaluate);
    changes += simplify_shape_chains(graph);
    changes += eliminate_dead_code(graph);
    ir::infer_shapes(graph);
    if (options.fuse) {
      int bn = fold_batchnorm(graph);
      if (bn) ir::infer_shapes(graph);
      changes += bn;
    }
    if (changes == 0) break;
  }
  if (options.fuse && options.fuse_epilogue) {
    for (int round = 0; round < 4; ++round) {
      int fused = fuse_epilogue(graph);
      if (fused == 0) break;
      eliminate_dead_code(graph);
      ir::infer_shapes(graph);
    }
  }
  ir::infer_shapes(graph);
}

}  // namespace kiln::passes
