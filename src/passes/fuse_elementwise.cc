// Elementwise fusion: a maximal group of elementwise float ops (Add Sub Mul Div Max Min and the
// unary ops with float math) whose results all have the group's output shape, and whose inner
// values nothing outside the group reads, becomes one kiln::FusedElementwise node
// (ops/fused_elementwise.h), which reads each input once and writes one output. A Concat whose
// only reader is the group joins it too: the group reads the Concat's inputs where they lie, and
// the concatenation is never written (DenseNet's Concat -> BatchNorm (Mul, Add) -> Relu becomes
// one pass instead of four). Groups grow from their last node backwards through producers.
//
// It runs on graphs with every shape known (an engine's graph once its input shapes are bound),
// after epilogue fusion has taken what a product's epilogue can do.
#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "ops/fused_elementwise.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// Limits of one group: what kiln's CUDA layer takes in its launch parameters.
constexpr size_t kMaxSteps = 16;
constexpr size_t kMaxInputs = 8;        // besides the concatenated parts
constexpr size_t kMaxConcatParts = 64;
constexpr size_t kMaxRank = 8;
constexpr int kMaxLiveResults = 4;

bool is_binary_step(const ir::Node& n) {
  ir::ElementwiseStep step;
  return n.domain.empty() && n.inputs.size() == 2 && parse_elementwise_op(n.op, step) && step.binary;
}

bool is_unary_step(const ir::Node& n) {
  if (!n.domain.empty() || n.inputs.size() != 1) return false;
  const ir::UnaryOpInfo* info = ir::find_unary_op(n.op);
  return info && ir::has_float_math(info->op);
}

// The known shape of a float32 value, or nullopt.
std::optional<std::vector<int64_t>> float_shape(const ir::Graph& g, const std::string& value) {
  const ir::TensorType* t = type_of(g, value);
  if (!t || t->dtype != DType::kFloat32 || !t->shape || !ir::all_known(*t->shape)) return std::nullopt;
  return ir::known_values(*t->shape);
}

class Grouper {
 public:
  explicit Grouper(ir::Graph& g) : g_(g), group_of_(g.nodes.size(), -1) {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      for (const std::string& out : g.nodes[i].outputs)
        if (!out.empty()) producer_[out] = static_cast<int>(i);
      for (const std::string& in : g.nodes[i].inputs)
        if (!in.empty()) readers_[in].insert(static_cast<int>(i));
    }
  }

  int run() {
    std::vector<ir::Node> fused;
    std::vector<bool> remove(g_.nodes.size(), false);
    std::map<int, size_t> replace;  // root node -> index in fused
    for (size_t i = g_.nodes.size(); i-- > 0;) {
      const int root = static_cast<int>(i);
      if (group_of_[i] >= 0 || !fusible(g_.nodes[i])) continue;
      std::optional<ir::Node> node = group_at(root);
      if (!node) continue;
      replace[root] = fused.size();
      fused.push_back(std::move(*node));
    }
    if (fused.empty()) return 0;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      auto r = replace.find(static_cast<int>(i));
      if (r != replace.end()) g_.nodes[i] = std::move(fused[r->second]);
      else if (group_of_[i] >= 0) remove[i] = true;
    }
    erase_nodes(g_, remove);
    return static_cast<int>(fused.size());
  }

 private:
  bool fusible(const ir::Node& n) const {
    if (!is_binary_step(n) && !is_unary_step(n)) return false;
    if (n.outputs.size() != 1 || n.outputs[0].empty()) return false;
    for (const std::string& in : n.inputs)
      if (in.empty() || !float_shape(g_, in)) return false;
    const auto shape = float_shape(g_, n.outputs[0]);
    return shape && shape->size() <= kMaxRank;
  }

  // Whether every node reading `value` is in `members`, and the graph does not output it.
  bool read_only_by(const std::string& value, const std::set<int>& members) const {
    if (g_.is_graph_output(value)) return false;
    auto r = readers_.find(value);
    if (r == readers_.end()) return false;
    return std::all_of(r->second.begin(), r->second.end(), [&](int n) { return members.count(n) != 0; });
  }

  int producer(const std::string& value) const {
    auto p = producer_.find(value);
    return p == producer_.end() ? -1 : p->second;
  }

  // The group whose last node is `root`, as one node; nullopt when it would not pay (one step
  // without a Concat).
  std::optional<ir::Node> group_at(int root) {
    const ir::Node& last = g_.nodes[static_cast<size_t>(root)];
    const std::vector<int64_t> shape = *float_shape(g_, last.outputs[0]);
    std::set<int> members = {root};
    // Grow to a fixed point: a value read twice inside the group joins once both readers have.
    for (bool grew = true; grew;) {
      grew = false;
      for (int m : std::vector<int>(members.begin(), members.end())) {
        for (const std::string& in : g_.nodes[static_cast<size_t>(m)].inputs) {
          const int p = producer(in);
          if (p < 0 || members.count(p) || group_of_[static_cast<size_t>(p)] >= 0) continue;
          const ir::Node& n = g_.nodes[static_cast<size_t>(p)];
          if (!fusible(n) || float_shape(g_, in) != shape || !read_only_by(in, members)) continue;
          std::set<int> bigger = members;
          bigger.insert(p);
          if (bigger.size() > kMaxSteps || external_inputs(bigger).size() > kMaxInputs) continue;
          members = std::move(bigger);
          grew = true;
        }
      }
    }
    // A Concat feeding the group, read by nothing else, whose parts are computed values.
    int concat = -1;
    for (const std::string& in : external_inputs(members)) {
      const int p = producer(in);
      if (p < 0 || group_of_[static_cast<size_t>(p)] >= 0) continue;
      const ir::Node& n = g_.nodes[static_cast<size_t>(p)];
      if (!n.domain.empty() || n.op != "Concat" || n.outputs.size() != 1 || n.inputs.empty() ||
          n.inputs.size() > kMaxConcatParts || float_shape(g_, in) != shape || !read_only_by(in, members))
        continue;
      bool parts_ok = true;
      for (const std::string& part : n.inputs)
        parts_ok = parts_ok && !part.empty() && !g_.constant(part) && float_shape(g_, part);
      if (!parts_ok) continue;
      concat = p;
      break;
    }
    if (members.size() < 2 && concat < 0) return std::nullopt;

    // Registers: the concatenation, then the other inputs in the order the steps first read them.
    std::map<std::string, int> reg;
    ir::Node fused;
    ir::ElementwiseProgram program;
    if (concat >= 0) {
      const ir::Node& c = g_.nodes[static_cast<size_t>(concat)];
      const int64_t rank = static_cast<int64_t>(shape.size());
      int64_t axis = c.attrs.get_int("axis", 0);
      if (axis < 0) axis += rank;
      if (axis < 0 || axis >= rank) return std::nullopt;
      fused.inputs = c.inputs;
      program.concat_parts = static_cast<int>(c.inputs.size());
      program.concat_axis = static_cast<int>(axis);
      program.members.push_back(c.name);
      reg[c.outputs[0]] = 0;
    }
    int next = concat >= 0 ? 1 : 0;
    for (int m : members)
      for (const std::string& in : g_.nodes[static_cast<size_t>(m)].inputs) {
        const int p = producer(in);
        if ((p >= 0 && members.count(p)) || reg.count(in)) continue;
        reg[in] = next++;
        fused.inputs.push_back(in);
      }
    program.inputs = next;
    for (int m : members) {  // node order is topological
      const ir::Node& n = g_.nodes[static_cast<size_t>(m)];
      ir::ElementwiseStep step;
      if (is_binary_step(n)) {
        parse_elementwise_op(n.op, step);
        step.a = reg.at(n.inputs[0]);
        step.b = reg.at(n.inputs[1]);
      } else {
        step.unary_op = ir::float_unary_op_of(n, step.params);
        step.a = reg.at(n.inputs[0]);
      }
      reg[n.outputs[0]] = next++;
      program.steps.push_back(step);
      program.members.push_back(n.name);
    }
    if (program.live_results() > kMaxLiveResults) return std::nullopt;
    fused.name = last.name;
    fused.op = "FusedElementwise";
    fused.domain = "kiln";
    fused.outputs = last.outputs;
    program.store(fused);
    for (int m : members) group_of_[static_cast<size_t>(m)] = root;
    if (concat >= 0) group_of_[static_cast<size_t>(concat)] = root;
    return fused;
  }

  // The values the members read that no member writes, without repeats.
  std::vector<std::string> external_inputs(const std::set<int>& members) const {
    std::vector<std::string> out;
    for (int m : members)
      for (const std::string& in : g_.nodes[static_cast<size_t>(m)].inputs) {
        const int p = producer(in);
        if ((p >= 0 && members.count(p)) || std::find(out.begin(), out.end(), in) != out.end()) continue;
        out.push_back(in);
      }
    return out;
  }

  ir::Graph& g_;
  std::vector<int> group_of_;  // the root of the group a node joined, or -1
  std::unordered_map<std::string, int> producer_;
  std::unordered_map<std::string, std::set<int>> readers_;
};

}  // namespace

int fuse_elementwise(ir::Graph& graph) { return Grouper(graph).run(); }

}  // namespace kiln::passes
