// The execution context: binds the engine's layers to this context's memory and handles,
// and runs them on a stream, as a CUDA graph after the first run.
#include <cublasLt.h>
#include <cudnn.h>

#include <cstring>

#include "cuda/check.h"
#include "cuda/engine.h"

namespace kiln::cuda {

CudaContext::CudaContext(const CudaEngine& engine, bool use_cuda_graph)
    : engine_(engine), use_cuda_graph_(use_cuda_graph) {
  if (engine.arena_bytes_) KILN_CUDA_CHECK(cudaMalloc(&arena_, engine.arena_bytes_));
  if (engine.workspace_bytes_) KILN_CUDA_CHECK(cudaMalloc(&workspace_, engine.workspace_bytes_));
  KILN_CUDNN_CHECK(cudnnCreate(&cudnn_));
  KILN_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  for (const PlannedLayer& l : engine.layers_) {
    LayerIO io;
    for (int b : l.inputs) io.inputs.push_back(b >= 0 ? address(b) : nullptr);
    for (int b : l.outputs) io.outputs.push_back(b >= 0 ? address(b) : nullptr);
    io.workspace = l.layer->workspace_bytes() ? workspace_ : nullptr;
    io.cudnn = cudnn_;
    io.cublaslt = cublaslt_;
    io_.push_back(std::move(io));
  }
  auto pin = [&](const EngineIO& e) {
    void* p = nullptr;
    const size_t bytes = engine.buffers_[e.buffer].spec.bytes();
    KILN_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
    pinned_[e.name] = p;
  };
  for (const EngineIO& e : engine.inputs_) pin(e);
  for (const EngineIO& e : engine.outputs_) pin(e);
}

CudaContext::~CudaContext() {
  if (graph_) cudaGraphExecDestroy(graph_);
  if (side_stream_) cudaStreamDestroy(side_stream_);
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  for (auto& [name, p] : pinned_) cudaFreeHost(p);
  if (cudnn_) cudnnDestroy(cudnn_);
  if (cublaslt_) cublasLtDestroy(cublaslt_);
  if (arena_) cudaFree(arena_);
  if (workspace_) cudaFree(workspace_);
}

void* CudaContext::address(int buffer) const {
  const Buffer& b = engine_.buffers_[buffer];
  switch (b.kind) {
    case BufferKind::kArena: return static_cast<char*>(arena_) + b.offset;
    case BufferKind::kWeight: return const_cast<void*>(b.weight);
    case BufferKind::kView: return address(b.view_of);
  }
  return nullptr;
}

void* CudaContext::input_buffer(const std::string& name) const {
  for (const EngineIO& e : engine_.inputs_)
    if (e.name == name) return address(e.buffer);
  throw Error(ErrorKind::kInvalidArgument, "the engine has no input named '" + name + "'");
}

void* CudaContext::output_buffer(const std::string& name) const {
  for (const EngineIO& e : engine_.outputs_)
    if (e.name == name) return address(e.buffer);
  throw Error(ErrorKind::kInvalidArgument, "the engine has no output named '" + name + "'");
}

void CudaContext::enqueue_layers(cudaStream_t stream) {
  for (size_t i = 0; i < engine_.layers_.size(); ++i) {
    try {
      engine_.layers_[i].layer->enqueue(io_[i], stream);
    } catch (Error& e) {
      if (e.node_name().empty()) e.node(engine_.layers_[i].name, engine_.layers_[i].op);
      throw;
    }
  }
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
  KILN_CUDNN_CHECK(cudnnSetStream(cudnn_, stream));
  if (!use_cuda_graph_) {
    enqueue_layers(stream);
    return;
  }
  if (graph_ && graph_stream_ == stream) {
    KILN_CUDA_CHECK(cudaGraphLaunch(graph_, stream));
    return;
  }
  // The first run on a stream runs eagerly (libraries load kernels and pick plans lazily, which
  // a capture must not see), then the same work is captured for the next runs.
  enqueue_layers(stream);
  if (graph_) {
    KILN_CUDA_CHECK(cudaGraphExecDestroy(graph_));
    graph_ = nullptr;
  }
  cudaGraph_t graph = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue_layers(stream);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaError_t status = cudaGraphInstantiate(&graph_, graph, 0);
  cudaGraphDestroy(graph);
  KILN_CUDA_CHECK(status);
  graph_stream_ = stream;
}

std::map<std::string, Tensor> CudaContext::run(const std::map<std::string, Tensor>& inputs, cudaStream_t stream) {
  for (const EngineIO& e : engine_.inputs_) {
    auto it = inputs.find(e.name);
    if (it == inputs.end()) throw Error(ErrorKind::kInvalidArgument, "input '" + e.name + "' is missing");
    const Tensor& t = it->second;
    if (t.dtype() != e.dtype)
      throw Error(ErrorKind::kInvalidArgument, "input '" + e.name + "' has dtype " + to_string(t.dtype()) +
                                                   ", the engine expects " + to_string(e.dtype));
    if (t.shape() != e.shape)
      throw Error(ErrorKind::kInvalidArgument, "input '" + e.name + "' has shape " + shape_to_string(t.shape()) +
                                                   ", the engine was built for " + shape_to_string(e.shape))
          .hint("build the engine for this shape (--shapes " + e.name + ":" + shape_to_string(t.shape()) + ")");
    std::memcpy(pinned_.at(e.name), t.raw(), t.nbytes());
    KILN_CUDA_CHECK(cudaMemcpyAsync(input_buffer(e.name), pinned_.at(e.name), t.nbytes(), cudaMemcpyHostToDevice, stream));
  }
  for (const auto& [name, t] : inputs) {
    bool known = false;
    for (const EngineIO& e : engine_.inputs_) known |= e.name == name;
    if (!known) throw Error(ErrorKind::kInvalidArgument, "the engine has no input named '" + name + "'");
  }
  enqueue(stream);
  std::map<std::string, Tensor> outputs;
  for (const EngineIO& e : engine_.outputs_) {
    Tensor t = Tensor::uninitialized(e.dtype, e.shape);
    KILN_CUDA_CHECK(cudaMemcpyAsync(pinned_.at(e.name), output_buffer(e.name), t.nbytes(), cudaMemcpyDeviceToHost, stream));
    outputs[e.name] = t;
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (auto& [name, t] : outputs) std::memcpy(t.raw(), pinned_.at(name), t.nbytes());
  return outputs;
}

std::vector<LayerTime> CudaContext::profile(cudaStream_t stream) {
  KILN_CUDNN_CHECK(cudnnSetStream(cudnn_, stream));
  const size_t n = engine_.layers_.size();
  std::vector<cudaEvent_t> events(n + 1);
  for (auto& e : events) KILN_CUDA_CHECK(cudaEventCreate(&e));
  std::vector<LayerTime> times;
  try {
    KILN_CUDA_CHECK(cudaEventRecord(events[0], stream));
    for (size_t i = 0; i < n; ++i) {
      engine_.layers_[i].layer->enqueue(io_[i], stream);
      KILN_CUDA_CHECK(cudaEventRecord(events[i + 1], stream));
    }
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < n; ++i) {
      LayerTime t;
      t.name = engine_.layers_[i].name;
      t.op = engine_.layers_[i].op;
      t.tactic = engine_.layers_[i].layer->tactic();
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

}  // namespace kiln::cuda
