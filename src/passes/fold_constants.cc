// Constant folding: a node whose inputs are all constants is computed once, at build time,
// and its outputs become initializers; a node output whose symbolic value (shape arithmetic
// such as Shape -> Gather on a static dim) is fully known becomes a constant too.
#include <set>

#include "ir/op_schema.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// Ops whose result differs from run to run must stay in the graph.
bool is_nondeterministic(const ir::Node& n) {
  static const std::set<std::string> ops = {"RandomNormal", "RandomUniform", "RandomNormalLike",
                                            "RandomUniformLike", "Multinomial", "Bernoulli"};
  return n.domain.empty() && ops.count(n.op) != 0;
}

// DequantizeLinear of an int8 weight is kept: the quantization stage reads the int8 data
// and its scale from it, and folding would store the weight four times larger.
bool keep_unfolded(const ir::Node& n) { return n.domain.empty() && n.op == "DequantizeLinear"; }

template <class T>
Tensor int_tensor(std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  std::vector<T> cast(values.begin(), values.end());
  return Tensor::from_vector<T>(std::move(shape), cast);
}

// The constant a fully known symbolic value stands for, or an undefined tensor when the
// value's type does not allow it (unknown rank, a dtype other than int32/int64/bool).
Tensor constant_from_symbolic(const ir::Value& v) {
  if (!v.symbolic_value || !ir::all_known(*v.symbolic_value) || v.type.rank() < 0 || v.type.rank() > 1) return {};
  std::vector<int64_t> values = ir::known_values(*v.symbolic_value);
  std::vector<int64_t> shape;
  if (v.type.rank() == 0) {
    if (values.size() != 1) return {};
  } else {
    const ir::Dim& d = (*v.type.shape)[0];
    if (d.known() && d.value != static_cast<int64_t>(values.size())) return {};
    shape.push_back(static_cast<int64_t>(values.size()));
  }
  if (v.type.dtype == DType::kInt64) return int_tensor<int64_t>(shape, values);
  if (v.type.dtype == DType::kInt32) return int_tensor<int32_t>(shape, values);
  if (v.type.dtype == DType::kBool) {  // a comparison's known result (binary.cc compare_symbolic)
    std::vector<bool> bits;
    for (int64_t x : values) bits.push_back(x != 0);
    return Tensor::from_vector<bool>(shape, bits);
  }
  return {};
}

// The total size of the node's outputs computed from its constant inputs, or -1 when the
// schema cannot tell.
int64_t output_bytes(const ir::Node& node, const std::vector<const Tensor*>& inputs) {
  std::vector<ir::TensorType> types(inputs.size());
  std::vector<const ir::TensorType*> type_ptrs(inputs.size(), nullptr);
  std::vector<const ir::Dims*> no_symbolic(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) continue;
    types[i].dtype = inputs[i]->dtype();
    types[i].shape = ir::dims_of(inputs[i]->shape());
    type_ptrs[i] = &types[i];
  }
  ir::InferContext ctx = ir::infer_node(node, type_ptrs, inputs, no_symbolic);
  int64_t bytes = 0;
  for (const ir::TensorType& t : ctx.output_types) {
    if (!t.shape || !ir::all_known(*t.shape)) return -1;
    int64_t n = 1;
    for (const ir::Dim& d : *t.shape) {
      n *= d.value;
      if (n > (int64_t{1} << 40)) return -1;
    }
    bytes += n * static_cast<int64_t>(element_size(t.dtype));
  }
  return bytes;
}

}  // namespace

int fold_constants(ir::Graph& graph, const NodeEvaluator& evaluate, int64_t max_bytes) {
  int folded = 0;
  std::vector<bool> remove(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& node = graph.nodes[i];
    if (is_nondeterministic(node) || keep_unfolded(node)) continue;
    // The engines read graph outputs from node results; a graph output stays computed.
    bool feeds_output = false;
    for (const std::string& o : node.outputs) feeds_output |= !o.empty() && graph.is_graph_output(o);
    if (feeds_output) continue;

    std::vector<const Tensor*> inputs;
    bool all_constant = true;
    for (const std::string& in : node.inputs) {
      const Tensor* t = in.empty() ? nullptr : graph.constant(in);
      if (!in.empty() && !t) all_constant = false;
      inputs.push_back(t);
    }

    std::vector<Tensor> results;
    if (all_constant && evaluate) {
      int64_t bytes = output_bytes(node, inputs);
      if (bytes < 0 || bytes > max_bytes) continue;
      std::optional<std::vector<Tensor>> out = evaluate(node, inputs);
      if (!out || out->size() != node.outputs.size()) continue;
      results = std::move(*out);
    } else {
      // Shape arithmetic whose result no longer depends on a runtime dimension.
      bool all_known = true;
      for (const std::string& o : node.outputs) {
        if (o.empty()) {
          results.emplace_back();
          continue;
        }
        const ir::Value* v = graph.find_value(o);
        Tensor t = v ? constant_from_symbolic(*v) : Tensor();
        if (!t.defined()) {
          all_known = false;
          break;
        }
        results.push_back(std::move(t));
      }
      if (!all_known) continue;
    }

    for (size_t o = 0; o < node.outputs.size(); ++o)
      if (!node.outputs[o].empty()) make_constant(graph, node.outputs[o], std::move(results[o]));
    remove[i] = true;
    ++folded;
  }
  erase_nodes(graph, remove);
  if (folded) graph.prune_values();
  return folded;
}

}  // namespace kiln::passes
