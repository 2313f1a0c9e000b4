// LayerNormalization [-> Reshape-like nodes] -> QuantizeLinear (per tensor) ->
// kiln::QuantizingLayerNorm (ops/normalization.cc), which writes the quantized copy itself, and the
// same reshapes on that copy. INT8 and FP8 builds put a QuantizeLinear in front of each 8-bit
// product whose input is a float value (compiler/quantize_graph.cc; a matrix product reads it
// reshaped to one-pixel images, compiler/gemm_as_conv.h), and in a transformer that value is a
// LayerNorm's output, read once more by the quantize layer (BERT-base at batch 32 on an H100:
// 0.0051 ms a quantize, two a layer; docs/design/int8.md, "LayerNorm writing the 8-bit copy").
// Quantizing commutes with a reshape (it is elementwise). The float output, and the float
// reshapes, stay where anything else reads them (the residual of a later product).
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// Whether `name` is a constant of one value of type `dtype`.
bool single_constant_of(const ir::Graph& g, const std::string& name, DType dtype) {
  const Tensor* t = name.empty() ? nullptr : g.constant(name);
  return t && t->dtype() == dtype && t->numel() == 1;
}

// Whether a LayerNormalization's Mean or InvStdDev output is read (the fused node has no place
// for them).
bool statistics_read(const ir::Graph& g, const ir::Node& norm) {
  for (size_t o = 1; o < norm.outputs.size(); ++o)
    if (!norm.outputs[o].empty() && (g.is_graph_output(norm.outputs[o]) || !g.consumers(norm.outputs[o]).empty())) return true;
  return false;
}

}  // namespace

int fuse_layer_norm_quantize(ir::Graph& graph) {
  NodeNames names(graph);
  std::vector<ir::Node> added;
  std::vector<bool> remove(graph.nodes.size(), false);
  std::vector<std::string> float_outputs;  // of the fused nodes, blanked below where nothing reads them
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& q = graph.nodes[i];
    if (!is_onnx(&q, "QuantizeLinear") || q.inputs.size() != 3 || q.outputs.size() != 1) continue;
    const ir::TensorType* qt = type_of(graph, q.outputs[0]);
    if (!qt || (qt->dtype != DType::kInt8 && qt->dtype != DType::kFloat8E4M3FN)) continue;
    if (!single_constant_of(graph, q.inputs[1], DType::kFloat32) || !single_constant_of(graph, q.inputs[2], qt->dtype)) continue;
    // Back through the reshapes to the LayerNormalization.
    std::vector<const ir::Node*> reshapes;  // nearest the LayerNormalization last
    std::string v = q.inputs[0];
    const ir::Node* p = producer_node(graph, v);
    while (p && reshapes_only(*p) && p->outputs.size() == 1 && !p->inputs.empty() && reshapes.size() < 8) {
      reshapes.push_back(p);
      v = p->inputs[0];
      p = producer_node(graph, v);
    }
    if (!is_onnx(p, "LayerNormalization") || p->outputs.empty() || p->outputs[0] != v || statistics_read(graph, *p)) continue;
    const int norm_index = graph.producer(v);
    const ir::Node& norm = *p;
    const ir::TensorType* x = type_of(graph, norm.inputs[0]);
    if (!x || x->dtype != DType::kFloat32) continue;

    ir::Node f;
    f.op = "QuantizingLayerNorm";
    f.domain = "kiln";
    f.name = norm.name;
    const std::string copy = reshapes.empty() ? q.outputs[0] : names.fresh(v + (qt->dtype == DType::kInt8 ? "_int8" : "_fp8"));
    f.inputs = {norm.inputs[0], norm.inputs[1], norm.inputs.size() > 2 ? norm.inputs[2] : std::string(), q.inputs[1], q.inputs[2]};
    f.outputs = {v, copy};
    f.attrs.set("axis", norm.attrs.get_int("axis", -1));
    f.attrs.set("epsilon", norm.attrs.get_float("epsilon", 1e-5f));
    if (qt->dtype == DType::kFloat8E4M3FN) f.attrs.set("saturate", q.attrs.get_int("saturate", 1));
    if (!reshapes.empty()) {
      ir::Value c;
      c.name = copy;
      c.type = graph.value(v).type;
      c.type.dtype = qt->dtype;
      graph.set_value(c);
    }
    // The reshapes again, on the quantized copy, ending at the QuantizeLinear's output.
    reshapes_on_quantized_copy(graph, names, reshapes, copy, q.outputs[0], qt->dtype, added);
    float_outputs.push_back(v);
    graph.nodes[static_cast<size_t>(norm_index)] = std::move(f);
    remove[i] = true;
  }
  if (float_outputs.empty()) return 0;
  erase_nodes(graph, remove);
  graph.nodes.insert(graph.nodes.end(), added.begin(), added.end());
  graph.topological_sort();    // the float output's readers may stand before the QuantizeLinear's place
  eliminate_dead_code(graph);  // float reshapes that only the QuantizeLinears read
  for (ir::Node& n : graph.nodes)
    if (n.op == "QuantizingLayerNorm" && n.domain == "kiln" && !graph.is_graph_output(n.outputs[0]) &&
        graph.consumers(n.outputs[0]).empty())
      n.outputs[0].clear();
  graph.prune_values();
  return static_cast<int>(float_outputs.size());
}

}  // namespace kiln::passes
