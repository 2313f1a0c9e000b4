// kiln::StridedAttention [-> Reshape-like nodes] -> QuantizeLinear (per tensor, to int8, zero
// point 0) -> the attention writing int8 itself: its inputs 4 and 5 take the QuantizeLinear's
// scale and zero point, its output becomes the int8 value, and the reshapes move onto it. An
// INT8 build puts a QuantizeLinear in front of each 8-bit product whose input is a float value
// (compiler/quantize_graph.cc); in a transformer the attention-output projection's input is the
// attention's output, which a quantize layer would read once more and write again (ViT-B/16 at
// batch 128 on an H100: 0.023 ms a block; docs/design/attention.md, "Attention writing int8").
// Only where the float output has no other reader: a float copy would cost what the fusion saves.
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

bool single_constant_of(const ir::Graph& g, const std::string& name, DType dtype) {
  const Tensor* t = name.empty() ? nullptr : g.constant(name);
  return t && t->dtype() == dtype && t->numel() == 1;
}

}  // namespace

int fuse_attention_quantize(ir::Graph& graph) {
  NodeNames names(graph);
  std::vector<ir::Node> added;
  std::vector<bool> remove(graph.nodes.size(), false);
  int fused = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& q = graph.nodes[i];
    if (!is_onnx(&q, "QuantizeLinear") || q.inputs.size() != 3 || q.outputs.size() != 1) continue;
    const ir::TensorType* qt = type_of(graph, q.outputs[0]);
    if (!qt || qt->dtype != DType::kInt8) continue;
    if (!single_constant_of(graph, q.inputs[1], DType::kFloat32) || !single_constant_of(graph, q.inputs[2], DType::kInt8) ||
        graph.constant(q.inputs[2])->data<int8_t>()[0] != 0)
      continue;
    // Back through the reshapes, each read by the next alone, to the attention.
    std::vector<const ir::Node*> reshapes;  // nearest the attention last
    std::string v = q.inputs[0];
    if (sole_consumer(graph, v) != static_cast<int>(i)) continue;
    const ir::Node* p = producer_node(graph, v);
    while (p && reshapes_only(*p) && p->outputs.size() == 1 && !p->inputs.empty() && reshapes.size() < 8 &&
           sole_consumer(graph, p->inputs[0]) == graph.producer(v)) {
      reshapes.push_back(p);
      v = p->inputs[0];
      p = producer_node(graph, v);
    }
    if (!p || p->op != "StridedAttention" || p->domain != "kiln" || p->outputs.size() != 1 || p->outputs[0] != v ||
        p->inputs.size() > 4 || graph.is_graph_output(v))
      continue;
    const ir::TensorType* x = type_of(graph, p->inputs[0]);
    if (!x || x->dtype != DType::kFloat32) continue;
    const int attention_index = graph.producer(v);
    if (remove[static_cast<size_t>(attention_index)]) continue;

    ir::Node a = *p;
    a.inputs.resize(4);  // Q, K, V and the mask (or none)
    a.inputs.push_back(q.inputs[1]);
    a.inputs.push_back(q.inputs[2]);
    const std::string copy = reshapes.empty() ? q.outputs[0] : names.fresh(v + "_int8");
    a.outputs = {copy};
    if (!reshapes.empty()) {
      ir::Value c;
      c.name = copy;
      c.type = graph.value(v).type;
      c.type.dtype = DType::kInt8;
      graph.set_value(c);
    }
    // The reshapes again, on the int8 output, ending at the QuantizeLinear's output.
    reshapes_on_quantized_copy(graph, names, reshapes, copy, q.outputs[0], DType::kInt8, added);
    for (const ir::Node* r : reshapes) remove[static_cast<size_t>(graph.producer(r->outputs[0]))] = true;
    graph.nodes[static_cast<size_t>(attention_index)] = std::move(a);
    remove[i] = true;
    ++fused;
  }
  if (!fused) return 0;
  erase_nodes(graph, remove);
  graph.nodes.insert(graph.nodes.end(), added.begin(), added.end());
  graph.topological_sort();
  graph.prune_values();
  return fused;
}

}  // namespace kiln::passes
