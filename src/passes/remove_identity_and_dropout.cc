// Identity, inference-mode Dropout and a Cast (or CastLike) to the type its input already has
// copy their input: their consumers can read the input directly. (Exporters write such Casts
// after a Softmax computed in float32 for a float32 model; left in, they hide the attention
// pattern.) When the copy is a graph output, the output's name is kept (callers bind it) by
// renaming the producer's output instead.
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// True for a Dropout that is the identity at inference: training_mode absent or a constant
// false, and the mask output unused.
bool is_inference_dropout(const ir::Graph& g, const ir::Node& n) {
  if (n.outputs.size() > 1 && !n.outputs[1].empty() &&
      (g.is_graph_output(n.outputs[1]) || !g.consumers(n.outputs[1]).empty()))
    return false;
  if (n.has_input(2)) {
    const Tensor* training = g.constant(n.inputs[2]);
    if (!training || training->numel() != 1 || training->value_as_int(0) != 0) return false;
  }
  return true;
}

// True for a Cast or CastLike whose input already has the target type.
bool is_identity_cast(const ir::Graph& g, const ir::Node& n) {
  const ir::Value* x = g.find_value(n.inputs[0]);
  if (!x || x->type.dtype == DType::kUndefined) return false;
  if (n.op == "CastLike") {
    const ir::Value* like = n.inputs.size() > 1 ? g.find_value(n.inputs[1]) : nullptr;
    return like && like->type.dtype == x->type.dtype;
  }
  return n.attrs.get_int("to", -1) == static_cast<int64_t>(x->type.dtype);
}

}  // namespace

int remove_identity_and_dropout(ir::Graph& graph) {
  int removed = 0;
  std::vector<bool> remove(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    ir::Node& node = graph.nodes[i];
    if (!node.domain.empty() || node.inputs.empty() || node.outputs.empty()) continue;
    if (node.op == "Identity") {
      // Identity of a non-tensor (sequence) input does not exist in kiln's IR.
    } else if (node.op == "Dropout") {
      if (!is_inference_dropout(graph, node)) continue;
    } else if (node.op == "Cast" || node.op == "CastLike") {
      if (!is_identity_cast(graph, node)) continue;
    } else {
      continue;
    }
    const std::string x = node.inputs[0];
    const std::string y = node.outputs[0];
    if (x.empty() || y.empty()) continue;

    if (!graph.is_graph_output(y)) {
      remove[i] = true;
      graph.replace_uses(y, x);
      ++removed;
      continue;
    }
    // y is a graph output: its producer can write y directly, provided x is an intermediate
    // value (not a graph input, constant or another graph output, which must stay distinct).
    int p = graph.producer(x);
    if (p < 0 || graph.is_graph_output(x)) continue;
    remove[i] = true;
    for (std::string& o : graph.nodes[static_cast<size_t>(p)].outputs)
      if (o == x) o = y;
    for (size_t k = 0; k < graph.nodes.size(); ++k)
      if (k != i)
        for (std::string& in : graph.nodes[k].inputs)
          if (in == x) in = y;
    // The producer's type (what inference computed) wins over y's declaration.
    if (const ir::Value* xv = graph.find_value(x)) {
      ir::Value yv = *xv;
      yv.name = y;
      const ir::Value* declared = graph.find_value(y);
      if (!yv.type.shape && declared) yv.type.shape = declared->type.shape;
      graph.set_value(std::move(yv));
    }
    ++removed;
  }
  erase_nodes(graph, remove);
  if (removed) graph.prune_values();
  return removed;
}

}  // namespace kiln::passes
