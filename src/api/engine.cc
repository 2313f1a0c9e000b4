// The public API (include/kiln/kiln.h): Engine and Context over what the compiler builds
// (src/compiler/pipeline.h) and the backend interface (src/backend/backend.h), and the engine
// file (src/engine).
#include "kiln/kiln.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "api/developer_environment.h"
#include "compiler/backends.h"
#include "compiler/pipeline.h"
#include "cpu/parallel.h"
#include "engine/engine_file.h"
#include "engine/header.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace kiln {

struct Engine::Impl {
  compiler::CompiledEngine compiled;
};

struct Context::Impl {
  std::shared_ptr<const Engine::Impl> engine;  // kept alive while the context runs
  std::unique_ptr<backend::Context> context;
};

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot open the model file (does it exist?)").file(path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Engine Engine::from_onnx(const std::string& onnx_path, const BuildOptions& options) {
  const std::string bytes = read_file(onnx_path);
  std::string base_dir = std::filesystem::path(onnx_path).parent_path().string();
  if (base_dir.empty()) base_dir = ".";
  BuildOptions chosen = options;
  api::apply_developer_environment(chosen);
  auto impl = std::make_shared<Impl>();
  impl->compiled = compiler::compile(bytes, onnx_path, base_dir, chosen);
  return Engine(std::move(impl));
}

void Engine::save(const std::string& engine_path) const {
  const compiler::CompiledEngine& e = impl_->compiled;
  engine_file::Header h;
  h.kiln_version = KILN_VERSION;
  h.backend = backend();
  h.device = compiler::device_identity(e.options.device, e.options.gpu);
  h.options = e.options;
  h.model_name = std::filesystem::path(e.name).filename().string();
  h.inputs = e.inputs;
  h.outputs = e.outputs;
  h.profiles = e.profiles;
  h.kept_float = e.kept_float;
  h.tactics = e.engine->tactics();
  engine_file::Contents c;
  c.header = engine_file::to_json(h);
  c.graph = onnx_export::export_engine_graph(e.engine->graph(), c.weights);
  engine_file::write(engine_path, c);
}

Engine Engine::load(const std::string& engine_path, size_t max_memory) {
  LoadOptions options;
  options.max_memory = max_memory;
  return load(engine_path, options);
}

Engine Engine::load(const std::string& engine_path, const LoadOptions& load_options) {
  engine_file::Contents c = engine_file::read(engine_path);
  engine_file::Header h = engine_file::header_from_json(c.header, engine_path);
  try {
    BuildOptions options = h.options;
    options.device = h.backend == "cuda" ? Device::kCuda : Device::kCpu;
    options.max_memory = load_options.max_memory;
    options.gpu = load_options.gpu;
    // The build's tactic options are the file's; of the developer variables only the CPU
    // engine's output poisoning applies to a loaded engine.
    BuildOptions developer;
    api::apply_developer_environment(developer);
    options.poison_outputs = developer.poison_outputs;
    compiler::check_device(options.device, options.gpu, h.device, engine_path);
    if (options.device == Device::kCuda && h.profiles.empty())
      throw Error(ErrorKind::kInvalidModel, "the GPU engine file has no optimization profile").file(engine_path);
    ir::Graph graph = onnx_import::import_engine_graph(c.graph, c.weights, engine_path);
    std::string().swap(c.weights);  // the graph's tensors hold the weights now
    if (options.device == Device::kCuda)
      for (const auto& [name, v] : graph.values())
        if (v.packed)
          throw Error(ErrorKind::kInvalidModel, "the GPU engine file's constant '" + name + "' is packed in layout " +
                                                    v.packed->layout + ", which only CPU engines hold")
              .file(engine_path);
    // The graph's inputs are the ones the profiles name, with their declared ranks.
    for (const OptimizationProfile& p : h.profiles) {
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
    auto impl = std::make_shared<Impl>();
    impl->compiled = compiler::assemble(std::move(graph), engine_path, options, h.profiles, h.tactics, h.kept_float);
    return Engine(std::move(impl));
  } catch (Error& e) {
    if (e.file_path().empty()) e.file(engine_path);
    throw;
  }
}

const std::vector<TensorDesc>& Engine::inputs() const { return impl_->compiled.inputs; }
const std::vector<TensorDesc>& Engine::outputs() const { return impl_->compiled.outputs; }
const std::vector<OptimizationProfile>& Engine::profiles() const { return impl_->compiled.profiles; }

std::string Engine::backend() const { return impl_->compiled.options.device == Device::kCuda ? "cuda" : "cpu"; }

int Engine::gpu() const { return impl_->compiled.options.device == Device::kCuda ? impl_->compiled.options.gpu : -1; }

size_t Engine::layer_count() const { return impl_->compiled.engine->layer_count(); }

EngineInfo Engine::info() const {
  const compiler::CompiledEngine& e = impl_->compiled;
  EngineInfo info;
  info.backend = backend();
  info.gpu = gpu();
  // A CPU engine asked for fp16, tf32 or best stores and computes float32.
  const bool cpu_kept = e.options.precision == Precision::kInt8 || e.options.precision == Precision::kFp8 ||
                        e.options.precision == Precision::kBf16;
  info.precision = e.options.device == Device::kCpu && !cpu_kept ? "fp32" : to_string(e.options.precision);
  info.int8_kept_float = e.kept_float;
  e.engine->describe(info);
  return info;
}

Context Engine::create_context(bool use_cuda_graph) const {
  ContextOptions options;
  options.use_cuda_graph = use_cuda_graph;
  return create_context(options);
}

Context Engine::create_context(const ContextOptions& options) const {
  auto c = std::make_shared<Context::Impl>();
  c->engine = impl_;
  c->context = impl_->compiled.engine->create_context(options);
  return Context(std::move(c));
}

std::map<std::string, Tensor> Engine::run(const std::map<std::string, Tensor>& inputs) const {
  return impl_->compiled.engine->run(inputs);
}

std::vector<LayerTiming> Engine::profile(const std::map<std::string, Tensor>& inputs) const {
  return impl_->compiled.engine->profile(inputs);
}

void Context::set_optimization_profile(int index) { impl_->context->set_optimization_profile(index); }
int Context::optimization_profile() const { return impl_->context->optimization_profile(); }
void Context::set_input_shape(const std::string& name, const std::vector<int64_t>& shape) {
  impl_->context->set_input_shape(name, shape);
}
std::vector<int64_t> Context::input_shape(const std::string& name) const { return impl_->context->input_shape(name); }
void Context::set_input_values(const std::string& name, const Tensor& values) {
  impl_->context->set_input_values(name, values);
}
std::vector<int64_t> Context::output_shape(const std::string& name) { return impl_->context->output_shape(name); }
std::vector<LayerInfo> Context::layers() { return impl_->context->layers(); }
void* Context::input_buffer(const std::string& name) const { return impl_->context->input_buffer(name); }
void* Context::output_buffer(const std::string& name) const { return impl_->context->output_buffer(name); }
void Context::set_tensor_address(const std::string& name, void* device_pointer, size_t bytes) {
  impl_->context->set_tensor_address(name, device_pointer, bytes);
}
void* Context::tensor_address(const std::string& name) const { return impl_->context->tensor_address(name); }
void Context::enqueue(void* cuda_stream) { impl_->context->enqueue(cuda_stream); }
void Context::wait_for_last_run(void* cuda_stream) { impl_->context->wait_for_last_run(cuda_stream); }
std::map<std::string, Tensor> Context::run(const std::map<std::string, Tensor>& inputs) {
  return impl_->context->run(inputs);
}
std::map<std::string, Tensor> Context::run_concatenated(const std::map<std::string, std::vector<Tensor>>& pieces,
                                                        int64_t zero_rows) {
  return impl_->context->run_concatenated(pieces, zero_rows);
}
std::vector<LayerTiming> Context::profile(void* cuda_stream) { return impl_->context->profile(cuda_stream); }

void set_cpu_threads(int threads) {
  if (threads < 0)
    throw Error(ErrorKind::kInvalidArgument, "CPU threads must be 0 (every CPU) or more, not " + std::to_string(threads));
  cpu::set_thread_count(threads);
}

int cpu_threads() { return cpu::thread_count(); }

PinnedHostMemory::PinnedHostMemory(void* address, size_t bytes, int gpu) {
  compiler::register_host_memory(address, bytes, gpu);
  address_ = address;
  bytes_ = bytes;
  gpu_ = gpu;
}

PinnedHostMemory::~PinnedHostMemory() { compiler::unregister_host_memory(address_, gpu_); }

PinnedHostMemory::PinnedHostMemory(PinnedHostMemory&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)), bytes_(std::exchange(other.bytes_, 0)), gpu_(other.gpu_) {}

PinnedHostMemory& PinnedHostMemory::operator=(PinnedHostMemory&& other) noexcept {
  if (this != &other) {
    compiler::unregister_host_memory(address_, gpu_);
    address_ = std::exchange(other.address_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    gpu_ = other.gpu_;
  }
  return *this;
}

}  // namespace kiln
