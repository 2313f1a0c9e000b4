// BuildOptions::input_values checked against the model: each names an input of a fixed shape
// (the same in every profile), converted to that input's dtype and shape.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/parameter_inputs.h"
#include "kiln/types.h"

namespace kiln::compiler {

constexpr int64_t kMaxInputValueElements = ir::kMaxParameterElements;

// The values of `given` in each input's dtype and shape (a value of another numeric dtype
// converted when the conversion is exact; a list of the input's element count reshaped to it).
// Throws kInvalidArgument naming the input: not an input, a shape that is not fixed in
// `profiles`, too many elements, a count that does not match, or a value the dtype cannot hold.
std::map<std::string, Tensor> resolve_input_values(const std::vector<TensorDesc>& inputs,
                                                   const std::vector<OptimizationProfile>& profiles,
                                                   const std::map<std::string, Tensor>& given);

}  // namespace kiln::compiler
