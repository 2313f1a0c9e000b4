// DFT's parameters, one definition for its schema and its CPU kernel.
#pragma once

#include <cstdint>
#include <optional>

#include "ir/op_schema.h"

namespace kiln::ir {

struct DftParams {
  int64_t axis = 0;      // non-negative, never the last (real/imaginary) dim
  int64_t length = 0;    // the transform's length (dft_length, else as ONNX's reference defaults it)
  int64_t out_size = 0;  // the output's size along axis
  bool inverse = false, onesided = false;
  bool real_output = false;  // inverse and onesided: a real signal ([..., 1])
};

// From the input's shape (rank >= 2, last dim 1 or 2), dft_length and axis (nullopt: absent;
// the axis defaults to -2). Throws kInvalidModel naming the node for an axis out of range or
// on the last dim, a non-positive length, or a last dim other than 1 or 2.
DftParams dft_params(const Node& node, const std::vector<int64_t>& shape, std::optional<int64_t> length,
                     std::optional<int64_t> axis);

}  // namespace kiln::ir
