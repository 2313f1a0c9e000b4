// The execution context: binds the plan of its current input shapes to this context's memory
// and handles, and runs it on a stream, as a CUDA graph (one per shape) after the first run.
#include <cublasLt.h>
#include <cuda.h>
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
    caller_address_.push_back(nullptr);
    caller_bytes_.push_back(0);
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
    for (Captured& g : b.graphs) cudaGraphExecDestroy(g.exec);
  if (side_stream_) cudaStreamDestroy(side_stream_);
  if (last_run_) cudaEventDestroy(last_run_);
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
  drop_bound();
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
  drop_bound();
  KILN_CUDA_CHECK(cudaFree(io_buffers_[slot]));
  KILN_CUDA_CHECK(cudaFreeHost(pinned_[slot]));
  io_buffers_[slot] = pinned_[slot] = nullptr;
  io_capacity_[slot] = 0;
  KILN_CUDA_CHECK(cudaMalloc(&io_buffers_[slot], bytes));
  KILN_CUDA_CHECK(cudaMallocHost(&pinned_[slot], bytes));
  io_capacity_[slot] = bytes;
}

void CudaContext::drop_bound() {
  for (auto& [key, b] : bound_)
    for (Captured& g : b.graphs) KILN_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
  bound_.clear();
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
    case BufferKind::kIo: return io_address(static_cast<size_t>(b.io));
  }
  return nullptr;
}

void* CudaContext::io_address(size_t slot) const {
  return caller_address_.at(slot) && !own_io_ ? caller_address_[slot] : io_buffers_.at(slot);
}

std::vector<void*> CudaContext::io_addresses() const {
  std::vector<void*> addresses(io_buffers_.size());
  for (size_t i = 0; i < addresses.size(); ++i) addresses[i] = io_address(i);
  return addresses;
}

size_t CudaContext::tensor_slot(const std::string& name) const {
  const std::vector<IoSlot>& io = engine_.io();
  for (bool is_input : {true, false})
    for (size_t i = 0; i < io.size(); ++i)
      if (io[i].name == name && io[i].is_input == is_input) {
        if (is_input && engine_.is_value_input(name))
          throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' is planned by value: the engine reads no memory for it")
              .hint("give its values with set_input_values()");
        return i;
      }
  throw Error(ErrorKind::kInvalidArgument, "the engine has no input or output named '" + name + "'");
}

namespace {

// The driver's view of an allocation: where the one holding `address` starts and how long it
// is. False where the driver call is missing (the check is then left out).
bool allocation_range(void* address, uintptr_t& start, size_t& size) {
  using GetAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  static const GetAttribute get = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &p, 12000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      return reinterpret_cast<GetAttribute>(p);
    (void)cudaGetLastError();
    return static_cast<GetAttribute>(nullptr);
  }();
  if (!get) return false;
  CUdeviceptr base = 0;
  size_t bytes = 0;
  const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(address);
  if (get(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at) != CUDA_SUCCESS ||
      get(&bytes, CU_POINTER_ATTRIBUTE_RANGE_SIZE, at) != CUDA_SUCCESS)
    return false;
  start = static_cast<uintptr_t>(base);
  size = bytes;
  return true;
}

// The runtime's view of `address`: type cudaMemoryTypeUnregistered where it knows nothing of it.
cudaPointerAttributes pointer_attributes(const void* address) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, address) != cudaSuccess) {
    (void)cudaGetLastError();
    attributes.type = cudaMemoryTypeUnregistered;
  }
  return attributes;
}

// Host memory the GPU reads directly (cudaHostAlloc's, or registered: PinnedHostMemory) at both
// ends: a tensor that runs past the end of a pinned range goes through the staging buffer.
bool is_page_locked(const Tensor& t) {
  const auto* bytes = static_cast<const unsigned char*>(t.raw());
  return pointer_attributes(bytes).type == cudaMemoryTypeHost &&
         pointer_attributes(bytes + t.nbytes() - 1).type == cudaMemoryTypeHost;
}

}  // namespace

void CudaContext::set_tensor_address(const std::string& name, void* address, size_t bytes) {
  const size_t slot = tensor_slot(name);
  const std::string what = std::string(engine_.io()[slot].is_input ? "input" : "output") + " '" + name + "'";
  if (!address) {
    caller_address_[slot] = nullptr;
    caller_bytes_[slot] = 0;
    return;
  }
  // kiln's kernels and the libraries' load 16-byte vectors and tiles; cudaMalloc aligns to 256.
  constexpr uintptr_t kAlignment = 256;
  if (reinterpret_cast<uintptr_t>(address) % kAlignment != 0)
    throw Error(ErrorKind::kInvalidArgument, "memory for " + what + " at " + std::to_string(reinterpret_cast<uintptr_t>(address)) +
                                                 " is not aligned to " + std::to_string(kAlignment) + " bytes")
        .hint("bind memory as cudaMalloc returns it (a tensor's own storage, not a view at an offset)");
  const cudaPointerAttributes attributes = pointer_attributes(address);
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    throw Error(ErrorKind::kInvalidArgument, "memory for " + what + " is not device memory (" +
                                                 (attributes.type == cudaMemoryTypeHost ? "pinned host memory" : "not CUDA memory") + ")")
        .hint("bind memory of GPU " + std::to_string(device) + "; host data goes through run()");
  if (attributes.device != device)
    throw Error(ErrorKind::kInvalidArgument, "memory for " + what + " is on GPU " + std::to_string(attributes.device) +
                                                 ", the engine runs on GPU " + std::to_string(device));
  uintptr_t start = 0;
  size_t size = 0;
  const uintptr_t at = reinterpret_cast<uintptr_t>(address);
  if (allocation_range(address, start, size) && (bytes > size || at - start > size - bytes))
    throw Error(ErrorKind::kInvalidArgument, "memory for " + what + " is said to be " + std::to_string(bytes) +
                                                 " bytes, past the end of its allocation (" + std::to_string(start + size - at) +
                                                 " bytes from the address)");
  caller_address_[slot] = address;
  caller_bytes_[slot] = bytes;
}

void* CudaContext::tensor_address(const std::string& name) const { return io_address(tensor_slot(name)); }

void CudaContext::check_bound_bytes(const ShapePlan& plan) const {
  // Every run asks: with nothing bound (servers, kiln bench) it looks no name up.
  if (own_io_ || std::all_of(caller_address_.begin(), caller_address_.end(), [](void* p) { return p == nullptr; })) return;
  for (const auto* list : {&plan.inputs(), &plan.outputs()})
    for (const EngineIO& x : *list) {
      const size_t slot = static_cast<size_t>(engine_.io_index(x.name, list == &plan.inputs()));
      const size_t need = plan.buffers()[static_cast<size_t>(x.buffer)].spec.bytes();
      if (caller_address_[slot] && caller_bytes_[slot] < need)
        throw Error(ErrorKind::kInvalidArgument, std::string(list == &plan.inputs() ? "input" : "output") + " '" + x.name +
                                                     "' is bound to " + std::to_string(caller_bytes_[slot]) + " bytes; at shape " +
                                                     shape_to_string(x.shape) + " " + to_string(x.dtype) + " it takes " +
                                                     std::to_string(need))
            .hint("bind memory for the current shapes (set_tensor_address) or unbind it");
    }
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
  b.io_uses.clear();
  b.addresses = io_addresses();
  // The slot whose memory a buffer is (views of it too: a view starts where its root does).
  auto slot_of = [&](int id) -> int {
    while (plan.buffers()[static_cast<size_t>(id)].kind == BufferKind::kView) id = plan.buffers()[static_cast<size_t>(id)].view_of;
    const Buffer& root = plan.buffers()[static_cast<size_t>(id)];
    return root.kind == BufferKind::kIo ? root.io : -1;
  };
  for (size_t i = 0; i < plan.layers().size(); ++i) {
    const PlannedLayer& l = plan.layers()[i];
    LayerIO io;
    for (int id : l.inputs) io.inputs.push_back(id >= 0 ? address(plan, id) : nullptr);
    for (int id : l.outputs) io.outputs.push_back(id >= 0 ? address(plan, id) : nullptr);
    for (bool output : {false, true}) {
      const std::vector<int>& ids = output ? l.outputs : l.inputs;
      for (size_t j = 0; j < ids.size(); ++j)
        if (ids[j] >= 0 && slot_of(ids[j]) >= 0) b.io_uses.push_back({i, j, static_cast<size_t>(slot_of(ids[j])), output});
    }
    io.workspace = l.layer->workspace_bytes() ? workspace_ : nullptr;
    io.cudnn = cudnn_;
    io.cublaslt = cublaslt_;
    b.io.push_back(std::move(io));
  }
}

void CudaContext::point_at(Bound& b, const std::vector<void*>& addresses) {
  if (b.addresses == addresses) return;
  for (const IoUse& use : b.io_uses)
    if (use.output)
      b.io[use.layer].outputs[use.index] = addresses[use.slot];
    else
      b.io[use.layer].inputs[use.index] = addresses[use.slot];
  b.addresses = addresses;
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
      for (Captured& g : oldest->second.graphs) KILN_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
      bound_.erase(oldest);
    }
    Bound& b = bound_[key];
    b.plan = std::move(plan);
    bind(b);
    it = bound_.find(key);
  } else {
    point_at(it->second, io_addresses());  // caller memory bound or unbound since: the layers follow
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
    KILN_CUDA_CHECK(cudaEventRecord(last_run_, stream));
    return;
  }
  if (!last_run_) KILN_CUDA_CHECK(cudaEventCreateWithFlags(&last_run_, cudaEventDisableTiming));
  Bound& b = bound();
  check_bound_bytes(*b.plan);
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
  KILN_CUDA_CHECK(cudaEventRecord(last_run_, stream));
}

void CudaContext::wait_for_last_run(cudaStream_t stream) {
  if (last_run_) KILN_CUDA_CHECK(cudaStreamWaitEvent(stream, last_run_, 0));
}

bool CudaContext::seen_recently(const std::vector<void*>& addresses) {
  if (std::find(recent_addresses_.begin(), recent_addresses_.end(), addresses) != recent_addresses_.end()) return true;
  if (recent_addresses_.size() >= kRecentAddressSets) recent_addresses_.erase(recent_addresses_.begin());
  recent_addresses_.push_back(addresses);
  return false;
}

void CudaContext::enqueue_graph(Bound& b, cudaStream_t stream) {
  const std::vector<void*> wanted = b.addresses;  // bound() pointed the layers at them
  const bool captured = std::any_of(b.graphs.begin(), b.graphs.end(), [&](const Captured& g) {
    return g.stream == stream && g.addresses == wanted;
  });
  ++runs_;
  if (captured || wanted == io_buffers_ || (seen_recently(wanted) && has_room_for_graph(b))) {
    launch_graph(b, stream);
    return;
  }
  // Caller memory met for the first time lately: capturing the plan again costs about as much
  // as launching it layer by layer, so unless the addresses come back (buffers used in turn, an
  // input that stays put) and a graph slot is free or stale, the run copies through the
  // context's buffers around their graph.
  const ShapePlan& plan = *b.plan;
  for (const EngineIO& x : plan.inputs()) {
    const size_t slot = static_cast<size_t>(engine_.io_index(x.name, true));
    if (wanted[slot] != io_buffers_[slot])
      KILN_CUDA_CHECK(cudaMemcpyAsync(io_buffers_[slot], wanted[slot], plan.buffers()[static_cast<size_t>(x.buffer)].spec.bytes(),
                                      cudaMemcpyDeviceToDevice, stream));
  }
  point_at(b, io_buffers_);
  launch_graph(b, stream);
  point_at(b, wanted);
  for (const EngineIO& x : plan.outputs()) {
    const size_t slot = static_cast<size_t>(engine_.io_index(x.name, false));
    if (wanted[slot] != io_buffers_[slot])
      KILN_CUDA_CHECK(cudaMemcpyAsync(wanted[slot], io_buffers_[slot], plan.buffers()[static_cast<size_t>(x.buffer)].spec.bytes(),
                                      cudaMemcpyDeviceToDevice, stream));
  }
}

bool CudaContext::has_room_for_graph(const Bound& b) const {
  if (b.graphs.size() < kGraphsPerShape) return true;
  return std::any_of(b.graphs.begin(), b.graphs.end(),
                     [&](const Captured& g) { return runs_ - g.last_run > kRecentAddressSets; });
}

void CudaContext::launch_graph(Bound& b, cudaStream_t stream) {
  for (Captured& g : b.graphs)
    if (g.stream == stream && g.addresses == b.addresses) {
      g.last_run = runs_;
      KILN_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
      return;
    }
  // The first run of a plan on a stream runs eagerly (libraries load kernels and pick plans
  // lazily, which a capture must not see), then the same work is captured for the next runs.
  // Once warm, new addresses (caller memory bound since) are captured and the graph launched.
  const bool warm = std::any_of(b.graphs.begin(), b.graphs.end(), [&](const Captured& g) { return g.stream == stream; });
  if (!warm) enqueue_layers(b, stream);
  cudaGraph_t graph = capture(b, stream);
  Captured* slot = nullptr;
  if (b.graphs.size() < kGraphsPerShape) {
    slot = &b.graphs.emplace_back();
  } else {
    slot = &*std::min_element(b.graphs.begin(), b.graphs.end(),
                              [](const Captured& x, const Captured& y) { return x.last_run < y.last_run; });
    // The least recently used graph takes the new addresses: an update in place is cheaper than
    // instantiating, and takes effect at the next launch (a launch in flight runs as it was).
    cudaGraphExecUpdateResultInfo result{};
    if (cudaGraphExecUpdate(slot->exec, graph, &result) != cudaSuccess) {
      (void)cudaGetLastError();
      const cudaError_t destroyed = cudaGraphExecDestroy(slot->exec);
      slot->exec = nullptr;
      if (destroyed != cudaSuccess) {
        cudaGraphDestroy(graph);
        b.graphs.erase(b.graphs.begin() + (slot - b.graphs.data()));
        KILN_CUDA_CHECK(destroyed);
      }
    }
  }
  cudaError_t status = cudaSuccess;
  if (!slot->exec) status = cudaGraphInstantiate(&slot->exec, graph, 0);
  cudaGraphDestroy(graph);
  if (status != cudaSuccess) {
    b.graphs.erase(b.graphs.begin() + (slot - b.graphs.data()));
    KILN_CUDA_CHECK(status);
  }
  slot->addresses = b.addresses;
  slot->stream = stream;
  slot->last_run = runs_;
  if (warm) KILN_CUDA_CHECK(cudaGraphLaunch(slot->exec, stream));
}

cudaGraph_t CudaContext::capture(const Bound& b, cudaStream_t stream) {
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
  try {
    drop_programmatic_edges(graph, cut_after);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  return graph;
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
  // Host tensors go through the context's own buffers: caller memory bound for enqueue() is
  // neither read nor overwritten.
  struct OwnBuffers {
    bool& own;
    explicit OwnBuffers(bool& flag) : own(flag) { own = true; }
    ~OwnBuffers() { own = false; }
  } own_buffers(own_io_);
  for (size_t i = 0; i < engine_.io().size(); ++i) {
    const IoSlot& slot = engine_.io()[i];
    if (!slot.is_input || engine_.is_value_input(slot.name)) continue;
    // The shapes lie within a profile, so the pinned staging (sized for the largest) holds them.
    // A piece in page-locked memory (PinnedHostMemory) goes to the device directly; the others
    // are copied into the staging at their offsets, each run of them sent by one copy.
    auto* staging = static_cast<unsigned char*>(pinned_[i]);
    auto* device = static_cast<unsigned char*>(io_buffers_[i]);
    size_t offset = 0;
    size_t staged_from = 0;  // the start of the staged run not yet sent
    auto send_staged = [&] {
      if (offset > staged_from)
        KILN_CUDA_CHECK(cudaMemcpyAsync(device + staged_from, staging + staged_from, offset - staged_from,
                                        cudaMemcpyHostToDevice, stream));
    };
    for (const Tensor& t : pieces.at(slot.name)) {
      if (!t.nbytes()) continue;
      if (is_page_locked(t)) {
        send_staged();
        KILN_CUDA_CHECK(cudaMemcpyAsync(device + offset, t.raw(), t.nbytes(), cudaMemcpyHostToDevice, stream));
        offset += t.nbytes();
        staged_from = offset;
      } else {
        std::memcpy(staging + offset, t.raw(), t.nbytes());
        offset += t.nbytes();
      }
    }
    send_staged();
    const size_t bytes = shape_bytes(shapes.at(slot.name), slot.dtype);
    if (bytes > offset) KILN_CUDA_CHECK(cudaMemsetAsync(device + offset, 0, bytes - offset, stream));
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
  check_bound_bytes(*b.plan);
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
  check_bound_bytes(*b.plan);
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
