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
// layer fell back to the CPU: see Engine::info()). A GPU engine plans a new input shape on
// first use (Context::set_input_shape, run) under a lock of the engine's: other contexts going
// to new shapes wait for it, those at shapes already planned do not.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

// An input or output of a model. A dimension of -1 is dynamic; dim_names[i] then holds its
// symbolic name ("batch"), if the model gave one.
struct TensorDesc {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
  std::vector<std::string> dim_names;
};

enum class Device { kCpu, kCuda };

// kFp32: strict float32 arithmetic. kTf32: float32 storage, TF32 tensor-core products.
// kFp16: float16 storage where a layer supports it (float32 accumulation); layers that must
// stay float32 do, and Engine::info() lists them. kBest: kFp16, with TF32 for float32 layers.
// kInt8: convolutions in INT8 (int8 tensor-core products, int32 sums, a float epilogue that
// requantizes) where BuildOptions::int8_scales gives their input's scale; every other layer as
// kFp16 on the GPU and float32 on the CPU (whose INT8 kernels are the exact integer reference).
// kFp8: kInt8 with FP8 E4M3 in place of int8 (Hopper's FP8 tensor cores through cuDNN; float32
// sums), for group-1 convolutions and matrix products with channels in multiples of 16, from
// the same calibrated scales; the CPU engine runs its float reference.
enum class Precision { kFp32, kTf32, kFp16, kBest, kInt8, kFp8 };
const char* to_string(Precision precision);

// The shapes an optimization profile accepts for one input: every dimension d between min[d]
// and max[d]. Tactics are timed at opt (the shape to run fastest), at min and max, and between
// (BuildOptions::profile_timing_step).
struct ShapeRange {
  std::vector<int64_t> min, opt, max;
};
// An optimization profile, TensorRT's notion: a range per input name. A GPU engine runs any
// input shapes that lie within one of its profiles.
using OptimizationProfile = std::map<std::string, ShapeRange>;

struct BuildOptions {
  bool optimize = true;  // run kiln's graph passes (constant folding, BatchNorm folding, fusion)
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;  // GPU engines
  // GPU engines: fixed input shapes, by input name. An input in neither input_shapes nor a
  // profile takes its declared shape with dynamic dimensions set to 1.
  std::map<std::string, std::vector<int64_t>> input_shapes;
  // GPU engines: dynamic shapes. Each profile gives ranges for some inputs; the others are
  // fixed as above. No profiles: one profile of the fixed shapes. (CPU engines run any shape.)
  std::vector<OptimizationProfile> profiles;
  // Tactics are timed at each profile's opt, min and max shapes, and at shapes between them
  // about this factor apart in elements (<= 1: none between); other shapes take the tactics of
  // the timed shape nearest to them. Smaller steps: longer builds, closer tactics.
  double profile_timing_step = 4.0;
  // A timing cache file: read if it exists, written after the build.
  std::string timing_cache;
  // Run nodes without a GPU layer on the CPU (slow; otherwise such nodes fail the build).
  bool allow_cpu_fallback = false;
  // Extra graph outputs, for debugging (like Polygraphy's --onnx-outputs): value names, or
  // "all" for every node output. Marked values are kept as they are (not fused away).
  std::vector<std::string> mark_outputs;
  // kInt8: the calibrated scale of each activation (value name -> scale; real = int8 * scale),
  // as `kiln calibrate` writes them (quantization/calibration_cache.h reads its files), and
  // node names to keep in float (mixed precision).
  std::map<std::string, float> int8_scales;
  std::vector<std::string> float_layers;
  // kInt8 and kFp8 GPU builds: quantized layers only where they are faster (TensorRT's --int8
  // and --fp8 with fp16 allowed). The build times the engine with every eligible layer quantized
  // and the fp16 one layer by layer at profile 0's opt shapes, keeps in fp16 the layers whose
  // quantized form (quantize and reformats included) is slower, repeats on the mixed engine (up
  // to 3 rounds), times the whole engines and keeps the fastest (about three builds' time);
  // EngineInfo::int8_kept_float says which layers stayed fp16 and why. false: every eligible
  // layer quantized, untimed (`kiln build --int8 --int8-all`, `--fp8 --fp8-all`).
  bool quantized_where_faster = true;
  // The most memory a run may allocate, in bytes; 0: the machine's physical memory (CPU
  // engines) or the GPU's memory (GPU engines). CPU: the tensors of one Engine::run. GPU: the
  // weights plus one context's activations, workspace and input and output buffers. A buffer
  // that would pass it is refused, before anything is allocated, with its size, tensor and node.
  // A limit of where the engine runs, not of the engine: it is not stored in the engine file.
  size_t max_memory = 0;
  // Progress lines of the build (layer by layer, with the chosen tactic); nullptr: quiet.
  std::function<void(const std::string&)> log;
};

struct LayerInfo {
  std::string name;
  std::string op;
  std::string tactic;     // e.g. "cudnn:fused algo=1", "cublasLt:algo#0", "cpu"
  std::string precision;  // storage of its output: "float16", "float32", ...
  bool cpu_fallback = false;
  double flops = 0;
  std::vector<int64_t> shape;  // of its (first) output; -1 where dynamic (CPU engines)
};

// A GPU engine's optimization profile as built: every input's range, and the plans of its
// opt and max shapes.
struct ProfileInfo {
  OptimizationProfile ranges;        // every input (fixed ones with min = opt = max)
  std::vector<LayerInfo> layers;     // at the opt shapes (output shapes at opt)
  std::vector<std::vector<int64_t>> min_shapes, max_shapes;  // per layer: its output at min / max
  size_t activation_bytes = 0;       // the arena at the max shapes
  size_t workspace_bytes = 0;        // library workspace at the max shapes
};

struct EngineInfo {
  std::string backend;     // "cpu" or "cuda"
  std::string device;      // GPU name, or "cpu"
  std::string precision;   // "fp32", "tf32", "fp16", "best", "int8"
  std::vector<LayerInfo> layers;  // GPU: at profile 0's opt shapes
  size_t weight_bytes = 0;       // GPU: weights on the device (shared by every shape and context)
  size_t activation_bytes = 0;   // GPU: the activation arena of one context (the largest plan's)
  size_t workspace_bytes = 0;    // GPU: library workspace of one context
  size_t io_bytes = 0;           // GPU: input and output buffers of one context (at the max shapes)
  std::vector<ProfileInfo> profiles;  // GPU engines
  size_t planned_shapes = 0;     // GPU: input shapes planned so far (min/opt/max of each profile, then those run)
  std::vector<std::string> fp32_layers;  // fp16 builds: float layers that kept float32
  std::vector<std::string> int8_kept_float;  // int8 builds: convolutions left in float, "name: why"
  bool has_cpu_fallback = false;
};

class Context;

class Engine {
 public:
  // Imports an ONNX model, optimizes it and builds an engine for options.device.
  static Engine from_onnx(const std::string& onnx_path, const BuildOptions& options = {});
  // Reads an engine file written by save(). The file is checked (format, kiln version,
  // checksum, GPU and library versions; for CPU engines, that this CPU has AVX2/FMA/F16C); a
  // mismatch is a kiln::Error that says which. max_memory: as BuildOptions::max_memory.
  static Engine load(const std::string& engine_path, size_t max_memory = 0);
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
  // Number of layers after optimization (GPU: including reformat layers).
  size_t layer_count() const;
  EngineInfo info() const;
  // A new execution context (GPU engines): its own activation memory and CUDA graph
  // (use_cuda_graph false: every run launches layer by layer).
  Context create_context(bool use_cuda_graph = true) const;

  // Runs the model. Every input must be given, with the declared dtype and a shape that
  // matches the declared one (CPU: dynamic dimensions may take any value, consistently; GPU:
  // the shapes must lie within a profile).
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const;

  struct Impl;

 private:
  friend class Context;
  explicit Engine(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Writes the model after kiln's folding passes as ONNX (what `kiln export --simplify` does):
// constants and shape arithmetic folded, BatchNorm folded into the layer before it, copies and
// dead nodes removed; no fusion into kiln's own ops, so any ONNX reader can run the result.
// Inputs keep their dynamic dimensions. Throws kiln::Error naming the file at fault.
struct SimplifyResult {
  size_t nodes_before = 0;  // as imported
  size_t nodes_after = 0;
};
SimplifyResult simplify_onnx(const std::string& onnx_path, const std::string& output_path);

// Per-layer time of one profiled run.
struct LayerTiming {
  std::string name, op, tactic;
  float ms = 0;
};

// One runner of a GPU engine: activation memory, library handles and CUDA graphs of its own.
// Inputs and outputs live in device buffers of the engine's dtypes, row-major.
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
  // The shape of an output at the current input shapes (plans them on first use).
  std::vector<int64_t> output_shape(const std::string& name);
  // The layers of the plan at the current input shapes, as Engine::info() describes them.
  std::vector<LayerInfo> layers();
  // Device pointers of an input or output buffer, large enough for the largest shapes of every
  // profile (valid as long as the context; they never move). Contents are row-major at the
  // current shapes.
  void* input_buffer(const std::string& name) const;
  void* output_buffer(const std::string& name) const;
  // Runs the engine at the current input shapes on a CUDA stream (a cudaStream_t; nullptr:
  // the legacy default stream), asynchronously: the first call at a shape captures a CUDA graph
  // (kept per shape, the 8 most recent), later ones replay it. Default streams cannot be
  // captured: there the graph runs on a stream of the context's, ordered after the caller's
  // earlier work and before its later work on that stream.
  void enqueue(void* cuda_stream);
  // Sets the input shapes from the tensors (the first profile that holds them, if the current
  // one does not), copies inputs in, runs, copies outputs out, waits.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs);
  // Times every layer of one run at the current shapes (no CUDA graph); waits.
  std::vector<LayerTiming> profile(void* cuda_stream);

  struct Impl;

 private:
  friend class Engine;
  explicit Context(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace kiln
