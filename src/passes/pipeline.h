// Graph passes: each takes a Graph and rewrites it in place; each lives in its own file and
// can be run and tested alone. optimize() runs them in the order the CPU and GPU backends want.
#pragma once

#include "ir/graph.h"

namespace kiln::passes {

// Each returns the number of rewrites it made (0: the graph is unchanged).
int eliminate_dead_code(ir::Graph& graph);

struct PassOptions {
  bool fold_constants = true;
  bool fuse = true;  // BatchNorm folding and Conv/Gemm epilogue fusion
};

// Runs the passes to a fixed point and re-infers shapes.
void optimize(ir::Graph& graph, const PassOptions& options = {});

}  // namespace kiln::passes
