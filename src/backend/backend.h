// The one interface every backend implements (src/cpu/backend.h, src/cuda/runtime/backend.h): a built
// engine, its execution contexts, and what a build times. The public API (src/api) and the
// compiler (src/compiler) see backends only through it; compiler/backends.cc is the one place
// that picks a backend for a device, and the one place that knows whether kiln was built with
// the CUDA backend.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ir/graph.h"
#include "kiln/types.h"

namespace kiln::backend {

// One runner of an engine (GPU: its activation memory, stream and CUDA graphs): what
// kiln::Context wraps; its methods mean what Context's do (include/kiln/kiln.h).
class Context {
 public:
  virtual ~Context() = default;
  virtual void set_optimization_profile(int index) = 0;
  virtual int optimization_profile() const = 0;
  virtual void set_input_shape(const std::string& name, const std::vector<int64_t>& shape) = 0;
  virtual std::vector<int64_t> input_shape(const std::string& name) const = 0;
  virtual void set_input_values(const std::string& name, const Tensor& values) = 0;
  virtual std::vector<int64_t> output_shape(const std::string& name) = 0;
  virtual std::vector<LayerInfo> layers() = 0;
  virtual void* input_buffer(const std::string& name) const = 0;
  virtual void* output_buffer(const std::string& name) const = 0;
  virtual void set_tensor_address(const std::string& name, void* address, size_t bytes) = 0;
  virtual void* tensor_address(const std::string& name) const = 0;
  virtual void enqueue(void* stream) = 0;
  virtual void wait_for_last_run(void* stream) = 0;
  virtual std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) = 0;
  virtual std::map<std::string, Tensor> run_concatenated(const std::map<std::string, std::vector<Tensor>>& pieces,
                                                         int64_t zero_rows) = 0;
  virtual std::vector<LayerTiming> profile(void* stream) = 0;
};

// Times a built engine, for the compiler's where-faster build (which takes the medians): a
// context of its own at profile 0's opt shapes, with fixed random inputs.
class Timer {
 public:
  virtual ~Timer() = default;
  // `runs` runs, each timed alone and waited for (what `kiln bench` measures), in ms.
  virtual std::vector<double> latency_samples_ms(int runs) = 0;
  // Per-layer times as the engine runs its layers, one list per sample: up to `runs` profiled
  // runs, or one list of each layer's time replayed in a CUDA graph where the backend times
  // layers that way (docs/design/tactic-timing.md).
  virtual std::vector<std::vector<LayerTiming>> layer_samples(int runs) = 0;
};

// A built engine: what kiln::Engine wraps.
class Engine {
 public:
  virtual ~Engine() = default;
  // The graph it runs, dynamic dimensions symbolic: what an engine file holds.
  virtual const ir::Graph& graph() const = 0;
  virtual size_t layer_count() const = 0;
  // Fills the backend's part of Engine::info(): device, layers, memory, profiles' plans.
  virtual void describe(EngineInfo& info) const = 0;
  // The graph's outputs as this engine computes them (declared: from the graph; a GPU engine
  // fixes the dimensions no profile lets vary).
  virtual std::vector<TensorDesc> outputs(std::vector<TensorDesc> declared) const { return declared; }
  virtual std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const = 0;
  // Throws kUnsupported where the backend has no contexts (the CPU engine runs with run()).
  virtual std::unique_ptr<Context> create_context(const ContextOptions& options) const = 0;
  // The tactics chosen (timing-cache entries): an engine built with them times nothing.
  virtual std::map<std::string, std::string> tactics() const { return {}; }
  // Throws kUnsupported where the backend has nothing to time.
  virtual std::unique_ptr<Timer> timer() const = 0;
  // Runs once with `inputs`, timing every layer (Engine::profile). Throws kUnsupported where the
  // backend times its layers through execution contexts.
  virtual std::vector<LayerTiming> profile(const std::map<std::string, Tensor>& inputs) const = 0;
};

}  // namespace kiln::backend
