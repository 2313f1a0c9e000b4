// Resize's output size and per-axis scale, shared by the schema and the CPU kernel so both
// agree (scales or sizes, axes, keep_aspect_ratio_policy, roi).
#pragma once

#include "ops/shape_dims.h"

namespace kiln::ir {

struct ResizePlan {
  Dims out;                       // per input axis
  std::vector<double> scale;      // per input axis; 1 where the axis is not resized
  std::vector<double> roi_start;  // per input axis, for tf_crop_and_resize (default 0)
  std::vector<double> roi_end;    // (default 1)
};

// `scales` (float) or `sizes` (int elements, possibly symbolic) gives the size; pass nullptr /
// nullopt for the one that is absent or empty. Throws kInvalidModel naming the node.
ResizePlan resize_plan(const Node& node, const Dims& in, const Tensor* roi, const Tensor* scales,
                       const std::optional<Dims>& sizes);

}  // namespace kiln::ir
