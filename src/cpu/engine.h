// The CPU engine: runs an (optimized) graph node by node with the registered CPU kernels.
// It is the reference for the GPU engine and the engine of machines without a GPU.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cpu/kernel.h"
#include "ir/graph.h"

namespace kiln::cpu {

// Recycles the storage of intermediate tensors between steps and between runs: fresh
// allocations of large buffers cost page faults on every run (11% of a ResNet-50 run). It also
// bounds the memory of runs: a new buffer that would take what the pool's buffers hold (free or
// in use, graph outputs included until their caller drops them) past the limit is refused
// before it is allocated.
class BufferPool {
 public:
  explicit BufferPool(size_t limit_bytes);
  // Storage of at least `bytes`, from the pool when a buffer of up to twice that size is free.
  // Throws kInvalidArgument (saying the size, what is held and the limit) rather than allocate
  // past the limit.
  std::shared_ptr<unsigned char[]> take(size_t bytes);
  // Returns a tensor's storage to the pool if nothing else holds it.
  void give(Tensor& t);
  // Whether the tensor's storage was made here and nothing else holds it.
  static bool sole_holder(const Tensor& t);
  size_t limit() const { return limit_; }
  // Bytes of the live buffers made here (free or in use).
  size_t held() const { return *held_; }

 private:
  std::mutex mutex_;
  std::multimap<size_t, std::shared_ptr<unsigned char[]>> free_;  // capacity -> buffer
  // Bytes of every live buffer made here; shared with the buffers' deleters, which may outlive
  // the pool (graph outputs).
  std::shared_ptr<std::atomic<size_t>> held_;
  size_t limit_;
};

// The machine's physical memory in bytes: the CPU engine's default memory limit.
size_t physical_memory_bytes();

class CpuEngine {
 public:
  // Creates a kernel for every node; throws one kUnsupported error naming every node that
  // has no CPU kernel (and why) if there are any. A run allocates at most `memory_limit` bytes
  // for its tensors (0: physical_memory_bytes()). `poison_outputs`: BuildOptions::poison_outputs.
  // `bfloat16_products`: KernelInit::bfloat16_products for every kernel (subgraphs' included).
  explicit CpuEngine(ir::Graph graph, size_t memory_limit = 0, bool poison_outputs = false,
                     bool bfloat16_products = false);

  const ir::Graph& graph() const { return graph_; }
  // How node i of graph() runs, as its kernel says (Kernel::tactic): "" for the plain float kernels.
  std::string tactic(size_t i) const { return i < steps_.size() && steps_[i].kernel ? steps_[i].kernel->tactic() : ""; }
  // Bytes its tensors hold now (intermediates kept for reuse, outputs still held by callers).
  size_t memory_held() const { return pool_.held(); }

  // Runs the graph. Inputs are checked against the declared dtypes and shapes (known dims
  // must match, a symbolic dim must take one value across all inputs). Callers on several
  // threads run one at a time: kernels keep scratch buffers between runs.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const;
  // Per step of one run, in graph().nodes' order: its wall-clock time in milliseconds (the
  // node's shape inference, output allocation and kernel), its FLOPs at the run's shapes, and
  // the bytes of its non-constant inputs and its outputs (LayerTiming::bytes).
  struct StepTimes {
    std::vector<double> ms;
    std::vector<double> flops;
    std::vector<double> bytes;
  };
  // run(), also timing each step.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs, StepTimes& times) const;

 private:
  std::map<std::string, Tensor> run_steps(const std::map<std::string, Tensor>& inputs, StepTimes* times) const;
  struct Step {
    const ir::Node* node;
    std::unique_ptr<Kernel> kernel;
    std::vector<int> inputs;   // slot per input, -1 for omitted
    std::vector<int> outputs;  // slot per output, -1 for omitted
    std::vector<int> release;  // slots whose last reader is this step
    int overwritable = -1;     // Kernel::overwritable_input, where this step releases it and reads it once
    bool reshapes = false;     // Kernel::output_reshapes_input, of a value the engine's kernels made (no graph input)
    bool makes_outputs = false;  // KernelEntry::makes_outputs
    // The output types the last run inferred and the input signature they were inferred for: a
    // run whose inputs give the same signature reuses them. values_decide: at those shapes the
    // types needed the computed inputs' values (a Reshape's computed shape, NonZero's count).
    mutable std::vector<int64_t> inferred_for;
    mutable std::vector<ir::TensorType> inferred_types;
    mutable bool values_decide = false;
  };
  // A step's input signature: each computed input's dtype and shape (constants never change) and,
  // where values decide the output types, the computed inputs' elements. False where they do and
  // an input is too large to be a shape-carrying one (NonZero's input, Compress's condition):
  // such a step infers its types every run.
  bool input_signature(const Step& step, const std::vector<const Tensor*>& values, bool with_values,
                       std::vector<int64_t>& signature) const;

  void check_inputs(const std::map<std::string, Tensor>& inputs) const;
  // Packed constants (cpu/packed_weights.h): those read by one node input only, one that its
  // kernel's entry takes packed; taking a loaded graph's packs (checked; the others unpacked)
  // before the kernels are made; keeping the packs the kernels made in place of the values after.
  std::set<std::string> packable_constants() const;
  void take_packed_constants(const std::set<std::string>& packable);
  void keep_packed_constants(const std::set<std::string>& packable);

  ir::Graph graph_;
  std::vector<Step> steps_;
  std::map<std::string, int> slots_;       // value name -> slot
  std::vector<Tensor> constant_slots_;     // slot -> constant tensor (undefined otherwise)
  int num_slots_ = 0;
  bool poison_outputs_ = false;
  bool bfloat16_products_ = false;
  mutable BufferPool pool_;
  mutable std::mutex run_mutex_;  // KILN_POISON_OUTPUTS=1: fill fresh outputs with 0xFF bytes
};

}  // namespace kiln::cpu
