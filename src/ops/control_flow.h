// What the schemas of If, Loop and Scan (control_flow.cc) and their CPU kernels
// (src/cpu/control_flow.cc) agree on: the types a node gives its subgraph.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

// The types of the inputs `node` gives its subgraph (If: either branch's; Loop and Scan: the
// body's), from the node's input types: a Loop's iteration and condition first; a Loop's carried
// values and a Scan's states with every dim left to the run (they may change shape between
// iterations); a scanned input without its scan axis. Fills `types` and returns "", or returns
// why they are not known (an input of unknown rank). Throws kInvalidModel naming the node for
// scan axes that do not fit.
std::string subgraph_input_types(const Node& node, const std::vector<const TensorType*>& inputs, std::vector<TensorType>& types);

}  // namespace kiln::ir
