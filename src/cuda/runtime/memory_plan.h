// Activation memory planning for the CUDA engine (memory_plan.cc says how).
#pragma once

#include <vector>

#include "cuda/runtime/engine.h"

namespace kiln::cuda {

// Assigns Buffer::offset to every kArena buffer from first_use/last_use; returns the arena
// size in bytes. Other buffers are left alone.
size_t plan_arena(std::vector<Buffer>& buffers);

}  // namespace kiln::cuda
