// A Loop whose trip count is a constant, whose condition is never false and whose carried values
// keep their types runs the same iterations every time: its body's nodes, once per iteration,
// take the Loop's place. Each iteration's copy reads the iteration number as a constant and the
// carried values the copy before it computed; the scan outputs are each iteration's value
// stacked by Unsqueeze and Concat. Then passes after it see through the loop (folding what the
// iteration numbers make constant), and a backend without Loop (the GPU engine) runs the model
// without handing it to the CPU engine.
//
// Loops whose carried values change shape (a value extended every iteration, which unrolled
// would copy the whole value each time), whose condition the body computes, or whose unrolled
// nodes would pass kMaxUnrolledNodes stay loops.
#include <algorithm>
#include <set>

#include "onnx/importer.h"
#include "passes/passes.h"

namespace kiln::passes {

namespace {

// Node names for nodes not yet in the graph: unique in it and among each other.
class NodeNames {
 public:
  explicit NodeNames(ir::Graph& graph) : graph_(graph) {}
  std::string operator()(const std::string& hint) {
    std::string name = graph_.unique_name(hint);
    for (int k = 1; !given_.insert(name).second; ++k) name = graph_.unique_name(hint + "_" + std::to_string(k));
    return name;
  }

 private:
  ir::Graph& graph_;
  std::set<std::string> given_;
};

// `sub`'s nodes for `graph`: input i of `sub` reads the value inputs[i], its constants and the
// values its nodes compute get fresh names under `prefix`. `outputs` receives the names that
// `sub`'s outputs have in `graph`.
std::vector<ir::Node> inline_subgraph(ir::Graph& graph, NodeNames& node_name, const std::string& prefix, const ir::Graph& sub,
                                      const std::vector<std::string>& inputs, std::vector<std::string>& outputs) {
  std::map<std::string, std::string> renamed;
  for (size_t i = 0; i < sub.inputs.size(); ++i) renamed[sub.inputs[i]] = inputs[i];
  // Values keep their dtypes; shapes other than constants' are left to the next inference.
  auto fresh = [&](const std::string& name, const ir::Value& value) {
    ir::Value v = value;
    if (!v.constant) v.type.shape.reset(), v.symbolic_value.reset();
    v.name = graph.unique_name(prefix + "/" + name);
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
  std::vector<ir::Node> nodes;
  for (const ir::Node& n : sub.nodes) {
    ir::Node copy = n;
    copy.name = node_name(prefix + "/" + n.name);
    for (std::string& in : copy.inputs)
      if (!in.empty()) in = graph_name(in);
    for (std::string& out : copy.outputs)
      if (!out.empty()) {
        fresh(out, sub.value(out));
        out = renamed.at(out);
      }
    nodes.push_back(std::move(copy));
  }
  outputs.clear();
  for (const std::string& out : sub.outputs) outputs.push_back(graph_name(out));
  return nodes;
}

// Whether `body`'s condition output is true in every iteration: the condition it was given (true
// in each unrolled iteration), a constant true, or either through Identity nodes.
bool condition_stays_true(const ir::Graph& body) {
  std::string cond = body.outputs[0];
  for (size_t hops = 0; hops <= body.nodes.size(); ++hops) {
    if (cond == body.inputs[1]) return true;
    if (const Tensor* c = body.constant(cond)) return c->numel() == 1 && c->value_as_double(0) != 0;
    const int producer = body.producer(cond);
    if (producer < 0 || body.nodes[static_cast<size_t>(producer)].op != "Identity") return false;
    cond = body.nodes[static_cast<size_t>(producer)].inputs[0];
  }
  return false;
}

// Whether each carried value leaves an iteration with the dtype and dims it entered with (dims
// the body does not know count as equal when they are the same named dim).
bool carried_types_stay(const ir::Graph& body, size_t carried) {
  for (size_t k = 0; k < carried; ++k) {
    const ir::Value* in = body.find_value(body.inputs[2 + k]);
    const ir::Value* out = body.find_value(body.outputs[1 + k]);
    if (!in || !out || !in->type.shape || !out->type.shape || in->type.dtype != out->type.dtype) return false;
    const ir::Dims& a = *in->type.shape;
    const ir::Dims& b = *out->type.shape;
    if (a.size() != b.size()) return false;
    for (size_t d = 0; d < a.size(); ++d) {
      if (a[d].known() != b[d].known()) return false;
      if (a[d].known() ? a[d].value != b[d].value : (a[d].symbol.empty() || a[d].symbol != b[d].symbol)) return false;
    }
  }
  return true;
}

}  // namespace

int unroll_loops(ir::Graph& graph) {
  int unrolled = 0;
  for (size_t n = 0; n < graph.nodes.size();) {
    const ir::Node node = graph.nodes[n++];
    if (node.op != "Loop" || !node.domain.empty() || node.inputs.size() < 2 || node.inputs[0].empty()) continue;
    const Tensor* trips = graph.constant(node.inputs[0]);
    if (!trips || trips->numel() != 1) continue;
    const int64_t count = trips->value_as_int(0);
    if (count < 1 || count > kMaxUnrolledTrips) continue;
    if (!node.inputs[1].empty()) {
      const Tensor* cond = graph.constant(node.inputs[1]);
      if (!cond || cond->numel() != 1 || cond->value_as_double(0) == 0) continue;
    }
    const int64_t carried_attr = node.attrs.get_int("carried", -1);
    if (carried_attr < 0 || static_cast<size_t>(carried_attr) + 2 > node.inputs.size() ||
        static_cast<size_t>(carried_attr) > node.outputs.size())
      continue;  // malformed: the Loop's own kernel says why
    const size_t carried = static_cast<size_t>(carried_attr);
    // The body typed as the first iteration sees it: the carried values' own types.
    std::vector<ir::TensorType> types{ir::TensorType{DType::kInt64, ir::Dims{}}, ir::TensorType{DType::kBool, ir::Dims{}}};
    for (size_t i = 2; i < node.inputs.size(); ++i) {
      const ir::Value* v = graph.find_value(node.inputs[i]);
      if (!v || !v->type.shape) break;
      types.push_back(v->type);
    }
    if (types.size() != node.inputs.size()) continue;  // a rank not known yet: a later round
    ir::Graph body;
    try {
      body = onnx_import::import_subgraph(node.attrs.get_string("body_model", ""), types, "body_model");
    } catch (Error& e) {
      if (e.node_name().empty()) e.node(node.name, node.op);
      throw;
    }
    if (body.outputs.size() != 1 + node.outputs.size() || body.inputs.size() != node.inputs.size()) continue;
    if (!condition_stays_true(body) || !carried_types_stay(body, carried)) continue;
    if (body.nodes.size() * static_cast<size_t>(count) > kMaxUnrolledNodes) continue;

    std::vector<ir::Node> nodes;
    NodeNames node_name(graph);
    const std::string cond_true = graph.add_constant(node.name + "/cond", Tensor::scalar<bool>(true));
    std::vector<std::string> feed(node.inputs.begin(), node.inputs.end());
    feed[1] = cond_true;
    const size_t scans = node.outputs.size() - carried;
    std::vector<std::vector<std::string>> scanned(scans);
    for (int64_t i = 0; i < count; ++i) {
      const std::string prefix = node.name + "/iteration" + std::to_string(i);
      feed[0] = graph.add_constant(prefix + "/number", Tensor::scalar<int64_t>(i));
      std::vector<std::string> outputs;
      std::vector<ir::Node> copies = inline_subgraph(graph, node_name, prefix, body, feed, outputs);
      nodes.insert(nodes.end(), std::make_move_iterator(copies.begin()), std::make_move_iterator(copies.end()));
      for (size_t k = 0; k < carried; ++k) feed[2 + k] = outputs[1 + k];
      for (size_t s = 0; s < scans; ++s) scanned[s].push_back(outputs[1 + carried + s]);
    }
    auto add_node = [&](const std::string& op, const std::string& hint, std::vector<std::string> inputs, const std::string& output) {
      ir::Node made;
      made.op = op;
      made.name = node_name(node.name + "/" + hint);
      made.inputs = std::move(inputs);
      made.outputs = {output};
      nodes.push_back(std::move(made));
    };
    for (size_t k = 0; k < carried; ++k)
      if (!node.outputs[k].empty()) add_node("Identity", "carried" + std::to_string(k), {feed[2 + k]}, node.outputs[k]);
    const std::string first_axis = scans ? graph.add_constant(node.name + "/stack_axis", Tensor::from_vector<int64_t>({1}, {0})) : "";
    for (size_t s = 0; s < scans; ++s) {
      const std::string& output = node.outputs[carried + s];
      if (output.empty()) continue;
      std::vector<std::string> rows;
      for (const std::string& value : scanned[s]) {
        ir::Value row;
        row.name = graph.unique_name(value + "/stacked");
        row.type.dtype = graph.value(value).type.dtype;
        graph.set_value(row);
        add_node("Unsqueeze", "stack" + std::to_string(s), {value, first_axis}, row.name);
        rows.push_back(row.name);
      }
      add_node("Concat", "scan" + std::to_string(s), rows, output);
      nodes.back().attrs.set("axis", int64_t{0});
    }
    const auto at = graph.nodes.begin() + static_cast<std::ptrdiff_t>(n - 1);
    graph.nodes.insert(graph.nodes.erase(at), nodes.begin(), nodes.end());
    n = n - 1 + nodes.size();  // past the copies (a Loop among them: a later round)
    ++unrolled;
  }
  return unrolled;
}

}  // namespace kiln::passes
