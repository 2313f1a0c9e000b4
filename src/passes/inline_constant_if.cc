// An If whose condition is a constant runs the same branch every time: its nodes take the If's
// place. The branch (a self-contained model: src/onnx/control_flow.cc) is imported with the
// node's inputs' types; its values get fresh names, its inputs become the node's inputs, its
// outputs the node's outputs (through Identity where a branch output is an input, a constant or
// another output too). Passes after it then see through the branch, and a backend without If
// (the GPU engine) can run the model.
#include "onnx/importer.h"
#include "passes/passes.h"

namespace kiln::passes {

namespace {

// The nodes of `branch` wired into `graph` in place of `node`.
std::vector<ir::Node> inline_branch(ir::Graph& graph, const ir::Node& node, const ir::Graph& branch) {
  std::map<std::string, std::string> renamed;
  for (size_t i = 0; i < branch.inputs.size(); ++i) renamed[branch.inputs[i]] = node.inputs[i + 1];
  // Values keep their dtypes; shapes other than constants' are left to the next inference (the
  // branch's own name the dims it did not know).
  auto fresh = [&](const std::string& name, const ir::Value& value) {
    ir::Value v = value;
    if (!v.constant) v.type.shape.reset(), v.symbolic_value.reset();
    v.name = graph.unique_name(node.name + "/" + name);
    renamed[name] = v.name;
    graph.set_value(std::move(v));
    return renamed[name];
  };
  for (const auto& [name, value] : branch.values())
    if (value.constant) fresh(name, value);
  // A branch output that a branch node makes takes the If output's name; the others are copied
  // by Identity nodes.
  std::vector<ir::Node> nodes;
  std::vector<bool> named(branch.outputs.size(), false);
  std::map<std::string, size_t> output_of;
  for (size_t o = 0; o < branch.outputs.size(); ++o)
    if (branch.producer(branch.outputs[o]) >= 0 && !output_of.count(branch.outputs[o])) output_of[branch.outputs[o]] = o;
  for (const ir::Node& n : branch.nodes) {
    ir::Node copy = n;
    copy.name = graph.unique_name(node.name + "/" + n.name);
    for (std::string& in : copy.inputs)
      if (!in.empty()) in = renamed.at(in);
    for (std::string& out : copy.outputs) {
      if (out.empty()) continue;
      if (auto it = output_of.find(out); it != output_of.end()) {  // the If output's value stays as it is
        renamed[out] = node.outputs[it->second];
        named[it->second] = true;
      } else {
        fresh(out, branch.value(out));
      }
      out = renamed.at(out);
    }
    nodes.push_back(std::move(copy));
  }
  for (size_t o = 0; o < branch.outputs.size(); ++o) {
    if (named[o] || node.outputs[o].empty()) continue;
    ir::Node copy;
    copy.op = "Identity";
    copy.name = graph.unique_name(node.name + "/output" + std::to_string(o));
    copy.inputs = {renamed.at(branch.outputs[o])};
    copy.outputs = {node.outputs[o]};
    nodes.push_back(std::move(copy));
  }
  return nodes;
}

}  // namespace

int inline_constant_if(ir::Graph& graph) {
  int inlined = 0;
  for (size_t n = 0; n < graph.nodes.size();) {
    const ir::Node node = graph.nodes[n++];
    if (node.op != "If" || !node.domain.empty() || node.inputs.empty()) continue;
    const Tensor* cond = graph.constant(node.inputs[0]);
    if (!cond || cond->numel() != 1) continue;
    std::vector<ir::TensorType> types;
    for (size_t i = 1; i < node.inputs.size(); ++i) {
      const ir::Value* v = graph.find_value(node.inputs[i]);
      if (!v || !v->type.shape) break;
      types.push_back(v->type);
    }
    if (types.size() + 1 != node.inputs.size()) continue;  // a rank not known yet: a later round
    const std::string attr = cond->value_as_double(0) != 0 ? "then_model" : "else_model";
    ir::Graph branch;
    try {
      branch = onnx_import::import_subgraph(node.attrs.get_string(attr, ""), types, attr);
    } catch (Error& e) {
      if (e.node_name().empty()) e.node(node.name, node.op);
      throw;
    }
    if (branch.outputs.size() != node.outputs.size())
      throw node.error(ErrorKind::kInvalidModel, attr + " gives " + std::to_string(branch.outputs.size()) + " outputs; the node has " +
                                                     std::to_string(node.outputs.size()));
    std::vector<ir::Node> nodes = inline_branch(graph, node, branch);
    const auto at = graph.nodes.begin() + static_cast<std::ptrdiff_t>(n - 1);
    graph.nodes.insert(graph.nodes.erase(at), nodes.begin(), nodes.end());
    n += nodes.size() - 1;  // past the branch's nodes (an If among them: a later round)
    ++inlined;
  }
  return inlined;
}

}  // namespace kiln::passes
