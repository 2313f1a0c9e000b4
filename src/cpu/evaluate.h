// Runs one node on the CPU kernels, given all its input values: what constant folding uses
// to compute a node whose inputs are all constants.
#pragma once

#include <optional>
#include <vector>

#include "ir/graph.h"

namespace kiln::cpu {

// The node's outputs (an undefined Tensor for an omitted output), or nullopt when the CPU
// engine has no kernel for the node or refuses it (its dtypes, or a kUnsupported error).
// `inputs` has one entry per node input, nullptr for an omitted optional one. Any other
// failure while computing throws a kiln::Error naming the node.
std::optional<std::vector<Tensor>> evaluate_node(const ir::Node& node, const std::vector<const Tensor*>& inputs);

}  // namespace kiln::cpu
