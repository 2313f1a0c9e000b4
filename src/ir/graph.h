// The graph IR: values with a data type and a shape whose dimensions may be symbolic, and
// nodes in topological order that read and write values by name.
//
// Ops are ONNX ops with the semantics of the newest opset kiln knows (the importer turns
// older forms into that one), plus kiln's own fused ops (domain "kiln"). The IR knows
// nothing of any backend.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln::ir {

// One dimension: known (value >= 0), symbolic (a name such as "N"), or unknown.
struct Dim {
  int64_t value = -1;
  std::string symbol;

  Dim() = default;
  Dim(int64_t v) : value(v) {}  // NOLINT: a known dimension converts implicitly
  static Dim named(std::string name) { Dim d; d.symbol = std::move(name); return d; }
  static Dim unknown() { return Dim(); }

  bool known() const { return value >= 0; }
  bool symbolic() const { return value < 0 && !symbol.empty(); }
  bool operator==(const Dim& o) const {
    return known() ? value == o.value : (o.value < 0 && !symbol.empty() && symbol == o.symbol);
  }
  bool operator!=(const Dim& o) const { return !(*this == o); }
  std::string str() const { return known() ? std::to_string(value) : (symbol.empty() ? "?" : symbol); }
};

using Dims = std::vector<Dim>;

std::string dims_to_string(const Dims& dims);  // "Nx3x224x224"
bool all_known(const Dims& dims);
std::vector<int64_t> known_values(const Dims& dims);  // throws if one is not known
Dims dims_of(const std::vector<int64_t>& shape);
// Throws kInvalidModel ("<what> has shape ...") when the known dimensions would make a tensor
// of `dtype` larger than kMaxTensorBytes (see shape_numel). Every shape that enters the IR (a
// declared one, an inferred one) passes here, so kernels and planners may multiply its
// dimensions without overflow checks.
void check_shape_size(const Dims& dims, DType dtype, const std::string& what);

// A value's type: dtype and shape; shape is nullopt when even the rank is unknown.
struct TensorType {
  DType dtype = DType::kUndefined;
  std::optional<Dims> shape;

  int rank() const { return shape ? static_cast<int>(shape->size()) : -1; }
  std::string str() const;
};

// A constant's values in a backend's own layout (the CPU engine's packed weights), opaque to the
// IR: `layout` names the layout to the backend that made it, `data` holds its bytes.
struct PackedConstant {
  std::string layout;
  Tensor data;
};

struct Value {
  std::string name;
  TensorType type;
  // Set for initializers and folded constants.
  std::optional<Tensor> constant;
  // Set where a backend holds the constant only in its own layout: `constant` is then a tensor of
  // the constant's dtype and shape without storage (Tensor::raw() is null), and whatever reads its
  // values asks that backend (cpu/packed_weights.h).
  std::shared_ptr<const PackedConstant> packed;
  // For small 0-D/1-D integer tensors computed from shapes (Shape -> Gather -> Concat ...):
  // their elements as dims, which may be symbolic. Lets a dynamic-batch Reshape know its shape.
  std::optional<Dims> symbolic_value;
};

using AttrValue = std::variant<int64_t, float, std::string, std::vector<int64_t>,
                               std::vector<float>, std::vector<std::string>, Tensor>;

class Attributes {
 public:
  bool has(const std::string& name) const { return map_.count(name) != 0; }
  void set(const std::string& name, AttrValue value) { map_[name] = std::move(value); }
  void erase(const std::string& name) { map_.erase(name); }
  const std::map<std::string, AttrValue>& all() const { return map_; }

  // Getters throw kInvalidModel when the attribute has another type; the default is
  // returned when it is absent. The node reference is only used for the error message.
  int64_t get_int(const std::string& name, int64_t fallback) const;
  float get_float(const std::string& name, float fallback) const;
  std::string get_string(const std::string& name, const std::string& fallback) const;
  std::vector<int64_t> get_ints(const std::string& name, const std::vector<int64_t>& fallback = {}) const;
  std::vector<float> get_floats(const std::string& name, const std::vector<float>& fallback = {}) const;
  std::vector<std::string> get_strings(const std::string& name, const std::vector<std::string>& fallback = {}) const;
  const Tensor* get_tensor(const std::string& name) const;
  int64_t require_int(const std::string& name) const;

 private:
  std::map<std::string, AttrValue> map_;
};

struct Node {
  std::string name;
  std::string op;      // "Conv", "Relu", "FusedConv" ...
  std::string domain;  // "" for ONNX, "kiln" for kiln's own ops
  std::vector<std::string> inputs;  // "" for an omitted optional input
  std::vector<std::string> outputs;
  Attributes attrs;

  // A kInvalidModel / kUnsupported error that already names this node.
  Error error(ErrorKind kind, const std::string& message) const;
  bool has_input(size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
};

class Graph {
 public:
  std::string name;
  int opset = 0;  // the model's default-domain opset
  std::vector<Node> nodes;  // topological order
  std::vector<std::string> inputs;   // runtime inputs (no initializers)
  std::vector<std::string> outputs;

  bool has_value(const std::string& name) const { return values_.count(name) != 0; }
  Value& value(const std::string& name);
  const Value& value(const std::string& name) const;
  Value* find_value(const std::string& name);
  const Value* find_value(const std::string& name) const;
  // Adds or replaces a value's entry (keeps the name in the entry consistent).
  Value& set_value(Value v);
  void erase_value(const std::string& name) { values_.erase(name); }
  const std::unordered_map<std::string, Value>& values() const { return values_; }

  // The constant tensor behind a value, or nullptr.
  const Tensor* constant(const std::string& name) const;
  // Adds an initializer under a fresh name built from `hint`; returns the name.
  std::string add_constant(const std::string& hint, Tensor t);
  // A name no value or node uses yet.
  std::string unique_name(const std::string& hint);

  // Index of the node producing `value`, or -1 (graph input, constant, or unknown).
  int producer(const std::string& value) const;
  // Indices of nodes reading `value`.
  std::vector<int> consumers(const std::string& value) const;
  bool is_graph_output(const std::string& value) const;

  // Replaces every use of `from` (node inputs and graph outputs) by `to`.
  void replace_uses(const std::string& from, const std::string& to);
  // Drops values that no node, input or output mentions.
  void prune_values();
  // Re-orders nodes topologically; throws kInvalidModel on a cycle or an undefined input.
  void topological_sort();

  int64_t parameter_count() const;  // elements of all constants
  int64_t parameter_bytes() const;

 private:
  std::unordered_map<std::string, Value> values_;
  int64_t name_counter_ = 0;
};

}  // namespace kiln::ir
