// Small helpers the passes share for reading and rewriting a graph.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::passes {

// Names for the nodes a pass adds while it rebuilds graph.nodes (graph.unique_name sees values,
// not the nodes a pass has moved out): the graph's node names at construction, and each name
// handed out since; a name taken by a node or a value gets "__1", "__2", ... appended.
class NodeNames {
 public:
  explicit NodeNames(const ir::Graph& graph) : graph_(graph) {
    for (const ir::Node& n : graph.nodes) taken_.insert(n.name);
  }
  std::string fresh(const std::string& hint) {
    std::string name = hint;
    for (int k = 1; name.empty() || taken_.count(name) || graph_.has_value(name); ++k) name = hint + "__" + std::to_string(k);
    taken_.insert(name);
    return name;
  }

 private:
  const ir::Graph& graph_;
  std::set<std::string> taken_;
};

// Number of node inputs (counting repeats) that read `value`.
inline int use_count(const ir::Graph& g, const std::string& value) {
  int n = 0;
  for (const ir::Node& node : g.nodes)
    for (const std::string& in : node.inputs)
      if (in == value) ++n;
  return n;
}

// True when `value` is read by exactly one node input and is not a graph output: the
// condition for absorbing the node that produces it into its consumer.
inline bool only_feeds_one_input(const ir::Graph& g, const std::string& value) {
  return !value.empty() && !g.is_graph_output(value) && use_count(g, value) == 1;
}

// The only node reading `value` (index), or -1 when there is not exactly one reading input
// or the value is a graph output.
inline int sole_consumer(const ir::Graph& g, const std::string& value) {
  if (!only_feeds_one_input(g, value)) return -1;
  std::vector<int> c = g.consumers(value);
  return c.size() == 1 ? c[0] : -1;
}

// A float32 constant behind `name`, or nullptr.
inline const Tensor* float_constant(const ir::Graph& g, const std::string& name) {
  const Tensor* t = name.empty() ? nullptr : g.constant(name);
  return t && t->dtype() == DType::kFloat32 ? t : nullptr;
}

// The node at index i, or nullptr for -1.
inline const ir::Node* node_at(const ir::Graph& g, int i) { return i < 0 ? nullptr : &g.nodes[static_cast<size_t>(i)]; }

// Whether n is the ONNX operator `op`.
inline bool is_onnx(const ir::Node* n, const char* op) { return n && n->domain.empty() && n->op == op; }

// For a binary node reading `x` on one side: the other input; "" if `x` is not an input.
inline std::string other_input(const ir::Node& n, const std::string& x) {
  if (n.inputs.size() != 2) return "";
  if (n.inputs[0] == x) return n.inputs[1];
  if (n.inputs[1] == x) return n.inputs[0];
  return "";
}

// The value of a single-output node, or "".
inline std::string out0(const ir::Node* n) { return n && n->outputs.size() == 1 ? n->outputs[0] : std::string(); }

// The one element of a float constant of a single element, or nullopt.
inline std::optional<float> scalar_constant(const ir::Graph& g, const std::string& name) {
  const Tensor* t = name.empty() ? nullptr : g.constant(name);
  if (!t || !is_float(t->dtype()) || t->numel() != 1) return std::nullopt;
  return static_cast<float>(t->value_as_double(0));
}

// Removes the nodes whose flag is set, keeping the order of the others.
inline void erase_nodes(ir::Graph& g, const std::vector<bool>& remove) {
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (i >= remove.size() || !remove[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
}

// The type of a value, or nullptr when the graph does not know it.
inline const ir::TensorType* type_of(const ir::Graph& g, const std::string& name) {
  const ir::Value* v = name.empty() ? nullptr : g.find_value(name);
  return v ? &v->type : nullptr;
}

// The shape of `name` when every dimension is known.
inline std::optional<std::vector<int64_t>> static_shape(const ir::Graph& g, const std::string& name) {
  const ir::TensorType* t = type_of(g, name);
  if (!t || !t->shape || !ir::all_known(*t->shape)) return std::nullopt;
  return ir::known_values(*t->shape);
}

// Replaces a value's entry by a constant with the same name (type taken from the tensor).
inline void make_constant(ir::Graph& g, const std::string& name, Tensor t) {
  ir::Value v;
  v.name = name;
  v.type.dtype = t.dtype();
  v.type.shape = ir::dims_of(t.shape());
  if (t.rank() <= 1 && is_integer(t.dtype()) && t.numel() <= 64) v.symbolic_value = ir::dims_of(t.to_int_vector());
  v.constant = std::move(t);
  g.set_value(std::move(v));
}

// The node writing `value`, or nullptr for a graph input, a constant or an empty name.
inline const ir::Node* producer_node(const ir::Graph& g, const std::string& value) {
  const int p = value.empty() ? -1 : g.producer(value);
  return p < 0 ? nullptr : &g.nodes[static_cast<size_t>(p)];
}

// Layers that change a tensor's shape but not its elements' order.
inline bool reshapes_only(const ir::Node& n) {
  return n.domain.empty() && (n.op == "Reshape" || n.op == "Squeeze" || n.op == "Unsqueeze" || n.op == "Flatten");
}

// The chain `reshapes` (nearest the producer last, each reading the one after it) once more, on
// the quantized copy `copy` of their first input, as nodes appended to `added`: the new values
// are of type `q_type` and shaped as the originals, the last one named `final_output` (the
// QuantizeLinear's output the chain replaces). For the passes that move a QuantizeLinear into
// its producer (fuse_layer_norm_quantize, fuse_attention_quantize).
inline void reshapes_on_quantized_copy(ir::Graph& graph, NodeNames& names, const std::vector<const ir::Node*>& reshapes,
                                       const std::string& copy, const std::string& final_output, DType q_type,
                                       std::vector<ir::Node>& added) {
  const char* suffix = q_type == DType::kInt8 ? "_int8" : "_fp8";
  std::string from = copy;
  for (size_t k = reshapes.size(); k-- > 0;) {
    ir::Node r = *reshapes[k];
    r.name = names.fresh(r.name + "_quantized");
    r.inputs[0] = from;
    if (k == 0) {
      r.outputs[0] = final_output;
    } else {
      r.outputs[0] = names.fresh(r.outputs[0] + suffix);
      ir::Value rv;
      rv.name = r.outputs[0];
      rv.type = graph.value(reshapes[k]->outputs[0]).type;
      rv.type.dtype = q_type;
      graph.set_value(rv);
    }
    from = r.outputs[0];
    added.push_back(std::move(r));
  }
}

// Layers whose output is a strided view of their input 0 (passes/fold_attention_views.cc).
inline bool moves_elements(const ir::Node& n) {
  return reshapes_only(n) || (n.domain.empty() && (n.op == "Transpose" || n.op == "Gather" || n.op == "Slice" || n.op == "Split"));
}

// The furthest tensor `value` comes from through layers that only move elements.
inline std::string chain_root(const ir::Graph& g, std::string value) {
  for (int steps = 0; steps < 64; ++steps) {
    const ir::Node* p = producer_node(g, value);
    if (!p || !moves_elements(*p) || p->inputs.empty() || p->inputs[0].empty()) break;
    value = p->inputs[0];
  }
  return value;
}

}  // namespace kiln::passes
