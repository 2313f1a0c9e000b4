#include "compiler/data_dependent_split.h"

#include <algorithm>
#include <map>
#include <set>

#include "cpu/kernel.h"

namespace kiln::compiler {

namespace {

bool makes_its_outputs(const ir::Node& node) {
  const cpu::KernelEntry* entry = cpu::KernelRegistry::instance().find(node.op, node.domain);
  return entry && entry->makes_outputs;
}

bool has_unplanned_output(const ir::Graph& graph, const ir::Node& node, bool symbols_known) {
  for (const std::string& out : node.outputs) {
    if (out.empty()) continue;
    const ir::Value* v = graph.find_value(out);
    if (!v || !v->type.shape) return true;
    for (const ir::Dim& d : *v->type.shape)
      if (!d.known() && !(symbols_known && d.symbolic())) return true;
  }
  return false;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// `graph` with only the nodes `keep` marks, reading `inputs` and computing `outputs`; values no
// node, input or output mentions (constants only the other part reads) dropped.
ir::Graph part_of(const ir::Graph& graph, const std::vector<bool>& keep, std::vector<std::string> inputs,
                  std::vector<std::string> outputs) {
  ir::Graph part = graph;
  part.nodes.clear();
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (keep[i]) part.nodes.push_back(graph.nodes[i]);
  part.inputs = std::move(inputs);
  part.outputs = std::move(outputs);
  part.prune_values();
  return part;
}

}  // namespace

std::string named_nodes(const std::vector<std::string>& nodes, size_t shown) {
  std::string text;
  for (size_t i = 0; i < nodes.size() && i < shown; ++i) text += (i ? ", " : "") + nodes[i];
  if (nodes.size() > shown) text += ", and " + std::to_string(nodes.size() - shown) + " more";
  return text;
}

bool may_have_data_dependent_shapes(const ir::Graph& graph) {
  return std::any_of(graph.nodes.begin(), graph.nodes.end(), [&](const ir::Node& n) {
    return makes_its_outputs(n) || has_unplanned_output(graph, n, /*symbols_known=*/true);
  });
}

std::optional<DataDependentSplit> split_at_data_dependent_shapes(const ir::Graph& graph, const ir::Graph& at_shapes) {
  // Values whose shapes the data decides, by name: the specialized graph may have folded or fused
  // other nodes, but a node whose shapes its data decides has nothing to fold, and keeps its
  // outputs' names.
  std::set<std::string> decided_by_data;
  for (const ir::Node& n : at_shapes.nodes)
    if (makes_its_outputs(n) || has_unplanned_output(at_shapes, n, /*symbols_known=*/false))
      for (const std::string& out : n.outputs)
        if (!out.empty()) decided_by_data.insert(out);

  // The tail: nodes computing such a value, and every node reading a tail node's output.
  std::vector<bool> in_tail(graph.nodes.size(), false);
  std::set<std::string> tail_values;
  DataDependentSplit split;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& n = graph.nodes[i];
    const bool starts = std::any_of(n.outputs.begin(), n.outputs.end(),
                                    [&](const std::string& o) { return decided_by_data.count(o) != 0; });
    const bool follows = std::any_of(n.inputs.begin(), n.inputs.end(),
                                     [&](const std::string& v) { return tail_values.count(v) != 0; });
    if (!starts && !follows) continue;
    in_tail[i] = true;
    if (starts && !follows) split.starts.push_back(n.name + " (" + n.op + ")");
    for (const std::string& out : n.outputs)
      if (!out.empty()) tail_values.insert(out);
  }
  if (tail_values.empty()) return std::nullopt;

  // What the head hands the tail: values head nodes compute that tail nodes read. The tail reads
  // graph inputs and constants itself, and holds as its own constants what a head's Identity
  // passes on of one (exporters write a weight two heads share as a constant and its Identity):
  // a constant is what lets the tail's per-region heads run on the GPU (row_stages.h).
  std::vector<std::string> head_inputs, tail_inputs, head_outputs, tail_outputs;
  std::map<std::string, const Tensor*> tail_constants;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!in_tail[i]) continue;
    for (const std::string& v : graph.nodes[i].inputs) {
      if (v.empty() || tail_values.count(v) || contains(split.handed, v) || tail_constants.count(v)) continue;
      const int producer = graph.producer(v);
      if (producer < 0) continue;
      const ir::Node& p = graph.nodes[static_cast<size_t>(producer)];
      const Tensor* passed = p.op == "Identity" && p.domain.empty() && p.has_input(0) ? graph.constant(p.inputs[0]) : nullptr;
      if (passed) tail_constants.emplace(v, passed);
      else split.handed.push_back(v);
    }
  }
  for (const std::string& in : graph.inputs) {
    bool head_reads = contains(graph.outputs, in) && !tail_values.count(in), tail_reads = false;
    for (size_t i = 0; i < graph.nodes.size(); ++i)
      if (contains(graph.nodes[i].inputs, in)) (in_tail[i] ? tail_reads : head_reads) = true;
    if (head_reads) head_inputs.push_back(in);
    if (tail_reads) tail_inputs.push_back(in);
  }
  for (const std::string& out : graph.outputs) (tail_values.count(out) ? tail_outputs : head_outputs).push_back(out);
  for (const std::string& v : split.handed) {
    tail_inputs.push_back(v);
    if (!contains(head_outputs, v)) head_outputs.push_back(v);
  }
  if (head_outputs.empty())
    throw Error(ErrorKind::kUnsupported, "the model's first nodes already depend on its data (" + split.starts.front() +
                                             "): its GPU part would compute nothing")
        .hint("build it for the CPU engine: --device cpu");
  std::vector<bool> in_head(in_tail.size());
  std::transform(in_tail.begin(), in_tail.end(), in_head.begin(), [](bool t) { return !t; });
  split.head = part_of(graph, in_head, std::move(head_inputs), std::move(head_outputs));
  split.tail = part_of(graph, in_tail, std::move(tail_inputs), std::move(tail_outputs));
  for (const auto& [name, constant] : tail_constants) split.tail.value(name).constant = *constant;
  return split;
}

}  // namespace kiln::compiler
