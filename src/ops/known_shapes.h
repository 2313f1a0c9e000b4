// For schemas that check concrete shapes against each other (DeformConv, CausalConvWithState,
// LinearAttention): an input's shape once every dim is known, and a shape as messages write it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/op_schema.h"

namespace kiln::ir {

// "[2, 3, 4]".
inline std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Input i's shape when it is given and every dim is known; nullopt otherwise.
inline std::optional<std::vector<int64_t>> known_shape(const InferContext& ctx, size_t i) {
  if (!ctx.has_input(i) || !ctx.shape_known(i) || !all_known(ctx.shape(i))) return std::nullopt;
  return known_values(ctx.shape(i));
}

}  // namespace kiln::ir
