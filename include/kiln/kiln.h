// kiln: compile ONNX models into inference engines and run them.
//
// This is the header a user reads first. A typical program:
//
//   kiln::Engine engine = kiln::Engine::from_onnx("resnet50.onnx");
//   kiln::Tensor image(kiln::DType::kFloat32, {1, 3, 224, 224});
//   auto outputs = engine.run({{"input", image}});
//
// On a GPU (built with the CUDA backend):
//
//   kiln::BuildOptions options;
//   options.device = kiln::Device::kCuda;
//   options.precision = kiln::Precision::kFp16;
//   options.input_shapes["input"] = {8, 3, 224, 224};   // fixed shapes, or a range:
//   // options.profiles = {{{"input", {{1, 3, 224, 224}, {32, 3, 224, 224}, {64, 3, 224, 224}}}}};
//   kiln::Engine engine = kiln::Engine::from_onnx("resnet50.onnx", options);
//   engine.save("resnet50.engine");                      // kiln::Engine::load() reads it back
//   kiln::Context context = engine.create_context();     // memory + CUDA graphs of one runner
//   auto outputs = context.run({{"input", batch}});      // any shape within the profile
//
// Every function throws kiln::Error (see error.h) on failure, never anything else.
// Thread safety: an Engine may be shared between threads: its const methods (inputs(), info(),
// create_context(), save(), ...) may be called from several threads at once. Engine::run()
// serializes its callers (CPU kernels keep scratch buffers; a GPU engine runs on one built-in
// context). A Context belongs to one thread at a time; several contexts of one engine may run
// at once on different threads, each on its own stream, sharing the engine's weights (unless a
// layer fell back to the CPU: see Engine::info()). A context's result does not depend on what
// else runs on the GPU: other contexts, other engines, other libraries' streams. A GPU engine
// plans a new input shape on first use (Context::set_input_shape, run) under a lock of the
// engine's: other contexts going
// to new shapes wait for it, those at shapes already planned do not.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/tensor.h"
#include "kiln/types.h"

namespace kiln {

class Context;

class Engine {
 public:
  // Imports an ONNX model, optimizes it and builds an engine for options.device.
  static Engine from_onnx(const std::string& onnx_path, const BuildOptions& options = {});
  // Reads an engine file written by save(). The file is checked (format, kiln version,
  // checksum, GPU and library versions; for CPU engines, that this CPU has AVX2/FMA/F16C); a
  // mismatch is a kiln::Error that says which. max_memory: as BuildOptions::max_memory.
  static Engine load(const std::string& engine_path, size_t max_memory = 0);
  // The same, on the GPU options.gpu names (an engine file is not tied to a device index: one
  // file loads once per GPU of the same architecture).
  static Engine load(const std::string& engine_path, const LoadOptions& options);
  // Writes the engine file (GPU and CPU engines; docs/engine-format.md): the optimized graph
  // and its weights (INT8 weights as int8), the profiles and the chosen tactics, so loading
  // runs no graph passes and times nothing.
  void save(const std::string& engine_path) const;

  // Inputs and outputs; -1 marks a dimension that varies (CPU engines: the model's dynamic
  // dimensions; GPU engines: those the profiles let vary).
  const std::vector<TensorDesc>& inputs() const;
  const std::vector<TensorDesc>& outputs() const;
  // GPU engines: the optimization profiles, each naming every input (fixed shapes: one
  // profile with min = opt = max). CPU engines: none (they run any shape).
  const std::vector<OptimizationProfile>& profiles() const;
  // "cpu" or "cuda".
  std::string backend() const;
  // GPU engines: the device index they run on (BuildOptions::gpu, LoadOptions::gpu); CPU: -1.
  int gpu() const;
  // Number of layers after optimization (GPU: including reformat layers).
  size_t layer_count() const;
  EngineInfo info() const;
  // A new execution context (GPU engines): its own activation memory and CUDA graph
  // (use_cuda_graph false: every run launches layer by layer).
  Context create_context(bool use_cuda_graph = true) const;
  // The same, as `options` say (ContextOptions in types.h: activation memory shared between
  // contexts that take turns).
  Context create_context(const ContextOptions& options) const;

  // Runs the model. Every input must be given, with the declared dtype and a shape that
  // matches the declared one (CPU: dynamic dimensions may take any value, consistently; GPU:
  // the shapes must lie within a profile).
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const;
  // CPU engines: run() once, timing every layer by the wall clock (its shape checks, output
  // allocation and kernel), in the engine's layer order. GPU engines time their layers through
  // a context (Context::profile) and throw kUnsupported here.
  std::vector<LayerTiming> profile(const std::map<std::string, Tensor>& inputs) const;

  struct Impl;

 private:
  friend class Context;
  explicit Engine(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// The inputs of an ONNX model as it declares them (-1 for a dynamic dimension, dim_names
// holding its name), read without building an engine. Throws kiln::Error naming the file.
std::vector<TensorDesc> model_inputs(const std::string& onnx_path);

// Writes the model after kiln's folding passes as ONNX (what `kiln export --simplify` does):
// constants and shape arithmetic folded, BatchNorm folded into the layer before it, copies and
// dead nodes removed; no fusion into kiln's own ops, so any ONNX reader can run the result.
// Inputs keep their dynamic dimensions. Throws kiln::Error naming the file at fault.
struct SimplifyResult {
  size_t nodes_before = 0;  // as imported
  size_t nodes_after = 0;
};
SimplifyResult simplify_onnx(const std::string& onnx_path, const std::string& output_path);

// The threads the CPU engine's parallel loops use, for the whole process, the calling thread
// included (0: the CPUs this process may run on, the default). Engines running at once on
// several threads share them: one runs its loops on them, the others on their own thread.
void set_cpu_threads(int threads);
int cpu_threads();


// One runner of a GPU engine: activation memory, library handles and CUDA graphs of its own.
// Inputs and outputs live in device buffers of the engine's dtypes, row-major, on the engine's
// GPU (Engine::gpu()); a stream given to enqueue() or profile() must belong to that GPU.
class Context {
 public:
  // The optimization profile whose ranges set_input_shape() checks (0 at first); choosing one
  // sets every input to that profile's opt shape.
  void set_optimization_profile(int index);
  int optimization_profile() const;
  // The shape of an input for the next enqueue() or profile() (the profile's opt shape until
  // set). Throws kiln::Error naming the input for an unknown name, a wrong rank, or a shape
  // outside the current profile.
  void set_input_shape(const std::string& name, const std::vector<int64_t>& shape);
  std::vector<int64_t> input_shape(const std::string& name) const;
  // The values of an input that sets parameters (BuildOptions::input_values) for the next
  // enqueue() or profile() (the build's until set; run() takes them from its inputs): a plan of
  // its own, made on first use. Throws kiln::Error for an input not planned by value, or values
  // of another dtype or shape.
  void set_input_values(const std::string& name, const Tensor& values);
  // The shape of an output at the current input shapes (plans them on first use).
  std::vector<int64_t> output_shape(const std::string& name);
  // The layers of the plan at the current input shapes, as Engine::info() describes them.
  std::vector<LayerInfo> layers();
  // Device pointers of an input or output buffer, large enough for the largest shapes of every
  // profile (valid as long as the context; they never move). Contents are row-major at the
  // current shapes. One exception: values set with set_input_values that make an output larger
  // than at the build's values move that output's buffer when they are planned (output_shape()
  // plans them); ask for output_buffer() after that.
  void* input_buffer(const std::string& name) const;
  void* output_buffer(const std::string& name) const;
  // Zero-copy I/O: enqueue() and profile() read an input from, or write an output to, memory of
  // the caller's (`bytes` at `device_pointer`) instead of the context's buffer, until bound again
  // or unbound (nullptr). The memory must be device memory of the engine's GPU, aligned to 256
  // bytes as cudaMalloc's is, `bytes` within one allocation; enqueue() throws when `bytes` do not
  // hold the tensor at the current shapes. The caller keeps it alive and unchanged while runs
  // use it. run() leaves bound memory alone (it copies through the context's buffers).
  void set_tensor_address(const std::string& name, void* device_pointer, size_t bytes);
  // The memory enqueue() uses for an input or output: the caller's when bound, else the context's.
  void* tensor_address(const std::string& name) const;
  // Runs the engine at the current input shapes on a CUDA stream (a cudaStream_t; nullptr:
  // the legacy default stream), asynchronously: the first call at a shape captures a CUDA graph
  // (kept per shape, the 8 most recent), later ones replay it. Bound memory gets graphs of its
  // own, up to 4 sets of addresses per shape, once its addresses come back (buffers used in
  // turn, an input that stays put), a graph unused in the last 8 runs giving way to new ones;
  // other memory is copied in and out around the graph of the context's buffers instead, which
  // costs less than a capture. Default streams cannot be captured: there the graph runs on a
  // stream of the context's, ordered after the caller's earlier work and before its later work
  // on that stream.
  void enqueue(void* cuda_stream);
  // Makes work queued on `cuda_stream` from now on wait until the last enqueue() (or run()) has
  // written its outputs, on whichever stream it ran: what a consumer of an output buffer on
  // another stream needs (DLPack's __dlpack__(stream=...)). Nothing to wait for before a run.
  void wait_for_last_run(void* cuda_stream);
  // Sets the input shapes from the tensors (the first profile that holds them, if the current
  // one does not), copies inputs in, runs, copies outputs out, waits.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs);
  // run() for a batch that arrives in pieces (a server's requests): each input is its pieces one
  // after another along the first dimension (the other dimensions alike), then `zero_rows` rows
  // of zeros (padding to a batch size planned before). Each piece is copied once, into the
  // context's transfer buffer: there is no concatenated copy on the host first.
  std::map<std::string, Tensor> run_concatenated(const std::map<std::string, std::vector<Tensor>>& pieces,
                                                 int64_t zero_rows = 0);
  // (run() and run_concatenated(): an input, or a piece, that lies in page-locked host memory,
  // such as a PinnedHostMemory's, is copied straight to the device instead.)
  // Times every layer of one run at the current shapes (no CUDA graph); waits.
  std::vector<LayerTiming> profile(void* cuda_stream);

  struct Impl;

 private:
  friend class Engine;
  explicit Context(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// Host memory the GPU copies from directly: page-locked for every GPU (cudaHostRegister) while this
// object lives. A Context's run() and run_concatenated() copy an input lying in it straight to
// the device, with no CPU copy into the context's transfer buffer first: what a server wants for
// inputs a client leaves in shared memory. The caller keeps the memory mapped while the object
// lives. `gpu`: the device current while it registers (the registration holds for every GPU).
// Throws kiln::Error (kUnsupported without the CUDA backend, kDevice when the driver refuses: no
// GPU, memory it cannot lock).
class PinnedHostMemory {
 public:
  PinnedHostMemory(void* address, size_t bytes, int gpu = 0);
  ~PinnedHostMemory();
  PinnedHostMemory(PinnedHostMemory&& other) noexcept;
  PinnedHostMemory& operator=(PinnedHostMemory&& other) noexcept;
  PinnedHostMemory(const PinnedHostMemory&) = delete;
  PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;
  void* data() const { return address_; }
  size_t size() const { return bytes_; }

 private:
  void* address_ = nullptr;
  size_t bytes_ = 0;
  int gpu_ = 0;
};

}  // namespace kiln
