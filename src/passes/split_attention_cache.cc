// An Attention with a key/value cache (past_key and past_value, opset 23) computes its present
// key and value as the past ones followed by the new, and attends over them; its causal and
// window masks place query i at i + past_length among the keys. For a backend whose attention
// layer takes no cache (the GPU engine's), this pass writes that out in nodes it has: Concats
// for present_key and present_value (3-D Q, K and V first split into heads, [B, S, H * D] ->
// [B, H, S, D]), an Attention over them without a cache, and the causal and window masking as
// a constant mask of the queries against all the keys (the same key ranges as
// ir::AttentionMasking gives with the cache), combined with the node's own mask: And for a
// boolean one, Add (0 or -inf) for a float32 one. Y goes back to [B, S, H * Dv] for 3-D inputs.
//
// Only where every shape is known (the mask is a constant of the queries and keys counts), the
// node has no nonpad_kv_seqlen and no qk_matmul_output, and its mask, if any, covers every key.
#include <limits>

#include "ops/attention_params.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

class CacheSplit {
 public:
  CacheSplit(ir::Graph& graph, NodeNames& names, const ir::Node& node) : graph_(graph), names_(names), node_(node) {}

  std::string add(const std::string& op, std::vector<std::string> inputs, const std::string& output = "",
                  std::vector<std::pair<std::string, ir::AttrValue>> attrs = {}) {
    ir::Node n;
    n.op = op;
    n.name = names_.fresh(node_.name + "/" + op);
    n.inputs = std::move(inputs);
    for (auto& [key, value] : attrs) n.attrs.set(key, std::move(value));
    std::string out = output;
    if (out.empty()) {
      ir::Value v;
      v.name = names_.fresh(n.name);
      v.type.dtype = graph_.value(n.inputs[0]).type.dtype;
      out = v.name;
      graph_.set_value(std::move(v));
    }
    n.outputs = {out};
    nodes_.push_back(std::move(n));
    return out;
  }
  std::string ints(const std::string& hint, std::vector<int64_t> values) {
    const int64_t n = static_cast<int64_t>(values.size());
    return graph_.add_constant(node_.name + "/" + hint, Tensor::from_vector<int64_t>({n}, values));
  }
  // [B, S, heads * size] -> [B, heads, S, size]
  std::string heads_of(const std::string& value, int64_t heads) {
    const std::string split = add("Reshape", {value, ints("heads_shape", {0, 0, heads, -1})});
    return add("Transpose", {split}, "", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  }
  std::vector<ir::Node>& nodes() { return nodes_; }

 private:
  ir::Graph& graph_;
  NodeNames& names_;
  const ir::Node& node_;
  std::vector<ir::Node> nodes_;
};

// The nodes replacing `node`, or none where it is not split.
std::vector<ir::Node> split(ir::Graph& graph, NodeNames& names, const ir::Node& node) {
  auto given = [&](size_t i) { return i < node.inputs.size() && !node.inputs[i].empty(); };
  if (!given(0) || !given(1) || !given(2) || !given(4) || !given(5) || given(6)) return {};
  if (node.outputs.size() > 3 && !node.outputs[3].empty()) return {};
  const auto q = static_shape(graph, node.inputs[0]), k = static_shape(graph, node.inputs[1]),
             v = static_shape(graph, node.inputs[2]), past_k = static_shape(graph, node.inputs[4]),
             past_v = static_shape(graph, node.inputs[5]);
  if (!q || !k || !v || !past_k || !past_v) return {};
  std::string why;
  const ir::AttentionShape s = ir::attention_shape(node, *q, *k, *v, *past_k, why);
  if (!why.empty() || past_v->size() != 4 || (*past_v)[0] != s.batch || (*past_v)[1] != s.kv_heads ||
      (*past_v)[2] != s.past_seq || (*past_v)[3] != s.v_head_size)
    return {};  // the node's own checks say why when it runs
  const int64_t total = s.total_kv();
  const ir::AttentionMasking masking(node);
  const bool masked_by_position = masking.causal || masking.left >= 0 || masking.right >= 0;
  std::string mask = given(3) ? node.inputs[3] : "";
  DType mask_dtype = DType::kBool;
  if (!mask.empty()) {
    const auto m = static_shape(graph, mask);
    mask_dtype = graph.value(mask).type.dtype;
    if (!m || m->empty() || m->size() > 4 || m->back() != total) return {};
    if (mask_dtype != DType::kBool && mask_dtype != DType::kFloat32) return {};
  }
  // The position mask is q_seq x total: refuse to make a constant past 16 M elements.
  if (masked_by_position && s.q_seq * total > (int64_t{1} << 24)) return {};

  CacheSplit c(graph, names, node);
  std::string query = node.inputs[0], key = node.inputs[1], value = node.inputs[2];
  if (s.three_d) {
    query = c.heads_of(query, s.q_heads);
    key = c.heads_of(key, s.kv_heads);
    value = c.heads_of(value, s.kv_heads);
  }
  const auto output = [&](size_t o) { return o < node.outputs.size() ? node.outputs[o] : std::string(); };
  const std::string present_key = c.add("Concat", {node.inputs[4], key}, output(1), {{"axis", int64_t{2}}});
  const std::string present_value = c.add("Concat", {node.inputs[5], value}, output(2), {{"axis", int64_t{2}}});
  if (masked_by_position) {
    // The keys each query sees, as the kernel with the cache computes them (batch 0: without
    // nonpad_kv_seqlen every batch is the same).
    Tensor allowed(mask_dtype, {s.q_seq, total});
    for (int64_t i = 0; i < s.q_seq; ++i) {
      const ir::AttentionKeyRange range = masking.keys(s, nullptr, 0, i);
      for (int64_t j = 0; j < total; ++j) {
        const bool sees = j >= range.first && j < range.last;
        if (mask_dtype == DType::kBool)
          allowed.data<bool>()[i * total + j] = sees;
        else
          allowed.data<float>()[i * total + j] = sees ? 0.f : -std::numeric_limits<float>::infinity();
      }
    }
    const std::string positions = graph.add_constant(node.name + "/positions", std::move(allowed));
    mask = mask.empty() ? positions : c.add(mask_dtype == DType::kBool ? "And" : "Add", {mask, positions});
  }
  ir::Node attention = node;
  attention.name = names.fresh(node.name + "/without_cache");
  attention.inputs = {query, present_key, present_value};
  if (!mask.empty()) attention.inputs.push_back(mask);
  for (const char* a : {"q_num_heads", "kv_num_heads", "is_causal", "left_window_size", "right_window_size", "qk_matmul_output_mode"})
    attention.attrs.erase(a);
  std::string y = node.outputs[0];
  if (s.three_d) {
    ir::Value heads;
    heads.name = names.fresh(node.name + "/y_heads");
    heads.type.dtype = graph.value(node.outputs[0]).type.dtype;
    graph.set_value(heads);
    y = heads.name;
  }
  attention.outputs = {y};
  c.nodes().push_back(std::move(attention));
  if (s.three_d) {
    const std::string rows = c.add("Transpose", {y}, "", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
    c.add("Reshape", {rows, c.ints("y_shape", {0, 0, -1})}, node.outputs[0]);
  }
  return std::move(c.nodes());
}

}  // namespace

int split_attention_cache(ir::Graph& graph) {
  int made = 0;
  NodeNames names(graph);
  for (size_t n = 0; n < graph.nodes.size();) {
    const ir::Node node = graph.nodes[n];
    std::vector<ir::Node> nodes;
    if (node.op == "Attention" && node.domain.empty()) nodes = split(graph, names, node);
    if (nodes.empty()) {
      ++n;
      continue;
    }
    const auto at = graph.nodes.begin() + static_cast<std::ptrdiff_t>(n);
    graph.nodes.insert(graph.nodes.erase(at), nodes.begin(), nodes.end());
    n += nodes.size();
    ++made;
  }
  return made;
}

}  // namespace kiln::passes
