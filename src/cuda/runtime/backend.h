// The CUDA engine behind the backend interface (src/backend/backend.h): the public build
// options and profiles lowered to the builder's (cuda/runtime/engine.h), engine descriptions, contexts on
// streams of their own, and the timer of the where-faster build.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.h"

namespace kiln::cuda {

// The graph at concrete input shapes (input name -> shape) and input values (the inputs that set
// parameters, BuildOptions::input_values), from the compiler: what each plan is built from.
using GraphAtShapes = std::function<ir::Graph(const std::map<std::string, std::vector<int64_t>>&,
                                              const std::map<std::string, Tensor>&)>;

// The GPU engine of `graph` (the optimized graph, dynamic dimensions symbolic) over `profiles`
// (each naming every input), timing tactics unless `tactics` (timing-cache entries, from an
// engine file) name them; built on, and running on, GPU options.gpu.
std::unique_ptr<backend::Engine> build_backend_engine(std::shared_ptr<const ir::Graph> graph, GraphAtShapes specialize,
                                                      const BuildOptions& options,
                                                      const std::vector<OptimizationProfile>& profiles,
                                                      const std::map<std::string, std::string>& tactics);

// What an engine file records of GPU `gpu` and the libraries (name, compute capability, CUDA
// runtime, cuDNN and cuBLASLt versions).
nlohmann::json device_identity(int gpu);

// Throws kInvalidArgument, naming `engine_path` and both machines, when an engine built where
// `built` was recorded cannot run on GPU `gpu` here (another compute capability, cuDNN or
// cuBLASLt), or when there is no GPU `gpu`.
void check_device(int gpu, const nlohmann::json& built, const std::string& engine_path);

// Page-locks `bytes` of host memory at `address` for every GPU (cudaHostRegister, portable; the
// registration made with GPU `gpu` current), so copies from it go to a device directly; throws
// kiln::Error with the driver's reason when it refuses. unregister_host_memory() undoes it (the
// memory must stay mapped until then).
void register_host_memory(void* address, size_t bytes, int gpu);
void unregister_host_memory(void* address, int gpu) noexcept;

}  // namespace kiln::cuda
