// kiln's plain data types: what a build is asked for (BuildOptions, profiles, precisions) and
// what an engine says of itself (EngineInfo, LayerInfo). Declared apart from kiln.h's Engine and
// Context so that every stage of kiln, the backends included, speaks them without depending on
// the public API's classes (docs/architecture.md, "Stages").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

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
// kBf16 (CPU engines): float32 storage, with the products of MatMul, Gemm and group-1
// convolutions by constant weights and Attention's two products in bfloat16 (both operands
// rounded to nearest even, float32 sums) on AMX-BF16 or AVX512-BF16 where the CPU has them,
// float32 where it has neither (an engine file built where the CPU had them holds its weights
// rounded to bfloat16). GPU builds refuse it (they take kFp16 or kBest).
enum class Precision { kFp32, kTf32, kFp16, kBest, kInt8, kFp8, kBf16 };
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

// How a GPU build chooses and launches its tactics. The defaults are what engines for others
// should be built with; the other values narrow the choice, for experiments and tests. They are
// recorded in the engine file (options.tactics) and in the timing cache's device line, so a
// cache written under other values is not used by a build under the defaults. kiln's developers
// set them through the environment variables of docs/env.md (src/api/developer_environment.cc).
struct TacticOptions {
  // Hopper: kiln's INT8 kernels launch with programmatic dependent launch (they load weights
  // and epilogue operands while the layer before them finishes).
  bool programmatic_launch = true;
  // Tactics and layers are timed as CUDA graph replays, as the engine runs them (false: plain
  // launches on the stream).
  bool graph_timing = true;
  // INT8/FP8 convolutions: "" every family; "cudnn" cuDNN's engines only; "cublaslt" cuBLASLt's
  // FP8 products only; "cutlass" CUTLASS's INT8/FP8 products only; "cutlass:NAME" CUTLASS's
  // kernel NAME only ("64x128x128 pingpong"); "kernel" kiln's INT8 kernels only;
  // "kernel:NAME" that kernel tactic where a layer has it (else kiln's other kernels).
  std::string quantized_conv;
  // > 1: kiln's implicit-GEMM INT8 convolution offered (and kept) split K this many ways only.
  int int8_k_splits = 0;
  // Float16 attention: "" every tactic; "products" cuBLASLt's products around kiln's softmax;
  // "cudnn" cuDNN's fused attention; "kernel" kiln's fused attention kernel (each where it takes
  // the layer, else the products).
  std::string attention;
  // Float convolutions: the families offered besides cuDNN's legacy API.
  bool cudnn_graphs = true;      // cuDNN's graph API
  bool conv_as_gemm = true;      // 1x1 convolutions as cuBLASLt products
  bool depthwise_kernel = true;  // kiln's depthwise kernels
  // Kernels kiln generates for a layer and compiles with NVRTC while it builds (elementwise
  // groups), timed beside its compiled kernels.
  bool generated_kernels = true;
  // Every candidate's time (and error) in the build log, not just the choice.
  bool log_candidates = false;

  bool operator==(const TacticOptions& o) const {
    return programmatic_launch == o.programmatic_launch && graph_timing == o.graph_timing &&
           quantized_conv == o.quantized_conv && int8_k_splits == o.int8_k_splits && attention == o.attention &&
           cudnn_graphs == o.cudnn_graphs &&
           conv_as_gemm == o.conv_as_gemm && depthwise_kernel == o.depthwise_kernel &&
           generated_kernels == o.generated_kernels && log_candidates == o.log_candidates;
  }
  // "" for the defaults, else the fields that differ ("graph_timing=0 quantized_conv=cudnn").
  std::string describe() const;
};

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
  // GPU engines: inputs that set parameters (a Reduce's axes, Resize's scales or sizes, Slice's
  // starts, TopK's k, a quantizer's scale; ir/parameter_inputs.h), with the values to plan for.
  // Each such input must have a fixed shape; its values are constants of the plan, and a run that
  // brings other values is planned for them on first use, as a new input shape is. Values of
  // another numeric dtype are converted to the input's when exact; a 1-D list of the input's
  // element count is reshaped to it. An input left out takes part in the plan as data (the layers
  // that need it constant refuse it, or it runs on the CPU engine).
  std::map<std::string, Tensor> input_values;
  // Tactics are timed at each profile's opt, min and max shapes, and at shapes between them
  // about this factor apart in elements (<= 1: none between); other shapes take the tactics of
  // the timed shape nearest to them. Smaller steps: longer builds, closer tactics.
  double profile_timing_step = 4.0;
  // A timing cache file: read if it exists, written after the build.
  std::string timing_cache;
  // GPU builds: nodes without a GPU layer run on the CPU engine inside the GPU engine (automatic
  // partitioning; each such node copies its inputs to the host and its outputs back, and the GPU
  // waits for it). false: such nodes fail the build, naming each and why (`kiln build --strict`).
  bool allow_cpu_fallback = true;
  // GPU builds whose tail runs on the CPU engine (nodes after one whose output shapes the data
  // decides): the tail's per-region heads (nodes that compute each row of a data-sized value on
  // its own from constants, such as a detection model's box and mask heads) run on the GPU, up to
  // 128 rows at a time. false: the whole tail on the CPU engine (`kiln build --no-gpu-row-stages`).
  bool gpu_row_stages = true;
  // Extra graph outputs, for debugging (like Polygraphy's --onnx-outputs): value names, or
  // "all" for every floating-point node output. Marked values are kept as they are (not fused
  // away).
  std::vector<std::string> mark_outputs;
  // kInt8: the calibrated scale of each activation (value name -> scale; real = int8 * scale),
  // as `kiln calibrate` writes them (quantization/calibration_cache.h reads its files), and
  // node names to keep in float (mixed precision).
  std::map<std::string, float> int8_scales;
  std::vector<std::string> float_layers;
  // GPU builds at fp16 (and best, INT8, FP8): node names (as `kiln inspect` lists the layers)
  // whose layers keep float32 storage and strict float32 math, their neighbours reformatting to
  // and from them (TensorRT's layer precision constraints; what `kiln debug precision --fp16`
  // finds). A name the optimized graph does not have fails the build.
  std::vector<std::string> fp32_layers;
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
  // GPU engines: the GPU they are built on and run on, as CUDA numbers the devices this process
  // sees (CUDA_VISIBLE_DEVICES narrows them). Every call into the engine and its contexts runs on
  // it, whatever device the calling thread has current. Where the engine runs, not what it is: not
  // stored in the engine file (Engine::load takes its own, LoadOptions::gpu).
  int gpu = 0;
  // GPU builds: how tactics are chosen and launched (recorded in the engine file).
  TacticOptions tactics;
  // CPU engines: fresh output buffers are filled with 0xFF bytes (NaN) before each kernel runs,
  // which proves that every kernel writes its whole output (the conformance tests' check).
  bool poison_outputs = false;
  // Progress lines of the build (layer by layer, with the chosen tactic); nullptr: quiet.
  std::function<void(const std::string&)> log;
};

// How Engine::load() places an engine file.
struct LoadOptions {
  size_t max_memory = 0;  // as BuildOptions::max_memory
  int gpu = 0;            // as BuildOptions::gpu (GPU engines)
};

// How Engine::create_context() makes a context (GPU engines).
struct ContextOptions {
  // Replay a CUDA graph per input shape (false: every run launches layer by layer).
  bool use_cuda_graph = true;
  // Take the activation memory (arena and library workspace) that the engine keeps for every
  // context made with this option, instead of memory of the context's own: several contexts then
  // hold one context's activations. Their runs take turns on the GPU (each waits for the one
  // enqueued before it, whichever context and stream that was), so it suits contexts that
  // rarely run at once: one per pipeline stage or per idle server instance. Inputs, outputs,
  // CUDA graphs and library handles stay each context's own.
  bool share_activation_memory = false;
};

struct LayerInfo {
  std::string name;
  std::string op;
  std::string tactic;     // e.g. "cudnn:fused algo=1", "cublasLt:algo#0", "cpu"
  std::string precision;  // storage of its output: "float16", "float32", ...
  bool cpu_fallback = false;
  double flops = 0;
  std::vector<int64_t> shape;  // of its (first) output; -1 where dynamic (CPU engines)
  // A fused group's (GPU engines' FusedElementwise): the names of the model's nodes it computes.
  std::vector<std::string> members;
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
  int gpu = -1;            // GPU engines: the device index they run on (BuildOptions::gpu); CPU: -1
  std::string precision;   // "fp32", "tf32", "fp16", "best", "int8", "fp8", "bf16"
  std::vector<LayerInfo> layers;  // GPU: at profile 0's opt shapes
  size_t weight_bytes = 0;       // GPU: weights on the device (shared by every shape and context)
  size_t activation_bytes = 0;   // GPU: the activation arena of one context (the largest plan's)
  size_t workspace_bytes = 0;    // GPU: library workspace of one context
  size_t io_bytes = 0;           // GPU: input and output buffers of one context (at the max shapes)
  // GPU: the device memory the engine and one context of it hold after their first runs, as
  // cudaMemGetInfo sees it: the weights' and the context's buffers in whole pages, and the
  // libraries' state (handles, kernels loaded on first use; a measured allowance).
  size_t device_memory_bytes = 0;
  std::vector<ProfileInfo> profiles;  // GPU engines
  size_t planned_shapes = 0;     // GPU: input shapes planned so far (min/opt/max of each profile, then those run)
  std::vector<std::string> fp32_layers;  // fp16 builds: float layers that kept float32
  std::vector<std::string> int8_kept_float;  // int8 builds: convolutions left in float, "name: why"
  bool has_cpu_fallback = false;
  // GPU engines: the nodes whose output shapes depend on their data ("name (op)"). They and every
  // node after them run on the CPU engine once the GPU's part has run; the outputs they compute
  // come only from run() (Context::enqueue refuses such an engine).
  std::vector<std::string> data_dependent_nodes;
};

// Per-layer time of one profiled run.
struct LayerTiming {
  std::string name, op, tactic;
  float ms = 0;
  double flops = 0;  // CPU engines: the layer's FLOPs at the run's shapes (GPU: 0; LayerInfo::flops has them)
  // The bytes of the layer's activations at the run's shapes: the inputs it read and the outputs it
  // wrote, in their storage types (constants such as weights not counted); bytes / ms is the
  // layer's effective bandwidth, which for a memory-bound layer is to be set against the device's.
  double bytes = 0;
};

}  // namespace kiln
