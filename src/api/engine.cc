// The public API (include/kiln/kiln.h) over the importer, the passes, the CPU engine and,
// when built with it, the CUDA engine.
#include "kiln/kiln.h"

#include <cpuid.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "api/where_faster.h"
#include "api/profiles.h"
#include "cpu/engine.h"
#include "engine/engine_file.h"
#include "ir/op_schema.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "passes/pipeline.h"
#include "quantization/qdq_import.h"
#include "quantization/quantize_graph.h"

#if KILN_WITH_CUDA
#include <cublasLt.h>
#include <cudnn.h>

#include "cuda/check.h"
#include "cuda/engine.h"
#include "cuda/graph_timing.h"
#endif

namespace kiln {

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kTf32: return "tf32";
    case Precision::kFp16: return "fp16";
    case Precision::kBest: return "best";
    case Precision::kInt8: return "int8";
    case Precision::kFp8: return "fp8";
  }
  return "?";
}

struct Engine::Impl {
  std::unique_ptr<cpu::CpuEngine> cpu;
  std::vector<TensorDesc> inputs;
  std::vector<TensorDesc> outputs;
  std::vector<OptimizationProfile> profiles;  // GPU engines
  BuildOptions options;
  std::string model_name;
  std::vector<std::string> int8_kept_float;  // kInt8: convs left in float, "name: why"
  // The optimized graph, dynamic dimensions symbolic: what GPU plans are specialized from and
  // what the engine file holds (CPU engines keep theirs in `cpu`).
  std::shared_ptr<const ir::Graph> graph;
#if KILN_WITH_CUDA
  std::unique_ptr<cuda::CudaEngine> gpu;
  // Engine::run's own context and stream, created on first use.
  mutable std::mutex run_mutex;
  mutable std::shared_ptr<Context::Impl> default_context;
#endif
};

struct Context::Impl {
  std::shared_ptr<const Engine::Impl> engine;
#if KILN_WITH_CUDA
  std::unique_ptr<cuda::CudaContext> context;
  cudaStream_t stream = nullptr;
  ~Impl() {
    context.reset();
    if (stream) cudaStreamDestroy(stream);
  }
#endif
};

namespace {

TensorDesc describe(const ir::Graph& g, const std::string& name) {
  TensorDesc d;
  d.name = name;
  const ir::Value& v = g.value(name);
  d.dtype = v.type.dtype;
  if (v.type.shape) {
    for (const ir::Dim& dim : *v.type.shape) {
      d.shape.push_back(dim.known() ? dim.value : -1);
      d.dim_names.push_back(dim.known() ? "" : dim.symbol);
    }
  }
  return d;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot open the model file (does it exist?)").file(path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

#if KILN_WITH_CUDA
cuda::Precision cuda_precision(Precision p) {
  switch (p) {
    case Precision::kFp32: return cuda::Precision::kFp32;
    case Precision::kTf32: return cuda::Precision::kTf32;
    case Precision::kFp16:
    case Precision::kBest:
    case Precision::kInt8:
    case Precision::kFp8: return cuda::Precision::kFp16;  // INT8 and FP8 layers are kiln::QConv nodes
  }
  return cuda::Precision::kFp32;
}

// What an engine file must match on the machine that loads it.
nlohmann::json device_identity() {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int runtime = 0;
  KILN_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  return {{"gpu", prop.name},
          {"compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
          {"cuda_runtime", runtime},
          {"cudnn", static_cast<int64_t>(cudnnGetVersion())},
          {"cublaslt", static_cast<int64_t>(cublasLtGetVersion())}};
}
#endif

// The CPU an engine file records (informative), and whether this one runs kiln's CPU kernels.
nlohmann::json cpu_identity() {
  // CPUID directly: clang's __builtin_cpu_supports does not know "f16c".
  unsigned a = 0, b = 0, c = 0, d = 0;
  bool v3 = false;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    const bool fma = c & (1u << 12), f16c = c & (1u << 29), avx = c & (1u << 28);
    unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
    const bool avx2 = __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7) && (b7 & (1u << 5));
    v3 = fma && f16c && avx && avx2;
  }
  return {{"cpu", "x86-64"}, {"x86_64_v3", v3}};
}

// The build options an engine file's header holds (Engine::save writes them).
BuildOptions options_from_header(const nlohmann::json& o) {
  BuildOptions options;
  const std::string precision = o.at("precision").get<std::string>();
  options.precision = precision == "fp16" ? Precision::kFp16 : precision == "tf32" ? Precision::kTf32
                      : precision == "best" ? Precision::kBest : precision == "int8" ? Precision::kInt8
                      : precision == "fp8" ? Precision::kFp8 : precision == "fp32" ? Precision::kFp32
                      : throw Error(ErrorKind::kInvalidModel, "the engine file names an unknown precision '" + precision + "'");
  if (o.contains("int8_scales")) options.int8_scales = o.at("int8_scales").get<std::map<std::string, float>>();
  if (o.contains("float_layers")) options.float_layers = o.at("float_layers").get<std::vector<std::string>>();
  options.optimize = o.at("optimize").get<bool>();
  options.allow_cpu_fallback = o.at("allow_cpu_fallback").get<bool>();
  if (o.contains("profile_timing_step")) options.profile_timing_step = o.at("profile_timing_step").get<double>();
  return options;
}

nlohmann::json profiles_to_json(const std::vector<OptimizationProfile>& profiles) {
  nlohmann::json out = nlohmann::json::array();
  for (const OptimizationProfile& p : profiles) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [name, r] : p) j[name] = {{"min", r.min}, {"opt", r.opt}, {"max", r.max}};
    out.push_back(j);
  }
  return out;
}

[[maybe_unused]] std::vector<OptimizationProfile> profiles_from_json(const nlohmann::json& j) {
  std::vector<OptimizationProfile> out;
  for (const nlohmann::json& p : j) {
    OptimizationProfile profile;
    for (const auto& [name, r] : p.items())
      profile[name] = ShapeRange{r.at("min").get<std::vector<int64_t>>(), r.at("opt").get<std::vector<int64_t>>(),
                                 r.at("max").get<std::vector<int64_t>>()};
    out.push_back(std::move(profile));
  }
  return out;
}

// The model in float, as an engine runs it before quantization: imported, Q/DQ pairs absorbed
// (their scales in `qdq`), optimized (dynamic dimensions kept symbolic), marked outputs added.
ir::Graph float_graph(const std::string& model_bytes, const std::string& name, const std::string& base_dir,
                      const BuildOptions& options, quantization::QdqScales& qdq) {
  ir::Graph graph = onnx_import::import_bytes(model_bytes, name, base_dir);
  // Named values are marked before the passes (so they survive them); "all" marks the outputs
  // of the optimized graph's nodes, so both engines compare the same fused layers.
  auto mark = [&](const std::string& v) {
    if (!v.empty() && !graph.is_graph_output(v) && !graph.constant(v)) graph.outputs.push_back(v);
  };
  bool mark_all = false;
  for (const std::string& m : options.mark_outputs) {
    if (m == "all") {
      mark_all = true;
    } else if (graph.has_value(m) && !graph.constant(m)) {
      mark(m);
    } else {
      throw Error(ErrorKind::kInvalidArgument, "--mark-outputs: the model has no computed value named '" + m + "'").file(name);
    }
  }
  // Explicit quantization: the model's Q/DQ pairs become scales for the INT8 pass.
  if (options.precision == Precision::kInt8) qdq = quantization::absorb_qdq(graph);
  try {
    if (options.optimize) passes::optimize(graph);
  } catch (Error& e) {
    if (e.file_path().empty()) e.file(name);
    throw;
  }
  if (mark_all)
    for (const ir::Node& n : graph.nodes)
      for (const std::string& out : n.outputs) mark(out);
  return graph;
}

// INT8 and FP8 builds: the float graph's convolutions quantized (the others: nothing to do).
void quantize_for_precision(ir::Graph& graph, const std::string& name, const BuildOptions& options,
                            const quantization::QdqScales& qdq, std::vector<std::string>& int8_kept_float) {
  if (options.precision != Precision::kInt8 && options.precision != Precision::kFp8) return;
  const bool fp8 = options.precision == Precision::kFp8;
  // The model's own scales first (a QDQ model), calibrated ones for the other values.
  std::map<std::string, float> scales = qdq.activations;
  scales.insert(options.int8_scales.begin(), options.int8_scales.end());
  if (scales.empty())
    throw Error(ErrorKind::kInvalidArgument, "an INT8 build needs calibrated activation scales").file(name)
        .hint("give calibration data (kiln build --int8 --calib DATA) or a calibration cache (--calib-cache FILE), "
              "or a model with QuantizeLinear/DequantizeLinear pairs");
  std::set<std::string> pinned(options.float_layers.begin(), options.float_layers.end());
  quantization::QuantizeTarget target;
  if (fp8) {
    // cuDNN's FP8 engines: group-1 convolutions of 16-channel multiples; both engines build
    // the same graph.
    target.format = quantization::QuantizeFormat::kFloat8E4M3;
    target.few_input_channels = false;
  } else {
    target.grouped_convolutions = options.device == Device::kCpu;
    target.depthwise_convolutions = true;    // the GPU's INT8 depthwise kernel
    target.gpu_grouped_convolutions = true;  // and its grouped one
  }
  quantization::QuantizeGraphReport r = quantization::quantize_graph(graph, scales, pinned, &qdq.weights, target);
  int8_kept_float = r.kept_float;
  if (options.log) {
    const std::string tag = fp8 ? "fp8" : "int8", format = fp8 ? "FP8" : "INT8";
    options.log(tag + ": " + std::to_string(r.quantized) + " convolutions in " + format + " (" + std::to_string(r.matrix_products) +
                " of them matrix products as 1x1 convolutions, " + std::to_string(r.model_weights) +
                " with the model's int8 weights), " + std::to_string(r.int8_values) + " " + tag + " tensors between them (" +
                std::to_string(r.int8_pools) + " through MaxPools), " +
                std::to_string(r.quantize_nodes) + " quantize layers");
    for (const std::string& k : r.kept_float) options.log(tag + ": kept in float: " + k);
  }
}

// The model as an engine runs it: the float graph, quantized for INT8 and FP8.
ir::Graph optimized_graph(const std::string& model_bytes, const std::string& name, const std::string& base_dir,
                          const BuildOptions& options, std::vector<std::string>& int8_kept_float) {
  quantization::QdqScales qdq;
  ir::Graph graph = float_graph(model_bytes, name, base_dir, options, qdq);
  quantize_for_precision(graph, name, options, qdq, int8_kept_float);
  return graph;
}

#if KILN_WITH_CUDA
cuda::Profile cuda_profile(const OptimizationProfile& p) {
  cuda::Profile out;
  for (const auto& [name, r] : p) out.inputs[name] = cuda::ShapeRange{r.min, r.opt, r.max};
  return out;
}

// A GPU plan's graph: the engine's graph at concrete input shapes, shape arithmetic folded (and
// anything that folding opens up fused, when the build optimizes).
cuda::CudaEngine::Specializer specializer(std::shared_ptr<const ir::Graph> graph, bool optimize, std::string name) {
  return [graph = std::move(graph), optimize, name = std::move(name)](const cuda::Shapes& shapes) {
    ir::Graph g = *graph;
    try {
      passes::bind_input_shapes(g, shapes);
      if (optimize) passes::optimize(g);
    } catch (Error& e) {
      if (e.file_path().empty()) e.file(name);
      throw;
    }
    return g;
  };
}
#endif

// Makes the engine of an optimized graph: the CPU engine, or the GPU engine over the profiles
// (with `tactics` used before any timing).
std::shared_ptr<Engine::Impl> make_engine(ir::Graph graph, const std::string& name, const BuildOptions& options,
                                          std::vector<OptimizationProfile> profiles,
                                          const std::map<std::string, std::string>& tactics,
                                          std::vector<std::string> int8_kept_float) {
  auto impl = std::make_shared<Engine::Impl>();
  impl->options = options;
  impl->options.log = nullptr;
  impl->model_name = name;
  impl->int8_kept_float = std::move(int8_kept_float);
  for (const std::string& in : graph.inputs) impl->inputs.push_back(describe(graph, in));
  for (const std::string& out : graph.outputs) impl->outputs.push_back(describe(graph, out));
  try {
    if (options.device == Device::kCpu) {
      if (!options.profiles.empty())
        throw Error(ErrorKind::kInvalidArgument, "optimization profiles are for GPU engines: the CPU engine runs any input shape")
            .hint("leave out --min-shapes/--opt-shapes/--max-shapes, or build for --device cuda");
      impl->cpu = std::make_unique<cpu::CpuEngine>(std::move(graph), options.max_memory);
    } else {
      if (profiles.empty()) profiles = api::resolve_profiles(impl->inputs, options);
#if KILN_WITH_CUDA
      impl->profiles = profiles;
      impl->inputs = api::profile_inputs(impl->inputs, profiles);
      impl->graph = std::make_shared<const ir::Graph>(std::move(graph));
      cuda::BuildConfig config;
      config.precision = cuda_precision(options.precision);
      config.allow_cpu_fallback = options.allow_cpu_fallback;
      config.timing_cache_path = options.timing_cache;
      config.timing_entries = tactics;
      config.timed_shape_step = options.profile_timing_step;
      config.max_memory = options.max_memory;
      config.log = options.log;
      for (const OptimizationProfile& p : profiles) config.profiles.push_back(cuda_profile(p));
      impl->gpu = cuda::CudaEngine::build(specializer(impl->graph, options.optimize, name), config);
      // Output dimensions that differ between the profiles' min and max plans vary; the others
      // are what every plan computes.
      for (size_t i = 0; i < impl->outputs.size(); ++i) {
        std::vector<int64_t> shape;
        for (int p = 0; p < static_cast<int>(profiles.size()); ++p)
          for (const auto& plan : {impl->gpu->opt_plan(p), impl->gpu->max_plan(p),
                                   impl->gpu->plan(cuda_profile(profiles[static_cast<size_t>(p)]).min())}) {
            const std::vector<int64_t>& s = plan->outputs().at(i).shape;
            if (shape.empty()) shape = s;
            for (size_t d = 0; d < shape.size() && d < s.size(); ++d)
              if (shape[d] != s[d]) shape[d] = -1;
          }
        impl->outputs[i].shape = shape;
        for (size_t d = 0; d < shape.size() && d < impl->outputs[i].dim_names.size(); ++d)
          if (shape[d] >= 0) impl->outputs[i].dim_names[d].clear();
      }
#else
      throw Error(ErrorKind::kUnsupported, "this kiln was built without the CUDA backend")
          .hint("rebuild with the CUDA toolkit installed (KILN_WITH_CUDA=ON), or use --device cpu");
#endif
    }
  } catch (Error& e) {
    if (e.file_path().empty()) e.file(name);
    throw;
  }
  return impl;
}

#if KILN_WITH_CUDA
// One profiled run of a GPU context as the public API reports it.
std::vector<LayerTiming> profile_layers(cuda::CudaContext& context, cudaStream_t stream) {
  std::vector<LayerTiming> out;
  for (const cuda::LayerTime& t : context.profile(stream)) out.push_back(LayerTiming{t.name, t.op, t.tactic, t.ms});
  return out;
}

// The middle one of timing samples (the upper of the two middle ones for an even count).
double middle_sample(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// A stream and random inputs (profile 0's opt shapes) to time a GPU engine with.
class EngineTimer {
 public:
  explicit EngineTimer(const cuda::CudaEngine& engine) : context_(engine) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaEventCreate(&start_));
    KILN_CUDA_CHECK(cudaEventCreate(&stop_));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    for (const cuda::IoSlot& slot : engine.io()) {
      if (!slot.is_input) continue;
      Tensor t(slot.dtype, context_.input_shape(slot.name));  // zeros
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (slot.dtype == DType::kFloat32) t.data<float>()[i] = uniform(rng);
        if (slot.dtype == DType::kFloat16) static_cast<uint16_t*>(t.raw())[i] = float_to_half(uniform(rng));
      }
      KILN_CUDA_CHECK(cudaMemcpy(context_.input_buffer(slot.name), t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
    }
    for (int i = 0; i < 3; ++i) context_.enqueue(stream_);  // captures the CUDA graph
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  ~EngineTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }
  // Median latency of `runs` replays, each timed alone and waited for, ms: what `kiln bench`
  // reports. Back-to-back replays (a mean over a stream of them) hide each graph's launch and
  // ranked a batch-1 engine differently from kiln bench (docs/design/tactic-timing.md, "Layers
  // and whole engines, as the engine runs them").
  double latency_ms(int runs) {
    std::vector<double> samples;
    for (int i = 0; i < runs; ++i) {
      KILN_CUDA_CHECK(cudaEventRecord(start_, stream_));
      context_.enqueue(stream_);
      KILN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      samples.push_back(ms);
    }
    return middle_sample(std::move(samples));
  }
  // Each layer's time: as a CUDA graph runs it (the median of a replayed graph of 10 launches of
  // the layer alone) unless KILN_GRAPH_TIMING=0, else the median over `runs` profiled runs.
  std::map<std::string, double> layer_ms(int runs) {
    std::vector<std::vector<LayerTiming>> all;
    if (cuda::graph_timing_enabled()) {
      all.emplace_back();
      for (const cuda::LayerTime& t : context_.profile_in_graph(stream_, 10))
        all.back().push_back(LayerTiming{t.name, t.op, t.tactic, t.ms});
    } else {
      for (int r = 0; r < runs; ++r) all.push_back(profile_layers(context_, stream_));
    }
    return api::median_layer_ms(all);
  }

 private:
  cuda::CudaContext context_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// `kiln build --int8` and `--fp8` on the GPU: quantized layers only where they are faster
// (api/where_faster.h). Builds the engine with every eligible layer quantized and the fp16 one,
// times both layer by layer, builds the mixed engine (fp16 where the quantized form lost;
// tactics already timed) and compares its own quantized layers again (up to three rounds),
// builds engines quantized only from the input to a point (api::leading_region_lengths), times
// the whole engines in turns and returns the fastest, its report naming the layers kept in
// fp16 and why. The per-layer sums are optimistic (ResNet-50 FP8 at batch 128: a mixed engine
// 0.56 ms slower than fp16, docs/design/fp8.md, "FP8 only where faster"), hence the last step.
std::shared_ptr<Engine::Impl> build_quantized_where_faster(const std::string& bytes, const std::string& name,
                                                           const std::string& base_dir, const BuildOptions& options) {
  const bool fp8 = options.precision == Precision::kFp8;
  const std::string tag = fp8 ? "fp8" : "int8", format = fp8 ? "FP8" : "INT8";
  auto log = [&](const std::string& line) {
    if (options.log) options.log(line);
  };
  // Imported and optimized once (a QDQ model's pairs absorbed into `qdq`); every candidate
  // quantizes a copy.
  quantization::QdqScales qdq;
  const ir::Graph float_model = float_graph(bytes, name, base_dir, options, qdq);
  // The engine of `o`'s quantized copy, and what that copy kept in float.
  auto build_quantized = [&](const BuildOptions& o, const std::map<std::string, std::string>& tactics,
                             std::vector<std::string>& kept) {
    ir::Graph g = float_model;
    quantize_for_precision(g, name, o, qdq, kept);  // before make_engine copies `kept`
    return make_engine(std::move(g), name, o, {}, tactics, kept);
  };
  std::vector<std::string> kept_all;
  log(tag + ": building the engine with every eligible layer in " + format);
  std::shared_ptr<Engine::Impl> all_quantized = build_quantized(options, {}, kept_all);
  BuildOptions half = options;
  half.precision = Precision::kFp16;
  log(tag + ": building the fp16 engine to time each " + format + " layer against");
  std::shared_ptr<Engine::Impl> fp16 = make_engine(float_model, name, half, {}, {}, {});

  log(tag + ": timing both engines layer by layer");
  std::map<std::string, double> fp16_ms = EngineTimer(*fp16->gpu).layer_ms(9);
  struct Candidate {
    std::string what;
    std::shared_ptr<Engine::Impl> engine;
    std::map<std::string, std::string> why_fp16;  // its layers in fp16 that could be quantized -> why
    double ms = 0;
  };
  std::vector<Candidate> candidates = {{"every eligible layer in " + format, all_quantized, {}},
                                       {"no " + format + " layer", fp16, {}}};
  // Rounds: compare the quantized layers of the current engine with fp16, pin the slower ones,
  // build again. A layer pinned changes its neighbours' costs (a quantized layer after it now
  // needs its input quantized), so the next round looks at the mixed engine's own times.
  std::map<std::string, std::string> slower;  // layer -> why it stays fp16
  std::set<std::string> slower_in_round_1;     // against fp16 with every neighbour quantized
  std::map<std::string, std::string> tactics = all_quantized->gpu->timing_entries();
  for (const auto& entry : fp16->gpu->timing_entries()) tactics.insert(entry);
  std::shared_ptr<Engine::Impl> current = all_quantized;
  for (int round = 1; round <= 3; ++round) {
    const std::vector<api::QuantizedLayerCost> costs =
        api::compare_quantized_layers(*current->graph, EngineTimer(*current->gpu).layer_ms(9), fp16_ms);
    size_t pinned = 0;
    for (size_t i = 0; i < costs.size(); ++i) {
      const api::QuantizedLayerCost& c = costs[i];
      const std::string line = fmt::format("{} {:.4f} ms + {:.4f} ms quantize/reformat vs fp16 {:.4f} ms", format,
                                           c.quantized_ms, c.added_ms, c.fp16_ms);
      const std::string choice = c.keep_quantized() ? " -> " + format : " -> fp16";
      if (round == 1) log(fmt::format("[{}/{}] {}: ", i + 1, costs.size(), tag) + c.layer + ": " + line + choice);
      if (c.keep_quantized()) continue;
      if (round > 1) log(fmt::format("{} round {}: ", tag, round) + c.layer + ": " + line + choice);
      slower[c.layer] = "fp16 is faster here (" + line + ")";
      if (round == 1) slower_in_round_1.insert(c.layer);
      ++pinned;
    }
    if (pinned == 0 || pinned == costs.size()) break;
    BuildOptions mixed = options;
    for (const auto& [layer, why] : slower) mixed.float_layers.push_back(layer);
    log(fmt::format("{}: building the mixed engine of round {} ({} layers in {})", tag, round, costs.size() - pinned, format));
    std::vector<std::string> kept_mixed;
    current = build_quantized(mixed, tactics, kept_mixed);
    for (const auto& entry : current->gpu->timing_entries()) tactics.insert(entry);
    candidates.push_back({fmt::format("mixed (round {})", round), current, slower});
  }
  // One quantized region from the input on (api::leading_region_lengths): the rounds above leave
  // islands, each with a quantize layer of its own.
  const std::vector<std::string> order = api::quantized_layers_in_order(*all_quantized->graph);
  for (size_t length : api::leading_region_lengths(order, slower_in_round_1)) {
    BuildOptions leading = options;
    leading.float_layers.insert(leading.float_layers.end(), order.begin() + static_cast<std::ptrdiff_t>(length), order.end());
    log(fmt::format("{}: building the engine with its first {} layers in {} ({} to {})", tag, length, format, order.front(),
                    order[length - 1]));
    std::vector<std::string> kept_leading;
    std::shared_ptr<Engine::Impl> engine = build_quantized(leading, tactics, kept_leading);
    for (const auto& entry : engine->gpu->timing_entries()) tactics.insert(entry);
    std::map<std::string, std::string> why;
    for (size_t i = length; i < order.size(); ++i) {
      auto it = slower.find(order[i]);
      why[order[i]] = it != slower.end() && slower_in_round_1.count(order[i])
                          ? it->second
                          : "after the leading " + format + " region, whose engine ran fastest";
    }
    candidates.push_back({fmt::format("the first {} layers in {}", length, format), engine, std::move(why)});
  }
  // Whole engines, timed in turns so that clocks and neighbours treat them alike, after a
  // warm-up that brings the clocks up (the GPU idled while the host built); the engines differ by
  // a few percent at batch 1, about what one short sample varies by.
  {
    std::vector<std::unique_ptr<EngineTimer>> timers;
    for (const Candidate& c : candidates) timers.push_back(std::make_unique<EngineTimer>(*c.engine->gpu));
    for (auto& t : timers) t->latency_ms(20);
    std::vector<std::vector<double>> rounds(candidates.size());
    for (int round = 0; round < 11; ++round)
      for (size_t i = 0; i < candidates.size(); ++i) rounds[i].push_back(timers[i]->latency_ms(20));
    for (size_t i = 0; i < candidates.size(); ++i) {
      candidates[i].ms = middle_sample(std::move(rounds[i]));
      log(fmt::format("{}: whole engine, {}: {:.4f} ms", tag, candidates[i].what, candidates[i].ms));
    }
  }
  const Candidate& best = *std::min_element(candidates.begin(), candidates.end(),
                                            [](const Candidate& a, const Candidate& b) { return a.ms < b.ms; });
  log(tag + ": keeping the engine with " + best.what);
  std::shared_ptr<Engine::Impl> chosen = best.engine;
  std::string summary;
  for (const Candidate& c : candidates) summary += (summary.empty() ? "" : ", ") + c.what + fmt::format(" {:.4f} ms", c.ms);
  if (chosen == fp16) {
    // A quantized engine without quantized layers: what the build measured, said as such.
    chosen->options = options;
    chosen->options.log = nullptr;
    chosen->int8_kept_float = kept_all;
    for (const ir::Node& n : all_quantized->graph->nodes) {
      if (n.op != "QConv" || n.domain != "kiln") continue;
      chosen->options.float_layers.push_back(n.name);
      chosen->int8_kept_float.push_back(n.name + ": the engine without " + format + " layers ran fastest (" + summary + ")");
    }
  } else if (chosen != all_quantized) {
    for (std::string& k : chosen->int8_kept_float) {
      const std::string layer = k.substr(0, k.find(": "));
      if (auto it = best.why_fp16.find(layer); it != best.why_fp16.end()) k = layer + ": " + it->second;
    }
  }
  return chosen;
}
#endif

}  // namespace

Engine Engine::from_onnx(const std::string& onnx_path, const BuildOptions& options) {
  std::string bytes = read_file(onnx_path);
  std::string base_dir = std::filesystem::path(onnx_path).parent_path().string();
  if (base_dir.empty()) base_dir = ".";
#if KILN_WITH_CUDA
  const bool quantized = options.precision == Precision::kInt8 || options.precision == Precision::kFp8;
  if (quantized && options.device == Device::kCuda && options.quantized_where_faster)
    return Engine(build_quantized_where_faster(bytes, onnx_path, base_dir, options));
#endif
  std::vector<std::string> kept_float;
  ir::Graph graph = optimized_graph(bytes, onnx_path, base_dir, options, kept_float);
  return Engine(make_engine(std::move(graph), onnx_path, options, {}, {}, std::move(kept_float)));
}

void Engine::save(const std::string& engine_path) const {
  engine_file::Contents c;
  nlohmann::json tactics = nlohmann::json::object();
  nlohmann::json device = cpu_identity();
  const ir::Graph* graph = impl_->cpu ? &impl_->cpu->graph() : impl_->graph.get();
#if KILN_WITH_CUDA
  if (impl_->gpu) {
    tactics = impl_->gpu->timing_entries();
    device = device_identity();
  }
#endif
  auto descs = [](const std::vector<TensorDesc>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const TensorDesc& d : list) out.push_back({{"name", d.name}, {"dtype", to_string(d.dtype)}, {"shape", d.shape}});
    return out;
  };
  c.header = {{"kiln_version", KILN_VERSION},
              {"backend", backend()},
              {"device", device},
              {"options",
               {{"precision", to_string(impl_->options.precision)},
                {"optimize", impl_->options.optimize},
                {"allow_cpu_fallback", impl_->options.allow_cpu_fallback},
                {"profile_timing_step", impl_->options.profile_timing_step},
                {"int8_scales", impl_->options.int8_scales},
                {"float_layers", impl_->options.float_layers}}},
              {"model_name", std::filesystem::path(impl_->model_name).filename().string()},
              {"inputs", descs(impl_->inputs)},
              {"outputs", descs(impl_->outputs)},
              {"profiles", profiles_to_json(impl_->profiles)},
              {"int8_kept_float", impl_->int8_kept_float},
              {"tactics", tactics}};
  c.graph = onnx_export::export_engine_graph(*graph, c.weights);
  engine_file::write(engine_path, c);
}

Engine Engine::load(const std::string& engine_path, size_t max_memory) {
  engine_file::Contents c = engine_file::read(engine_path);
  const nlohmann::json& h = c.header;
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!h.contains(key)) throw Error(ErrorKind::kInvalidModel, std::string("the engine file's header has no '") + key + "'").file(engine_path);
    return h.at(key);
  };
  try {
    std::string version = field("kiln_version").get<std::string>();
    if (version != KILN_VERSION)
      throw Error(ErrorKind::kInvalidModel, "the engine was built by kiln " + version + ", this is kiln " + KILN_VERSION)
          .file(engine_path)
          .hint("rebuild it with this kiln (kiln build)");
    const std::string backend = field("backend").get<std::string>();
    BuildOptions options;
    std::map<std::string, std::string> tactics;
    std::vector<OptimizationProfile> profiles;
    if (backend == "cpu") {
      // The CPU kernels are compiled for x86-64-v3: a machine without it would fault on the
      // first AVX2 instruction, so say so instead.
      const nlohmann::json here = cpu_identity();
      if (!here.at("x86_64_v3").get<bool>())
        throw Error(ErrorKind::kInvalidArgument, "this CPU lacks AVX2, FMA or F16C, which kiln's CPU engine needs")
            .file(engine_path);
      options = options_from_header(field("options"));
      options.device = Device::kCpu;
    } else if (backend == "cuda") {
#if KILN_WITH_CUDA
      nlohmann::json here = device_identity();
      const nlohmann::json& built = field("device");
      for (const char* key : {"compute_capability", "cudnn", "cublaslt"}) {
        if (!built.contains(key) || built.at(key) != here.at(key))
          throw Error(ErrorKind::kInvalidArgument, std::string("the engine was built for ") + key + " " +
                                                       (built.contains(key) ? built.at(key).dump() : "?") + " (" +
                                                       built.value("gpu", std::string("?")) + "), this machine has " +
                                                       here.at(key).dump() + " (" + here.at("gpu").get<std::string>() + ")")
              .file(engine_path)
              .hint("rebuild the engine on this machine: kiln build model.onnx -o model.engine");
      }
      options = options_from_header(field("options"));
      options.device = Device::kCuda;
      tactics = field("tactics").get<std::map<std::string, std::string>>();
      profiles = profiles_from_json(field("profiles"));
      if (profiles.empty()) throw Error(ErrorKind::kInvalidModel, "the GPU engine file has no optimization profile").file(engine_path);
#else
      throw Error(ErrorKind::kUnsupported, "this kiln was built without the CUDA backend and cannot run GPU engines").file(engine_path);
#endif
    } else {
      throw Error(ErrorKind::kInvalidModel, "unknown engine backend '" + backend + "'").file(engine_path);
    }
    options.max_memory = max_memory;
    ir::Graph graph = onnx_import::import_engine_graph(c.graph, c.weights, engine_path);
    // The graph's inputs are the ones the profiles name, with their declared ranks.
    for (const OptimizationProfile& p : profiles) {
      if (p.size() != graph.inputs.size())
        throw Error(ErrorKind::kInvalidModel, "the engine file's profiles do not name the graph's inputs").file(engine_path);
      for (const std::string& in : graph.inputs) {
        auto r = p.find(in);
        const ir::Value& v = graph.value(in);
        if (r == p.end() || !v.type.shape || r->second.min.size() != v.type.shape->size() ||
            r->second.opt.size() != r->second.min.size() || r->second.max.size() != r->second.min.size())
          throw Error(ErrorKind::kInvalidModel, "the engine file's profiles do not match its graph's input '" + in + "'")
              .file(engine_path);
      }
    }
    std::vector<std::string> kept_float;
    if (h.contains("int8_kept_float")) kept_float = h.at("int8_kept_float").get<std::vector<std::string>>();
    return Engine(make_engine(std::move(graph), engine_path, options, profiles, tactics, std::move(kept_float)));
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kInvalidModel, std::string("the engine file's header is malformed: ") + e.what()).file(engine_path);
  } catch (Error& e) {
    if (e.file_path().empty()) e.file(engine_path);
    throw;
  }
}

const std::vector<TensorDesc>& Engine::inputs() const { return impl_->inputs; }
const std::vector<TensorDesc>& Engine::outputs() const { return impl_->outputs; }
const std::vector<OptimizationProfile>& Engine::profiles() const { return impl_->profiles; }

std::string Engine::backend() const { return impl_->cpu ? "cpu" : "cuda"; }

size_t Engine::layer_count() const {
#if KILN_WITH_CUDA
  if (impl_->gpu) return impl_->gpu->opt_plan(0)->layers().size();
#endif
  return impl_->cpu->graph().nodes.size();
}

#if KILN_WITH_CUDA
namespace {

std::vector<LayerInfo> plan_layers(const cuda::ShapePlan& plan) {
  std::vector<LayerInfo> out;
  for (const cuda::PlannedLayer& l : plan.layers()) {
    LayerInfo li;
    li.name = l.name;
    li.op = l.op;
    li.tactic = l.layer->tactic();
    li.precision = l.outputs.empty() || l.outputs[0] < 0 ? "" : to_string(plan.buffers()[l.outputs[0]].spec.format.dtype);
    if (!l.outputs.empty() && l.outputs[0] >= 0) li.shape = plan.buffers()[l.outputs[0]].spec.shape;
    li.cpu_fallback = l.cpu_fallback;
    li.flops = l.flops;
    out.push_back(li);
  }
  return out;
}

}  // namespace
#endif

EngineInfo Engine::info() const {
  EngineInfo info;
  info.backend = backend();
  const bool quantized = impl_->options.precision == Precision::kInt8 || impl_->options.precision == Precision::kFp8;
  info.precision = impl_->cpu && !quantized ? "fp32" : to_string(impl_->options.precision);
  info.int8_kept_float = impl_->int8_kept_float;
  if (impl_->cpu) {
    info.device = "cpu";
    const ir::Graph& g = impl_->cpu->graph();
    for (const ir::Node& n : g.nodes) {
      const ir::Value* out = n.outputs.empty() ? nullptr : g.find_value(n.outputs[0]);
      LayerInfo l{n.name, n.op, "cpu", out ? to_string(out->type.dtype) : "", false, 0, {}};
      if (out && out->type.shape)
        for (const ir::Dim& d : *out->type.shape) l.shape.push_back(d.known() ? d.value : -1);
      try {
        l.flops = static_cast<double>(ir::node_flops(g, n));
      } catch (const Error&) {
      }
      info.layers.push_back(l);
    }
    return info;
  }
#if KILN_WITH_CUDA
  const cuda::CudaEngine& e = *impl_->gpu;
  info.device = e.device_name();
  for (size_t p = 0; p < impl_->profiles.size(); ++p) {
    const int index = static_cast<int>(p);
    ProfileInfo pi;
    pi.ranges = impl_->profiles[p];
    pi.layers = plan_layers(*e.opt_plan(index));
    // The same layers at min and max, matched by name (a layer the other plan lacks: no shape).
    auto shapes_by_name = [](const cuda::ShapePlan& plan) {
      std::map<std::string, std::vector<int64_t>> out;
      for (const LayerInfo& l : plan_layers(plan)) out[l.name] = l.shape;
      return out;
    };
    const auto min_shapes = shapes_by_name(*e.plan(cuda_profile(impl_->profiles[p]).min()));
    const auto max_shapes = shapes_by_name(*e.max_plan(index));
    for (const LayerInfo& l : pi.layers) {
      auto lo = min_shapes.find(l.name), hi = max_shapes.find(l.name);
      pi.min_shapes.push_back(lo == min_shapes.end() ? std::vector<int64_t>{} : lo->second);
      pi.max_shapes.push_back(hi == max_shapes.end() ? std::vector<int64_t>{} : hi->second);
    }
    pi.activation_bytes = e.max_plan(index)->arena_bytes();
    pi.workspace_bytes = e.max_plan(index)->workspace_bytes();
    info.profiles.push_back(std::move(pi));
  }
  info.layers = info.profiles.at(0).layers;
  for (const LayerInfo& l : info.layers) info.has_cpu_fallback |= l.cpu_fallback;
  info.weight_bytes = e.weight_bytes();
  info.activation_bytes = e.arena_bytes();
  info.workspace_bytes = e.workspace_bytes();
  for (const cuda::IoSlot& slot : e.io()) info.io_bytes += slot.capacity;
  info.planned_shapes = e.plan_count();
  info.fp32_layers = e.opt_plan(0)->fp32_layers();
#endif
  return info;
}

Context Engine::create_context(bool use_cuda_graph) const {
#if KILN_WITH_CUDA
  if (impl_->gpu) {
    auto c = std::make_shared<Context::Impl>();
    c->engine = impl_;
    c->context = std::make_unique<cuda::CudaContext>(*impl_->gpu, use_cuda_graph);
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    return Context(std::move(c));
  }
#endif
  throw Error(ErrorKind::kUnsupported, "execution contexts are for GPU engines; CPU engines run with Engine::run");
}

std::map<std::string, Tensor> Engine::run(const std::map<std::string, Tensor>& inputs) const {
#if KILN_WITH_CUDA
  if (impl_->gpu) {
    std::lock_guard<std::mutex> lock(impl_->run_mutex);
    if (!impl_->default_context) impl_->default_context = create_context().impl_;
    return Context(impl_->default_context).run(inputs);
  }
#endif
  return impl_->cpu->run(inputs);
}

#if KILN_WITH_CUDA
void Context::set_optimization_profile(int index) { impl_->context->set_profile(index); }
int Context::optimization_profile() const { return impl_->context->profile(); }
void Context::set_input_shape(const std::string& name, const std::vector<int64_t>& shape) {
  impl_->context->set_input_shape(name, shape);
}
std::vector<int64_t> Context::input_shape(const std::string& name) const { return impl_->context->input_shape(name); }
std::vector<int64_t> Context::output_shape(const std::string& name) {
  for (const cuda::EngineIO& out : impl_->context->current_plan().outputs())
    if (out.name == name) return out.shape;
  throw Error(ErrorKind::kInvalidArgument, "the engine has no output named '" + name + "'");
}
std::vector<LayerInfo> Context::layers() { return plan_layers(impl_->context->current_plan()); }
void* Context::input_buffer(const std::string& name) const { return impl_->context->input_buffer(name); }
void* Context::output_buffer(const std::string& name) const { return impl_->context->output_buffer(name); }
void Context::enqueue(void* cuda_stream) { impl_->context->enqueue(static_cast<cudaStream_t>(cuda_stream)); }
std::map<std::string, Tensor> Context::run(const std::map<std::string, Tensor>& inputs) {
  return impl_->context->run(inputs, impl_->stream);
}
std::vector<LayerTiming> Context::profile(void* cuda_stream) {
  return profile_layers(*impl_->context, static_cast<cudaStream_t>(cuda_stream));
}
#else
namespace {
[[noreturn]] void no_cuda() { throw Error(ErrorKind::kUnsupported, "no CUDA backend"); }
}  // namespace
void Context::set_optimization_profile(int) { no_cuda(); }
int Context::optimization_profile() const { no_cuda(); }
void Context::set_input_shape(const std::string&, const std::vector<int64_t>&) { no_cuda(); }
std::vector<int64_t> Context::input_shape(const std::string&) const { no_cuda(); }
std::vector<int64_t> Context::output_shape(const std::string&) { no_cuda(); }
std::vector<LayerInfo> Context::layers() { no_cuda(); }
void* Context::input_buffer(const std::string&) const { no_cuda(); }
void* Context::output_buffer(const std::string&) const { no_cuda(); }
void Context::enqueue(void*) { no_cuda(); }
std::map<std::string, Tensor> Context::run(const std::map<std::string, Tensor>&) { no_cuda(); }
std::vector<LayerTiming> Context::profile(void*) { no_cuda(); }
#endif

}  // namespace kiln
