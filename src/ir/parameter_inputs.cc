#include "ir/parameter_inputs.h"

#include <algorithm>
#include <map>
#include <set>

namespace kiln::ir {

namespace {

// ONNX ops (default domain) and the inputs of each that are parameters.
const std::map<std::string, std::vector<size_t>>& parameter_slots() {
  static const std::map<std::string, std::vector<size_t>> slots = {
      {"CenterCropPad", {1}},   {"Clip", {1, 2}},          {"Col2Im", {1, 2}},
      {"ConstantOfShape", {0}}, {"CumProd", {1}},          {"CumSum", {1}},
      {"DequantizeLinear", {1, 2}},                        {"DFT", {1, 2}},
      {"Dropout", {1, 2}},      {"Expand", {1}},           {"OneHot", {1}},
      {"Pad", {1, 2, 3}},       {"QuantizeLinear", {1, 2}}, {"Range", {0, 1, 2}},
      {"ReduceL1", {1}},        {"ReduceL2", {1}},         {"ReduceLogSum", {1}},
      {"ReduceLogSumExp", {1}}, {"ReduceMax", {1}},        {"ReduceMean", {1}},
      {"ReduceMin", {1}},       {"ReduceProd", {1}},       {"ReduceSum", {1}},
      {"ReduceSumSquare", {1}}, {"Reshape", {1}},          {"Resize", {1, 2, 3}},
      {"Slice", {1, 2, 3, 4}},  {"Split", {1}},            {"Squeeze", {1}},
      {"Tile", {1}},            {"TopK", {1}},             {"Trilu", {1}},
      {"Unsqueeze", {1}},       {"Upsample", {1}},
  };
  return slots;
}

}  // namespace

bool is_parameter_slot(const Node& node, size_t index) {
  if (!node.domain.empty() && node.domain != "ai.onnx") return false;
  auto it = parameter_slots().find(node.op);
  return it != parameter_slots().end() && std::find(it->second.begin(), it->second.end(), index) != it->second.end();
}

std::vector<std::string> parameter_inputs(const Graph& graph, int64_t max_elements) {
  // Walk back from every parameter slot through the producers of the values it reads.
  std::map<std::string, const Node*> producer;
  for (const Node& n : graph.nodes)
    for (const std::string& out : n.outputs)
      if (!out.empty()) producer[out] = &n;
  std::set<std::string> reached;
  std::vector<std::string> pending;
  for (const Node& n : graph.nodes)
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (!n.inputs[i].empty() && is_parameter_slot(n, i)) pending.push_back(n.inputs[i]);
  while (!pending.empty()) {
    const std::string v = pending.back();
    pending.pop_back();
    if (!reached.insert(v).second) continue;
    auto it = producer.find(v);
    if (it == producer.end()) continue;
    const Node& n = *it->second;
    if (n.op == "Shape" || n.op == "Size") continue;
    for (const std::string& in : n.inputs)
      if (!in.empty()) pending.push_back(in);
  }
  std::vector<std::string> out;
  for (const std::string& in : graph.inputs) {
    if (!reached.count(in)) continue;
    const Value* v = graph.find_value(in);
    if (!v || !v->type.shape || !all_known(*v->type.shape)) continue;
    int64_t elements = 1;
    for (const Dim& d : *v->type.shape) elements = d.value > max_elements ? max_elements + 1 : std::min(elements * d.value, max_elements + 1);
    if (elements <= max_elements) out.push_back(in);
  }
  return out;
}

}  // namespace kiln::ir
