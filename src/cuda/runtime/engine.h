// The CUDA engine: the builder lowers an optimized graph specialized to concrete input shapes
// to a plan of layers over planned buffers (builder.cc); the engine keeps a plan per input
// shape within its optimization profiles (profiles.cc); an execution context runs the plan of
// its current shapes on a stream, as one CUDA graph per shape after the first run (context.cc).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/runtime/layer.h"
#include "cuda/runtime/weight_memory.h"
#include "ir/graph.h"

namespace kiln::cuda {

// Input shapes by input name: one binding of an engine's inputs.
using Shapes = std::map<std::string, std::vector<int64_t>>;
// The values of the inputs that set parameters (BuildOptions::input_values), by input name: the
// rest of a binding. A plan treats them as constants.
using Values = std::map<std::string, Tensor>;

// The cuDNN handle a plan's layers are built with, made when the first layer asks for one (an
// execution context's own; its plans run with the handle their cuDNN execution plans were
// finalized with). Empty: the builder makes a handle for the build and destroys it after.
using CudnnSource = std::function<cudnnContext*()>;

// The shapes an optimization profile accepts for one input: each dimension d within
// [min[d], max[d]]. Tactics are timed at opt, min, max and between (timed_shapes()).
struct ShapeRange {
  std::vector<int64_t> min, opt, max;
};

// An optimization profile: a range for every input of the graph (fixed inputs: min = opt = max).
struct Profile {
  std::map<std::string, ShapeRange> inputs;

  // "" when every input's shape lies in the profile; else why not, naming the input and the
  // dimension ("input 'x': dimension 0 is 300, above the profile's max 256").
  std::string mismatch(const Shapes& shapes) const;
  Shapes min() const;
  Shapes opt() const;
  Shapes max() const;
};

struct BuildConfig {
  Precision precision = Precision::kFp32;
  bool allow_cpu_fallback = true;    // ops without a GPU layer run on the CPU engine's kernel
  std::string timing_cache_path;     // read if present, written after the build
  // Timing-cache entries to use before the file's (an engine file's tactics): no timing.
  std::map<std::string, std::string> timing_entries;
  size_t max_workspace_bytes = size_t{1} << 30;
  // The optimization profiles; at least one.
  std::vector<Profile> profiles;
  // The values the profiles' plans are built for; a context starts with them.
  Values input_values;
  // Besides each profile's opt, min and max shapes, tactics are timed at shapes spaced by about
  // this factor in elements between them (geometrically; <= 1: none), so that a shape planned
  // on first use starts from tactics timed near it.
  double timed_shape_step = 4.0;
  // Plans kept for shapes other than the profiles' min/opt/max (least recently used dropped).
  size_t max_cached_plans = 16;
  // The most device memory the weights and one context may take (0: the GPU's memory); a
  // context that would pass it, or the device's free memory, is refused before it allocates.
  size_t max_memory = 0;
  std::function<void(const std::string&)> log;  // progress lines; nullptr: quiet
  TacticOptions tactics;  // how tactics are chosen and launched (kiln/types.h)
  // fp16 builds: nodes whose layers take Precision::kFp32 (BuildOptions::fp32_layers).
  std::set<std::string> fp32_layers;
};

// Where a buffer's memory comes from.
//   kArena:  the execution context's activation arena, at `offset`
//   kWeight: the engine's weight memory (constants)
//   kView:   another buffer's memory (reshapes, layout changes that move no bytes)
//   kIo:     the context's buffer of an engine input or output (`io`: index in CudaEngine::io()),
//            sized for the largest shape the profiles allow, so its address never changes
enum class BufferKind : uint8_t { kArena, kWeight, kView, kIo };

struct Buffer {
  std::string name;
  TensorSpec spec;
  BufferKind kind = BufferKind::kArena;
  size_t offset = 0;             // kArena: offset in the activation arena
  const void* weight = nullptr;  // kWeight: device pointer in the engine's weight memory
  int view_of = -1;              // kView: the buffer whose memory this one shares
  int io = -1;                   // kIo: index in CudaEngine::io()
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
  std::vector<std::string> members;  // a fused group's nodes (the node's "members" attribute)
};

// An input or output of one plan: its shape at that plan's binding.
struct EngineIO {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int buffer = -1;
};

// The layers and buffers of an engine at one binding of its input shapes: what the builder
// (builder.cc) makes of the graph specialized to those shapes.
class ShapePlan {
 public:
  ~ShapePlan();
  const Shapes& shapes() const { return shapes_; }
  const Values& values() const { return values_; }
  // The inputs the plan reads from device buffers (the value inputs are constants in it).
  const std::vector<EngineIO>& inputs() const { return inputs_; }
  const std::vector<EngineIO>& outputs() const { return outputs_; }
  const std::vector<PlannedLayer>& layers() const { return layers_; }
  // Whether some layer runs on the CPU engine (CPU fallback).
  bool has_cpu_fallback() const {
    return std::any_of(layers_.begin(), layers_.end(), [](const PlannedLayer& l) { return l.cpu_fallback; });
  }
  const std::vector<Buffer>& buffers() const { return buffers_; }
  size_t arena_bytes() const { return arena_bytes_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  // The implementation of each layer (node name -> Layer::tactic()), for inspection.
  std::map<std::string, std::string> tactics() const;
  // The timing-cache entries this plan used (key -> tactic), and the tactic each node took
  // (node name -> the same tactic strings): plans at other shapes start from the latter.
  const std::map<std::string, std::string>& timing_entries() const { return timing_entries_; }
  const std::map<std::string, std::string>& node_tactics() const { return node_tactics_; }
  // Names of float layers that kept float32 in an fp16 build.
  std::vector<std::string> fp32_layers() const;
  // The graph specialized to shapes() that the plan was built from (contexts build their own
  // plans from it without specializing again).
  const std::shared_ptr<const ir::Graph>& graph() const { return graph_; }

 private:
  friend class Builder;
  ShapePlan() = default;
  std::shared_ptr<const ir::Graph> graph_;
  Shapes shapes_;
  Values values_;
  std::vector<EngineIO> inputs_, outputs_;
  std::vector<Buffer> buffers_;
  std::vector<PlannedLayer> layers_;
  size_t arena_bytes_ = 0;
  size_t workspace_bytes_ = 0;
  std::map<std::string, std::string> timing_entries_, node_tactics_;
};

// An engine input or output as the execution contexts hold it.
struct IoSlot {
  std::string name;
  DType dtype = DType::kUndefined;
  bool is_input = true;
  size_t capacity = 0;  // bytes of its largest shape in any profile
};

class TimingCache;

// The activation memory that an engine's contexts made with
// ContextOptions::share_activation_memory take turns with (context.cc): one arena and workspace
// for the largest plan the build made, and the order of their runs on the GPU.
struct SharedActivations {
  SharedActivations(size_t arena_bytes, size_t workspace_bytes);
  ~SharedActivations();
  SharedActivations(const SharedActivations&) = delete;
  SharedActivations& operator=(const SharedActivations&) = delete;
  void* arena = nullptr;
  size_t arena_bytes = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Held while a context enqueues a run: its stream waits for `last_run`, then the run is
  // enqueued, then `last_run` is recorded after it.
  std::mutex turn;
  cudaEvent_t last_run = nullptr;

 private:
  void release();
};

// A GPU engine: optimization profiles and the plans built for them. The plans of every
// profile's opt, min and max shapes, and of shapes between them (timed_shapes()), are built
// (their tactics timed) by build(); a plan for any other shape within a profile is built on
// first use (plan()), each layer starting from the tactic it took in the timed plan nearest in
// size, so nothing is timed again unless that tactic cannot run the new shape. Weights are uploaded once and shared by every plan.
// Thread-safe: plan() and context_plan() may be called from several threads at once.
class CudaEngine {
 public:
  // The graph specialized to input shapes and values (dims bound, value inputs made constants,
  // shapes inferred, shape arithmetic folded): what a plan is built from. Called from plan() on
  // any thread, one call at a time.
  using Specializer = std::function<ir::Graph(const Shapes&, const Values&)>;

  // Builds for the current CUDA device. Throws kUnsupported naming every node without a GPU
  // layer (unless CPU fallback is on), kInvalidArgument for a malformed profile.
  static std::unique_ptr<CudaEngine> build(Specializer specialize, const BuildConfig& config);
  ~CudaEngine();

  const std::vector<Profile>& profiles() const { return profiles_; }
  const std::vector<IoSlot>& io() const { return io_; }
  // Index of an input (is_input) or output in io(); throws kInvalidArgument naming it. The value
  // inputs come last among the slots (after the outputs).
  int io_index(const std::string& name, bool is_input) const;
  // Whether an input is planned by value (BuildConfig::input_values).
  bool is_value_input(const std::string& name) const { return config_.input_values.count(name) != 0; }
  bool has_value_inputs() const { return !config_.input_values.empty(); }
  // The engine's plan for `shapes` and `values` (every input named; the caller has checked them
  // against a profile): what info() and the engine file describe. Contexts do not run it (below).
  std::shared_ptr<const ShapePlan> plan(const Shapes& shapes, const Values& values) const;
  // The same at the values the engine was built for.
  std::shared_ptr<const ShapePlan> plan(const Shapes& shapes) const { return plan(shapes, config_.input_values); }
  // A plan of one execution context's own at `shapes`, built with the tactics of plan(shapes),
  // so it computes the same, and with the context's cuDNN handle (`cudnn`): a cuDNN execution
  // plan keeps the handle it was finalized with, which must outlive it. Contexts never share
  // layers: a layer may keep state of its own on the device (cuDNN's runtime-compiled engines
  // do), and the weights are shared anyway.
  std::shared_ptr<const ShapePlan> context_plan(const Shapes& shapes, const Values& values, const CudnnSource& cudnn) const;
  // The plan of a profile's opt shapes, built by build().
  std::shared_ptr<const ShapePlan> opt_plan(int profile) const;
  // The plan of a profile's max shapes (memory is planned for it), built by build().
  std::shared_ptr<const ShapePlan> max_plan(int profile) const;

  size_t weight_bytes() const;
  size_t weight_held_bytes() const;  // the weights' device memory, in whole pages
  // The largest activation arena / workspace of the plans built so far.
  size_t arena_bytes() const;
  size_t workspace_bytes() const;
  const BuildConfig& config() const { return config_; }
  size_t plan_count() const;
  Precision precision() const { return precision_; }
  const std::string& device_name() const { return device_name_; }
  // The timing-cache entries of every plan built so far (for the engine file: loading with
  // them times nothing).
  std::map<std::string, std::string> timing_entries() const;
  // The activation memory of the contexts that share theirs (made on first use, sized for
  // arena_bytes() and workspace_bytes() then).
  std::shared_ptr<SharedActivations> shared_activations() const;

 private:
  CudaEngine() = default;
  // The plan at `shapes` and `values` from `graph` (null: the graph specialized to them now).
  std::shared_ptr<const ShapePlan> build_plan(const Shapes& shapes, const Values& values,
                                              const std::map<std::string, std::string>* hints,
                                         const BuildConfig& config, std::shared_ptr<const ir::Graph> graph = nullptr,
                                         const CudnnSource& cudnn = {}) const;

  Specializer specialize_;
  BuildConfig config_;
  std::vector<Profile> profiles_;
  std::vector<IoSlot> io_;
  Precision precision_ = Precision::kFp32;
  std::string device_name_;

  mutable std::mutex mutex_;  // guards everything below
  mutable WeightMemory weights_;
  mutable std::unique_ptr<TimingCache> cache_;
  // Plans by shape key: the profiles' min/opt/max ones (pinned), then up to max_cached_plans
  // others, least recently used first out.
  mutable std::map<std::string, std::shared_ptr<const ShapePlan>> pinned_, cached_;
  mutable std::vector<std::string> cached_order_;  // least recently used first
  std::vector<std::shared_ptr<const ShapePlan>> opt_plans_, max_plans_;
  mutable size_t arena_bytes_ = 0, workspace_bytes_ = 0;
  mutable std::shared_ptr<SharedActivations> shared_activations_;
};

// A printable key of a binding: "input=8x3x224x224;mask=8x16", then each value input's values
// ("axes:=[1,2]"; floating-point ones to every digit).
std::string shapes_key(const Shapes& shapes);
std::string binding_key(const Shapes& shapes, const Values& values);

// The shapes a profile's tactics are timed at: opt, min, max, then shapes on the geometric paths
// min -> opt and opt -> max, about `step` apart in elements (every varying dimension moved by the
// same fraction of its log range); duplicates dropped.
std::vector<Shapes> timed_shapes(const Profile& profile, double step);

// Per-layer times of a profiled run.
struct LayerTime {
  std::string name, op, tactic;
  float ms = 0;
  double bytes = 0;  // its activation buffers (inputs and outputs) at the bound shapes: LayerTiming::bytes
};

// One execution context: its own activation arena, workspace, input/output buffers,
// stream-bound library handles, and one CUDA graph per input shape it ran (a bounded cache).
// A context must be used from one thread at a time; several contexts may share an engine.
// With ContextOptions::share_activation_memory, the arena and workspace are the engine's
// SharedActivations, and every run takes its turn on them.
class CudaContext {
 public:
  explicit CudaContext(const CudaEngine& engine, const ContextOptions& options = {});
  ~CudaContext();
  // The device memory `engine` and one context of it hold after their first runs
  // (EngineInfo::device_memory_bytes), known before either runs.
  static size_t predicted_bytes(const CudaEngine& engine);
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // The optimization profile that set_input_shape() checks against (0 at first). Selecting one
  // sets every input to its opt shape.
  void set_profile(int index);
  int profile() const { return profile_; }
  // The shape of an input for the next runs (the profile's opt shape until set). Throws
  // kInvalidArgument naming the input: unknown name, wrong rank, or outside the profile.
  void set_input_shape(const std::string& name, const std::vector<int64_t>& shape);
  const std::vector<int64_t>& input_shape(const std::string& name) const;
  const Shapes& input_shapes() const { return shapes_; }
  // The values of an input planned by value (BuildConfig::input_values) for the next enqueue()s
  // (the build's until set; run() sets them from its inputs). Throws kInvalidArgument for another
  // input, or values of another dtype or shape.
  void set_input_values(const std::string& name, const Tensor& values);
  // The plan for the current input shapes (built on first use).
  const ShapePlan& current_plan();

  // Device buffers of the engine's inputs and outputs (logical dtype, row-major), large
  // enough for any shape of any profile; their addresses never change, but for an output of an
  // engine with inputs planned by value whose values need more room than the build's (grow_io).
  void* input_buffer(const std::string& name) const;
  void* output_buffer(const std::string& name) const;

  // Caller memory for an input or output (zero-copy I/O): enqueue() reads or writes `bytes` at
  // `address` instead of the context's own buffer until bound again or unbound (nullptr). The
  // address must be device memory of this GPU, aligned to 256 bytes (as cudaMalloc's), with
  // `bytes` inside one allocation; each enqueue() checks that `bytes` hold the tensor at the
  // current shapes. Throws kInvalidArgument naming the tensor and the reason.
  void set_tensor_address(const std::string& name, void* address, size_t bytes);
  // The memory enqueue() uses for an input or output: the caller's when bound, else the context's.
  void* tensor_address(const std::string& name) const;

  // Runs the engine on `stream` at the current input shapes, reading the inputs' memory and
  // writing the outputs' (tensor_address()). Asynchronous; the first call at a shape on a stream
  // captures a CUDA graph, later calls replay it. Caller memory gets graphs of its own
  // (kGraphsPerShape sets of addresses per shape, a stale one updated in place) once its
  // addresses come back (seen_recently(), has_room_for_graph()); otherwise the run copies it in
  // and out around the graph of the context's buffers: a capture costs about what launching
  // layer by layer does.
  void enqueue(cudaStream_t stream);
  // Makes later work on `stream` wait for the last enqueue() (an event recorded after each on
  // the caller's stream; nothing before the first).
  void wait_for_last_run(cudaStream_t stream);

  // Sets the input shapes from the tensors (choosing a profile that holds them), copies them
  // in (through pinned staging) to the context's own buffers (bound caller memory is left
  // alone), runs, copies the outputs back, waits.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs, cudaStream_t stream);
  // The same for inputs given in pieces: each input is its pieces one after another along the
  // first dimension, then `zero_rows` rows of zeros. Each piece is copied once, into the pinned
  // staging at its offset (a batch of requests is not concatenated on the host first).
  std::map<std::string, Tensor> run_concatenated(const std::map<std::string, std::vector<Tensor>>& pieces,
                                                 int64_t zero_rows, cudaStream_t stream);

  // Runs layer by layer with events between layers (no CUDA graph); synchronizes.
  std::vector<LayerTime> profile(cudaStream_t stream);

  // Each layer's time as a CUDA graph runs it: a graph of `launches` launches of the layer alone,
  // replayed (cuda/runtime/graph_timing.h); a layer that cannot be captured gets its time between events.
  // What the quantized build compares layers by: between events, a layer's time includes its
  // launch from the host, which the engine's graph does not pay (docs/design/int8.md, "Why
  // per-layer timing misleads at batch 1").
  std::vector<LayerTime> profile_in_graph(cudaStream_t stream, int launches);

  // Plans bound per context (one per input shape; least recently used first out), and CUDA
  // graphs per plan (one per set of input and output addresses and stream). A bound plan costs
  // host memory and its graphs, no device memory of its own (the arena and workspace are the
  // context's); sixteen hold a server's planned batch sizes up to 2,048 rows (serve/batcher.h).
  static constexpr size_t kMaxGraphs = 16;
  static constexpr size_t kGraphsPerShape = 4;
  static constexpr size_t kRecentAddressSets = 8;

 private:
  // One CUDA graph of a plan: the input and output addresses (per io slot) and the stream it
  // was captured with.
  struct Captured {
    std::vector<void*> addresses;
    cudaStream_t stream = nullptr;
    cudaGraphExec_t exec = nullptr;
    uint64_t last_run = 0;  // runs_ at its last launch
  };
  // A layer's pointer to an input or output slot's memory: io[layer].inputs/outputs[index].
  struct IoUse {
    size_t layer, index, slot;
    bool output;
  };
  // A plan bound to this context's memory and handles, with its CUDA graphs once captured.
  struct Bound {
    std::shared_ptr<const ShapePlan> plan;
    std::vector<LayerIO> io;  // per layer
    std::vector<IoUse> io_uses;
    std::vector<void*> addresses;  // the io slots' memory that `io` points at
    std::vector<Captured> graphs;  // at most kGraphsPerShape
    uint64_t last_used = 0;
  };
  Bound& bound();
  void bind(Bound& b);
  // Points the plan's layers at `addresses` (per io slot).
  static void point_at(Bound& b, const std::vector<void*>& addresses);
  // The graph of `b` at its current addresses on `stream`, launched; captured first when there is
  // none (the first run of a plan on a stream runs eagerly instead, before its capture).
  void launch_graph(Bound& b, cudaStream_t stream);
  // Whether caller memory at `addresses` was met in one of the last kRecentAddressSets runs that
  // had no graph for it (and notes it, when not): only such addresses are worth a capture.
  bool seen_recently(const std::vector<void*>& addresses);
  // Whether `b` may take one more graph: fewer than kGraphsPerShape, or one not launched in the
  // last kRecentAddressSets runs. Without the second condition, a rotation of more buffer sets
  // than graphs kept (but few enough to be seen recently) would evict a graph on every run, each
  // run a capture; with it, the sets beyond the graphs copy through the context's buffers.
  bool has_room_for_graph(const Bound& b) const;
  // Destroys every bound plan's graphs and the plans (their work must be done).
  void drop_bound();
  // The memory of each io slot that the next run uses: the caller's where bound (but for run()).
  std::vector<void*> io_addresses() const;
  void* io_address(size_t slot) const;
  // Throws when caller memory bound to an input or output of `plan` is smaller than it.
  void check_bound_bytes(const ShapePlan& plan) const;
  // The slot of a name that set_tensor_address() takes: an input's, else an output's.
  size_t tensor_slot(const std::string& name) const;
  // Throws, before anything is allocated, when this context would pass the memory limit or the
  // device's free memory.
  void check_memory() const;
  void reserve(size_t arena_bytes, size_t workspace_bytes);
  // An output buffer (and its staging) reallocated to `bytes`, every bound plan dropped: an
  // engine with inputs planned by value may need more at other values than at the build's.
  void grow_io(size_t slot, size_t bytes);
  void enqueue_layers(const Bound& b, cudaStream_t stream);
  void enqueue_graph(Bound& b, cudaStream_t stream);
  // The plan's layers captured on `stream` into a graph (not run).
  cudaGraph_t capture(const Bound& b, cudaStream_t stream);
  // Leaves the shared activation memory for memory of this context's own (a plan needs more).
  void stop_sharing();
  void* address(const ShapePlan& plan, int buffer) const;

  const CudaEngine& engine_;
  bool use_cuda_graph_;
  int profile_ = 0;
  Shapes shapes_;
  Values values_;
  void* arena_ = nullptr;
  size_t arena_capacity_ = 0;
  void* workspace_ = nullptr;
  size_t workspace_capacity_ = 0;
  std::shared_ptr<SharedActivations> shared_;  // arena_ and workspace_ are its memory, not ours
  std::vector<void*> io_buffers_;   // per CudaEngine::io() slot
  // Caller memory bound per slot (nullptr: none) and its size; run() sets own_io_ to leave it alone.
  std::vector<void*> caller_address_;
  std::vector<size_t> caller_bytes_;
  bool own_io_ = false;
  std::vector<std::vector<void*>> recent_addresses_;  // seen_recently()'s memory, oldest first
  std::vector<void*> pinned_;       // host staging per slot
  std::vector<size_t> io_capacity_;  // bytes of each slot's buffer and staging
  cudnnContext* cudnn_ = nullptr;
  cublasLtContext* cublaslt_ = nullptr;
  std::map<std::string, Bound> bound_;  // by shapes_key
  uint64_t clock_ = 0;
  uint64_t runs_ = 0;  // runs enqueued with graphs: how stale a graph is
  // For callers on a default stream, which cannot be captured: the graph runs on this stream,
  // ordered after and before the caller's work by the two events.
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  cudaEvent_t last_run_ = nullptr;  // recorded after each enqueue() on the caller's stream
};

// Throws kiln::Error naming both when kiln's kernels are not compiled for this GPU's
// architecture (KILN_CUDA_ARCHITECTURES); every build and load asks first.
void check_gpu_architecture(const cudaDeviceProp& prop);

// Layers that the builder adds itself.
std::unique_ptr<Layer> make_reformat_layer(const TensorSpec& from, const TensorSpec& to);
// A layer that runs the CPU engine's kernel for `node`: device -> pinned host -> kernel (in a
// host callback) -> device. Captured in the CUDA graph like any layer; slow, for coverage.
std::unique_ptr<Layer> make_cpu_fallback_layer(const LayerRequest& request, const LayerFormats& formats);

// Host-side conversion of a constant to a storage format (float32 -> float16, NCHW -> NHWC).
Tensor convert_constant(const Tensor& t, const Format& format);

}  // namespace kiln::cuda
