// Slice's per-axis arithmetic (negative indices, clamping, negative steps), shared by the
// schema and the CPU kernel so both agree on every edge case.
#pragma once

#include "ops/shape_dims.h"

namespace kiln::ir {

struct SliceAxis {
  int64_t axis = 0;
  int64_t start = 0;  // the first index read (after clamping); meaningful when length is known
  int64_t step = 1;
  Dim length;
};

// One entry per sliced axis; throws kInvalidModel naming the node on inconsistent inputs.
std::vector<SliceAxis> slice_params(const Node& node, const Dims& in, const std::vector<int64_t>& starts,
                                    const std::vector<int64_t>& ends, const std::optional<std::vector<int64_t>>& axes,
                                    const std::optional<std::vector<int64_t>>& steps);

}  // namespace kiln::ir
