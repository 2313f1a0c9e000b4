// The builder: lowers an optimized graph with concrete shapes to a CudaEngine.
//
// It walks the nodes in order. Each node is lowered by its family's LayerEntry (layer.h);
// where a layer wants an input in another format than the one it is stored in, a reformat
// layer is inserted (once per value and format). Reshape-like ops become views. Constants a
// layer asks for are converted on the host and uploaded once. Candidate tactics are timed on
// this GPU through the BuildServices the builder implements, with a timing cache. Last, the
// activation arena is planned from buffer lifetimes.
#include <cublasLt.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"
#include "cuda/runtime/graph_timing.h"
#include "cuda/runtime/memory_plan.h"
#include "cuda/runtime/runtime_compiler.h"
#include "cuda/runtime/timing_cache.h"
#include "ir/op_schema.h"
#include "ir/parameter_inputs.h"
#include "ops/slice_params.h"

namespace kiln::cuda {

void fill_random(void* data, DType dtype, int64_t n, uint32_t seed, cudaStream_t stream);

ShapePlan::~ShapePlan() = default;

std::map<std::string, std::string> ShapePlan::tactics() const {
  std::map<std::string, std::string> out;
  for (const PlannedLayer& l : layers_) out[l.name] = l.layer->tactic();
  return out;
}

std::vector<std::string> ShapePlan::fp32_layers() const {
  std::vector<std::string> out;
  for (const PlannedLayer& l : layers_)
    if (l.fp32_under_fp16) out.push_back(l.name + " (" + l.op + ")");
  return out;
}

namespace {

bool is_view_op(const ir::Graph& g, const ir::Node& n) {
  if (!n.domain.empty()) return false;
  if (n.op == "Dropout") {
    // Inference-mode Dropout only: training_mode absent or a constant false.
    if (n.outputs.size() != 1 && !(n.outputs.size() == 2 && n.outputs[1].empty())) return false;
    if (!n.has_input(2)) return true;
    const Tensor* mode = g.constant(n.inputs[2]);
    return mode && mode->numel() == 1 && mode->value_as_double(0) == 0.0;
  }
  return n.op == "Reshape" || n.op == "Flatten" || n.op == "Squeeze" || n.op == "Unsqueeze" || n.op == "Identity";
}

// Shape and Size of a tensor whose shape the build knows: constants.
bool is_shape_op(const ir::Node& n) { return n.domain.empty() && (n.op == "Shape" || n.op == "Size"); }

// NCHW and NHWC are the same bytes when C == 1 or H * W == 1.
bool layouts_share_memory(const std::vector<int64_t>& shape) {
  return shape.size() == 4 && (shape[1] == 1 || shape[2] * shape[3] == 1);
}

class ScratchMemory {
 public:
  ~ScratchMemory() { if (data_) cudaFree(data_); }
  void* get(size_t bytes) {
    if (bytes > capacity_) {
      if (data_) KILN_CUDA_CHECK(cudaFree(data_));
      data_ = nullptr;
      capacity_ = std::max(bytes, capacity_ * 2);
      KILN_CUDA_CHECK(cudaMalloc(&data_, capacity_));
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

std::string device_signature(const cudaDeviceProp& prop) {
  return std::string(prop.name) + " sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
         " cudnn " + std::to_string(cudnnGetVersion()) + " cublasLt " + std::to_string(cublasLtGetVersion());
}

// Lowers one specialized graph to a ShapePlan. Weights go to the engine's (shared) weight memory;
// tactics come from the timing cache, else from `hints` (node name -> the tactic the node took
// in a plan at other shapes), else from timing the candidates.
class Builder final : public BuildServices {
 public:
  Builder(const ir::Graph& graph, const BuildConfig& config, TimingCache& cache, WeightMemory& weights,
          const std::map<std::string, std::string>* hints, const CudnnSource& cudnn_source)
      : graph_(graph), config_(config), cache_(cache), weights_(weights), hints_(hints), cudnn_source_(cudnn_source) {}

  ~Builder() override {
    if (events_[0]) cudaEventDestroy(events_[0]);
    if (events_[1]) cudaEventDestroy(events_[1]);
    if (cudnn_ && cudnn_source_) cudnnSetStream(cudnn_, nullptr);  // the handle outlives stream_
    else if (cudnn_) cudnnDestroy(cudnn_);
    if (cublaslt_) cublasLtDestroy(cublaslt_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // `graph` is the graph given to the constructor, kept by the plan.
  std::unique_ptr<ShapePlan> build(const Shapes& shapes, const Values& values, std::shared_ptr<const ir::Graph> graph);

  // --- BuildServices ----------------------------------------------------------------------
  const void* upload(const void* host, size_t bytes) override { return weights_.upload(host, bytes); }
  const LayerIO& scratch_io() override;
  void* scratch(size_t bytes) override { return workspace_scratch_.get(bytes); }
  float time_ms(const std::function<void(cudaStream_t)>& run) override;
  std::optional<std::string> cached_tactic(const std::string& key) override {
    std::optional<std::string> t = cache_.find(key);
    if (!t && hints_ && current_request_) {
      // Not timed at this shape: start from what the node took at other shapes. A layer that
      // cannot use it times its candidates and records the winner instead.
      if (auto h = hints_->find(current_request_->node.name); h != hints_->end()) t = h->second;
    }
    if (t) note_tactic(key, *t);
    return t;
  }
  void record_tactic(const std::string& key, const std::string& tactic) override {
    cache_.set(key, tactic);
    note_tactic(key, tactic);
  }
  // Code is no node's tactic: it neither becomes a hint nor takes one.
  std::optional<std::string> cached_code(const std::string& key) override {
    std::optional<std::string> code = cache_.find(key);
    if (code) plan_->timing_entries_[key] = *code;
    return code;
  }
  void record_code(const std::string& key, const std::string& code) override {
    cache_.set(key, code);
    plan_->timing_entries_[key] = code;
  }
  // Groups alike (a network's repeated blocks) generate the same source: it compiles once.
  std::shared_future<std::string> compile(const std::string& source, const std::string& name) override {
    if (!compiler_) compiler_ = std::make_unique<CompileQueue>(prop_, compile_threads());
    auto [it, added] = compiling_.try_emplace(source);
    if (added) it->second = compiler_->submit(source, name);
    return it->second;
  }
  void finish_later(std::function<void(BuildServices&)> finish) override {
    Deferred d;
    d.finish = std::move(finish);
    d.request = std::make_unique<LayerRequest>(*current_request_);
    d.formats = *current_formats_;
    d.inputs = current_inputs_;
    d.constant_specs = current_constant_specs_;
    d.layer = current_layer_;
    deferred_.push_back(std::move(d));
  }
  // Made on first use: a cuDNN handle holds megabytes of device memory (docs/design/gpu-engine.md,
  // "Device memory"), which a build of kiln's kernels alone never needs. A plan that will run
  // (an execution context's) takes the handle it will run with from cudnn_source_: cuDNN's
  // execution plans keep the handle they were finalized with.
  cudnnContext* cudnn() override {
    if (!cudnn_) {
      if (cudnn_source_)
        cudnn_ = cudnn_source_();
      else
        KILN_CUDNN_CHECK(cudnnCreate(&cudnn_));
      KILN_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
      scratch_io_.cudnn = cudnn_;
    }
    return cudnn_;
  }
  cublasLtContext* cublaslt() override { return cublaslt_; }
  const cudaDeviceProp& device() override { return prop_; }
  cudaStream_t stream() override { return stream_; }

 private:
  int add_buffer(Buffer b) {
    buffers_.push_back(std::move(b));
    return static_cast<int>(buffers_.size()) - 1;
  }
  int root(int id) const {
    while (buffers_[id].kind == BufferKind::kView) id = buffers_[id].view_of;
    return id;
  }
  int buffer_in_format(const std::string& value, const Format& format);
  int constant_buffer(const std::string& value, const Format& format);
  void add_layer(PlannedLayer layer);
  void lower_view(const ir::Node& node);
  bool slice_is_view(const ir::Node& node) const;
  std::optional<Layout> transpose_view_layout(const ir::Node& node) const;
  void lower_transpose_view(const ir::Node& node, Layout layout);
  void lower_shape(const ir::Node& node);
  // Gives the outputs of a node that could not be lowered placeholder buffers, so the build
  // goes on and reports every unsupported node at once.
  void placeholder_outputs(const ir::Node& node);
  void lower_node(const ir::Node& node, std::vector<std::string>& unsupported);
  void log(const std::string& line) override { if (config_.log) config_.log(line); }
  const TacticOptions& tactics() override { return config_.tactics; }
  void note_tactic(const std::string& key, const std::string& tactic) {
    plan_->timing_entries_[key] = tactic;
    if (current_request_) plan_->node_tactics_[current_request_->node.name] = tactic;
  }
  // Compiles run beside the build's own thread, one per core up to 16 (each NVRTC compile takes
  // about 0.1 s of one core and some 100 MB).
  static int compile_threads() { return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)); }
  void finish_deferred_layers();

  // A layer that chooses its tactic once every node is lowered (finish_later), with what its
  // scratch_io() is made from.
  struct Deferred {
    std::function<void(BuildServices&)> finish;
    std::unique_ptr<LayerRequest> request;
    LayerFormats formats;
    std::vector<int> inputs;
    std::shared_ptr<std::deque<TensorSpec>> constant_specs;  // what request points at
    size_t layer = 0;  // in plan_->layers_
  };

  const ir::Graph& graph_;
  const BuildConfig& config_;
  TimingCache& cache_;
  WeightMemory& weights_;
  const std::map<std::string, std::string>* hints_;
  const CudnnSource& cudnn_source_;
  std::unique_ptr<ShapePlan> plan_;
  std::deque<Buffer> buffers_;  // a deque: requests hold pointers to specs while buffers are added
  std::map<std::string, int> value_buffer_;
  std::map<std::pair<std::string, std::string>, int> converted_;

  cudaDeviceProp prop_{};
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  cudaEvent_t events_[2] = {nullptr, nullptr};

  // The request being lowered, for scratch_io().
  const LayerRequest* current_request_ = nullptr;
  const LayerFormats* current_formats_ = nullptr;
  std::vector<int> current_inputs_;
  std::shared_ptr<std::deque<TensorSpec>> current_constant_specs_;
  size_t current_layer_ = 0;  // the index in plan_->layers_ the layer being created will have
  std::unique_ptr<CompileQueue> compiler_;
  std::map<std::string, std::shared_future<std::string>> compiling_;  // by source
  std::vector<Deferred> deferred_;
  LayerIO scratch_io_;
  bool scratch_ready_ = false;
  ScratchMemory io_scratch_, workspace_scratch_;
  uint32_t seed_ = 1;
};

const LayerIO& Builder::scratch_io() {
  if (scratch_ready_) return scratch_io_;
  const LayerRequest& r = *current_request_;
  const LayerFormats& f = *current_formats_;
  std::vector<size_t> offsets;
  size_t total = 0;
  auto reserve = [&](size_t bytes) {
    offsets.push_back(total);
    total += (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  };
  for (size_t i = 0; i < r.inputs.size(); ++i)
    reserve(r.has_input(i) && !r.is_constant(i) ? r.inputs[i]->bytes() : 0);
  for (size_t i = 0; i < r.output_shapes.size(); ++i)
    reserve(f.outputs[i].defined() ? TensorSpec{r.output_shapes[i], f.outputs[i]}.bytes() : 0);
  char* base = static_cast<char*>(io_scratch_.get(total));
  scratch_io_ = LayerIO{};
  scratch_io_.cudnn = cudnn_;
  scratch_io_.cublaslt = cublaslt_;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    if (!r.has_input(i)) { scratch_io_.inputs.push_back(nullptr); continue; }
    if (r.is_constant(i)) {
      int id = current_inputs_[i];
      scratch_io_.inputs.push_back(id >= 0 ? buffers_[id].weight : nullptr);
      continue;
    }
    void* p = base + offsets[i];
    const TensorSpec& s = *r.inputs[i];
    fill_random(p, s.format.dtype, s.elements(), seed_++, stream_);
    scratch_io_.inputs.push_back(p);
  }
  for (size_t i = 0; i < r.output_shapes.size(); ++i)
    scratch_io_.outputs.push_back(f.outputs[i].defined() ? base + offsets[r.inputs.size() + i] : nullptr);
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  scratch_ready_ = true;
  return scratch_io_;
}

float Builder::time_ms(const std::function<void(cudaStream_t)>& run) {
  run(stream_);  // warm-up: module loading, lazy initialization
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // Batch enough launches per sample that launch overhead and timer resolution stay small.
  KILN_CUDA_CHECK(cudaEventRecord(events_[0], stream_));
  run(stream_);
  KILN_CUDA_CHECK(cudaEventRecord(events_[1], stream_));
  KILN_CUDA_CHECK(cudaEventSynchronize(events_[1]));
  float once = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&once, events_[0], events_[1]));
  const int per_sample = std::clamp(static_cast<int>(0.2f / std::max(once, 1e-4f)), 1, 20);
  // As the engine runs it, in a CUDA graph (cuda/runtime/graph_timing.h), unless that is off or fails.
  if (config_.tactics.graph_timing)
    if (const float ms = graph_replay_ms(stream_, run, per_sample); ms >= 0) return ms;
  return median_sample_ms(
      stream_, [&] {
        for (int i = 0; i < per_sample; ++i) run(stream_);
      },
      per_sample);
}

int Builder::constant_buffer(const std::string& value, const Format& format) {
  auto key = std::make_pair(value, "const:" + format.str());
  if (auto it = converted_.find(key); it != converted_.end()) return it->second;
  const Tensor& t = *graph_.constant(value);
  Tensor converted = convert_constant(t, format);
  Buffer b;
  b.name = value;
  b.spec = TensorSpec{t.shape(), format};
  b.kind = BufferKind::kWeight;
  b.weight = upload(converted.raw(), converted.nbytes());
  int id = add_buffer(std::move(b));
  converted_[key] = id;
  return id;
}

int Builder::buffer_in_format(const std::string& value, const Format& format) {
  auto found = value_buffer_.find(value);
  if (found == value_buffer_.end()) {
    if (graph_.constant(value)) return constant_buffer(value, format);
    throw Error(ErrorKind::kInternal, "value '" + value + "' has no buffer");
  }
  const int src = found->second;
  const TensorSpec from = buffers_[src].spec;
  if (from.format == format) return src;
  auto key = std::make_pair(value, format.str());
  if (auto it = converted_.find(key); it != converted_.end()) return it->second;
  Buffer b;
  b.name = value + "@" + format.str();
  b.spec = TensorSpec{from.shape, format};
  int id;
  if (from.format.dtype == format.dtype && layouts_share_memory(from.shape)) {
    b.kind = BufferKind::kView;
    b.view_of = src;
    id = add_buffer(std::move(b));
  } else {
    TensorSpec to = b.spec;
    id = add_buffer(std::move(b));
    PlannedLayer layer;
    layer.name = "reformat(" + value + ")";
    layer.op = "Reformat";
    layer.layer = make_reformat_layer(from, to);
    layer.inputs = {src};
    layer.outputs = {id};
    add_layer(std::move(layer));
  }
  converted_[key] = id;
  return id;
}

void Builder::add_layer(PlannedLayer layer) {
  const int index = static_cast<int>(plan_->layers_.size());
  for (int in : layer.inputs)
    if (in >= 0) {
      Buffer& r = buffers_[root(in)];
      r.last_use = std::max(r.last_use, index);
    }
  for (int out : layer.outputs)
    if (out >= 0) {
      buffers_[out].first_use = index;
      buffers_[out].last_use = std::max(buffers_[out].last_use, index);
    }
  plan_->layers_.push_back(std::move(layer));
}

void Builder::lower_view(const ir::Node& node) {
  int src = value_buffer_.count(node.inputs[0]) ? value_buffer_.at(node.inputs[0]) : -1;
  Format f;
  if (src >= 0) {
    f = buffers_[src].spec.format;
    f.layout = Layout::kLinear;
  } else {
    f = Format{graph_.value(node.inputs[0]).type.dtype, Layout::kLinear};
  }
  src = buffer_in_format(node.inputs[0], f);
  Buffer b;
  b.name = node.outputs[0];
  b.spec = TensorSpec{ir::known_values(*graph_.value(node.outputs[0]).type.shape), f};
  b.kind = BufferKind::kView;
  b.view_of = src;
  value_buffer_[node.outputs[0]] = add_buffer(std::move(b));
}

// A Slice that reads the first elements of its input (ir::slice_reads_leading_elements), stored
// row-major or in a layout that is the same bytes, moves nothing: it is lowered as a view. At
// batch 1 a classifier's INT8 layer computes 1008 channels and a Slice keeps 1000; as a copy it
// was a memcpy node of its own in the CUDA graph. Anything else (steps, offsets, a non-constant
// parameter, a model error) is left to the Slice layer, which copies or reports it.
bool Builder::slice_is_view(const ir::Node& node) const {
  if (node.op != "Slice" || !node.domain.empty() || node.inputs.size() < 3 || node.outputs.size() != 1) return false;
  auto in = value_buffer_.find(node.inputs[0]);
  if (in == value_buffer_.end()) return false;
  const TensorSpec& spec = buffers_[in->second].spec;
  if (spec.format.layout != Layout::kLinear && !layouts_share_memory(spec.shape)) return false;
  try {
    std::vector<std::optional<std::vector<int64_t>>> ints(5);
    for (size_t i = 1; i < 5; ++i) {
      if (!node.has_input(i)) continue;
      const Tensor* t = graph_.constant(node.inputs[i]);
      if (!t) return false;
      ints[i] = t->to_int_vector();
    }
    if (!ints[1] || !ints[2]) return false;
    return ir::slice_reads_leading_elements(
        spec.shape, ir::slice_params(node, ir::dims_of(spec.shape), *ints[1], *ints[2], ints[3], ints[4]));
  } catch (const Error&) {
    return false;
  }
}

// A Transpose between NCHW and NHWC of a value already stored the other way moves no bytes:
// perm (0,2,3,1) of a value stored NHWC is those bytes read row-major, and perm (0,3,1,2) of a
// row-major value is its bytes read as NHWC. ConvNeXt-style blocks transpose to channels-last
// and back around every LayerNorm and pair of products; as views those transposes cost nothing
// and the values downstream keep the layout the convolutions want. The layout the output is
// stored in, or nothing when the Transpose must copy.
std::optional<Layout> Builder::transpose_view_layout(const ir::Node& node) const {
  if (node.op != "Transpose" || !node.domain.empty() || node.inputs.size() != 1 || node.outputs.size() != 1)
    return std::nullopt;
  auto in = value_buffer_.find(node.inputs[0]);
  if (in == value_buffer_.end()) return std::nullopt;
  const TensorSpec& spec = buffers_[in->second].spec;
  if (spec.shape.size() != 4) return std::nullopt;
  const std::vector<int64_t> perm = node.attrs.get_ints("perm");
  if (spec.format.layout == Layout::kNHWC && perm == std::vector<int64_t>{0, 2, 3, 1}) return Layout::kLinear;
  if (spec.format.layout == Layout::kLinear && perm == std::vector<int64_t>{0, 3, 1, 2}) return Layout::kNHWC;
  return std::nullopt;
}

void Builder::lower_transpose_view(const ir::Node& node, Layout layout) {
  const int src = value_buffer_.at(node.inputs[0]);
  Buffer b;
  b.name = node.outputs[0];
  b.spec = TensorSpec{ir::known_values(*graph_.value(node.outputs[0]).type.shape),
                      Format{buffers_[src].spec.format.dtype, layout}};
  if (b.spec.bytes() != buffers_[src].spec.bytes())
    throw node.error(ErrorKind::kInternal, "a transposed view differs in size from its input");
  b.kind = BufferKind::kView;
  b.view_of = src;
  value_buffer_[node.outputs[0]] = add_buffer(std::move(b));
}

void Builder::placeholder_outputs(const ir::Node& node) {
  for (const std::string& out : node.outputs) {
    if (out.empty()) continue;
    const ir::Value& v = graph_.value(out);
    Buffer b;
    b.name = out;
    std::vector<int64_t> shape;
    if (v.type.shape)
      for (const ir::Dim& d : *v.type.shape) shape.push_back(d.known() ? d.value : 0);
    b.spec = TensorSpec{shape, Format{v.type.dtype, Layout::kLinear}};
    value_buffer_[out] = add_buffer(std::move(b));
  }
}

void Builder::lower_shape(const ir::Node& node) {
  const std::vector<int64_t>& shape = buffers_[value_buffer_.at(node.inputs[0])].spec.shape;
  Tensor result;
  if (node.op == "Size") {
    result = Tensor::from_vector<int64_t>({}, {shape_numel(shape)});
  } else {
    const int64_t rank = static_cast<int64_t>(shape.size());
    auto clamp = [&](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
    const int64_t start = clamp(node.attrs.get_int("start", 0));
    const int64_t end = node.attrs.has("end") ? clamp(node.attrs.get_int("end", rank)) : rank;
    std::vector<int64_t> dims;
    for (int64_t i = start; i < end; ++i) dims.push_back(shape[static_cast<size_t>(i)]);
    result = Tensor::from_vector<int64_t>({static_cast<int64_t>(dims.size())}, dims);
  }
  Buffer b;
  b.name = node.outputs[0];
  b.spec = TensorSpec{result.shape(), Format{DType::kInt64, Layout::kLinear}};
  b.kind = BufferKind::kWeight;
  b.weight = upload(result.raw(), result.nbytes());
  value_buffer_[node.outputs[0]] = add_buffer(std::move(b));
}

void Builder::lower_node(const ir::Node& node, std::vector<std::string>& unsupported) {
  // Logical specs of constants, kept alive while the request (or a copy deferred) points at them.
  auto constant_specs = std::make_shared<std::deque<TensorSpec>>();
  // A node pinned to float32 in an fp16 build: its layer picks float32 formats and math like an
  // fp32 build's, and buffer_in_format reformats its neighbours' fp16 to and from them.
  const bool pinned_fp32 = config_.precision == Precision::kFp16 && config_.fp32_layers.count(node.name);
  LayerRequest request{node, pinned_fp32 ? Precision::kFp32 : config_.precision, {}, {}, {}, {}, {}};
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!node.has_input(i)) {
      request.inputs.push_back(nullptr);
      request.constants.push_back(nullptr);
      request.input_dtypes.push_back(DType::kUndefined);
      continue;
    }
    const ir::Value& v = graph_.value(node.inputs[i]);
    request.input_dtypes.push_back(v.type.dtype);
    if (const Tensor* c = graph_.constant(node.inputs[i])) {
      constant_specs->push_back(TensorSpec{c->shape(), Format{c->dtype(), Layout::kLinear}});
      request.inputs.push_back(&constant_specs->back());
      request.constants.push_back(c);
    } else {
      request.inputs.push_back(&buffers_[value_buffer_.at(node.inputs[i])].spec);
      request.constants.push_back(nullptr);
    }
  }
  for (const std::string& out : node.outputs) {
    if (out.empty()) {  // an omitted optional output (Attention's present_key before its logits)
      request.output_shapes.emplace_back();
      request.output_dtypes.push_back(DType::kUndefined);
      continue;
    }
    const ir::Value& v = graph_.value(out);
    if (!v.type.shape || !ir::all_known(*v.type.shape))
      throw node.error(ErrorKind::kUnsupported, "the shape of output '" + out + "' (" + v.type.str() +
                                                    ") is not known at build time (it depends on the data)");
    request.output_shapes.push_back(ir::known_values(*v.type.shape));
    request.output_dtypes.push_back(v.type.dtype);
  }

  const LayerEntry* entry = LayerRegistry::instance().find(node.op, node.domain);
  std::string why = entry ? entry->check(request) : "kiln has no CUDA layer for " + node.op;
  const bool fallback = !why.empty();
  if (fallback && !config_.allow_cpu_fallback) {
    unsupported.push_back(node.name + " (" + node.op + "): " + why);
    placeholder_outputs(node);
    return;
  }
  LayerFormats formats;
  if (fallback) {
    for (size_t i = 0; i < request.inputs.size(); ++i)
      formats.inputs.push_back(request.has_input(i) && !request.is_constant(i)
                                   ? Format{request.input_dtypes[i], Layout::kLinear} : Format{});
    for (DType d : request.output_dtypes) formats.outputs.push_back(Format{d, Layout::kLinear});
  } else {
    formats = entry->formats(request);
  }
  if (formats.inputs.size() != request.inputs.size() || formats.outputs.size() != node.outputs.size())
    throw node.error(ErrorKind::kInternal, "the CUDA layer's formats do not match the node's inputs/outputs");

  std::vector<int> inputs;
  std::deque<TensorSpec> chosen;
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    if (!request.has_input(i)) { inputs.push_back(-1); continue; }
    if (request.is_constant(i)) {
      inputs.push_back(formats.inputs[i].defined() ? constant_buffer(node.inputs[i], formats.inputs[i]) : -1);
      continue;
    }
    if (!formats.inputs[i].defined())
      throw node.error(ErrorKind::kInternal, "the CUDA layer gave no format for runtime input " + std::to_string(i));
    int id = buffer_in_format(node.inputs[i], formats.inputs[i]);
    inputs.push_back(id);
    request.inputs[i] = &buffers_[id].spec;
  }
  std::vector<int> outputs;
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    if (node.outputs[i].empty()) {
      outputs.push_back(-1);
      continue;
    }
    Buffer b;
    b.name = node.outputs[i];
    b.spec = TensorSpec{request.output_shapes[i], formats.outputs[i]};
    outputs.push_back(add_buffer(std::move(b)));
  }

  current_request_ = &request;
  current_formats_ = &formats;
  current_inputs_ = inputs;
  current_constant_specs_ = constant_specs;
  current_layer_ = plan_->layers_.size();
  scratch_ready_ = false;
  PlannedLayer layer;
  layer.name = node.name;
  layer.op = node.op;
  layer.cpu_fallback = fallback;
  layer.members = node.attrs.get_strings("members");
  layer.layer = fallback ? make_cpu_fallback_layer(request, formats) : entry->create(request, formats, *this);
  current_request_ = nullptr;
  current_constant_specs_.reset();
  layer.inputs = inputs;
  layer.outputs = outputs;
  if (config_.precision == Precision::kFp16) {
    layer.fp32_under_fp16 = pinned_fp32;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (request.output_dtypes[i] == DType::kFloat32 && formats.outputs[i].dtype == DType::kFloat32)
        layer.fp32_under_fp16 = true;
  }
  try {
    layer.flops = static_cast<double>(ir::node_flops(graph_, node));
  } catch (const Error&) {
    layer.flops = 0;
  }
  add_layer(std::move(layer));
  for (size_t i = 0; i < node.outputs.size(); ++i)
    if (!node.outputs[i].empty()) value_buffer_[node.outputs[i]] = outputs[i];
}

void Builder::finish_deferred_layers() {
  if (deferred_.empty()) return;
  log("timing the generated kernels of " + std::to_string(deferred_.size()) + " layer(s), compiled on " +
      std::to_string(compiler_ ? compiler_->threads() : 0) + " thread(s) while the others were lowered");
  // By index, and each moved out first: a layer may defer again (appending) as it finishes.
  for (size_t k = 0; k < deferred_.size(); ++k) {
    Deferred d = std::move(deferred_[k]);
    current_request_ = d.request.get();
    current_formats_ = &d.formats;
    current_inputs_ = d.inputs;
    current_constant_specs_ = d.constant_specs;
    current_layer_ = d.layer;
    scratch_ready_ = false;
    d.finish(*this);
    current_request_ = nullptr;
    current_constant_specs_.reset();
    const PlannedLayer& layer = plan_->layers_.at(d.layer);
    log("[" + std::to_string(k + 1) + "/" + std::to_string(deferred_.size()) + "] " + layer.name + " (" + layer.op +
        "): " + layer.layer->tactic());
  }
  deferred_.clear();
}

std::unique_ptr<ShapePlan> Builder::build(const Shapes& shapes, const Values& values,
                                          std::shared_ptr<const ir::Graph> graph) {
  plan_.reset(new ShapePlan());
  plan_->shapes_ = shapes;
  plan_->values_ = values;
  plan_->graph_ = std::move(graph);
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device));
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KILN_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  KILN_CUDA_CHECK(cudaEventCreate(&events_[0]));
  KILN_CUDA_CHECK(cudaEventCreate(&events_[1]));

  // Graph inputs: the context's input buffers (kIo, in graph.inputs order), logical dtype, row-major.
  int io = 0;
  for (const std::string& name : graph_.inputs) {
    const ir::Value& v = graph_.value(name);
    if (!v.type.shape || !ir::all_known(*v.type.shape))
      throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' has shape " + v.type.str() +
                                                   ": the GPU build needs every input dimension bound")
          .hint("give the shapes with --shapes name:1x3x224x224 or --batch N");
    Buffer b;
    b.name = name;
    b.spec = TensorSpec{ir::known_values(*v.type.shape), Format{v.type.dtype, Layout::kLinear}};
    b.kind = BufferKind::kIo;
    b.io = io++;
    b.first_use = 0;
    b.last_use = std::numeric_limits<int>::max();
    int id = add_buffer(std::move(b));
    value_buffer_[name] = id;
    plan_->inputs_.push_back(EngineIO{name, v.type.dtype, buffers_[id].spec.shape, id});
  }

  // Inputs left as data that set parameters: what a build refused for want of their values names.
  std::string values_hint;
  for (const std::string& name : ir::parameter_inputs(graph_, ir::kMaxParameterElements))
    values_hint += (values_hint.empty() ? "" : ", ") + name;
  if (!values_hint.empty())
    values_hint = "input(s) " + values_hint + " set parameters of the model: give their values (--input-values NAME=V1,V2,..., "
                  "BuildOptions::input_values) and the engine plans for them";
  for (const std::string& name : config_.fp32_layers)
    if (std::none_of(graph_.nodes.begin(), graph_.nodes.end(), [&](const ir::Node& n) { return n.name == name; }))
      throw Error(ErrorKind::kInvalidArgument, "layer '" + name + "' is pinned to float32, and the optimized graph has no node of that name")
          .hint("name a layer as `kiln inspect --optimize` (or `kiln build -v`) lists the engine's layers");
  std::vector<std::string> unsupported;
  const size_t total = graph_.nodes.size();
  auto started = std::chrono::steady_clock::now();
  for (size_t i = 0; i < total; ++i) {
    const ir::Node& node = graph_.nodes[i];
    try {
      if (is_view_op(graph_, node) || slice_is_view(node)) {
        lower_view(node);
      } else if (std::optional<Layout> layout = transpose_view_layout(node)) {
        lower_transpose_view(node, *layout);
      } else if (is_shape_op(node) && value_buffer_.count(node.inputs[0])) {
        lower_shape(node);
      } else {
        lower_node(node, unsupported);
      }
    } catch (Error& e) {
      if (!values_hint.empty() && e.hint_text().empty()) e.hint(values_hint);
      throw;
    }
    if (config_.log && !plan_->layers_.empty() && plan_->layers_.back().name == node.name) {
      const bool waiting = !deferred_.empty() && deferred_.back().layer + 1 == plan_->layers_.size();
      log("[" + std::to_string(i + 1) + "/" + std::to_string(total) + "] " + node.name + " (" + node.op + "): " +
          (waiting ? std::string("timed once its generated kernels compile") : plan_->layers_.back().layer->tactic()));
    }
  }
  if (!unsupported.empty()) {
    std::string msg = std::to_string(unsupported.size()) + " node(s) cannot run on the GPU:";
    for (const std::string& u : unsupported) msg += "\n  " + u;
    throw Error(ErrorKind::kUnsupported, msg)
        .hint((values_hint.empty() ? "" : values_hint + "; ") +
              "without --strict (BuildOptions::allow_cpu_fallback) they run on the CPU engine inside the GPU engine (slow)");
  }
  finish_deferred_layers();

  // Graph outputs: the logical dtype, row-major, one buffer each, in the context's output
  // buffers (kIo): the buffer whose memory an output is becomes that output's slot.
  std::set<int> taken;
  for (const EngineIO& in : plan_->inputs_) taken.insert(in.buffer);
  for (const std::string& name : graph_.outputs) {
    const ir::Value& v = graph_.value(name);
    if (!v.type.shape || !ir::all_known(*v.type.shape))
      throw Error(ErrorKind::kUnsupported, "output '" + name + "' has no known shape at build time");
    int id = buffer_in_format(name, Format{v.type.dtype, Layout::kLinear});
    if (buffers_[root(id)].kind != BufferKind::kArena || taken.count(root(id)) ||
        buffers_[root(id)].spec.bytes() != buffers_[id].spec.bytes()) {
      // A constant output, one that shares memory with an input or another output, or a view of
      // part of a larger buffer (a Slice's first elements; the output slot is sized for the
      // output alone): copy.
      Buffer b;
      b.name = name + "@output";
      b.spec = buffers_[id].spec;
      int copy = add_buffer(std::move(b));
      PlannedLayer layer;
      layer.name = "copy(" + name + ")";
      layer.op = "Copy";
      layer.layer = make_reformat_layer(buffers_[id].spec, buffers_[copy].spec);
      layer.inputs = {id};
      layer.outputs = {copy};
      add_layer(std::move(layer));
      id = copy;
    }
    Buffer& r = buffers_[root(id)];
    taken.insert(root(id));
    r.kind = BufferKind::kIo;
    r.io = io++;
    r.last_use = std::numeric_limits<int>::max();
    plan_->outputs_.push_back(EngineIO{name, v.type.dtype, buffers_[id].spec.shape, id});
  }

  // Memory: lifetimes are layer indices; views live in their root buffer.
  const int n_layers = static_cast<int>(plan_->layers_.size());
  for (Buffer& b : buffers_) {
    if (b.last_use == std::numeric_limits<int>::max()) b.last_use = n_layers;
    if (b.first_use < 0) b.first_use = b.last_use < 0 ? 0 : b.first_use;
    if (b.last_use < b.first_use) b.last_use = b.first_use;  // written, never read
  }
  plan_->buffers_.assign(buffers_.begin(), buffers_.end());
  plan_->arena_bytes_ = plan_arena(plan_->buffers_);
  for (const PlannedLayer& l : plan_->layers_)
    plan_->workspace_bytes_ = std::max(plan_->workspace_bytes_, l.layer->workspace_bytes());
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  log("built " + std::to_string(n_layers) + " layers at " + shapes_key(shapes) + " in " +
      std::to_string(seconds).substr(0, 5) + " s");
  return std::move(plan_);
}

std::unique_ptr<ShapePlan> build_plan(std::shared_ptr<const ir::Graph> graph, const Shapes& shapes, const Values& values,
                                      const BuildConfig& config, TimingCache& cache, WeightMemory& weights,
                                      const std::map<std::string, std::string>* hints, const CudnnSource& cudnn) {
  Builder builder(*graph, config, cache, weights, hints, cudnn);
  return builder.build(shapes, values, std::move(graph));
}

}  // namespace kiln::cuda
