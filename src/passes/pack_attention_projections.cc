// Q, K and V projected from one tensor by three constant matrices (BERT, RoBERTa, DistilBERT,
// HF ViT: MatMul(X, W_q) + b_q, and the same for K and V) become one product by the matrices
// side by side, X [.., E] times [W_q W_k W_v], with the biases side by side, split into the three
// projections after. One GEMM of 3N columns instead of three of N: at small batches each launch
// and each pass over X costs about as much as the arithmetic.
//
// The Split copies unless fold_attention_views then reads the heads in place from the packed
// product (as it does for GPT-2's or nn.MultiheadAttention's one projection), so the pass packs
// an attention's projections only where that happens: it packs and folds a copy of the graph
// first, and packs in the graph only the attentions whose Split died there. K and V alone are
// packed when Q comes from another tensor (cross-attention).
#include <algorithm>
#include <cstring>
#include <optional>

#include "ir/op_schema.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// X [.., K] times a constant W [K, N], plus an optional constant bias [N]: the projection writing
// `output` (MatMul [+ Add], or kiln::FusedMatMul with no activation or residual). Packed, it is
// written as MatMul and Add again, for fuse_epilogue.
struct Projection {
  std::string output;
  std::string x;
  const Tensor* weight = nullptr;
  const Tensor* bias = nullptr;
  std::vector<std::string> nodes;  // the MatMul, and the bias Add (names)
};

std::optional<Projection> projection_writing(const ir::Graph& g, const std::string& output) {
  Projection p;
  p.output = output;
  const ir::Node* n = producer_node(g, output);
  // kiln::FusedMatMul with a bias and nothing else (an engine's graph is optimized again per
  // shape, after fuse_epilogue made these).
  if (n && n->domain == "kiln" && n->op == "FusedMatMul" && n->outputs.size() == 1 && n->inputs.size() >= 2) {
    const bool plain = n->attrs.get_string("activation", "").empty() && (n->inputs.size() < 4 || n->inputs[3].empty());
    const bool has_bias = n->inputs.size() > 2 && !n->inputs[2].empty();
    p.weight = float_constant(g, n->inputs[1]);
    p.bias = has_bias ? float_constant(g, n->inputs[2]) : nullptr;
    if (!plain || !p.weight || p.weight->rank() != 2 || (has_bias && (!p.bias || p.bias->rank() != 1)) ||
        (p.bias && p.bias->dim(0) != p.weight->dim(1)))
      return std::nullopt;
    p.x = n->inputs[0];
    p.nodes.push_back(n->name);
    return p;
  }
  std::string product = output;
  if (n && n->domain.empty() && n->op == "Add" && n->inputs.size() == 2) {
    for (size_t i = 0; i < 2; ++i) {
      const Tensor* b = float_constant(g, n->inputs[1 - i]);
      const ir::Node* mm = producer_node(g, n->inputs[i]);
      if (b && b->rank() == 1 && mm && mm->domain.empty() && mm->op == "MatMul" && only_feeds_one_input(g, n->inputs[i])) {
        p.bias = b;
        product = n->inputs[i];
        p.nodes.push_back(n->name);
        n = mm;
        break;
      }
    }
  }
  if (!n || !n->domain.empty() || n->op != "MatMul" || n->inputs.size() != 2 || n->outputs.size() != 1 ||
      n->outputs[0] != product)
    return std::nullopt;
  p.weight = float_constant(g, n->inputs[1]);
  if (!p.weight || p.weight->rank() != 2) return std::nullopt;
  if (p.bias && p.bias->dim(0) != p.weight->dim(1)) return std::nullopt;
  p.x = n->inputs[0];
  p.nodes.push_back(n->name);
  return p;
}

// Row-major float32 matrices (or vectors) side by side along their last axis.
Tensor side_by_side(const std::vector<const Tensor*>& parts) {
  const int64_t rows = parts[0]->rank() == 2 ? parts[0]->dim(0) : 1;
  int64_t cols = 0;
  for (const Tensor* t : parts) cols += t->dim(t->rank() - 1);
  Tensor out(DType::kFloat32, parts[0]->rank() == 2 ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{cols});
  float* dst = out.data<float>();
  int64_t at = 0;
  for (const Tensor* t : parts) {
    const int64_t n = t->dim(t->rank() - 1);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * cols + at, t->data<float>() + r * n, static_cast<size_t>(n) * sizeof(float));
    at += n;
  }
  return out;
}

int node_index(const ir::Graph& g, const std::string& name) {
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].name == name) return static_cast<int>(i);
  return -1;
}

// Packs the projections of the attention writing `y` (an Attention node); returns the Split's
// name, or "" when they cannot be packed.
std::string pack(ir::Graph& g, const std::string& y) {
  const int at = g.producer(y);
  if (at < 0) return "";
  const ir::Node att = g.nodes[static_cast<size_t>(at)];
  if (att.inputs.size() < 3) return "";
  std::optional<Projection> proj[3];
  for (size_t i = 0; i < 3; ++i) proj[i] = projection_writing(g, chain_root(g, att.inputs[i]));
  auto packable = [&](const std::optional<Projection>& a, const std::optional<Projection>& b) {
    return a && b && a->x == b->x && a->output != b->output && a->weight->dim(0) == b->weight->dim(0) &&
           (a->bias == nullptr) == (b->bias == nullptr);
  };
  std::vector<Projection> group;
  if (packable(proj[0], proj[1]) && packable(proj[1], proj[2]) && packable(proj[0], proj[2]))
    group = {*proj[0], *proj[1], *proj[2]};
  else if (packable(proj[1], proj[2]))
    group = {*proj[1], *proj[2]};
  else
    return "";

  std::vector<const Tensor*> weights, biases;
  std::vector<int64_t> sizes;
  for (const Projection& p : group) {
    weights.push_back(p.weight);
    if (p.bias) biases.push_back(p.bias);
    sizes.push_back(p.weight->dim(1));
  }
  const std::string base = att.name + "_packed_projection";
  const std::string w = g.add_constant(base + "_weight", side_by_side(weights));
  std::vector<ir::Node> made;
  ir::Node mm;
  mm.op = "MatMul";
  mm.name = g.unique_name(base);
  mm.inputs = {group[0].x, w};
  mm.outputs = {g.unique_name(base + "_product")};
  made.push_back(mm);
  std::string packed = mm.outputs[0];
  if (!biases.empty()) {
    ir::Node add;
    add.op = "Add";
    add.name = g.unique_name(base + "_bias");
    add.inputs = {packed, g.add_constant(base + "_bias", side_by_side(biases))};
    add.outputs = {g.unique_name(base + "_biased")};
    packed = add.outputs[0];
    made.push_back(add);
  }
  ir::Node split;
  split.op = "Split";
  split.name = g.unique_name(base + "_split");
  split.inputs = {packed, g.add_constant(base + "_sizes", Tensor::from_vector<int64_t>({static_cast<int64_t>(sizes.size())}, sizes))};
  split.attrs.set("axis", int64_t{-1});
  // The Split writes the projections' own outputs: everything that read them still does.
  for (const Projection& p : group) split.outputs.push_back(p.output);
  made.push_back(split);

  std::vector<bool> remove(g.nodes.size(), false);
  size_t first = g.nodes.size();
  for (const Projection& p : group)
    for (const std::string& name : p.nodes) {
      const int i = node_index(g, name);
      if (i < 0) return "";  // not reached: the nodes were just found
      remove[static_cast<size_t>(i)] = true;
      first = std::min(first, static_cast<size_t>(i));
    }
  // The packed layers go where the first projection was (X exists there), in order.
  g.nodes.insert(g.nodes.begin() + static_cast<std::ptrdiff_t>(first), made.begin(), made.end());
  remove.insert(remove.begin() + static_cast<std::ptrdiff_t>(first), made.size(), false);
  erase_nodes(g, remove);
  g.topological_sort();
  return split.name;
}

std::vector<std::string> attention_outputs(const ir::Graph& g) {
  std::vector<std::string> out;
  for (const ir::Node& n : g.nodes)
    if (n.domain.empty() && n.op == "Attention" && !n.outputs.empty() && !n.outputs[0].empty()) out.push_back(n.outputs[0]);
  return out;
}

}  // namespace

int pack_attention_projections(ir::Graph& graph) {
  const std::vector<std::string> attentions = attention_outputs(graph);
  if (attentions.empty()) return 0;
  // The trial: pack every attention on a copy (weights are shared, not copied), fold, and see
  // which Splits died.
  ir::Graph trial = graph;
  std::vector<std::pair<std::string, std::string>> tried;  // (attention output, Split name)
  for (const std::string& y : attentions)
    if (std::string split = pack(trial, y); !split.empty()) tried.emplace_back(y, split);
  if (tried.empty()) return 0;
  ir::infer_shapes(trial);
  fold_attention_views(trial);
  int packed = 0;
  for (const auto& [y, split] : tried) {
    if (node_index(trial, split) >= 0) continue;  // the Split still copies: leave these projections
    if (!pack(graph, y).empty()) ++packed;
  }
  if (packed) {
    eliminate_dead_code(graph);
    graph.prune_values();
  }
  return packed;
}

}  // namespace kiln::passes
