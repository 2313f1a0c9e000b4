// Random inputs for a model (kiln run --random, kiln bench, the fp16 accuracy budget): floats
// ~ N(0, 1), integers and booleans small and non-negative.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::tools {

// A tensor of `desc`'s dtype and `shape`. Throws kUnsupported naming the input for a dtype it
// cannot fill (strings, FP8, ...).
Tensor random_input(const TensorDesc& desc, const std::vector<int64_t>& shape, std::mt19937_64& rng);

}  // namespace kiln::tools
