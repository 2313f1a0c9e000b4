#include "passes/pipeline.h"

#include "ir/op_schema.h"

namespace kiln::passes {

void optimize(ir::Graph& graph, const PassOptions& options) {
  for (int round = 0; round < 16; ++round) {
    int changes = 0;
    changes += eliminate_dead_code(graph);
    ir::infer_shapes(graph);
    if (changes == 0) break;
  }
}

}  // namespace kiln::passes
