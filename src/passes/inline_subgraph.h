// A subgraph's nodes wired into the enclosing graph: what inline_constant_if does with an If's
// branch, and unroll_loops with each iteration of a Loop's or Scan's body.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/rewrite.h"

namespace kiln::passes {

// `sub`'s nodes for `graph`, to be put in place of the node that held it: input i of `sub` reads
// the value inputs[i]; its constants and the values its nodes compute are added to `graph` under
// fresh names made from `prefix` (dtypes kept, shapes other than constants' left to the next
// inference: the subgraph's own may name dims the graph does not know). Where output_names[o] is
// not empty, the node of `sub` that makes output o writes that value of `graph` as it is, in place
// of a fresh one. `outputs` receives the names `sub`'s outputs have in `graph`: output_names[o]
// where a node made it, otherwise (an output that is an input, a constant or another output too)
// the value it is, which the caller copies where it needs output_names[o] itself.
std::vector<ir::Node> inline_subgraph(ir::Graph& graph, NodeNames& names, const std::string& prefix, const ir::Graph& sub,
                                      const std::vector<std::string>& inputs, const std::vector<std::string>& output_names,
                                      std::vector<std::string>& outputs);

}  // namespace kiln::passes
