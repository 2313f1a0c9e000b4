#include "cuda/runtime/backend.h"

#include <cublasLt.h>
#include <cudnn.h>

#include <mutex>
#include <random>

#include "cuda/runtime/check.h"
#include "cuda/runtime/device_scope.h"
#include "cuda/runtime/engine.h"
#include "cuda/runtime/graph_timing.h"
#include "ir/sizes.h"

namespace kiln::cuda {

namespace {

cuda::Precision lowered_precision(kiln::Precision p) {
  switch (p) {
    case kiln::Precision::kFp32: return Precision::kFp32;
    case kiln::Precision::kTf32: return Precision::kTf32;
    case kiln::Precision::kFp16:
    case kiln::Precision::kBest:
    case kiln::Precision::kInt8:
    case kiln::Precision::kFp8: return Precision::kFp16;  // INT8 and FP8 layers are kiln::QConv nodes
  }
  return Precision::kFp32;
}

Profile lowered_profile(const OptimizationProfile& p) {
  Profile out;
  for (const auto& [name, r] : p) out.inputs[name] = cuda::ShapeRange{r.min, r.opt, r.max};
  return out;
}

std::vector<LayerInfo> plan_layers(const ShapePlan& plan) {
  std::vector<LayerInfo> out;
  for (const PlannedLayer& l : plan.layers()) {
    LayerInfo li;
    li.name = l.name;
    li.op = l.op;
    li.tactic = l.layer->tactic();
    li.precision = l.outputs.empty() || l.outputs[0] < 0 ? "" : to_string(plan.buffers()[l.outputs[0]].spec.format.dtype);
    if (!l.outputs.empty() && l.outputs[0] >= 0) li.shape = plan.buffers()[l.outputs[0]].spec.shape;
    li.cpu_fallback = l.cpu_fallback;
    li.flops = l.flops;
    li.members = l.members;
    out.push_back(li);
  }
  return out;
}

std::vector<LayerTiming> to_layer_timings(const std::vector<LayerTime>& times) {
  std::vector<LayerTiming> out;
  for (const LayerTime& t : times) out.push_back(LayerTiming{t.name, t.op, t.tactic, t.ms, 0.0, t.bytes});
  return out;
}

// A context on a stream of its own: what kiln::Context runs on. Made, used and destroyed with its
// engine's GPU current (device_scope.h).
class CudaBackendContext final : public backend::Context {
 public:
  // The caller makes `gpu` current.
  CudaBackendContext(const CudaEngine& engine, const ContextOptions& options, int gpu)
      : gpu_(gpu), context_(std::make_unique<CudaContext>(engine, options)) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaBackendContext() override {
    DeviceScope scope(gpu_, /*checked=*/false);
    context_.reset();  // first: its work in flight may run on stream_
    if (stream_) cudaStreamDestroy(stream_);
  }

  void set_optimization_profile(int index) override {
    DeviceScope scope(gpu_);
    context_->set_profile(index);
  }
  int optimization_profile() const override { return context_->profile(); }
  void set_input_shape(const std::string& name, const std::vector<int64_t>& shape) override {
    DeviceScope scope(gpu_);
    context_->set_input_shape(name, shape);
  }
  std::vector<int64_t> input_shape(const std::string& name) const override { return context_->input_shape(name); }
  void set_input_values(const std::string& name, const Tensor& values) override { context_->set_input_values(name, values); }
  std::vector<int64_t> output_shape(const std::string& name) override {
    DeviceScope scope(gpu_);
    for (const EngineIO& out : context_->current_plan().outputs())
      if (out.name == name) return out.shape;
    throw Error(ErrorKind::kInvalidArgument, "the engine has no output named '" + name + "'");
  }
  std::vector<LayerInfo> layers() override {
    DeviceScope scope(gpu_);
    return plan_layers(context_->current_plan());
  }
  void* input_buffer(const std::string& name) const override { return context_->input_buffer(name); }
  void* output_buffer(const std::string& name) const override { return context_->output_buffer(name); }
  void set_tensor_address(const std::string& name, void* address, size_t bytes) override {
    DeviceScope scope(gpu_);
    context_->set_tensor_address(name, address, bytes);
  }
  void* tensor_address(const std::string& name) const override { return context_->tensor_address(name); }
  void enqueue(void* stream) override {
    DeviceScope scope(gpu_);
    context_->enqueue(static_cast<cudaStream_t>(stream));
  }
  void wait_for_last_run(void* stream) override {
    DeviceScope scope(gpu_);
    context_->wait_for_last_run(static_cast<cudaStream_t>(stream));
  }
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) override {
    DeviceScope scope(gpu_);
    return context_->run(inputs, stream_);
  }
  std::map<std::string, Tensor> run_concatenated(const std::map<std::string, std::vector<Tensor>>& pieces,
                                                 int64_t zero_rows) override {
    DeviceScope scope(gpu_);
    return context_->run_concatenated(pieces, zero_rows, stream_);
  }
  std::vector<LayerTiming> profile(void* stream) override {
    DeviceScope scope(gpu_);
    return to_layer_timings(context_->profile(static_cast<cudaStream_t>(stream)));
  }

 private:
  int gpu_;
  std::unique_ptr<CudaContext> context_;
  cudaStream_t stream_ = nullptr;
};

// A context of its own at profile 0's opt shapes with fixed random inputs, its CUDA graph
// captured: what the where-faster build times engines with.
class CudaTimer final : public backend::Timer {
 public:
  // The caller makes `gpu` current.
  CudaTimer(const CudaEngine& engine, int gpu)
      : gpu_(gpu), context_(std::make_unique<CudaContext>(engine)), graph_timing_(engine.config().tactics.graph_timing) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaEventCreate(&start_));
    KILN_CUDA_CHECK(cudaEventCreate(&stop_));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    for (const IoSlot& slot : engine.io()) {
      if (!slot.is_input) continue;
      Tensor t(slot.dtype, context_->input_shape(slot.name));  // zeros
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (slot.dtype == DType::kFloat32) t.data<float>()[i] = uniform(rng);
        if (slot.dtype == DType::kFloat16) static_cast<uint16_t*>(t.raw())[i] = float_to_half(uniform(rng));
      }
      KILN_CUDA_CHECK(cudaMemcpy(context_->input_buffer(slot.name), t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
    }
    for (int i = 0; i < 3; ++i) context_->enqueue(stream_);  // captures the CUDA graph
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  ~CudaTimer() override {
    DeviceScope scope(gpu_, /*checked=*/false);
    context_.reset();  // first: it holds device memory and graphs of this GPU
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  // Each replay timed alone and waited for: back-to-back replays (a mean over a stream of them)
  // hide each graph's launch and ranked a batch-1 engine differently from kiln bench
  // (docs/design/tactic-timing.md, "Layers and whole engines, as the engine runs them").
  std::vector<double> latency_samples_ms(int runs) override {
    DeviceScope scope(gpu_);
    std::vector<double> samples;
    for (int i = 0; i < runs; ++i) {
      KILN_CUDA_CHECK(cudaEventRecord(start_, stream_));
      context_->enqueue(stream_);
      KILN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      samples.push_back(ms);
    }
    return samples;
  }

  // As a CUDA graph runs each layer (a replayed graph of 10 launches of the layer alone) unless
  // the build's tactic options time on the stream, else `runs` profiled runs.
  std::vector<std::vector<LayerTiming>> layer_samples(int runs) override {
    DeviceScope scope(gpu_);
    std::vector<std::vector<LayerTiming>> all;
    if (graph_timing_) {
      all.push_back(to_layer_timings(context_->profile_in_graph(stream_, 10)));
    } else {
      for (int r = 0; r < runs; ++r) all.push_back(to_layer_timings(context_->profile(stream_)));
    }
    return all;
  }

 private:
  int gpu_;
  std::unique_ptr<CudaContext> context_;
  bool graph_timing_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// Every call that may reach the GPU runs with the engine's GPU current (device_scope.h).
class CudaBackendEngine final : public backend::Engine {
 public:
  CudaBackendEngine(std::shared_ptr<const ir::Graph> graph, std::unique_ptr<CudaEngine> engine,
                    std::vector<OptimizationProfile> profiles, int gpu)
      : graph_(std::move(graph)), engine_(std::move(engine)), profiles_(std::move(profiles)), gpu_(gpu) {}
  ~CudaBackendEngine() override {
    DeviceScope scope(gpu_, /*checked=*/false);
    default_context_.reset();
    engine_.reset();
  }

  const ir::Graph& graph() const override { return *graph_; }
  size_t layer_count() const override {
    DeviceScope scope(gpu_);
    return engine_->opt_plan(0)->layers().size();
  }

  void describe(EngineInfo& info) const override {
    DeviceScope scope(gpu_);
    const CudaEngine& e = *engine_;
    info.device = e.device_name();
    for (size_t p = 0; p < profiles_.size(); ++p) {
      const int index = static_cast<int>(p);
      ProfileInfo pi;
      pi.ranges = profiles_[p];
      pi.layers = plan_layers(*e.opt_plan(index));
      // The same layers at min and max, matched by name (a layer the other plan lacks: no shape).
      auto shapes_by_name = [](const ShapePlan& plan) {
        std::map<std::string, std::vector<int64_t>> out;
        for (const LayerInfo& l : plan_layers(plan)) out[l.name] = l.shape;
        return out;
      };
      const auto min_shapes = shapes_by_name(*e.plan(lowered_profile(profiles_[p]).min()));
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
    for (const IoSlot& slot : e.io()) info.io_bytes += slot.capacity;
    info.device_memory_bytes = CudaContext::predicted_bytes(e);
    info.planned_shapes = e.plan_count();
    info.fp32_layers = e.opt_plan(0)->fp32_layers();
  }

  // Output dimensions that differ between the profiles' min and max plans vary; the others are
  // what every plan computes.
  std::vector<TensorDesc> outputs(std::vector<TensorDesc> declared) const override {
    DeviceScope scope(gpu_);
    for (size_t i = 0; i < declared.size(); ++i) {
      std::vector<int64_t> shape;
      for (int p = 0; p < static_cast<int>(profiles_.size()); ++p)
        for (const auto& plan : {engine_->opt_plan(p), engine_->max_plan(p),
                                 engine_->plan(lowered_profile(profiles_[static_cast<size_t>(p)]).min())}) {
          const std::vector<int64_t>& s = plan->outputs().at(i).shape;
          if (shape.empty()) shape = s;
          for (size_t d = 0; d < shape.size() && d < s.size(); ++d)
            if (shape[d] != s[d]) shape[d] = -1;
        }
      declared[i].shape = shape;
      for (size_t d = 0; d < shape.size() && d < declared[i].dim_names.size(); ++d)
        if (shape[d] >= 0) declared[i].dim_names[d].clear();
    }
    return declared;
  }

  // On a built-in context of its own, created on first use; callers take turns.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const override {
    std::lock_guard<std::mutex> lock(run_mutex_);
    if (!default_context_) default_context_ = create_context(ContextOptions{});
    return default_context_->run(inputs);
  }

  std::unique_ptr<backend::Context> create_context(const ContextOptions& options) const override {
    DeviceScope scope(gpu_);
    return std::make_unique<CudaBackendContext>(*engine_, options, gpu_);
  }

  std::map<std::string, std::string> tactics() const override { return engine_->timing_entries(); }

  std::vector<LayerTiming> profile(const std::map<std::string, Tensor>&) const override {
    throw Error(ErrorKind::kUnsupported,
                "a GPU engine times its layers through an execution context: Context::profile (kiln bench --profile)");
  }

  std::unique_ptr<backend::Timer> timer() const override {
    DeviceScope scope(gpu_);
    return std::make_unique<CudaTimer>(*engine_, gpu_);
  }

 private:
  std::shared_ptr<const ir::Graph> graph_;
  std::unique_ptr<CudaEngine> engine_;
  std::vector<OptimizationProfile> profiles_;
  int gpu_;
  mutable std::mutex run_mutex_;
  mutable std::unique_ptr<backend::Context> default_context_;
};

// The partition of a plan, for the build's log: the nodes that run on the CPU engine, and what
// they cost each run (the bytes their inputs and outputs cross to the host and back; the GPU
// waits while the CPU computes). "" when every node has a GPU layer.
std::string cpu_partition_line(const ShapePlan& plan) {
  std::vector<std::string> nodes;
  double bytes = 0;
  for (const PlannedLayer& l : plan.layers()) {
    if (!l.cpu_fallback) continue;
    nodes.push_back(l.name + " (" + l.op + ")");
    for (const std::vector<int>* ids : {&l.inputs, &l.outputs})
      for (int id : *ids)
        if (id >= 0 && plan.buffers()[static_cast<size_t>(id)].kind != BufferKind::kWeight)
          bytes += static_cast<double>(plan.buffers()[static_cast<size_t>(id)].spec.bytes());
  }
  if (nodes.empty()) return "";
  constexpr size_t kNamed = 8;
  std::string names;
  for (size_t i = 0; i < nodes.size() && i < kNamed; ++i) names += (i ? ", " : "") + nodes[i];
  if (nodes.size() > kNamed) names += ", and " + std::to_string(nodes.size() - kNamed) + " more";
  return std::to_string(nodes.size()) + " node(s) have no GPU layer and run on the CPU engine: " + names + ". Each run copies " +
         format_bytes(bytes) + " between the GPU and the host for them, and the GPU waits while the CPU computes them; " +
         "--strict refuses the build instead";
}

}  // namespace

std::unique_ptr<backend::Engine> build_backend_engine(std::shared_ptr<const ir::Graph> graph, GraphAtShapes specialize,
                                                      const BuildOptions& options,
                                                      const std::vector<OptimizationProfile>& profiles,
                                                      const std::map<std::string, std::string>& tactics) {
  BuildConfig config;
  config.precision = lowered_precision(options.precision);
  config.allow_cpu_fallback = options.allow_cpu_fallback;
  config.timing_cache_path = options.timing_cache;
  config.timing_entries = tactics;
  config.timed_shape_step = options.profile_timing_step;
  config.max_memory = options.max_memory;
  config.log = options.log;
  config.tactics = options.tactics;
  config.fp32_layers.insert(options.fp32_layers.begin(), options.fp32_layers.end());
  for (const OptimizationProfile& p : profiles) config.profiles.push_back(lowered_profile(p));
  config.input_values = options.input_values;
  DeviceScope scope(options.gpu);
  std::unique_ptr<CudaEngine> engine = CudaEngine::build(std::move(specialize), config);
  if (config.log) {
    const std::string partition = cpu_partition_line(*engine->opt_plan(0));
    if (!partition.empty()) config.log(partition);
  }
  return std::make_unique<CudaBackendEngine>(std::move(graph), std::move(engine), profiles, options.gpu);
}

nlohmann::json device_identity(int gpu) {
  check_gpu_index(gpu);
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, gpu));
  int runtime = 0;
  KILN_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  return {{"gpu", prop.name},
          {"compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
          {"cuda_runtime", runtime},
          {"cudnn", static_cast<int64_t>(cudnnGetVersion())},
          {"cublaslt", static_cast<int64_t>(cublasLtGetVersion())}};
}

void check_device(int gpu, const nlohmann::json& built, const std::string& engine_path) {
  const nlohmann::json here = device_identity(gpu);
  for (const char* key : {"compute_capability", "cudnn", "cublaslt"}) {
    if (!built.contains(key) || built.at(key) != here.at(key))
      throw Error(ErrorKind::kInvalidArgument, std::string("the engine was built for ") + key + " " +
                                                   (built.contains(key) ? built.at(key).dump() : "?") + " (" +
                                                   built.value("gpu", std::string("?")) + "), this machine has " +
                                                   here.at(key).dump() + " (" + here.at("gpu").get<std::string>() + ")")
          .file(engine_path)
          .hint("rebuild the engine on this machine: kiln build model.onnx -o model.engine");
  }
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, gpu));
  check_gpu_architecture(prop);
}

void register_host_memory(void* address, size_t bytes, int gpu) {
  if (!address || bytes == 0) throw Error(ErrorKind::kInvalidArgument, "host memory to pin is empty");
  DeviceScope on(gpu);
  const cudaError_t status = cudaHostRegister(address, bytes, cudaHostRegisterPortable);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(ErrorKind::kDevice, "cannot pin " + std::to_string(bytes) + " bytes of host memory for the GPU: " +
                                         cudaGetErrorString(status));
  }
}

void unregister_host_memory(void* address, int gpu) noexcept {
  if (!address) return;
  DeviceScope on(gpu, false);
  if (cudaHostUnregister(address) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace kiln::cuda
