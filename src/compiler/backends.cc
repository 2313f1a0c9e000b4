#include "compiler/backends.h"

#include <algorithm>
#include <optional>

#include "compiler/data_dependent_split.h"
#include "compiler/host_tail_engine.h"
#include "compiler/pipeline.h"
#include "compiler/row_stages.h"
#include "compiler/staged_tail_engine.h"
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

// Row stages run up to this many rows (regions) at a time: a detection model's box head sees up
// to a thousand proposals (8 runs), its mask head up to a hundred detections (one run).
constexpr int64_t kRowStageRows = 128;

struct BuiltTail {
  std::unique_ptr<backend::Engine> engine;
  std::map<std::string, std::string> on_gpu;  // node name -> its tactic, for the tail's nodes in row stages
};

// The tail: its row stages (row_stages.h) on the GPU, each built for 1 to kRowStageRows rows, in fp16
// where the build is INT8 or FP8 (nothing calibrated the tail's values), the rest on the CPU
// engine. A stage whose GPU build fails stays on the CPU engine, with a log line saying why.
BuiltTail build_tail(const ir::Graph& tail, const std::string& name, const BuildOptions& options,
                     const std::map<std::string, std::string>& tactics) {
  BuildOptions stage_options = options;
  if (options.precision == Precision::kInt8 || options.precision == Precision::kFp8) stage_options.precision = Precision::kFp16;
  stage_options.input_values.clear();
  stage_options.input_shapes.clear();
  stage_options.profiles.clear();
  stage_options.int8_scales.clear();
  stage_options.float_layers.clear();
  stage_options.mark_outputs.clear();

  std::vector<RowStage> stages;
  std::map<std::string, std::unique_ptr<backend::Engine>> stage_engines;  // by the stage's rows value
  BuiltTail built;
  size_t staged_nodes = 0;
  for (RowStage& stage : find_row_stages(tail)) {
    auto graph = std::make_shared<const ir::Graph>(row_stage_graph(tail, stage));
    std::vector<int64_t> fewest{1}, most{kRowStageRows};
    const ir::Dims& dims = *graph->value(stage.rows).type.shape;
    for (size_t d = 1; d < dims.size(); ++d) {
      fewest.push_back(dims[d].value);
      most.push_back(dims[d].value);
    }
    stage_options.fp32_layers.clear();
    for (const std::string& layer : options.fp32_layers)
      for (size_t i : stage.nodes)
        if (tail.nodes[i].name == layer) stage_options.fp32_layers.push_back(layer);
    try {
      stage_engines[stage.rows] = cuda::build_backend_engine(graph, specializer(graph, options.optimize, name), stage_options,
                                                             {OptimizationProfile{{stage.rows, ShapeRange{fewest, most, most}}}},
                                                             tactics);
    } catch (const Error& e) {
      if (options.log)
        options.log("the " + std::to_string(stage.nodes.size()) + " node(s) computing each row of '" + stage.rows +
                    "' stay on the CPU engine: their GPU build failed: " + e.what());
      continue;
    }
    const std::string tactic = "gpu (rows of '" + stage.rows + "', up to " + std::to_string(kRowStageRows) + " at a time)";
    for (size_t i : stage.nodes) built.on_gpu[tail.nodes[i].name] = tactic;
    staged_nodes += stage.nodes.size();
    stages.push_back(std::move(stage));
  }
  if (stages.empty()) {
    built.engine = cpu::build_backend_engine(tail, options.max_memory, options.poison_outputs);
    return built;
  }
  if (options.log) {
    std::vector<std::string> rows;
    for (const RowStage& s : stages) rows.push_back("'" + s.rows + "'");
    options.log(std::to_string(staged_nodes) + " of the " + std::to_string(tail.nodes.size()) +
                " node(s) after the data-dependent shapes compute each row of " + named_nodes(rows) +
                " on its own and run on the GPU after all, up to " + std::to_string(kRowStageRows) +
                " rows at a time (" + std::to_string(stages.size()) + " stage(s))");
  }
  std::vector<TailPart> parts = tail_parts(tail, stages, kRowStageRows);
  for (TailPart& p : parts)
    p.engine = p.stage ? std::move(stage_engines.at(p.stage->rows))
                       : cpu::build_backend_engine(p.graph, options.max_memory, options.poison_outputs);
  built.engine = make_staged_tail_engine(tail, std::move(parts));
  return built;
}

// The head on the GPU (profiles and input values of the inputs it reads), the tail on the CPU
// engine with its row stages on the GPU, and the build's log lines saying so.
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
  BuiltTail tail;
  if (options.gpu_row_stages) tail = build_tail(split.tail, name, options, tactics);
  else tail.engine = cpu::build_backend_engine(split.tail, options.max_memory, options.poison_outputs);
  return make_host_tail_engine(std::move(whole), std::move(split), std::move(head), std::move(tail.engine),
                               std::move(tail.on_gpu));
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
