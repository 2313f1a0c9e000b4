// MaxUnpool's output size, one definition for its schema and its CPU kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/op_schema.h"

namespace kiln::ir {

// The spatial sizes MaxUnpool's indices refer to, (in - 1) * stride + kernel - pads, for the
// spatial sizes `in` (-1 where unknown gives -1). Throws kInvalidModel naming the node for
// attribute lists of the wrong length, non-positive kernels or strides, negative pads, sizes
// that overflow or come out negative.
std::vector<int64_t> max_unpool_sizes(const Node& node, const std::vector<int64_t>& in);

}  // namespace kiln::ir
