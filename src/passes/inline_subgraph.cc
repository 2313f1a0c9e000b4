#include "passes/inline_subgraph.h"

#include <algorithm>
#include <map>

namespace kiln::passes {

std::vector<ir::Node> inline_subgraph(ir::Graph& graph, NodeNames& names, const std::string& prefix, const ir::Graph& sub,
                                      const std::vector<std::string>& inputs, const std::vector<std::string>& output_names,
                                      std::vector<std::string>& outputs) {
  std::map<std::string, std::string> renamed;
  for (size_t i = 0; i < sub.inputs.size(); ++i) renamed[sub.inputs[i]] = inputs[i];
  auto fresh = [&](const std::string& name, const ir::Value& value) {
    ir::Value v = value;
    if (!v.constant) v.type.shape.reset(), v.symbolic_value.reset();
    v.name = names.fresh(prefix + "/" + name);
    renamed[name] = v.name;
    graph.set_value(std::move(v));
  };
  std::vector<std::string> constants;  // in name order: the fresh names do not depend on a hash's order
  for (const auto& [name, value] : sub.values())
    if (value.constant && !renamed.count(name)) constants.push_back(name);
  std::sort(constants.begin(), constants.end());
  for (const std::string& name : constants) fresh(name, sub.value(name));
  auto graph_name = [&](const std::string& name) {
    auto it = renamed.find(name);
    if (it == renamed.end()) throw Error(ErrorKind::kInternal, prefix + ": value '" + name + "' is read before it is made");
    return it->second;
  };
  // The outputs a node of `sub` makes that take a name of the graph (the first, where one value
  // is several outputs).
  std::map<std::string, std::string> named_output;
  for (size_t o = 0; o < sub.outputs.size() && o < output_names.size(); ++o)
    if (!output_names[o].empty() && sub.producer(sub.outputs[o]) >= 0) named_output.emplace(sub.outputs[o], output_names[o]);
  std::vector<ir::Node> nodes;
  for (const ir::Node& n : sub.nodes) {
    ir::Node copy = n;
    copy.name = names.fresh(prefix + "/" + n.name);
    for (std::string& in : copy.inputs)
      if (!in.empty()) in = graph_name(in);
    for (std::string& out : copy.outputs) {
      if (out.empty()) continue;
      if (auto it = named_output.find(out); it != named_output.end())
        renamed[out] = it->second;  // the graph's value stays as it is
      else
        fresh(out, sub.value(out));
      out = renamed.at(out);
    }
    nodes.push_back(std::move(copy));
  }
  outputs.clear();
  for (const std::string& out : sub.outputs) outputs.push_back(graph_name(out));
  return nodes;
}

}  // namespace kiln::passes
