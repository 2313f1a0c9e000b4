// Channel-group normalizations -> kiln::FusedGroupNorm (ops/normalization.cc), the activation
// after them absorbed:
//   GroupNormalization (opset 21's form)                               [-> activation]
//   InstanceNormalization (num_groups = C)                             [-> activation]
//   Reshape(X, [N, G, -1]) -> InstanceNormalization(scale 1, bias 0) -> Reshape(to X's shape)
//     [-> Mul(gamma per channel)] [-> Add(beta per channel)]           [-> activation]
// The last is how torch.onnx writes torch.nn.GroupNorm below opset 21 (both exporters). As one
// node the tensor is read and written once instead of once per node, and the GPU layer spreads
// a few long groups over every SM (cuda/layers/group_norm.cu).
#include <algorithm>

#include "passes/match_activation.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

struct Found {
  std::vector<int> nodes;  // every node replaced, the anchor (the normalization) included
  ir::Node fused;
};

// The known shape of a float32 value with a known channel dim (dim 1), or nullptr.
const ir::Dims* channel_shape(const ir::Graph& g, const std::string& value, size_t min_rank) {
  const ir::TensorType* t = type_of(g, value);
  if (!t || t->dtype != DType::kFloat32 || !t->shape || t->shape->size() < min_rank || !(*t->shape)[1].known())
    return nullptr;
  return &*t->shape;
}

// Whether `name` is a float32 constant of `count` elements, each `value`.
bool filled_constant(const ir::Graph& g, const std::string& name, int64_t count, float value) {
  const Tensor* t = float_constant(g, name);
  if (!t || t->numel() != count) return false;
  const float* p = t->data<float>();
  return std::all_of(p, p + count, [value](float v) { return v == value; });
}

// A float32 constant that, broadcast against a tensor of rank `rank`, varies only along dim 1
// (C entries): its C values; or nullopt.
std::optional<std::vector<float>> per_channel(const ir::Graph& g, const std::string& name, size_t rank, int64_t c) {
  const Tensor* t = float_constant(g, name);
  if (!t || static_cast<size_t>(t->rank()) > rank) return std::nullopt;
  const size_t lead = rank - static_cast<size_t>(t->rank());
  for (int64_t d = 0; d < t->rank(); ++d)
    if (t->dim(d) != 1 && !(lead + static_cast<size_t>(d) == 1 && t->dim(d) == c)) return std::nullopt;
  std::vector<float> out(static_cast<size_t>(c));
  for (int64_t k = 0; k < c; ++k) out[static_cast<size_t>(k)] = t->data<float>()[t->numel() == 1 ? 0 : k];
  return out;
}

// Whether Reshape node `reshape` gives back X's shape: its output's known dims are X's, or its
// shape is Shape(X).
bool restores_shape(const ir::Graph& g, const ir::Node& reshape, const std::string& x, const ir::Dims& x_shape) {
  const ir::TensorType* t = type_of(g, reshape.outputs[0]);
  if (t && t->shape && *t->shape == x_shape) return true;
  const ir::Node* shape = reshape.inputs.size() == 2 ? producer_node(g, reshape.inputs[1]) : nullptr;
  return is_onnx(shape, "Shape") && shape->inputs.size() == 1 && shape->inputs[0] == x && !shape->attrs.has("start") &&
         !shape->attrs.has("end");
}

// The exporters' GroupNorm around InstanceNormalization node `i`, up to its optional Mul and Add.
std::optional<Found> decomposed(ir::Graph& g, int i, std::string& cur) {
  const ir::Node& norm = g.nodes[static_cast<size_t>(i)];
  const std::string& grouped = norm.inputs[0];
  const int first = g.producer(grouped);
  const ir::Node* split = node_at(g, first);
  if (!is_onnx(split, "Reshape") || sole_consumer(g, grouped) != i) return std::nullopt;
  const std::string& x = split->inputs[0];
  const ir::Dims* xs = channel_shape(g, x, 2);
  const ir::Dims* gs = channel_shape(g, grouped, 3);
  if (!xs || !gs || gs->size() != 3) return std::nullopt;
  const int64_t c = (*xs)[1].value, groups = (*gs)[1].value;
  if (groups < 1 || c % groups != 0) return std::nullopt;
  // [N, G, rest]: the first dim is N, or the last is what the rest of X holds.
  bool rows_ok = (*gs)[0] == (*xs)[0];
  if (!rows_ok && (*gs)[2].known()) {
    int64_t rest = c / groups;
    for (size_t d = 2; d < xs->size(); ++d) rest = (*xs)[d].known() && rest >= 0 ? rest * (*xs)[d].value : -1;
    rows_ok = rest >= 0 && rest == (*gs)[2].value;
  }
  if (!rows_ok || !filled_constant(g, norm.inputs[1], groups, 1.f) || !filled_constant(g, norm.inputs[2], groups, 0.f))
    return std::nullopt;
  const int back_i = sole_consumer(g, norm.outputs[0]);
  const ir::Node* back = node_at(g, back_i);
  if (!is_onnx(back, "Reshape") || back->inputs[0] != norm.outputs[0] || back->outputs.size() != 1 ||
      !restores_shape(g, *back, x, *xs))
    return std::nullopt;
  Found f;
  f.nodes = {first, i, back_i};
  cur = back->outputs[0];
  std::vector<float> gamma(static_cast<size_t>(c), 1.f), beta(static_cast<size_t>(c), 0.f);
  for (const char* op : {"Mul", "Add"}) {
    const int next_i = sole_consumer(g, cur);
    const ir::Node* next = node_at(g, next_i);
    if (!is_onnx(next, op) || next->outputs.size() != 1) continue;
    const std::optional<std::vector<float>> values = per_channel(g, other_input(*next, cur), xs->size(), c);
    if (!values) continue;
    (std::string(op) == "Mul" ? gamma : beta) = *values;
    f.nodes.push_back(next_i);
    cur = next->outputs[0];
  }
  f.fused.inputs = {x, g.add_constant(norm.name + "_gamma", Tensor::from_vector<float>({c}, gamma)),
                    g.add_constant(norm.name + "_beta", Tensor::from_vector<float>({c}, beta))};
  f.fused.attrs.set("num_groups", groups);
  return f;
}

std::optional<Found> match(ir::Graph& g, int i) {
  const ir::Node& n = g.nodes[static_cast<size_t>(i)];
  const bool group = is_onnx(&n, "GroupNormalization"), instance = is_onnx(&n, "InstanceNormalization");
  if ((!group && !instance) || n.inputs.size() != 3 || n.outputs.size() != 1) return std::nullopt;
  std::string cur;
  std::optional<Found> f;
  if (instance) f = decomposed(g, i, cur);
  if (!f) {
    const ir::Dims* xs = channel_shape(g, n.inputs[0], instance ? 3 : 2);
    if (!xs) return std::nullopt;
    f.emplace();
    f->nodes = {i};
    f->fused.inputs = n.inputs;
    f->fused.attrs.set("num_groups", group ? n.attrs.get_int("num_groups", 1) : (*xs)[1].value);
    cur = n.outputs[0];
  }
  const ir::Node& norm = g.nodes[static_cast<size_t>(i)];
  f->fused.attrs.set("epsilon", norm.attrs.get_float("epsilon", 1e-5f));
  std::optional<ActivationMatch> act = match_activation(g, cur);
  if (act) {
    f->nodes.insert(f->nodes.end(), act->nodes.begin(), act->nodes.end());
    cur = act->output;
  }
  (act ? act->act : ir::Activation{}).store(f->fused);
  f->fused.name = norm.name;
  f->fused.op = "FusedGroupNorm";
  f->fused.domain = "kiln";
  f->fused.outputs = {cur};
  std::vector<std::string> members;
  for (int k : f->nodes) members.push_back(g.nodes[static_cast<size_t>(k)].name);
  f->fused.attrs.set("members", members);
  return f;
}

}  // namespace

int fuse_group_norm(ir::Graph& graph) {
  std::vector<Found> found;
  std::vector<bool> taken(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (taken[i]) continue;
    std::optional<Found> f = match(graph, static_cast<int>(i));
    if (!f || std::any_of(f->nodes.begin(), f->nodes.end(), [&](int k) { return taken[static_cast<size_t>(k)]; })) continue;
    for (int k : f->nodes) taken[static_cast<size_t>(k)] = true;
    found.push_back(std::move(*f));
  }
  // Each fused node takes the place of the last node it replaces, where all its inputs exist.
  std::vector<bool> remove(graph.nodes.size(), false);
  for (Found& f : found) {
    const int last = *std::max_element(f.nodes.begin(), f.nodes.end());
    for (int k : f.nodes) remove[static_cast<size_t>(k)] = k != last;
    graph.nodes[static_cast<size_t>(last)] = std::move(f.fused);
  }
  erase_nodes(graph, remove);
  return static_cast<int>(found.size());
}

}  // namespace kiln::passes
