// The CPU engine behind the backend interface (src/backend/backend.h).
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "backend/backend.h"

namespace kiln::cpu {

// The CPU engine of an optimized graph (dynamic dimensions stay symbolic: it runs any shape);
// a run allocates at most `memory_limit` bytes (0: the machine's memory). bfloat16_products:
// Precision::kBf16's products where the CPU has them (KernelInit::bfloat16_products).
std::unique_ptr<backend::Engine> build_backend_engine(ir::Graph graph, size_t memory_limit, bool poison_outputs = false,
                                                      bool bfloat16_products = false);

// What an engine file records of this CPU ("x86_64_v3": whether it has the AVX2, FMA and F16C
// that kiln's CPU kernels are compiled for).
nlohmann::json device_identity();

// Throws kInvalidArgument, naming `engine_path`, when this CPU cannot run kiln's CPU kernels.
void check_device(const std::string& engine_path);

}  // namespace kiln::cpu
