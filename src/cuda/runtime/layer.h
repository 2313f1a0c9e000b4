// The CUDA backend's layer interface. One file per op family in src/cuda/ registers a
// LayerEntry with KILN_REGISTER_CUDA_LAYERS; the builder (builder.h) lowers every node of an
// optimized graph, whose shapes are all known, to one Layer.
//
// Lowering one node, in three steps:
//   1. check(request):   "" if the family can run this node at the request's precision, else
//                        why not (the build error quotes it).
//   2. formats(request): the storage format (dtype, layout) the layer reads for each input
//                        and writes for each output. The builder inserts reformat layers
//                        (layout change and/or dtype cast) in front of inputs stored otherwise.
//   3. create(request, formats, services): the Layer. It may upload weights and time
//                        candidate implementations (tactics) through BuildServices.
//
// Conventions:
// - Logical shapes are ONNX's. A rank-4 tensor stored kNHWC holds logical [N,C,H,W] in
//   memory order [N,H,W,C]; every other tensor is stored kLinear (row-major, ONNX order).
// - Precision kFp16 means: store float32 activations as float16 where the kernel supports
//   it (accumulate in float32). A layer that keeps float32 under kFp16 is reported by the
//   build as running in fp32. Non-float tensors keep their dtype.
// - Constant inputs (weights, shape arguments) arrive as host tensors in request.constants.
//   A layer that wants one on the device as it is asks for it with a defined format in
//   LayerFormats::inputs (the builder converts and uploads it, and io.inputs[i] points at it);
//   with Format{} it is not uploaded (io.inputs[i] is nullptr) and the layer reads the host
//   tensor at create time (e.g. Reshape's shape, Conv weights it repacks and uploads itself).
// - enqueue() runs inside CUDA graph capture: it must not allocate, synchronize, copy to or
//   from pageable host memory, or read anything on the host that changes between runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/registry.h"
#include "kiln/types.h"

struct cudnnContext;
struct cublasLtContext;

namespace kiln::cuda {

enum class Layout : uint8_t { kLinear, kNHWC };
const char* to_string(Layout layout);

struct Format {
  DType dtype = DType::kUndefined;
  Layout layout = Layout::kLinear;

  bool defined() const { return dtype != DType::kUndefined; }
  bool operator==(const Format& o) const { return dtype == o.dtype && layout == o.layout; }
  bool operator!=(const Format& o) const { return !(*this == o); }
  std::string str() const;  // "float16/nhwc"
};

// A tensor on the device as the builder knows it: logical shape and storage format.
struct TensorSpec {
  std::vector<int64_t> shape;  // logical (ONNX order), all dims known
  Format format;

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t elements() const;
  size_t bytes() const;
  // Dims in memory order: shape for kLinear, [N,H,W,C] for kNHWC.
  std::vector<int64_t> physical_shape() const;
  // Element strides of the logical dims (ONNX order), in elements; works for both layouts.
  std::vector<int64_t> logical_strides() const;
};

enum class Precision : uint8_t { kFp32, kTf32, kFp16 };
const char* to_string(Precision precision);

// What the builder knows of a node when it lowers it.
struct LayerRequest {
  const ir::Node& node;
  Precision precision;
  // Per node input (nullptr for an omitted optional input). For a runtime input: how it is
  // stored now (in formats()) or how the layer will receive it (in create()). For a constant:
  // its logical shape and dtype, kLinear.
  std::vector<const TensorSpec*> inputs;
  std::vector<const Tensor*> constants;        // host tensor of each constant input, else nullptr
  std::vector<DType> input_dtypes;             // logical ONNX dtypes (kUndefined if omitted)
  std::vector<std::vector<int64_t>> output_shapes;  // logical, inferred
  std::vector<DType> output_dtypes;            // logical ONNX dtypes

  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
  bool is_constant(size_t i) const { return i < constants.size() && constants[i] != nullptr; }
  // Whether input i is given: present and named (an optional input left out has an empty name;
  // a negative i, no such input).
  bool given(int64_t i) const {
    const auto k = static_cast<size_t>(i);
    return i >= 0 && has_input(k) && k < node.inputs.size() && !node.inputs[k].empty();
  }
  // Input i's shape where it is given.
  std::optional<std::vector<int64_t>> shape_if_given(size_t i) const {
    if (!given(static_cast<int64_t>(i))) return std::nullopt;
    return input_shape(i);
  }
  const std::vector<int64_t>& input_shape(size_t i) const { return inputs.at(i)->shape; }
  // The storage dtype for a logical float32 tensor at this precision (float16 under kFp16).
  DType float_storage() const { return precision == Precision::kFp16 ? DType::kFloat16 : DType::kFloat32; }
  // The storage dtype of a tensor of this logical dtype at this precision (float32 ->
  // float_storage(), anything else unchanged).
  DType storage_of(DType logical) const { return logical == DType::kFloat32 ? float_storage() : logical; }
};

struct LayerFormats {
  std::vector<Format> inputs;   // one per node input; Format{} for omitted inputs and for
                                // constants the layer does not want uploaded
  std::vector<Format> outputs;  // one per node output
};

// Float32, linear, for every given input and every output the node has: the formats of a layer
// that keeps float32 under fp16 and reads all its inputs on the device.
LayerFormats float32_linear_formats(const LayerRequest& r);

// Device pointers for one execution of a layer, and the library handles of the execution
// context that runs it (each context has its own, bound to its stream).
struct LayerIO {
  std::vector<const void*> inputs;  // nullptr for omitted inputs and non-uploaded constants
  std::vector<void*> outputs;
  void* workspace = nullptr;        // workspace_bytes() bytes (nullptr when 0)
  cudnnContext* cudnn = nullptr;
  cublasLtContext* cublaslt = nullptr;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual void enqueue(const LayerIO& io, cudaStream_t stream) const = 0;
  virtual size_t workspace_bytes() const { return 0; }
  // Whether enqueue() uses LayerIO::cudnn: a context makes its cuDNN handle (megabytes of device
  // memory) only when one of its layers does.
  virtual bool uses_cudnn() const { return false; }
  // The implementation chosen, for `kiln inspect` and profiles: "cudnn:algo=1", "kernel:softmax".
  virtual std::string tactic() const = 0;
  // A failure of the runs since the last call that enqueue() could not throw (a CPU fallback's
  // kernel failing in a host callback, an index a kernel found out of range and flagged to
  // pinned memory), taken and cleared; nullopt when none. CudaContext::run asks after it has
  // synchronized, and throws it.
  virtual std::optional<Error> take_failure() const { return std::nullopt; }
};

// Build-time services the builder offers to layer factories.
class BuildServices {
 public:
  virtual ~BuildServices() = default;
  // Copies `bytes` to device memory owned by the engine (weights); valid as long as the engine.
  virtual const void* upload(const void* host, size_t bytes) = 0;
  // For timing tactics: device buffers shaped like this node's inputs and outputs in the
  // chosen formats, filled with random values (inputs) -- real uploaded constants where the
  // layer asked for them.
  virtual const LayerIO& scratch_io() = 0;
  // Scratch device memory of at least `bytes` for timing (e.g. a candidate's workspace).
  virtual void* scratch(size_t bytes) = 0;
  // Median time in milliseconds of `run` on the build stream (after warm-up). Throws if
  // `run` throws; a candidate that fails should be skipped by its caller.
  virtual float time_ms(const std::function<void(cudaStream_t)>& run) = 0;
  // The timing cache: the tactic recorded for `key` on this GPU, if any, and recording one.
  virtual std::optional<std::string> cached_tactic(const std::string& key) = 0;
  virtual void record_tactic(const std::string& key, const std::string& tactic) = 0;
  // Code a layer generated and compiled (a cubin, as text) by a key naming its source: kept in
  // the timing cache and the engine file beside the tactics, so that loading an engine, and
  // rebuilding with the timing cache, compile nothing.
  virtual std::optional<std::string> cached_code(const std::string& key) = 0;
  virtual void record_code(const std::string& key, const std::string& code) = 0;
  // Starts compiling generated CUDA C++ for this GPU (runtime_compiler.h) on a worker thread and
  // returns at once: the future holds the cubin, or the compile's kiln::Error.
  virtual std::shared_future<std::string> compile(const std::string& source, const std::string& name) = 0;
  // Calls `finish` once every node is lowered, with scratch_io() and the tactic records
  // (cached_tactic, record_tactic) of the layer being created now. A layer whose candidates
  // include code still compiling times them then, so that its compile overlaps the lowering of
  // the layers after it instead of stalling the build. No layer runs before every `finish` has.
  virtual void finish_later(std::function<void(BuildServices&)> finish) = 0;
  virtual cudnnContext* cudnn() = 0;
  virtual cublasLtContext* cublaslt() = 0;
  virtual const cudaDeviceProp& device() = 0;
  virtual cudaStream_t stream() = 0;
  // How the build chooses and launches tactics (BuildOptions::tactics).
  virtual const TacticOptions& tactics() = 0;
  // A line of the build's log (nothing when the build is quiet).
  virtual void log(const std::string& line) = 0;
};

struct LayerEntry {
  std::string op;
  std::string domain;  // "" or "kiln"
  std::function<std::string(const LayerRequest&)> check;
  std::function<LayerFormats(const LayerRequest&)> formats;
  std::function<std::unique_ptr<Layer>(const LayerRequest&, const LayerFormats&, BuildServices&)> create;
  std::string dtypes;  // for docs/operators.md, e.g. "float32, float16"
};

using LayerRegistry = ir::Registry<LayerEntry>;

// Registers a family of layers: KILN_REGISTER_CUDA_LAYERS(matmul) { registry.add({...}); }
#define KILN_REGISTER_CUDA_LAYERS(family) KILN_REGISTRY_FAMILY(::kiln::cuda::LayerRegistry, kiln_register_cuda_, family)

// --- helpers shared by families -----------------------------------------------------------

// A layer from a lambda, for layers that keep only what the lambda captures.
using EnqueueFn = std::function<void(const LayerIO&, cudaStream_t)>;
std::unique_ptr<Layer> make_layer(std::string tactic, EnqueueFn fn, size_t workspace_bytes = 0);

// A layer from a lambda whose kernels may meet a value they cannot use (an index out of range):
// fn gets the device address of the layer's RunFlag (run_flag.h) to raise, and CudaContext::run
// throws kInvalidArgument `error` after a run that raised it.
using CheckedEnqueueFn = std::function<void(const LayerIO&, cudaStream_t, int* flag)>;
std::unique_ptr<Layer> make_checked_layer(std::string tactic, CheckedEnqueueFn fn, std::string error,
                                          size_t workspace_bytes = 0);

// The formats of an op that reads and writes every runtime tensor in one layout: float
// tensors at float_storage() (or float32 when `float16_ok` is false), others unchanged;
// constants not uploaded. Layout is kNHWC only if `nhwc_ok` and input 0 is stored kNHWC.
LayerFormats uniform_formats(const LayerRequest& r, bool float16_ok, bool nhwc_ok);

// Index arithmetic for kernels over strided / broadcast views, up to this rank.
constexpr int kMaxKernelRank = 8;
struct StridedShape {
  int rank = 0;
  int64_t dims[kMaxKernelRank] = {};     // output dims, in the order the kernel iterates
  int64_t strides[kMaxKernelRank] = {};  // element strides of one operand (0: broadcast)
};

// The launch grid for `n` elements processed `per_thread` at a time with `block` threads.
inline unsigned grid_for(int64_t n, int block = 256, int per_thread = 1) {
  int64_t blocks = (n + int64_t{block} * per_thread - 1) / (int64_t{block} * per_thread);
  if (blocks < 1) blocks = 1;
  if (blocks > (int64_t{1} << 31) - 1) blocks = (int64_t{1} << 31) - 1;
  return static_cast<unsigned>(blocks);
}

}  // namespace kiln::cuda
