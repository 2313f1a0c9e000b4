// What the CPU engine's If, Loop and Scan kernels (cpu/control_flow.cc) do to a subgraph before
// they build it.
#pragma once

#include "ir/graph.h"

namespace kiln::cpu {

// The passes that need no backend, to a fixed point, as compiler::optimize runs them on a whole
// model: cleanup (Identity, inference Dropout, identity Casts), constant folding (shape
// arithmetic of values the subgraph reads unchanged, nodes of constants only) and dead code. The
// subgraph's inputs and outputs keep their names and order. A Loop's body runs every iteration:
// left in, each of those nodes costs every trip. Returns the number of rewrites.
int simplify_subgraph(ir::Graph& graph);

}  // namespace kiln::cpu
