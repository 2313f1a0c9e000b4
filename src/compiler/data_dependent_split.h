// A GPU engine plans every buffer before it runs, so a node whose output shapes its data decides
// (NonZero, NonMaxSuppression, Unique, an If whose condition is computed, a Loop, ...) cannot be
// one of its layers, nor can anything that reads such a node's outputs. A GPU build of such a
// model (torchvision's detection models: a backbone, then box selection) splits the graph in two:
// the head, every node whose shapes the input shapes decide, runs on the GPU; the tail, the first
// node whose shapes the data decides and every node after it, runs on the CPU engine, which sizes
// each output as it runs (docs/design/control-flow.md, "GPU builds: a CPU tail").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::compiler {

struct DataDependentSplit {
  // The head: the graph's inputs that its nodes read, its outputs that the head computes, then
  // the values it hands the tail (`handed`).
  ir::Graph head;
  // The tail: the graph's inputs that its nodes read, then the handed values; the graph's outputs
  // that the tail computes.
  ir::Graph tail;
  std::vector<std::string> handed;  // values the head computes and the tail reads
  // The nodes whose output shapes their data decides ("name (op)", in graph order): where the
  // tail begins.
  std::vector<std::string> starts;
};

// The first `shown` of `nodes`, comma-separated, then "and N more": what a message names of a
// split's starts (a detection model's per-class selection has hundreds).
std::string named_nodes(const std::vector<std::string>& nodes, size_t shown = 4);

// True when `graph` (dynamic dimensions symbolic) has a node whose output shapes may not follow
// from the input shapes: a dimension neither known nor named, or a node whose CPU kernel makes its
// own outputs (If, Loop, Scan). A cheap test before specializing the graph to find out.
bool may_have_data_dependent_shapes(const ir::Graph& graph);

// Splits `graph` where `at_shapes` (the same graph specialized to concrete input shapes: every
// shape the input shapes decide is known there) still has a node whose outputs have a dimension
// that is not known, or whose CPU kernel makes its outputs. Nothing (nullopt) when every node's
// shapes follow from the input shapes. Throws kUnsupported, naming the node, when the very first
// nodes depend on the data (the head would compute nothing: no output, nothing for the tail).
std::optional<DataDependentSplit> split_at_data_dependent_shapes(const ir::Graph& graph, const ir::Graph& at_shapes);

}  // namespace kiln::compiler
