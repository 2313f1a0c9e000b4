// Chains of convolutions -> kiln::ChannelsLastConv (MaxPools and GlobalAveragePools among them
// -> kiln::ChannelsLastMaxPool and kiln::ChannelsLastGlobalAveragePool, elementwise ops among
// them reading and writing channels-last), with Transposes only where a chain meets the rest of
// the graph:
//
//   X -> Conv -> FusedConv(Z = ...) -> ...            (each reads and writes [N, C, H, W])
//   X -> Transpose(0,2,3,1) -> ChannelsLastConv -> ChannelsLastConv -> ... -> Transpose(0,3,1,2)
//
// A chain ("region") is the nodes that `runs` accepts, joined where one's output is another's
// input X or residual Z (a pool's input; any rank-4 input of an elementwise op). Elementwise ops
// join because the same permutation of all their rank-4 operands leaves what they compute
// unchanged: a squeeze-and-excitation block (GlobalAveragePool, two 1x1 convolutions on one
// pixel, a Mul of the block's activations by the [N, C, 1, 1] result) stays in its chain. A
// region is rewritten when it has two convolutions or more and its convolutions' arithmetic
// (FLOPs per image: symbolic dims count as 1; pools and elementwise ops count none) is at least
// `min_flops_per_moved_element` times the elements its Transposes move; other regions stay as
// they are. The channels-first outputs stay in the graph where something else reads them
// (a Transpose each), under their names, so graph outputs and every other reader are unchanged.
// A model's own Transpose(0,2,3,1) of a rewritten convolution's output (ConvNeXt writes one after
// each depthwise convolution) then reads the channels-last output directly.
// A chain's first convolution that `reads_channels_first` accepts (the CPU's: an image of a few
// channels) reads its input as it comes, with no Transpose (attribute input_channels_first).
#include <algorithm>
#include <numeric>
#include <set>

#include "ir/unary_ops.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

const std::vector<int64_t> kToChannelsLast = {0, 2, 3, 1};
const std::vector<int64_t> kToChannelsFirst = {0, 3, 1, 2};

// Elements of one image of a rank-4 value (dims past the first; unknown ones count as 1).
int64_t image_elements(const ir::Graph& graph, const std::string& value) {
  const ir::TensorType* t = type_of(graph, value);
  if (!t || !t->shape) return 0;
  int64_t n = 1;
  for (size_t i = 1; i < t->shape->size(); ++i) n *= (*t->shape)[i].known() ? (*t->shape)[i].value : 1;
  return n;
}

std::optional<ir::Dims> permuted(const ir::Graph& graph, const std::string& value, const std::vector<int64_t>& perm) {
  const ir::TensorType* t = type_of(graph, value);
  if (!t || !t->shape || t->shape->size() != 4) return std::nullopt;
  ir::Dims d;
  for (int64_t p : perm) d.push_back((*t->shape)[static_cast<size_t>(p)]);
  return d;
}

bool is_max_pool(const ir::Node& n) { return n.domain.empty() && n.op == "MaxPool"; }
bool is_global_average_pool(const ir::Node& n) { return n.domain.empty() && n.op == "GlobalAveragePool"; }
bool is_conv(const ir::Node& n) { return n.op == "Conv" || n.op == "FusedConv"; }

bool is_rank4(const ir::Graph& graph, const std::string& value) {
  const ir::TensorType* t = type_of(graph, value);
  return t && t->shape && t->shape->size() == 4;
}

// The inputs that carry [N, C, H, W] activations: a convolution's X and FusedConv's residual Z,
// a pool's X, every rank-4 input of an elementwise op.
std::vector<size_t> activation_inputs(const ir::Graph& graph, const ir::Node& node) {
  if (is_conv(node)) {
    std::vector<size_t> idx{0};
    if (node.op == "FusedConv" && node.has_input(3)) idx.push_back(3);
    return idx;
  }
  if (is_max_pool(node) || is_global_average_pool(node)) return {0};
  std::vector<size_t> idx;
  for (size_t k = 0; k < node.inputs.size(); ++k)
    if (!node.inputs[k].empty() && is_rank4(graph, node.inputs[k])) idx.push_back(k);
  return idx;
}

// Whether every input of `reader` that is `v` is an activation input.
bool reads_only_as_activation(const ir::Graph& graph, const ir::Node& reader, const std::string& v) {
  const std::vector<size_t> act = activation_inputs(graph, reader);
  for (size_t k = 0; k < reader.inputs.size(); ++k)
    if (reader.inputs[k] == v && std::find(act.begin(), act.end(), k) == act.end()) return false;
  return true;
}

int find_root(std::vector<int>& parent, int i) {
  while (parent[static_cast<size_t>(i)] != i) i = parent[static_cast<size_t>(i)] = parent[static_cast<size_t>(parent[static_cast<size_t>(i)])];
  return i;
}

bool is_transpose(const ir::Node& n, const std::vector<int64_t>& perm) {
  return n.domain.empty() && n.op == "Transpose" && n.inputs.size() == 1 && n.outputs.size() == 1 &&
         n.attrs.get_ints("perm") == perm;
}

}  // namespace

bool layout_free_elementwise(const ir::Graph& graph, const ir::Node& node) {
  static const std::set<std::string> kBinary = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"};
  const bool elementwise = node.domain.empty() ? kBinary.count(node.op) || ir::find_unary_op(node.op)
                                               : node.domain == "kiln" && node.op == "FusedElementwise" &&
                                                     node.attrs.get_int("concat_parts", 0) == 0;
  if (!elementwise || node.outputs.size() != 1 || !is_rank4(graph, node.outputs[0])) return false;
  // Operands that are not rank 4 broadcast the same in either layout only when they hold one value.
  for (const std::string& in : node.inputs) {
    if (in.empty() || is_rank4(graph, in)) continue;
    const ir::TensorType* t = type_of(graph, in);
    if (!t || !t->shape) return false;
    for (const ir::Dim& d : *t->shape)
      if (!d.known() || d.value != 1) return false;
  }
  return true;
}

int channels_last_convs(ir::Graph& graph, const ConvLayoutQuery& runs, double min_flops_per_moved_element,
                        const ConvLayoutQuery& reads_channels_first) {
  const size_t count = graph.nodes.size();
  std::vector<bool> candidate(count, false);
  std::vector<int> parent(count);
  std::iota(parent.begin(), parent.end(), 0);
  for (size_t i = 0; i < count; ++i) {
    const ir::Node& n = graph.nodes[i];
    candidate[i] = runs(graph, n) && n.outputs.size() == 1 && permuted(graph, n.outputs[0], kToChannelsLast);
    for (size_t in : activation_inputs(graph, n)) candidate[i] = candidate[i] && permuted(graph, n.inputs[in], kToChannelsLast);
  }
  for (size_t i = 0; i < count; ++i) {
    if (!candidate[i]) continue;
    for (size_t in : activation_inputs(graph, graph.nodes[i])) {
      const int p = graph.producer(graph.nodes[i].inputs[in]);
      if (p >= 0 && candidate[static_cast<size_t>(p)]) parent[static_cast<size_t>(find_root(parent, p))] = find_root(parent, static_cast<int>(i));
    }
  }

  // Per region: convolutions, what its Transposes and its convolutions move.
  struct Region {
    int convs = 0;
    int64_t boundary = 0;  // elements the Transposes move, per image
    double flops = 0;      // the convolutions' arithmetic, per image
    std::set<std::string> inputs_seen;
  };
  std::map<int, Region> regions;
  auto in_region = [&](int node, int root) { return node >= 0 && candidate[static_cast<size_t>(node)] && find_root(parent, node) == root; };
  for (size_t i = 0; i < count; ++i) {
    if (!candidate[i]) continue;
    const int root = find_root(parent, static_cast<int>(i));
    Region& r = regions[root];
    const ir::Node& conv = graph.nodes[i];
    const std::string& y = conv.outputs[0];
    const Tensor* w = !is_conv(conv) || conv.inputs.size() < 2 ? nullptr : graph.constant(conv.inputs[1]);
    if (is_conv(conv)) ++r.convs;
    const int64_t fan_in = w && w->rank() == 4 ? w->dim(1) * w->dim(2) * w->dim(3) : 0;  // multiply-adds per output
    r.flops += 2.0 * static_cast<double>(image_elements(graph, y)) * static_cast<double>(fan_in);
    for (size_t in : activation_inputs(graph, conv)) {
      const std::string& v = conv.inputs[in];
      if (!in_region(graph.producer(v), root) && r.inputs_seen.insert(v).second) r.boundary += image_elements(graph, v);
    }
    bool read_outside = graph.is_graph_output(y);
    for (int c : graph.consumers(y)) {
      const ir::Node& reader = graph.nodes[static_cast<size_t>(c)];
      if (is_transpose(reader, kToChannelsLast) && !graph.is_graph_output(reader.outputs[0])) continue;  // folded below
      read_outside = read_outside || !in_region(c, root) || !reads_only_as_activation(graph, reader, y);
    }
    if (read_outside) r.boundary += image_elements(graph, y);
  }
  std::vector<bool> rewrite(count, false);
  int rewritten = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!candidate[i]) continue;
    const Region& r = regions[find_root(parent, static_cast<int>(i))];
    rewrite[i] = r.convs >= 2 && r.flops >= min_flops_per_moved_element * static_cast<double>(r.boundary);
  }

  std::map<std::string, std::string> channels_last;  // value -> its channels-last copy
  std::set<std::string> rewritten_outputs;           // values a rewritten node makes
  std::vector<ir::Node> nodes;
  nodes.reserve(count + 8);
  auto typed = [&](const std::string& hint, const ir::TensorType& like, std::optional<ir::Dims> dims) {
    ir::Value v;
    v.name = graph.unique_name(hint);
    v.type.dtype = like.dtype;
    v.type.shape = std::move(dims);
    graph.set_value(v);
    return v.name;
  };
  NodeNames node_names(graph);
  auto transpose = [&](const std::string& name, const std::string& in, const std::string& out, const std::vector<int64_t>& perm) {
    ir::Node t;
    t.name = node_names.fresh(name);
    t.op = "Transpose";
    t.inputs = {in};
    t.outputs = {out};
    t.attrs.set("perm", perm);
    return t;
  };
  for (size_t i = 0; i < count; ++i) {
    if (!rewrite[i]) {
      nodes.push_back(std::move(graph.nodes[i]));
      continue;
    }
    ir::Node conv = std::move(graph.nodes[i]);
    for (size_t in : activation_inputs(graph, conv)) {
      std::string& v = conv.inputs[in];
      // A first convolution that reads its input as it comes (an image of a few channels).
      if (in == 0 && is_conv(conv) && !rewritten_outputs.count(v) && reads_channels_first && reads_channels_first(graph, conv)) {
        conv.attrs.set("input_channels_first", int64_t{1});
        continue;
      }
      auto it = channels_last.find(v);
      if (it == channels_last.end()) {
        const std::string nhwc = typed(v + "_channels_last", *type_of(graph, v), permuted(graph, v, kToChannelsLast));
        nodes.push_back(transpose(v + "_to_channels_last", v, nhwc, kToChannelsLast));
        it = channels_last.emplace(v, nhwc).first;
      }
      v = it->second;
    }
    const std::string y = conv.outputs[0];
    const std::string y_nhwc = typed(y + "_channels_last", *type_of(graph, y), permuted(graph, y, kToChannelsLast));
    channels_last[y] = y_nhwc;
    rewritten_outputs.insert(y);
    if (is_conv(conv) || is_max_pool(conv) || is_global_average_pool(conv)) {
      conv.op = is_conv(conv) ? "ChannelsLastConv" : is_max_pool(conv) ? "ChannelsLastMaxPool" : "ChannelsLastGlobalAveragePool";
      conv.domain = "kiln";
    }  // an elementwise op stays itself, on channels-last operands
    conv.outputs = {y_nhwc};
    const std::string conv_name = conv.name;
    nodes.push_back(std::move(conv));
    nodes.push_back(transpose(conv_name + "_to_channels_first", y_nhwc, y, kToChannelsFirst));
    ++rewritten;
  }
  graph.nodes = std::move(nodes);
  if (rewritten == 0) return 0;

  // A Transpose(0,2,3,1) of a rewritten output reads the channels-last copy itself.
  for (const ir::Node& n : graph.nodes) {
    if (!is_transpose(n, kToChannelsLast) || graph.is_graph_output(n.outputs[0])) continue;
    auto it = channels_last.find(n.inputs[0]);
    const int p = graph.producer(n.inputs[0]);
    if (it != channels_last.end() && p >= 0 && is_transpose(graph.nodes[static_cast<size_t>(p)], kToChannelsFirst))
      graph.replace_uses(n.outputs[0], it->second);
  }
  eliminate_dead_code(graph);
  return rewritten;
}

}  // namespace kiln::passes
