#include "compiler/row_stages.h"

#include <algorithm>
#include <map>
#include <set>

#include "ir/op_schema.h"

namespace kiln::compiler {

namespace {

enum class RowRole { kNone, kProduct, kFollower };

bool is(const ir::Node& n, const char* op, const char* domain = "") { return n.op == op && n.domain == domain; }

bool constant_or_absent(const ir::Graph& g, const ir::Node& n, size_t i) {
  return !n.has_input(i) || g.constant(n.inputs[i]) != nullptr;
}

// The shape of a row value: float32 (what the tail's CPU engine hands the GPU), rank `rank` (any
// when 0), the first dimension decided by the data, every other one known.
bool row_shaped(const ir::Graph& g, const std::string& name, int rank) {
  const ir::Value* v = g.find_value(name);
  if (!v || v->constant || v->type.dtype != DType::kFloat32 || !v->type.shape) return false;
  const ir::Dims& dims = *v->type.shape;
  if (dims.empty() || (rank > 0 && static_cast<int>(dims.size()) != rank) || dims[0].known()) return false;
  return std::all_of(dims.begin() + 1, dims.end(), [](const ir::Dim& d) { return d.known() && d.value > 0; });
}

// A Gemm's C as a bias: absent, or one row broadcast to every row (never one value per row, which
// would tie the product to the rows' order).
bool bias_of_every_row(const ir::Graph& g, const ir::Node& n) {
  if (!n.has_input(2)) return true;
  const Tensor* c = g.constant(n.inputs[2]);
  return c && (c->rank() <= 1 || (c->rank() == 2 && c->dim(0) == 1));
}

// What `n` is to a row stage: a product (convolution, matrix product) that computes each row of its
// output from the same row of its first input and constants, a follower that does the same with
// little arithmetic, or neither.
RowRole row_role(const ir::Graph& g, const ir::Node& n) {
  if (n.outputs.size() != 1 || n.outputs[0].empty() || !n.has_input(0)) return RowRole::kNone;
  const std::string& in = n.inputs[0];
  if (is(n, "Conv") || is(n, "FusedConv", "kiln") || is(n, "ConvTranspose")) {
    const bool residual = n.op == "FusedConv" && n.has_input(3);
    return row_shaped(g, in, 4) && !residual && constant_or_absent(g, n, 1) && n.has_input(1) && constant_or_absent(g, n, 2)
               ? RowRole::kProduct
               : RowRole::kNone;
  }
  if (is(n, "Gemm") || is(n, "FusedGemm", "kiln")) {
    const bool residual = n.op == "FusedGemm" && n.has_input(3);
    return row_shaped(g, in, 2) && !residual && n.attrs.get_int("transA", 0) == 0 && n.has_input(1) &&
                   constant_or_absent(g, n, 1) && bias_of_every_row(g, n)
               ? RowRole::kProduct
               : RowRole::kNone;
  }
  if (is(n, "MatMul") || is(n, "FusedMatMul", "kiln")) {
    const bool residual = n.op == "FusedMatMul" && n.has_input(3);
    const Tensor* b = n.has_input(1) ? g.constant(n.inputs[1]) : nullptr;
    return row_shaped(g, in, 2) && !residual && b && b->rank() == 2 && constant_or_absent(g, n, 2) ? RowRole::kProduct
                                                                                               : RowRole::kNone;
  }
  if (is(n, "Flatten")) return n.attrs.get_int("axis", 1) == 1 && row_shaped(g, in, 0) ? RowRole::kFollower : RowRole::kNone;
  if (is(n, "Relu") || is(n, "LeakyRelu") || is(n, "Sigmoid") || is(n, "Tanh"))
    return n.inputs.size() == 1 && row_shaped(g, in, 0) ? RowRole::kFollower : RowRole::kNone;
  return RowRole::kNone;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

std::vector<RowStage> find_row_stages(const ir::Graph& graph) {
  // Nodes join the stage of the value they read: the stage that computes it, or the one that
  // already reads it from outside (a box head's class scores and box deltas both read its last
  // hidden layer; two heads reading one value become one stage).
  std::vector<RowStage> stages;
  std::vector<bool> has_product;
  std::map<std::string, size_t> stage_of_value;  // values stage nodes compute, and each stage's `rows`
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& n = graph.nodes[i];
    const RowRole role = row_role(graph, n);
    if (role == RowRole::kNone) continue;
    auto it = stage_of_value.find(n.inputs[0]);
    size_t s;
    if (it != stage_of_value.end()) {
      s = it->second;
    } else {
      s = stages.size();
      stages.push_back(RowStage{n.inputs[0], {}, {}});
      has_product.push_back(false);
      stage_of_value[n.inputs[0]] = s;
    }
    stages[s].nodes.push_back(i);
    if (role == RowRole::kProduct) has_product[s] = true;
    stage_of_value[n.outputs[0]] = s;
  }

  std::vector<RowStage> kept;
  for (size_t s = 0; s < stages.size(); ++s) {
    if (!has_product[s]) continue;  // activations alone: nothing worth a copy to the GPU and back
    RowStage& stage = stages[s];
    std::set<size_t> members(stage.nodes.begin(), stage.nodes.end());
    for (size_t i : stage.nodes) {
      const std::string& out = graph.nodes[i].outputs[0];
      bool read_outside = graph.is_graph_output(out);
      for (int c : graph.consumers(out))
        if (!members.count(static_cast<size_t>(c))) read_outside = true;
      if (read_outside && !contains(stage.outputs, out)) stage.outputs.push_back(out);
    }
    if (!stage.outputs.empty()) kept.push_back(std::move(stage));
  }
  return kept;
}

ir::Graph row_stage_graph(const ir::Graph& graph, const RowStage& stage) {
  ir::Graph part = graph;
  part.nodes.clear();
  for (size_t i : stage.nodes) part.nodes.push_back(graph.nodes[i]);
  part.inputs = {stage.rows};
  part.outputs = stage.outputs;
  part.prune_values();
  // Shapes again from the input's: every computed value's first dimension becomes "rows".
  for (const ir::Node& n : part.nodes)
    for (const std::string& out : n.outputs)
      if (!out.empty()) part.erase_value(out);
  ir::Value& in = part.value(stage.rows);
  (*in.type.shape)[0] = ir::Dim::named("rows");
  in.symbolic_value.reset();
  ir::infer_shapes(part);
  return part;
}

}  // namespace kiln::compiler
