// The CUDA engine: the builder lowers an optimized graph with concrete shapes to a plan of
// layers over planned buffers (builder.cc); an execution context runs the plan on a stream,
// as one CUDA graph after the first run (context.cc).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/layer.h"
#include "ir/graph.h"

namespace kiln::cuda {

struct BuildConfig {
  Precision precision = Precision::kFp32;
  bool allow_cpu_fallback = false;   // ops without a GPU layer run on the CPU engine's kernel
  std::string timing_cache_path;     // read if present, written after the build
  // Timing-cache entries to use before the file's (an engine file's tactics): no timing.
  std::map<std::string, std::string> timing_entries;
  size_t max_workspace_bytes = size_t{1} << 30;
  std::function<void(const std::string&)> log;  // progress lines; nullptr: quiet
};

// Where a buffer's memory comes from.
enum class BufferKind : uint8_t { kArena, kWeight, kView };

struct Buffer {
  std::string name;
  TensorSpec spec;
  BufferKind kind = BufferKind::kArena;
  size_t offset = 0;             // kArena: offset in the activation arena
  const void* weight = nullptr;  // kWeight: device pointer in the engine's weight memory
  int view_of = -1;              // kView: the buffer whose memory this one shares
  int first_use = -1, last_use = -1;  // layer indices (graph inputs/outputs: whole run)
};

struct PlannedLayer {
  std::string name;   // node name, or "reformat(<value>)"
  std::string op;     // "FusedConv", "Reformat", ...
  std::unique_ptr<Layer> layer;
  std::vector<int> inputs;   // buffer ids, -1 for omitted / not uploaded
  std::vector<int> outputs;
  bool fp32_under_fp16 = false;  // a float layer that kept float32 in an fp16 build
  bool cpu_fallback = false;
  double flops = 0;
};

struct EngineIO {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int buffer = -1;
};

// Device memory the engine owns for weights: a bump allocator over large blocks.
class WeightMemory {
 public:
  WeightMemory() = default;
  WeightMemory(const WeightMemory&) = delete;
  WeightMemory& operator=(const WeightMemory&) = delete;
  ~WeightMemory();
  const void* upload(const void* host, size_t bytes);
  size_t bytes() const { return used_; }

 private:
  std::vector<void*> blocks_;
  size_t block_left_ = 0;
  char* cursor_ = nullptr;
  size_t used_ = 0;
};

class CudaEngine {
 public:
  // Builds for the current CUDA device. The graph must be optimized and every shape known.
  // Throws kUnsupported naming every node without a GPU layer (unless CPU fallback is on).
  static std::unique_ptr<CudaEngine> build(const ir::Graph& graph, const BuildConfig& config);
  ~CudaEngine();

  const std::vector<EngineIO>& inputs() const { return inputs_; }
  const std::vector<EngineIO>& outputs() const { return outputs_; }
  const std::vector<PlannedLayer>& layers() const { return layers_; }
  const std::vector<Buffer>& buffers() const { return buffers_; }
  size_t arena_bytes() const { return arena_bytes_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  size_t weight_bytes() const { return weights_.bytes(); }
  Precision precision() const { return precision_; }
  const std::string& device_name() const { return device_name_; }
  // Tactic per node name (for inspection), and the timing-cache entries this build used
  // (for the engine file: rebuilding with them times nothing).
  std::map<std::string, std::string> tactics() const;
  const std::map<std::string, std::string>& timing_entries() const { return timing_entries_; }
  // Names of float layers that kept float32 in an fp16 build.
  std::vector<std::string> fp32_layers() const;

 private:
  friend class Builder;
  friend class CudaContext;
  CudaEngine() = default;

  std::vector<EngineIO> inputs_, outputs_;
  std::vector<Buffer> buffers_;
  std::vector<PlannedLayer> layers_;
  WeightMemory weights_;
  size_t arena_bytes_ = 0;
  size_t workspace_bytes_ = 0;
  Precision precision_ = Precision::kFp32;
  std::string device_name_;
  std::map<std::string, std::string> timing_entries_;
};

// Per-layer times of a profiled run.
struct LayerTime {
  std::string name, op, tactic;
  float ms = 0;
};

// One execution context: its own activation arena, workspace, stream-bound library handles
// and CUDA graph. A context must be used from one thread at a time; several contexts may
// share an engine.
class CudaContext {
 public:
  explicit CudaContext(const CudaEngine& engine, bool use_cuda_graph = true);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // Device buffers of the engine's inputs and outputs (logical dtype, row-major).
  void* input_buffer(const std::string& name) const;
  void* output_buffer(const std::string& name) const;

  // Runs the engine on `stream` reading input_buffer()s and writing output_buffer()s.
  // Asynchronous; the first call on a stream captures a CUDA graph, later calls replay it.
  void enqueue(cudaStream_t stream);

  // Copies host inputs in (through pinned staging), runs, copies outputs back, waits.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs, cudaStream_t stream);

  // Runs layer by layer with events between layers (no CUDA graph); synchronizes.
  std::vector<LayerTime> profile(cudaStream_t stream);

 private:
  void enqueue_layers(cudaStream_t stream);
  void* address(int buffer) const;

  const CudaEngine& engine_;
  bool use_cuda_graph_;
  void* arena_ = nullptr;
  void* workspace_ = nullptr;
  cudnnContext* cudnn_ = nullptr;
  cublasLtContext* cublaslt_ = nullptr;
  std::vector<LayerIO> io_;  // per layer, bound to this context's memory
  cudaGraphExec_t graph_ = nullptr;
  cudaStream_t graph_stream_ = nullptr;
  // For callers on a default stream, which cannot be captured: the graph runs on this stream,
  // ordered after and before the caller's work by the two events.
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  std::map<std::string, void*> pinned_;  // staging per input/output name
};

// Layers that the builder adds itself.
std::unique_ptr<Layer> make_reformat_layer(const TensorSpec& from, const TensorSpec& to);
// A layer that runs the CPU engine's kernel for `node`: device -> pinned host -> kernel (in a
// host callback) -> device. Captured in the CUDA graph like any layer; slow, for coverage.
std::unique_ptr<Layer> make_cpu_fallback_layer(const LayerRequest& request, const LayerFormats& formats);

// Host-side conversion of a constant to a storage format (float32 -> float16, NCHW -> NHWC).
Tensor convert_constant(const Tensor& t, const Format& format);

}  // namespace kiln::cuda
