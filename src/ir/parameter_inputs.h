// Parameter inputs: node inputs whose values, not just their shapes, decide the output shape or
// how a layer is made (a Reduce's axes, Resize's scales and sizes, Slice's starts, TopK's k, a
// quantizer's scale). A graph input that feeds one of them is what a GPU engine plans for by
// value (BuildOptions::input_values): bound to given values, it is a constant of the plan, and
// other values make another plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

// The most elements an input planned by value may have: parameters are axes, sizes and scales,
// not data (each distinct value is a plan of its own).
constexpr int64_t kMaxParameterElements = 4096;

// Whether input `index` of `node` is a parameter input of its op.
bool is_parameter_slot(const Node& node, size_t index);

// The graph inputs whose values reach a parameter input (directly or through computation on
// them; not through Shape or Size, which read only a shape) and that have a known shape of at
// most `max_elements` elements, in the graph's input order.
std::vector<std::string> parameter_inputs(const Graph& graph, int64_t max_elements);

}  // namespace kiln::ir
