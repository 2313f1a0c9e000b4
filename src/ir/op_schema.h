// Op schemas: for each IR op, how to infer output types and shapes and count FLOPs.
//
// One file per op family in src/ops/ registers its schemas with KILN_REGISTER_OPS. The same
// inference runs at build time (symbolic dims, constant inputs only) and at run time on the
// CPU engine (every input concrete, every value known), so there is one source of truth.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/registry.h"

namespace kiln::ir {

struct InferContext {
  const Node& node;
  // Per input; nullptr for an omitted optional input.
  std::vector<const TensorType*> input_types;
  std::vector<const Tensor*> input_values;      // the data, where known
  std::vector<const Dims*> input_symbolic;      // shape-derived int values, where known
  // Filled by the schema, one per node output.
  std::vector<TensorType> output_types;
  std::vector<std::optional<Dims>> output_symbolic;

  size_t num_inputs() const { return input_types.size(); }
  bool has_input(size_t i) const { return i < input_types.size() && input_types[i]; }
  const TensorType& type(size_t i) const;  // throws if the input is absent
  DType dtype(size_t i) const { return type(i).dtype; }
  // The input's shape; throws kUnsupported when the rank is unknown.
  const Dims& shape(size_t i) const;
  bool shape_known(size_t i) const { return has_input(i) && type(i).shape.has_value(); }
  const Tensor* value(size_t i) const { return i < input_values.size() ? input_values[i] : nullptr; }
  // The input's integer elements when known, as dims (from a constant or a shape chain).
  std::optional<Dims> int_elements(size_t i) const;

  void set_output(size_t i, DType dtype, std::optional<Dims> shape);
  void set_symbolic(size_t i, Dims value);

  // kInvalidModel naming the node.
  [[noreturn]] void fail(const std::string& message) const;
  [[noreturn]] void unsupported(const std::string& message) const;
};

struct FlopsContext {
  const Node& node;
  std::vector<const TensorType*> input_types;
  std::vector<const TensorType*> output_types;
  // Product of known dims; 0 if anything is unknown.
  static int64_t numel(const TensorType* t);
};

struct OpSchema {
  std::string op;
  std::string domain;  // "" (ONNX) or "kiln"
  int min_inputs = 1;
  int max_inputs = 1;
  int min_outputs = 1;
  int max_outputs = 1;
  std::function<void(InferContext&)> infer;
  // Multiply-adds count as 2 FLOPs. Null: counts nothing (data movement).
  std::function<int64_t(const FlopsContext&)> flops;
  // What kiln does not support of this op, for docs/operators.md ("" = nothing known).
  std::string limits;
};

using OpRegistry = Registry<OpSchema>;

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
// Registers a family of ops: KILN_REGISTER_OPS(conv) { registry.add({...}); }
#define KILN_REGISTER_OPS(family) KILN_REGISTRY_FAMILY(::kiln::ir::OpRegistry, kiln_register_ops_, family)

// Runs a node's schema on the given input types/values; returns the output types (and fills
// output symbolic values). Throws with the node named on failure.
InferContext infer_node(const Node& node, const std::vector<const TensorType*>& types,
                        const std::vector<const Tensor*>& values,
                        const std::vector<const Dims*>& symbolic);

// Infers every value's type in a graph (in order), keeping declared output shapes where
// inference knows less. Called after import and by passes that change the graph.
void infer_shapes(Graph& graph);

// After a graph's inputs were bound to shapes or values: forgets what inference derived without
// them (shapes not fully known, symbolic values of computed values), then infers every shape again.
void reinfer_shapes(Graph& graph);

// FLOPs of one node in a graph whose shapes have been inferred (0 if unknown).
int64_t node_flops(const Graph& graph, const Node& node);
// The same for inputs and outputs of these types (a run's actual shapes).
int64_t node_flops(const Node& node, std::vector<const TensorType*> inputs, std::vector<const TensorType*> outputs);

// Helpers shared by schemas.
// Ranks above this are refused: a model declaring one is corrupt, not large.
constexpr int64_t kMaxRank = 64;
// `rank` unknown dims; fails the context when the rank is negative or above kMaxRank.
Dims unknown_dims(const InferContext& ctx, int64_t rank);
// Numpy-style broadcast of two shapes; nullopt if incompatible.
std::optional<Dims> broadcast_dims(const Dims& a, const Dims& b);
// Normalizes a possibly negative axis against a rank; fails the context when out of range.
int64_t normalize_axis(const InferContext& ctx, int64_t axis, int64_t rank);

}  // namespace kiln::ir
