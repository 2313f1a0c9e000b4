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

// Whether a slice of a row-major tensor of dims `in` (all known) with `params` (slice_params)
// reads exactly the first elements of its input, in order: starts at 0, steps of 1 where more
// than one element is kept, every axis before the first that keeps several elements kept to one
// element, every axis after it whole (a classifier's padded [1, 1008] cut to [1, 1000]). Such a
// slice moves no bytes: its output can be a view of its input's memory. False for an empty slice.
bool slice_reads_leading_elements(const std::vector<int64_t>& in, const std::vector<SliceAxis>& params);

}  // namespace kiln::ir
