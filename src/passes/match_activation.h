// Activations written out as nodes after a value, for the passes that absorb them into the
// kernel producing the value (passes/fuse_epilogue.cc, passes/fuse_group_norm.cc).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/activation.h"
#include "ir/graph.h"

namespace kiln::passes {

struct ActivationMatch {
  std::vector<int> nodes;  // the activation's nodes (indices), to be absorbed
  std::string output;      // the activation's result: the value the fused node writes
  ir::Activation act;
};

// The activation reading `x` whose nodes can be absorbed (x is read by nothing else and is not
// a graph output), or nullopt. Besides the single-node activations of ir::Activation, it knows
// the SiLU (x * Sigmoid(x)) and erf-Gelu (x * 0.5 * (1 + Erf(x / sqrt 2))) patterns exporters
// write out as several nodes.
std::optional<ActivationMatch> match_activation(const ir::Graph& g, const std::string& x);

}  // namespace kiln::passes
