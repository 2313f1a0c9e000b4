// The execution context: binds the plan of its current input shapes to this context's memory
// and handles, and runs it on a stream, as a CUDA graph (one per shape) after the first run.
#include <cublasLt.h>
#include <cudnn.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"
#include "cuda/runtime/launch_order.h"
#include "cuda/runtime/graph_timing.h"
#include "ir/sizes.h"

namespace kiln::cuda {

SharedActivations::SharedActivations(size_t arena_size, size_t workspace_size) {
  try {
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&last_run, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaMalloc(&arena, std::max<size_t>(arena_size, 1)));
    arena_bytes = arena_size;
    KILN_CUDA_CHECK(cudaMalloc(&workspace, std::max<size_t>(workspace_size, 1)));
    workspace_bytes = workspace_size;
  } catch (...) {
    release();
    throw;
  }
}

// The last context holding it is gone, and with it (its destructor synchronized) every run.
SharedActivations::~SharedActivations() { release(); }

void SharedActivations::release() {
  if (arena) cudaFree(arena);
  if (workspace) cudaFree(workspace);
  if (last_run) cudaEventDestroy(last_run);
  arena = workspace = nullptr;
  last_run = nullptr;
}

std::shared_ptr<SharedActivations> CudaEngine::shared_activations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!shared_activations_) shared_activations_ = std::make_shared<SharedActivations>(arena_bytes_, workspace_bytes_);
  return shared_activations_;
}

namespace {

// One run's turn on shared activation memory (nothing without it): the stream waits on the GPU
// for the run enqueued before, by any context on any stream; finish() marks this run's end for
// the next. The lock keeps the wait and the mark of concurrent callers in one order.
class ActivationTurn {
 public:
  ActivationTurn(SharedActivations* shared, cudaStream_t stream) : shared_(shared), stream_(stream) {
    if (!shared_) return;
    lock_ = std::unique_lock<std::mutex>(shared_->turn);
    KILN_CUDA_CHECK(cudaStreamWaitEvent(stream_, shared_->last_run, 0));
  }
  void finish() {
    if (!shared_) return;
    KILN_CUDA_CHECK(cudaEventRecord(shared_->last_run, stream_));
    shared_ = nullptr;
  }
  // A run that failed midway still marks its end, so that the next waits for what it enqueued.
  ~ActivationTurn() {
    if (shared_) cudaEventRecord(shared_->last_run, stream_);
  }
  ActivationTurn(const ActivationTurn&) = delete;
  ActivationTurn& operator=(const ActivationTurn&) = delete;

 private:
  SharedActivations* shared_;
  cudaStream_t stream_;
  std::unique_lock<std::mutex> lock_;
};

}  // namespace

CudaContext::CudaContext(const CudaEngine& engine, const ContextOptions& options)
    : engine_(engine), use_cuda_graph_(options.use_cuda_graph) {
  if (options.share_activation_memory) {
    shared_ = engine.shared_activations();
    arena_ = shared_->arena;
    arena_capacity_ = shared_->arena_bytes;
    workspace_ = shared_->workspace;
    workspace_capacity_ = shared_->workspace_bytes;
  }
  check_memory();
  KILN_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  for (const IoSlot& slot : engine.io()) {
    void* device = nullptr;
    void* host = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&device, std::max<size_t>(slot.capacity, 1)));
    io_buffers_.push_back(device);
    KILN_CUDA_CHECK(cudaMallocHost(&host, std::max<size_t>(slot.capacity, 1)));
    pinned_.push_back(host);
    io_capacity_.push_back(slot.capacity);
  }
  // Memory for the largest plan the build made (every profile's max shape among them).
  reserve(engine.arena_bytes(), engine.workspace_bytes());
  set_profile(0);
  for (const auto& [name, values] : engine.config().input_values) values_[name] = values.clone();
}

void CudaContext::check_memory() const {
  size_t io = 0;
  for (const IoSlot& slot : engine_.io()) io += std::max<size_t>(slot.capacity, 1);
  const size_t need = io + (shared_ ? 0 : engine_.arena_bytes() + engine_.workspace_bytes());
  size_t free = 0, total = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const size_t limit = engine_.config().max_memory ? engine_.config().max_memory : total;
  const std::string parts = " (activations " + format_bytes(static_cast<double>(engine_.arena_bytes())) + ", workspace " +
                            format_bytes(static_cast<double>(engine_.workspace_bytes())) + ", inputs and outputs " +
                            format_bytes(static_cast<double>(io)) + ")";
  if (engine_.weight_bytes() > limit || need > limit - engine_.weight_bytes())
    throw Error(ErrorKind::kInvalidArgument, "an execution context needs " + format_bytes(static_cast<double>(need)) + parts +
                                                 " beside the weights' " + format_bytes(static_cast<double>(engine_.weight_bytes())) +
                                                 ": that passes the memory limit of " + format_bytes(static_cast<double>(limit)))
        .hint("raise --max-memory (BuildOptions::max_memory), or build for smaller max shapes");
  if (need > free)
    throw Error(ErrorKind::kDevice, "an execution context needs " + format_bytes(static_cast<double>(need)) + parts +
                                        ", the GPU has " + format_bytes(static_cast<double>(free)) + " free")
        .hint("free GPU memory (other contexts, other processes), or build for smaller max shapes");
}

namespace {

// The device allocates in pages of 2 MiB: a buffer costs whole pages.
size_t in_pages(size_t bytes) {
  constexpr size_t kPage = size_t{2} << 20;
  return (bytes + kPage - 1) / kPage * kPage;
}

// What the libraries hold once an engine has run, beside the engine's own buffers: what
// cudaMemGetInfo's figure leaves over their pages (bench/results/device_memory/;
// docs/design/gpu-engine.md, "Device memory"). The runtime, cuBLASLt's handle, kernels loaded on
// first use and the CUDA graph take about 4 MiB (ResNet-18 INT8 on kiln's kernels alone); a
// context's cuDNN handle 9 MiB more (12 to 14 MiB in all where convolutions run on cuDNN).
constexpr size_t kRuntimeStateBytes = size_t{4} << 20;
constexpr size_t kCudnnHandleBytes = size_t{9} << 20;

}  // namespace

size_t CudaContext::predicted_bytes(const CudaEngine& engine) {
  size_t io = 0;
  for (const IoSlot& slot : engine.io()) io += std::max<size_t>(slot.capacity, 1);
  // A context makes a cuDNN handle only for a plan with a layer that uses it (bind()).
  bool cudnn = false;
  for (int p = 0; p < static_cast<int>(engine.profiles().size()); ++p)
    for (const auto& plan : {engine.opt_plan(p), engine.max_plan(p)})
      for (const PlannedLayer& l : plan->layers()) cudnn = cudnn || l.layer->uses_cudnn();
  return engine.weight_held_bytes() + in_pages(engine.arena_bytes()) + in_pages(engine.workspace_bytes()) + in_pages(io) +
         kRuntimeStateBytes + (cudnn ? kCudnnHandleBytes : 0);
}

CudaContext::~CudaContext() {
  cudaDeviceSynchronize();  // work in flight uses the layers and memory freed below
  for (auto& [key, b] : bound_)
    if (b.graph) cudaGraphExecDestroy(b.graph);
  if (side_stream_) cudaStreamDestroy(side_stream_);
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  for (void* p : pinned_) cudaFreeHost(p);
  for (void* p : io_buffers_) cudaFree(p);
  if (cudnn_) cudnnDestroy(cudnn_);
  if (cublaslt_) cublasLtDestroy(cublaslt_);
  if (!shared_ && arena_) cudaFree(arena_);
  if (!shared_ && workspace_) cudaFree(workspace_);
}

void CudaContext::stop_sharing() {
  if (!shared_) return;
  // Runs of this context on the shared memory must be done before its plans are rebound.
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  shared_.reset();
  arena_ = workspace_ = nullptr;
  arena_capacity_ = workspace_capacity_ = 0;
}

void CudaContext::reserve(size_t arena_bytes, size_t workspace_bytes) {
  if (arena_bytes <= arena_capacity_ && workspace_bytes <= workspace_capacity_) return;
  // A plan built after this context was made needs more memory than any before it (rare:
  // the profiles' max shapes are planned at build time). Work in flight may still use the old
  // memory, and every bound plan points into it. Shared memory is never grown under the other
  // contexts: this one takes memory of its own.
  stop_sharing();
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto& [key, b] : bound_)
    if (b.graph) KILN_CUDA_CHECK(cudaGraphExecDestroy(b.graph));
  bound_.clear();
  auto grow = [](void*& memory, size_t& capacity, size_t bytes) {
    if (bytes <= capacity) return;
    if (memory) KILN_CUDA_CHECK(cudaFree(memory));
    memory = nullptr;
    capacity = 0;
    KILN_CUDA_CHECK(cudaMalloc(&memory, std::max<size_t>(bytes, 1)));
    capacity = bytes;
  };
  grow(arena_, arena_capacity_, arena_bytes);
  grow(workspace_, workspace_capacity_, workspace_bytes);
}

void CudaContext::grow_io(size_t slot, size_t bytes) {
  // Work in flight may use the old buffer, and every bound plan points at it.
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto& [key, b] : bound_)
    if (b.graph) KILN_CUDA_CHECK(cudaGraphExecDestroy(b.graph));
  bound_.clear();
  KILN_CUDA_CHECK(cudaFree(io_buffers_[slot]));
  KILN_CUDA_CHECK(cudaFreeHost(pinned_[slot]));
  io_buffers_[slot] = pinned_[slot] = nullptr;
  io_capacity_[slot] = 0;
  KILN_CUDA_CHECK(cudaMalloc(&io_buffers_[slot], bytes));
  KILN_CUDA_CHECK(cudaMallocHost(&pinned_[slot], bytes));
  io_capacity_[slot] = bytes;
}

void CudaContext::set_profile(int index) {
  if (index < 0 || index >= static_cast<int>(engine_.profiles().size()))
    throw Error(ErrorKind::kInvalidArgument, "optimization profile " + std::to_string(index) + " does not exist: the engine has " +
                                                 std::to_string(engine_.profiles().size()));
  profile_ = index;
  shapes_ = engine_.profiles()[static_cast<size_t>(index)].opt();
}

void CudaContext::set_input_values(const std::string& name, const Tensor& values) {
  engine_.io_index(name, true);  // names an input, or throws
  auto it = values_.find(name);
  if (it == values_.end())
    throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' is not planned by value: its data goes in its input buffer")
        .hint("give its values when building (BuildOptions::input_values, --input-values) to plan for them");
  if (values.dtype() != it->second.dtype() || values.shape() != it->second.shape())
    throw Error(ErrorKind::kInvalidArgument, "values for input '" + name + "' must be " + to_string(it->second.dtype()) + " " +
                                                 shape_to_string(it->second.shape()) + ", not " + to_string(values.dtype()) +
                                                 " " + shape_to_string(values.shape()));
  it->second = values.clone();
}

void CudaContext::set_input_shape(const std::string& name, const std::vector<int64_t>& shape) {
  engine_.io_index(name, true);  // names an input, or throws
  Shapes next = shapes_;
  next[name] = shape;
  const std::string why = engine_.profiles()[static_cast<size_t>(profile_)].mismatch(next);
  if (!why.empty())
    throw Error(ErrorKind::kInvalidArgument, "input shape " + shape_to_string(shape) + " for '" + name +
                                                 "' is outside optimization profile " + std::to_string(profile_) + ": " + why)
        .hint("build the engine with a profile that covers it (--min-shapes/--max-shapes), or pick another profile");
  shapes_ = std::move(next);
}

const std::vector<int64_t>& CudaContext::input_shape(const std::string& name) const {
  engine_.io_index(name, true);
  return shapes_.at(name);
}

const ShapePlan& CudaContext::current_plan() { return *bound().plan; }

void* CudaContext::address(const ShapePlan& plan, int buffer) const {
  const Buffer& b = plan.buffers()[buffer];
  switch (b.kind) {
    case BufferKind::kArena: return static_cast<char*>(arena_) + b.offset;
    case BufferKind::kWeight: return const_cast<void*>(b.weight);
    case BufferKind::kView: return address(plan, b.view_of);
    case BufferKind::kIo: return io_buffers_.at(static_cast<size_t>(b.io));
  }
  return nullptr;
}

void* CudaContext::input_buffer(const std::string& name) const {
  return io_buffers_[static_cast<size_t>(engine_.io_index(name, true))];
}

void* CudaContext::output_buffer(const std::string& name) const {
  return io_buffers_[static_cast<size_t>(engine_.io_index(name, false))];
}

void CudaContext::bind(Bound& b) {
  const ShapePlan& plan = *b.plan;
  // The cuDNN handle is made for the first plan with a layer that uses it (binding happens on a
  // run's eager pass, never inside a graph capture).
  if (!cudnn_ && std::any_of(plan.layers().begin(), plan.layers().end(),
                             [](const PlannedLayer& l) { return l.layer->uses_cudnn(); }))
    KILN_CUDNN_CHECK(cudnnCreate(&cudnn_));
  b.io.clear();
  for (const PlannedLayer& l : plan.layers()) {
    LayerIO io;
    for (int id : l.inputs) io.inputs.push_back(id >= 0 ? address(plan, id) : nullptr);
    for (int id : l.outputs) io.outputs.push_back(id >= 0 ? address(plan, id) : nullptr);
    io.workspace = l.layer->workspace_bytes() ? workspace_ : nullptr;
    io.cudnn = cudnn_;
    io.cublaslt = cublaslt_;
    b.io.push_back(std::move(io));
  }
}

CudaContext::Bound& CudaContext::bound() {
  const std::string key = binding_key(shapes_, values_);
  auto it = bound_.find(key);
  if (it == bound_.end()) {
    std::shared_ptr<const ShapePlan> plan = engine_.context_plan(shapes_, values_, [this] {
      if (!cudnn_) KILN_CUDNN_CHECK(cudnnCreate(&cudnn_));
      return cudnn_;
    });
    for (const auto* list : {&plan->inputs(), &plan->outputs()})
      for (const EngineIO& x : *list) {
        const size_t slot = static_cast<size_t>(engine_.io_index(x.name, list == &plan->inputs()));
        const size_t bytes = plan->buffers()[x.buffer].spec.bytes();
        if (bytes <= io_capacity_[slot]) continue;
        // Values other than the build's may make an output larger than any shape in the profiles.
        if (list == &plan->inputs() || !engine_.has_value_inputs())
          throw Error(ErrorKind::kInternal, "'" + x.name + "' at " + key + " needs more memory than at the profiles' max shapes");
        grow_io(slot, bytes);
      }
    reserve(plan->arena_bytes(), plan->workspace_bytes());
    if (bound_.size() >= kMaxGraphs) {
      auto oldest = std::min_element(bound_.begin(), bound_.end(),
                                     [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
      // Its layers (this context's own) go with it: the work they were given must be done (on
      // whichever streams the caller used; this happens at the ninth distinct shape only).
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      if (oldest->second.graph) KILN_CUDA_CHECK(cudaGraphExecDestroy(oldest->second.graph));
      bound_.erase(oldest);
    }
    Bound& b = bound_[key];
    b.plan = std::move(plan);
    bind(b);
    it = bound_.find(key);
  }
  it->second.last_used = ++clock_;
  return it->second;
}

namespace {

// Enqueues each layer after calling before(i); an error names the layer it came from.
template <class Before>
void enqueue_each_layer(const std::vector<PlannedLayer>& layers, const std::vector<LayerIO>& io, cudaStream_t stream,
                        Before before) {
  for (size_t i = 0; i < layers.size(); ++i) {
    try {
      before(i);
      layers[i].layer->enqueue(io[i], stream);
    } catch (Error& e) {
      if (e.node_name().empty()) e.node(layers[i].name, layers[i].op);
      throw;
    }
  }
}

}  // namespace

void CudaContext::enqueue_layers(const Bound& b, cudaStream_t stream) {
  // Each layer after an empty kernel (launch_order.h); the first too, as the stream's work before
  // it (a previous run) may still read the arena.
  enqueue_each_layer(b.plan->layers(), b.io, stream, [&](size_t) { launch_layer_barrier(stream); });
}

void CudaContext::enqueue(cudaStream_t stream) {
  if (use_cuda_graph_ && (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)) {
    // A default stream cannot be captured (PyTorch's current stream is the legacy one unless
    // the caller picked another): replay on the context's own stream, joined to the caller's.
    if (!side_stream_) {
      KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    }
    KILN_CUDA_CHECK(cudaEventRecord(fork_, stream));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, fork_, 0));
    enqueue(side_stream_);
    KILN_CUDA_CHECK(cudaEventRecord(join_, side_stream_));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(stream, join_, 0));
    return;
  }
  Bound& b = bound();
  if (cudnn_) KILN_CUDNN_CHECK(cudnnSetStream(cudnn_, stream));
  ActivationTurn turn(shared_.get(), stream);
  // A plan with CPU fallback layers runs without a CUDA graph: while contexts replayed graphs
  // holding their host functions, another context's eager cuDNN launches failed now and then
  // (CUDNN_STATUS_EXECUTION_FAILED; bench/probes/partition_contexts_probe.py: 3 of 8 trials of
  // four contexts on threads, none without graphs or without fallback layers, and still 2 of 24
  // with every first run made one at a time). The GPU waits for those layers' CPU work anyway.
  if (use_cuda_graph_ && !b.plan->has_cpu_fallback())
    enqueue_graph(b, stream);
  else
    enqueue_layers(b, stream);
  turn.finish();
}

void CudaContext::enqueue_graph(Bound& b, cudaStream_t stream) {
  if (b.graph && b.graph_stream == stream) {
    KILN_CUDA_CHECK(cudaGraphLaunch(b.graph, stream));
    return;
  }
  // The first run on a stream runs eagerly (libraries load kernels and pick plans lazily, which
  // a capture must not see), then the same work is captured for the next runs.
  enqueue_layers(b, stream);
  if (b.graph) {
    KILN_CUDA_CHECK(cudaGraphExecDestroy(b.graph));
    b.graph = nullptr;
  }
  cudaGraph_t graph = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  // The captured nodes that end a layer before a library's layer: their programmatic edges go
  // (launch_order.h).
  std::set<cudaGraphNode_t> cut_after;
  const std::vector<PlannedLayer>& layers = b.plan->layers();
  try {
    enqueue_each_layer(layers, b.io, stream, [&](size_t i) {
      if (!needs_full_edges_in(layers[i].layer->tactic())) return;
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      const cudaGraphNode_t* last = nullptr;
      size_t count = 0;
      KILN_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &capturing, nullptr, nullptr, &last, nullptr, &count));
      cut_after.insert(last, last + count);
    });
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaError_t status = cudaSuccess;
  try {
    drop_programmatic_edges(graph, cut_after);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  status = cudaGraphInstantiate(&b.graph, graph, 0);
  cudaGraphDestroy(graph);
  KILN_CUDA_CHECK(status);
  b.graph_stream = stream;
}

std::map<std::string, Tensor> CudaContext::run(const std::map<std::string, Tensor>& inputs, cudaStream_t stream) {
  std::map<std::string, std::vector<Tensor>> pieces;
  for (const auto& [name, t] : inputs) pieces[name].push_back(t);
  return run_concatenated(pieces, 0, stream);
}

std::map<std::string, Tensor> CudaContext::run_concatenated(const std::map<std::string, std::vector<Tensor>>& pieces,
                                                            int64_t zero_rows, cudaStream_t stream) {
  // (kMaxTensorBytes bounds it so that adding it to a shape's first dimension cannot overflow.)
  if (zero_rows < 0 || zero_rows > kMaxTensorBytes)
    throw Error(ErrorKind::kInvalidArgument, "zero_rows is " + std::to_string(zero_rows) + ", not between 0 and " +
                                                 std::to_string(kMaxTensorBytes));
  Shapes shapes;
  for (const IoSlot& slot : engine_.io()) {
    if (!slot.is_input) continue;
    auto it = pieces.find(slot.name);
    if (it == pieces.end() || it->second.empty())
      throw Error(ErrorKind::kInvalidArgument, "input '" + slot.name + "' is missing");
    std::vector<int64_t> shape = it->second.front().shape();
    for (const Tensor& t : it->second) {
      if (t.dtype() != slot.dtype)
        throw Error(ErrorKind::kInvalidArgument, "input '" + slot.name + "' has dtype " + to_string(t.dtype()) +
                                                     ", the engine expects " + to_string(slot.dtype));
      if (&t == &it->second.front()) continue;
      // A later piece: the same rank and the same dimensions after the first, its rows added.
      if (t.rank() != static_cast<int>(shape.size()) || t.rank() == 0 ||
          !std::equal(shape.begin() + 1, shape.end(), t.shape().begin() + 1))
        throw Error(ErrorKind::kInvalidArgument, "input '" + slot.name + "': a piece of shape " +
                                                     shape_to_string(t.shape()) + " does not continue pieces of shape " +
                                                     shape_to_string(shape) + " along the first dimension");
      shape[0] += t.dim(0);
    }
    if (zero_rows > 0) {
      if (shape.empty())
        throw Error(ErrorKind::kInvalidArgument, "input '" + slot.name + "' is a scalar: it has no rows to add zeros to");
      shape[0] += zero_rows;
    }
    shape_numel(shape);  // a shape too large is refused here, before any copy
    shapes[slot.name] = shape;
  }
  for (const auto& [name, unused] : pieces) engine_.io_index(name, true);  // no unknown names
  // The current profile if it holds these shapes, else the first that does.
  const std::vector<Profile>& profiles = engine_.profiles();
  std::string why = profiles[static_cast<size_t>(profile_)].mismatch(shapes);
  if (!why.empty()) {
    std::string all = "profile " + std::to_string(profile_) + ": " + why;
    for (size_t p = 0; p < profiles.size() && !why.empty(); ++p) {
      if (static_cast<int>(p) == profile_) continue;
      std::string w = profiles[p].mismatch(shapes);
      if (w.empty()) {
        profile_ = static_cast<int>(p);
        why.clear();
      } else {
        all += "; profile " + std::to_string(p) + ": " + w;
      }
    }
    if (!why.empty()) {
      const bool fixed = profiles.size() == 1 && profiles[0].min() == profiles[0].max();
      std::string given;
      for (const auto& [name, shape] : shapes) given += (given.empty() ? "" : ", ") + name + ":" + shape_to_string(shape);
      const std::string message =
          fixed ? "input shapes " + given + " are not the engine's: it was built for " + shapes_key(profiles[0].opt()) + " (" + why + ")"
                : "input shapes " + given + " fit no optimization profile of the engine (" + all + ")";
      throw Error(ErrorKind::kInvalidArgument, message)
          .hint("build the engine for these shapes (--shapes, or a profile: --min-shapes/--opt-shapes/--max-shapes)");
    }
  }
  // Inputs planned by value: this run's values choose the plan (a plan of its own on first use).
  Values values = values_;
  for (auto& [name, given] : values) {
    const std::vector<Tensor>& list = pieces.at(name);
    if (list.size() != 1 || zero_rows > 0)
      throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' sets a parameter of the model (the engine plans for its "
                                                   "values): it cannot be batched from several requests");
    given = list.front().clone();
  }
  shapes_ = shapes;
  values_ = std::move(values);
  for (size_t i = 0; i < engine_.io().size(); ++i) {
    const IoSlot& slot = engine_.io()[i];
    if (!slot.is_input || engine_.is_value_input(slot.name)) continue;
    // The shapes lie within a profile, so the pinned staging (sized for the largest) holds them.
    auto* staging = static_cast<unsigned char*>(pinned_[i]);
    size_t offset = 0;
    for (const Tensor& t : pieces.at(slot.name)) {
      if (t.nbytes()) std::memcpy(staging + offset, t.raw(), t.nbytes());
      offset += t.nbytes();
    }
    const size_t bytes = shape_bytes(shapes.at(slot.name), slot.dtype);
    std::memset(staging + offset, 0, bytes - offset);
    KILN_CUDA_CHECK(cudaMemcpyAsync(io_buffers_[i], pinned_[i], bytes, cudaMemcpyHostToDevice, stream));
  }
  const ShapePlan& plan = *bound().plan;
  for (const PlannedLayer& l : plan.layers()) l.layer->take_failure();  // of an enqueue() before: not this run's
  enqueue(stream);
  std::map<std::string, Tensor> outputs;
  std::vector<std::pair<size_t, Tensor>> copies;
  for (const EngineIO& out : plan.outputs()) {
    const size_t slot = static_cast<size_t>(engine_.io_index(out.name, false));
    Tensor t = Tensor::uninitialized(out.dtype, out.shape);
    KILN_CUDA_CHECK(cudaMemcpyAsync(pinned_[slot], io_buffers_[slot], t.nbytes(), cudaMemcpyDeviceToHost, stream));
    copies.push_back({slot, t});
    outputs[out.name] = t;
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (const PlannedLayer& l : plan.layers())
    if (std::optional<Error> failure = l.layer->take_failure()) throw *failure;
  for (auto& [slot, t] : copies) std::memcpy(t.raw(), pinned_[slot], t.nbytes());
  return outputs;
}

namespace {

// LayerTime::bytes: the layer's input and output buffers at the plan's shapes, weights not counted.
double activation_bytes(const ShapePlan& plan, const PlannedLayer& layer) {
  double bytes = 0;
  for (const std::vector<int>* ids : {&layer.inputs, &layer.outputs})
    for (int id : *ids)
      if (id >= 0 && plan.buffers()[static_cast<size_t>(id)].kind != BufferKind::kWeight)
        bytes += static_cast<double>(plan.buffers()[static_cast<size_t>(id)].spec.bytes());
  return bytes;
}

}  // namespace

std::vector<LayerTime> CudaContext::profile(cudaStream_t stream) {
  Bound& b = bound();
  if (cudnn_) KILN_CUDNN_CHECK(cudnnSetStream(cudnn_, stream));
  ActivationTurn turn(shared_.get(), stream);
  const std::vector<PlannedLayer>& layers = b.plan->layers();
  const size_t n = layers.size();
  std::vector<cudaEvent_t> events(n + 1);
  for (auto& e : events) KILN_CUDA_CHECK(cudaEventCreate(&e));
  std::vector<LayerTime> times;
  try {
    KILN_CUDA_CHECK(cudaEventRecord(events[0], stream));
    for (size_t i = 0; i < n; ++i) {
      layers[i].layer->enqueue(b.io[i], stream);
      KILN_CUDA_CHECK(cudaEventRecord(events[i + 1], stream));
    }
    turn.finish();
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < n; ++i) {
      LayerTime t;
      t.name = layers[i].name;
      t.op = layers[i].op;
      t.tactic = layers[i].layer->tactic();
      t.bytes = activation_bytes(*b.plan, layers[i]);
      KILN_CUDA_CHECK(cudaEventElapsedTime(&t.ms, events[i], events[i + 1]));
      times.push_back(t);
    }
  } catch (...) {
    for (auto& e : events) cudaEventDestroy(e);
    throw;
  }
  for (auto& e : events) cudaEventDestroy(e);
  return times;
}

std::vector<LayerTime> CudaContext::profile_in_graph(cudaStream_t stream, int launches) {
  Bound& b = bound();
  if (cudnn_) KILN_CUDNN_CHECK(cudnnSetStream(cudnn_, stream));
  const std::vector<PlannedLayer>& layers = b.plan->layers();
  std::vector<LayerTime> times, by_events;
  if (shared_) {
    // Timing replays each layer many times: the shared memory is taken for the whole of it
    // (profile() would wait on this context's own turn).
    throw Error(ErrorKind::kInvalidArgument, "per-layer timing in CUDA graphs needs a context with activation memory of its own")
        .hint("create the context without share_activation_memory");
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerTime t;
    t.name = layers[i].name;
    t.op = layers[i].op;
    t.tactic = layers[i].layer->tactic();
    t.bytes = activation_bytes(*b.plan, layers[i]);
    layers[i].layer->enqueue(b.io[i], stream);  // warm-up, outside the capture
    t.ms = graph_replay_ms(stream, [&](cudaStream_t s) { layers[i].layer->enqueue(b.io[i], s); }, launches);
    if (t.ms < 0) {  // a layer that cannot be captured: its time between events
      if (by_events.empty()) by_events = profile(stream);
      t.ms = by_events[i].ms;
    }
    times.push_back(t);
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return times;
}

}  // namespace kiln::cuda
