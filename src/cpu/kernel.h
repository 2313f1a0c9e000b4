// The CPU backend's kernel interface: one file per op family in src/cpu/ registers kernels
// with KILN_REGISTER_CPU_KERNELS.
//
// A kernel is created once per node when the engine is built (it may pre-pack constant
// weights then) and run many times. Output tensors arrive allocated with the shapes the op
// schema inferred from the actual inputs; the kernel fills them.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "ir/registry.h"

namespace kiln::cpu {

struct KernelInit {
  const ir::Node& node;
  std::vector<const ir::TensorType*> input_types;  // nullptr for omitted inputs
  std::vector<const Tensor*> constants;            // constant inputs (weights), else nullptr
  std::vector<const ir::TensorType*> output_types;
  bool poison_outputs = false;  // the engine's (CpuEngine): engines of subgraphs do the same
  // Precision::kBf16: products by constant weights (and Attention's) in bfloat16 where the CPU
  // has them (cpu/bf16_gemm.h); kernels without a bfloat16 form ignore it.
  bool bfloat16_products = false;
  // Per input, its values packed before (a loaded engine's, checked), or nullptr. Only inputs a
  // kernel's entry lists in KernelEntry::packed_inputs come packed; constants[i] is then a tensor
  // of the constant's dtype and shape without storage (cpu/packed_weights.h).
  std::vector<const ir::PackedConstant*> packed;

  DType dtype(size_t i) const { return i < input_types.size() && input_types[i] ? input_types[i]->dtype : DType::kUndefined; }
  bool has_input(size_t i) const { return i < input_types.size() && input_types[i]; }
  const ir::PackedConstant* packed_input(size_t i) const { return i < packed.size() ? packed[i] : nullptr; }
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) = 0;
  // An input whose buffer output 0 may be written into, or -1: the kernel reads each of that
  // input's elements only for the output element at the same index, before writing it. The
  // engine hands the buffer over where the input has the output's type and shape, dies at this
  // node and is held by nothing else: a convolution's residual, whose output written in place
  // needs no fresh buffer pulled into the cache for writing (docs/design/cpu-gemm.md, "The
  // residual's buffer as the output").
  virtual int overwritable_input() const { return -1; }
  // True when output 0 is overwritable_input()'s elements in the same order under another shape
  // (Reshape and its kin): the engine hands its buffer over whatever the two shapes are, where the
  // element counts agree, and the kernel then has nothing to copy.
  virtual bool output_reshapes_input() const { return false; }
  // How it computes where that is not plain float32 (the bfloat16 products: "bf16 amx-bf16"), for
  // EngineInfo's layers; "" otherwise.
  virtual std::string tactic() const { return ""; }
  // Constant inputs (of those its entry lists in packed_inputs) that it holds only as these packs
  // and never reads at run: where it is a constant's only reader, the engine keeps the pack in
  // place of the values (cpu/packed_weights.h). An input that came packed (KernelInit::packed) is
  // never read at run either, whether the kernel took the pack or unpacked it.
  virtual std::vector<std::pair<size_t, ir::PackedConstant>> packed_constants() const { return {}; }
};

// A kernel from a lambda, for kernels that keep no state.
using RunFn = std::function<void(const std::vector<const Tensor*>&, std::vector<Tensor>&)>;
std::unique_ptr<Kernel> make_kernel(RunFn fn);

struct KernelEntry {
  std::string op;
  std::string domain;  // "" or "kiln"
  // "" if this node can run here, else why not (e.g. "int8 inputs are not supported").
  std::function<std::string(const KernelInit&)> check;
  std::function<std::unique_ptr<Kernel>(const KernelInit&)> create;
  std::string dtypes;  // for docs/operators.md, e.g. "float32, int64"
  // The kernel makes its outputs itself (If, NonMaxSuppression: their shapes are known only once
  // it has run); the engine hands it undefined tensors, and its schema sees the inputs' types and
  // shapes but not their data.
  bool makes_outputs = false;
  // Inputs whose packs (Kernel::packed_constants) a loaded engine hands this kernel as they are.
  std::vector<size_t> packed_inputs;
};

using KernelRegistry = ir::Registry<KernelEntry>;

// Registers a family of kernels: KILN_REGISTER_CPU_KERNELS(conv) { registry.add({...}); }
#define KILN_REGISTER_CPU_KERNELS(family) KILN_REGISTRY_FAMILY(::kiln::cpu::KernelRegistry, kiln_register_cpu_, family)

// A check that accepts the listed dtypes for input 0 (the common case).
std::function<std::string(const KernelInit&)> accept_dtypes(std::vector<DType> dtypes);

}  // namespace kiln::cpu
