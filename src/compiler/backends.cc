#include "compiler/backends.h"

#include <algorithm>
#include <optional>

#include "compiler/data_dependent_split.h"
#include "compiler/host_tail_engine.h"
#include "compiler/pipeline.h"
#include "cpu/backend.h"
#include "cpu/conv_channels_last.h"
#include "ir/op_schema.h"
#include "passes/passes.h"

#if KILN_WITH_CUDA
#include "cuda/runtime/backend.h"
#endif

namespace kiln::compiler {

namespace {

// The CPU engine's graph: spatial means as GlobalAveragePools (passes::reduce_mean_to_global_pool),
// chains of convolutions channels-last where its kernels read them in place, with the pools and
// elementwise ops among them (passes::channels_last_convs), their large depthwise-separable blocks
// in one node each (passes::separable_convs). An engine file holds the graph after this; loading it runs the
// passes again, which find nothing left to rewrite.
ir::Graph laid_out_for_cpu(ir::Graph graph) {
  if (passes::reduce_mean_to_global_pool(graph) > 0) ir::infer_shapes(graph);
  const passes::ConvLayoutQuery runs = [](const ir::Graph& g, const ir::Node& n) {
    return cpu::channels_last_conv_runs(g, n) || cpu::channels_last_pool_runs(g, n) ||
           (passes::layout_free_elementwise(g, n) && cpu::channels_last_elementwise_runs(g, n));
  };
  if (passes::channels_last_convs(graph, runs, cpu::kChannelsLastMinFlopsPerMovedElement,
                                  cpu::channels_last_conv_reads_channels_first) > 0) {
    ir::infer_shapes(graph);
    if (passes::separable_convs(graph, cpu::kSeparableMinDepthwiseInputBytes) > 0) ir::infer_shapes(graph);
  }
  return graph;
}

#if !KILN_WITH_CUDA
[[noreturn]] void no_cuda() {
  throw Error(ErrorKind::kUnsupported, "this kiln was built without the CUDA backend")
      .hint("rebuild with the CUDA toolkit installed (KILN_WITH_CUDA=ON), or use --device cpu");
}
#endif

#if KILN_WITH_CUDA
// The split of a GPU build whose shapes depend on the data, found on the graph specialized to
// profile 0's opt shapes (where every shape the inputs decide is known).
std::optional<DataDependentSplit> split_for_gpu(const std::shared_ptr<const ir::Graph>& graph, const std::string& name,
                                                const BuildOptions& options,
                                                const std::vector<OptimizationProfile>& profiles) {
  Shapes opt;
  for (const auto& [input, range] : profiles.front()) opt[input] = range.opt;
  return split_at_data_dependent_shapes(*graph, specializer(graph, options.optimize, name)(opt, options.input_values));
}

// The head on the GPU (profiles and input values of the inputs it reads), the tail on the CPU
// engine, and the build's log line saying so.
std::unique_ptr<backend::Engine> build_with_host_tail(std::shared_ptr<const ir::Graph> whole, DataDependentSplit split,
                                                      const std::string& name, const BuildOptions& options,
                                                      const std::vector<OptimizationProfile>& profiles,
                                                      const std::map<std::string, std::string>& tactics) {
  auto reads = [&](const std::string& input) {
    return std::find(split.head.inputs.begin(), split.head.inputs.end(), input) != split.head.inputs.end();
  };
  std::vector<OptimizationProfile> head_profiles;
  for (const OptimizationProfile& p : profiles) {
    OptimizationProfile head;
    for (const auto& [input, range] : p)
      if (reads(input)) head.emplace(input, range);
    head_profiles.push_back(std::move(head));
  }
  BuildOptions head_options = options;
  head_options.input_values.clear();
  for (const auto& [input, values] : options.input_values)
    if (reads(input)) head_options.input_values.emplace(input, values);
  if (options.log) {
    options.log(std::to_string(split.tail.nodes.size()) + " node(s) follow " + named_nodes(split.starts) +
                ", whose output shapes depend on the data, and run on the CPU engine after the GPU's part; each run "
                "copies what the GPU hands them (" + named_nodes(split.handed, 8) +
                ") to the host. --strict refuses the build instead");
  }
  auto head_graph = std::make_shared<const ir::Graph>(split.head);
  std::unique_ptr<backend::Engine> head =
      cuda::build_backend_engine(head_graph, specializer(head_graph, options.optimize, name), head_options, head_profiles, tactics);
  std::unique_ptr<backend::Engine> tail = cpu::build_backend_engine(split.tail, options.max_memory, options.poison_outputs);
  return make_host_tail_engine(std::move(whole), std::move(split), std::move(head), std::move(tail));
}
#endif

}  // namespace

std::unique_ptr<backend::Engine> build_backend_engine(ir::Graph graph, const std::string& name,
                                                      const BuildOptions& options,
                                                      const std::vector<OptimizationProfile>& profiles,
                                                      const std::map<std::string, std::string>& tactics) {
  if (options.device == Device::kCpu)
    return cpu::build_backend_engine(laid_out_for_cpu(std::move(graph)), options.max_memory, options.poison_outputs,
                                     options.precision == Precision::kBf16);
#if KILN_WITH_CUDA
  auto shared = std::make_shared<const ir::Graph>(std::move(graph));
  if (options.allow_cpu_fallback && may_have_data_dependent_shapes(*shared) && !profiles.empty())
    if (std::optional<DataDependentSplit> split = split_for_gpu(shared, name, options, profiles))
      return build_with_host_tail(std::move(shared), std::move(*split), name, options, profiles, tactics);
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

void register_host_memory(void* address, size_t bytes, int gpu) {
#if KILN_WITH_CUDA
  cuda::register_host_memory(address, bytes, gpu);
#else
  (void)address;
  (void)bytes;
  (void)gpu;
  no_cuda();
#endif
}

void unregister_host_memory(void* address, int gpu) noexcept {
#if KILN_WITH_CUDA
  cuda::unregister_host_memory(address, gpu);
#else
  (void)address;
  (void)gpu;
#endif
}

}  // namespace kiln::compiler
