// Col2Im's geometry, one definition for its schema and its CPU kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/op_schema.h"
#include "ir/sizes.h"

namespace kiln::ir {

struct Col2ImGeometry {
  std::vector<int64_t> image, block, dilations, strides, pads;  // pads: begins, then ends
  std::vector<int64_t> per_dim;  // blocks along each dim
  int64_t block_size = 1;        // prod(block)
  int64_t blocks = 1;            // prod(per_dim): L
};

// Throws kInvalidModel naming the node for lengths that disagree, non-positive sizes, negative
// pads, a block larger than the padded image or sizes that overflow.
Col2ImGeometry col2im_geometry(const Node& node, const std::vector<int64_t>& image, const std::vector<int64_t>& block);

}  // namespace kiln::ir
