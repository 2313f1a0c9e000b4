// DeformConv's geometry (opset 19), one definition for its schema and its CPU kernel: a 2-D
// convolution whose every kernel tap samples the input at its usual place moved by a learned
// offset (bilinearly, zero outside the image), optionally scaled by a mask.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ops/conv_geometry.h"

namespace kiln::ir {

struct DeformConvParams {
  ConvGeometry geometry;
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t out_channels = 0, out_height = 0, out_width = 0;
  int64_t offset_group = 1;
};

// From the shapes of X [N, C, H, W], W [oC, C / group, kH, kW], offset
// [N, offset_group * 2 * kH * kW, oH, oW], the mask [N, offset_group * kH * kW, oH, oW] and the
// bias [oC] (nullopt where absent). Throws kInvalidModel naming the node for any disagreement,
// kUnsupported for other than 2-D.
DeformConvParams deform_conv_params(const Node& node, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                    const std::vector<int64_t>& offset, const std::optional<std::vector<int64_t>>& mask,
                                    const std::optional<std::vector<int64_t>>& bias);

}  // namespace kiln::ir
