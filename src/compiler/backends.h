// The one place that picks a backend for a device, and the one place that knows whether kiln
// was built with the CUDA backend (KILN_WITH_CUDA): everything above it sees backends only
// through src/backend/backend.h.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "kiln/types.h"

namespace kiln::compiler {

// The engine of an optimized graph for options.device (dynamic dimensions symbolic); GPU
// engines over `profiles` (each naming every input), with `tactics` used before any timing.
std::unique_ptr<backend::Engine> build_backend_engine(ir::Graph graph, const std::string& name,
                                                      const BuildOptions& options,
                                                      const std::vector<OptimizationProfile>& profiles,
                                                      const std::map<std::string, std::string>& tactics);

// What an engine file records of this machine's `device` (GPU: of the device index `gpu`).
nlohmann::json device_identity(Device device, int gpu);

// Throws kiln::Error naming `engine_path` unless this machine (GPU engines: its GPU `gpu`) can run
// an engine built for `device` where `recorded` (device_identity() there) was taken.
void check_device(Device device, int gpu, const nlohmann::json& recorded, const std::string& engine_path);

// Page-locks host memory for the GPUs (the CUDA backend's register_host_memory); throws
// kUnsupported without the CUDA backend.
void register_host_memory(void* address, size_t bytes, int gpu);
void unregister_host_memory(void* address, int gpu) noexcept;

}  // namespace kiln::compiler
