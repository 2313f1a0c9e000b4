#include "compiler/backends.h"

#include "compiler/pipeline.h"
#include "cpu/backend.h"

#if KILN_WITH_CUDA
#include "cuda/runtime/backend.h"
#endif

namespace kiln::compiler {

namespace {
[[noreturn]] void no_cuda() {
  throw Error(ErrorKind::kUnsupported, "this kiln was built without the CUDA backend")
      .hint("rebuild with the CUDA toolkit installed (KILN_WITH_CUDA=ON), or use --device cpu");
}
}  // namespace

std::unique_ptr<backend::Engine> build_backend_engine(ir::Graph graph, const std::string& name,
                                                      const BuildOptions& options,
                                                      const std::vector<OptimizationProfile>& profiles,
                                                      const std::map<std::string, std::string>& tactics) {
  if (options.device == Device::kCpu) return cpu::build_backend_engine(std::move(graph), options.max_memory, options.poison_outputs);
#if KILN_WITH_CUDA
  auto shared = std::make_shared<const ir::Graph>(std::move(graph));
  return cuda::build_backend_engine(shared, specializer(shared, options.optimize, name), options, profiles, tactics);
#else
  no_cuda();
#endif
}

nlohmann::json device_identity(Device device, int gpu) {
  if (device == Device::kCpu) return cpu::device_identity();
#if KILN_WITH_CUDA
  return cuda::device_identity(gpu);
#else
  no_cuda();
#endif
}

void check_device(Device device, int gpu, const nlohmann::json& recorded, const std::string& engine_path) {
  if (device == Device::kCpu) return cpu::check_device(engine_path);
#if KILN_WITH_CUDA
  cuda::check_device(gpu, recorded, engine_path);
#else
  throw Error(ErrorKind::kUnsupported, "this kiln was built without the CUDA backend and cannot run GPU engines")
      .file(engine_path);
#endif
}

}  // namespace kiln::compiler
