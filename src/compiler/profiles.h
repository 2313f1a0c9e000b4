// Optimization profiles as the builder needs them: every input of the model with a range, from
// BuildOptions' profiles and fixed input_shapes (kiln.h), checked against the declared inputs.
#pragma once

#include <string>
#include <vector>

#include "kiln/types.h"

namespace kiln::compiler {

// Each profile of `options` (or one profile of the fixed shapes when it has none), naming every
// input of `declared` (the model's inputs, -1 for dynamic dimensions): an input without a range
// takes options.input_shapes' shape, else its declared shape with dynamic dimensions 1, as
// min = opt = max. Throws kInvalidArgument naming the input and profile for: an input the model
// lacks, a wrong rank, a fixed dimension given another size, a dimension below 1, min > opt or
// opt > max, or an input given both a fixed shape and a range.
std::vector<OptimizationProfile> resolve_profiles(const std::vector<TensorDesc>& declared, const BuildOptions& options);

// The inputs as a GPU engine over these profiles declares them: a dimension that is the same in
// every profile's min and max keeps that size, any other is -1.
std::vector<TensorDesc> profile_inputs(const std::vector<TensorDesc>& declared,
                                       const std::vector<OptimizationProfile>& profiles);

}  // namespace kiln::compiler
