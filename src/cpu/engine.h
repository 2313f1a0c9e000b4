// The CPU engine: runs an (optimized) graph node by node with the registered CPU kernels.
// It is the reference for the GPU engine and the engine of machines without a GPU.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpu/kernel.h"
#include "ir/graph.h"

namespace kiln::cpu {

class CpuEngine {
 public:
  // Creates a kernel for every node; throws one kUnsupported error naming every node that
  // has no CPU kernel (and why) if there are any.
  explicit CpuEngine(ir::Graph graph);

  const ir::Graph& graph() const { return graph_; }

  // Runs the graph. Inputs are checked against the declared dtypes and shapes (known dims
  // must match, a symbolic dim must take one value across all inputs).
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const;

 private:
  struct Step {
    const ir::Node* node;
    std::unique_ptr<Kernel> kernel;
    std::vector<int> inputs;   // slot per input, -1 for omitted
    std::vector<int> outputs;  // slot per output, -1 for omitted
    std::vector<int> release;  // slots whose last reader is this step
  };

  void check_inputs(const std::map<std::string, Tensor>& inputs) const;

  ir::Graph graph_;
  std::vector<Step> steps_;
  std::map<std::string, int> slots_;       // value name -> slot
  std::vector<Tensor> constant_slots_;     // slot -> constant tensor (undefined otherwise)
  int num_slots_ = 0;
  bool poison_outputs_ = false;  // KILN_POISON_OUTPUTS=1: fill fresh outputs with 0xFF bytes
};

}  // namespace kiln::cpu
