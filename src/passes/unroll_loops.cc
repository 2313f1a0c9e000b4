// A Loop whose trip count is a constant, whose condition is never false and whose carried values
// keep their types runs the same iterations every time, and so does a Scan whose scanned length
// is known: the body's nodes, once per iteration, take the node's place. Each iteration's copy
// reads the Loop's iteration number as a constant (a Scan's copy its slices, by Gather at a
// constant index) and the carried values or states the copy before it computed; the scan outputs
// are each iteration's element stacked by Unsqueeze and Concat. Then passes after it see through
// the loop (folding what the iteration numbers make constant), and a backend without Loop and
// Scan (the GPU engine) runs the model without handing it to the CPU engine.
//
// Loops whose carried values change shape (a value extended every iteration, which unrolled
// would copy the whole value each time), whose condition the body computes, whose body holds
// control flow of its own, or whose unrolled nodes would pass kMaxUnrolledNodes stay loops.
#include <algorithm>
#include <optional>

#include "ir/op_schema.h"
#include "onnx/importer.h"
#include "passes/inline_subgraph.h"
#include "passes/passes.h"

namespace kiln::passes {

namespace {

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

// Whether each of `count` carried values (body inputs from `first_in`, outputs from `first_out`)
// leaves an iteration with the dtype and dims it entered with (dims the body does not know count
// as equal when they are the same named dim).
bool carried_types_stay(const ir::Graph& body, size_t first_in, size_t first_out, size_t count) {
  for (size_t k = 0; k < count; ++k) {
    const ir::Value* in = body.find_value(body.inputs[first_in + k]);
    const ir::Value* out = body.find_value(body.outputs[first_out + k]);
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

// Whether `body` holds an If, Loop or Scan: unrolled, each copy's could unroll again, and
// nested loops would multiply past kMaxUnrolledNodes.
bool has_control_flow(const ir::Graph& body) {
  return std::any_of(body.nodes.begin(), body.nodes.end(),
                     [](const ir::Node& n) { return n.op == "If" || n.op == "Loop" || n.op == "Scan"; });
}

// Whether a loop's `copies` (its body's nodes, once per iteration) and `stacking` nodes besides
// fit kMaxUnrolledNodes, and the graph with them kMaxUnrolledGraphNodes.
bool fits(const ir::Graph& graph, size_t copies, size_t stacking) {
  return copies <= kMaxUnrolledNodes && graph.nodes.size() + copies + stacking <= kMaxUnrolledGraphNodes + 1;
}

// The types of `node`'s inputs, or none where a rank is not known yet (a later round).
std::optional<std::vector<ir::TensorType>> input_types(const ir::Graph& graph, const ir::Node& node, size_t first) {
  std::vector<ir::TensorType> types;
  for (size_t i = first; i < node.inputs.size(); ++i) {
    const ir::Value* v = graph.find_value(node.inputs[i]);
    if (!v || !v->type.shape) return std::nullopt;
    types.push_back(v->type);
  }
  return types;
}

// The body typed by `types`, the values it reads from the enclosing graph from `first_read` on
// with their values where they are constants there (an Unsqueeze's axes, a Reshape's shape):
// what its copies will read once unrolled, so that its outputs' types are known as they will be.
ir::Graph import_body(const ir::Graph& graph, const ir::Node& node, const std::vector<ir::TensorType>& types, size_t first_read) {
  ir::Graph body;
  try {
    body = onnx_import::import_subgraph(node.attrs.get_string("body_model", ""), types, "body_model");
  } catch (Error& e) {
    if (e.node_name().empty()) e.node(node.name, node.op);
    throw;
  }
  bool constants = false;
  for (size_t i = first_read; i < node.inputs.size() && i < body.inputs.size(); ++i)
    if (const Tensor* c = graph.constant(node.inputs[i])) {
      body.value(body.inputs[i]).constant = *c;
      constants = true;
    }
  if (constants) ir::infer_shapes(body);
  return body;
}

// The nodes that replace one Loop or Scan, as they are made.
class Unrolled {
 public:
  Unrolled(ir::Graph& graph, const ir::Node& node) : graph_(graph), node_(node), names_(graph) {}

  // The body once more, reading `feed`; its outputs' names in the graph.
  std::vector<std::string> iteration(int64_t i, const ir::Graph& body, const std::vector<std::string>& feed) {
    std::vector<std::string> outputs;
    std::vector<ir::Node> copies = inline_subgraph(graph_, names_, prefix(i), body, feed, {}, outputs);
    nodes_.insert(nodes_.end(), std::make_move_iterator(copies.begin()), std::make_move_iterator(copies.end()));
    return outputs;
  }
  std::string prefix(int64_t i) const { return node_.name + "/iteration" + std::to_string(i); }

  // A node of `op` writing a new value of `dtype` (or `output`, where given).
  std::string add(const std::string& op, const std::string& hint, std::vector<std::string> inputs, DType dtype,
                  const std::string& output = "", std::optional<int64_t> axis = std::nullopt) {
    ir::Node made;
    made.op = op;
    made.name = names_.fresh(node_.name + "/" + hint);
    made.inputs = std::move(inputs);
    if (axis) made.attrs.set("axis", *axis);
    if (output.empty()) {
      ir::Value v;
      v.name = names_.fresh(made.name);
      v.type.dtype = dtype;
      graph_.set_value(v);
      made.outputs = {v.name};
    } else {
      made.outputs = {output};
    }
    nodes_.push_back(std::move(made));
    return nodes_.back().outputs[0];
  }

  // `elements` (one per iteration) stacked along `axis` of the stacked rank, last first where
  // `reverse`, into `output`: an Unsqueeze each and a Concat, as the Loop and Scan stack them.
  void stack(const std::vector<std::string>& elements, int64_t axis, bool reverse, const std::string& output, size_t k) {
    const std::string hint = "stack" + std::to_string(k);
    const std::string axes = graph_.add_constant(node_.name + "/" + hint + "_axis", Tensor::from_vector<int64_t>({1}, {axis}));
    std::vector<std::string> rows;
    for (const std::string& e : elements) rows.push_back(add("Unsqueeze", hint, {e, axes}, graph_.value(e).type.dtype));
    if (reverse) std::reverse(rows.begin(), rows.end());
    add("Concat", hint, rows, DType::kUndefined, output, axis);
  }

  // Puts the nodes in the place of the node at `at`; returns the index after them.
  size_t replace(size_t at) {
    auto it = graph_.nodes.begin() + static_cast<std::ptrdiff_t>(at);
    graph_.nodes.insert(graph_.nodes.erase(it), nodes_.begin(), nodes_.end());
    return at + nodes_.size();
  }

 private:
  ir::Graph& graph_;
  const ir::Node& node_;
  NodeNames names_;
  std::vector<ir::Node> nodes_;
};

// Loop: inputs M, cond, `carried` values, then what the body reads; the body takes (iteration,
// cond, carried..., reads...) and gives (cond, carried..., scans...). Scan outputs stack along a
// new first axis.
bool unroll_loop(ir::Graph& graph, size_t at, size_t& next) {
  const ir::Node& node = graph.nodes[at];
  if (node.inputs.size() < 2 || node.inputs[0].empty()) return false;
  const Tensor* trips = graph.constant(node.inputs[0]);
  if (!trips || trips->numel() != 1) return false;
  const int64_t count = trips->value_as_int(0);
  if (count < 1 || count > kMaxUnrolledTrips) return false;
  if (!node.inputs[1].empty()) {
    const Tensor* cond = graph.constant(node.inputs[1]);
    if (!cond || cond->numel() != 1 || cond->value_as_double(0) == 0) return false;
  }
  const int64_t carried_attr = node.attrs.get_int("carried", -1);
  if (carried_attr < 0 || static_cast<size_t>(carried_attr) + 2 > node.inputs.size() ||
      static_cast<size_t>(carried_attr) > node.outputs.size())
    return false;  // malformed: the Loop's own kernel says why
  const size_t carried = static_cast<size_t>(carried_attr);
  // The body typed as the first iteration sees it: the carried values' own types.
  std::optional<std::vector<ir::TensorType>> types = input_types(graph, node, 2);
  if (!types) return false;
  types->insert(types->begin(), {ir::TensorType{DType::kInt64, ir::Dims{}}, ir::TensorType{DType::kBool, ir::Dims{}}});
  const ir::Graph body = import_body(graph, node, *types, 2 + carried);
  if (body.outputs.size() != 1 + node.outputs.size() || body.inputs.size() != node.inputs.size()) return false;
  if (!condition_stays_true(body) || !carried_types_stay(body, 2, 1, carried)) return false;
  const size_t iterations = static_cast<size_t>(count), scans = node.outputs.size() - carried;
  if (has_control_flow(body) || !fits(graph, body.nodes.size() * iterations, carried + scans * (iterations + 1))) return false;

  const ir::Node loop = node;  // `node` goes when the graph's nodes change
  Unrolled unrolled(graph, loop);
  std::vector<std::string> feed(loop.inputs.begin(), loop.inputs.end());
  feed[1] = graph.add_constant(loop.name + "/cond", Tensor::scalar<bool>(true));
  std::vector<std::vector<std::string>> elements(scans);
  for (int64_t i = 0; i < count; ++i) {
    feed[0] = graph.add_constant(unrolled.prefix(i) + "/number", Tensor::scalar<int64_t>(i));
    const std::vector<std::string> outputs = unrolled.iteration(i, body, feed);
    for (size_t k = 0; k < carried; ++k) feed[2 + k] = outputs[1 + k];
    for (size_t k = 0; k < scans; ++k) elements[k].push_back(outputs[1 + carried + k]);
  }
  for (size_t k = 0; k < carried; ++k)
    if (!loop.outputs[k].empty()) unrolled.add("Identity", "carried" + std::to_string(k), {feed[2 + k]}, DType::kUndefined, loop.outputs[k]);
  for (size_t k = 0; k < scans; ++k)
    if (!loop.outputs[carried + k].empty()) unrolled.stack(elements[k], 0, false, loop.outputs[carried + k], k);
  next = unrolled.replace(at);
  return true;
}

// Scan: inputs the states, the scanned values, then what the body reads; the body takes the
// states, one slice of each scanned value (along its axis, forward or reversed) and the values
// read, and gives the states and one element of each scan output.
bool unroll_scan(ir::Graph& graph, size_t at, size_t& next) {
  const ir::Node& node = graph.nodes[at];
  if (node.attrs.get_int("batched", 0) != 0) return false;  // opset 8's form: a scan per batch entry
  const int64_t states_attr = node.attrs.get_int("states", -1), scanned_attr = node.attrs.get_int("num_scan_inputs", -1);
  if (states_attr < 0 || scanned_attr < 1 || static_cast<size_t>(states_attr + scanned_attr) > node.inputs.size() ||
      static_cast<size_t>(states_attr) > node.outputs.size())
    return false;  // malformed: the Scan's own kernel says why
  const size_t states = static_cast<size_t>(states_attr), scanned = static_cast<size_t>(scanned_attr);
  const size_t scans = node.outputs.size() - states;
  std::vector<int64_t> input_axes = node.attrs.get_ints("scan_input_axes", std::vector<int64_t>(scanned, 0));
  const std::vector<int64_t> input_reverse = node.attrs.get_ints("scan_input_directions", std::vector<int64_t>(scanned, 0));
  const std::vector<int64_t> output_axes = node.attrs.get_ints("scan_output_axes", std::vector<int64_t>(scans, 0));
  const std::vector<int64_t> output_reverse = node.attrs.get_ints("scan_output_directions", std::vector<int64_t>(scans, 0));
  if (input_axes.size() != scanned || input_reverse.size() != scanned || output_axes.size() != scans ||
      output_reverse.size() != scans)
    return false;
  std::optional<std::vector<ir::TensorType>> types = input_types(graph, node, 0);
  if (!types) return false;
  // The length: every scanned value's axis, known and the same; the body sees a slice.
  int64_t length = -1;
  for (size_t j = 0; j < scanned; ++j) {
    ir::Dims& dims = *(*types)[states + j].shape;
    const int64_t rank = static_cast<int64_t>(dims.size());
    int64_t& axis = input_axes[j];
    if (axis < -rank || axis >= rank) return false;
    if (axis < 0) axis += rank;
    const ir::Dim d = dims[static_cast<size_t>(axis)];
    if (!d.known() || (length >= 0 && d.value != length)) return false;
    length = d.value;
    dims.erase(dims.begin() + axis);
  }
  if (length < 1 || length > kMaxUnrolledTrips) return false;
  const ir::Graph body = import_body(graph, node, *types, states + scanned);
  if (body.outputs.size() != node.outputs.size() || body.inputs.size() != node.inputs.size()) return false;
  if (!carried_types_stay(body, 0, 0, states)) return false;
  const size_t steps = static_cast<size_t>(length);
  if (has_control_flow(body) || !fits(graph, (body.nodes.size() + scanned) * steps, states + scans * (steps + 1))) return false;
  std::vector<int64_t> stack_axes;  // each scan output's axis, of the stacked rank
  for (size_t k = 0; k < scans; ++k) {
    const ir::Value* element = body.find_value(body.outputs[states + k]);
    if (!element || !element->type.shape) return false;
    const int64_t rank = static_cast<int64_t>(element->type.shape->size()) + 1;
    if (output_axes[k] < -rank || output_axes[k] >= rank) return false;
    stack_axes.push_back(output_axes[k] < 0 ? output_axes[k] + rank : output_axes[k]);
  }

  const ir::Node scan = node;  // `node` goes when the graph's nodes change
  Unrolled unrolled(graph, scan);
  std::vector<std::string> feed(scan.inputs.begin(), scan.inputs.end());
  std::vector<std::vector<std::string>> elements(scans);
  for (int64_t t = 0; t < length; ++t) {
    for (size_t j = 0; j < scanned; ++j) {
      const std::string& input = scan.inputs[states + j];
      const int64_t index = input_reverse[j] ? length - 1 - t : t;
      const std::string at_index = graph.add_constant(unrolled.prefix(t) + "/index" + std::to_string(j),
                                                      Tensor::scalar<int64_t>(index));
      feed[states + j] = unrolled.add("Gather", "iteration" + std::to_string(t) + "/slice" + std::to_string(j),
                                      {input, at_index}, graph.value(input).type.dtype, "", input_axes[j]);
    }
    const std::vector<std::string> outputs = unrolled.iteration(t, body, feed);
    for (size_t k = 0; k < states; ++k) feed[k] = outputs[k];
    for (size_t k = 0; k < scans; ++k) elements[k].push_back(outputs[states + k]);
  }
  for (size_t k = 0; k < states; ++k)
    if (!scan.outputs[k].empty()) unrolled.add("Identity", "state" + std::to_string(k), {feed[k]}, DType::kUndefined, scan.outputs[k]);
  for (size_t k = 0; k < scans; ++k)
    if (!scan.outputs[states + k].empty())
      unrolled.stack(elements[k], stack_axes[k], output_reverse[k] != 0, scan.outputs[states + k], k);
  next = unrolled.replace(at);
  return true;
}

}  // namespace

int unroll_loops(ir::Graph& graph) {
  int unrolled = 0;
  for (size_t n = 0; n < graph.nodes.size();) {
    const ir::Node& node = graph.nodes[n];
    size_t next = n + 1;
    // (A Loop or Scan among the copies: a later round.)
    if (node.domain.empty() && ((node.op == "Loop" && unroll_loop(graph, n, next)) || (node.op == "Scan" && unroll_scan(graph, n, next)))) {
      ++unrolled;
      // The copies' types, for the loops after this one that read them (a chain of loops
      // unrolls in one call, not one loop per round of the optimizer).
      ir::infer_shapes(graph);
    }
    n = next;
  }
  return unrolled;
}

}  // namespace kiln::passes
