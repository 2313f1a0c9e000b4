// Which axes a Reduce* node reduces, shared by the schema and the CPU kernel.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

// Normalized, sorted, unique axes to reduce for an input of `rank`, from the node's `axes`
// input elements (nullopt when absent). An empty result with `noop` true means identity;
// empty `axes` with noop_with_empty_axes=0 means every axis. Throws kInvalidModel naming
// the node for an out-of-range or repeated axis.
std::vector<int64_t> reduce_axes(const Node& node, const std::optional<std::vector<int64_t>>& axes, int64_t rank,
                                 bool* noop);

}  // namespace kiln::ir
