// Transpose(Reshape(X)) where the Reshape only merges runs of X's adjacent axes ->
// Reshape(Transpose(X)), the permutation carried over to the merged axes:
//
//   X [B, C, H, W] -> Reshape [B, C, H * W] -> Transpose (0, 2, 1)      (flatten(2).transpose(1, 2))
//   X [B, C, H, W] -> Transpose (0, 2, 3, 1) -> Reshape [B, H * W, C]
//
// Both move the same elements; the second reads X in its own axes. That matters where X is a
// convolution's output stored channels-last on the GPU: the Reshape needs X in row-major order
// (a Reformat first), while a Transpose reads any layout, and this one is X's channels-last bytes
// in order (a plain copy). Vision transformers' patch embeddings and detection heads write the
// first form. Only merges are taken (a Reshape that splits an axis changes which axes a
// permutation can name), and only where the new Transpose has at most 6 axes (the GPU's
// strided-copy kernels take 6).
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

constexpr size_t kMaxTransposeRank = 6;

// The runs of `x`'s axes whose products are `merged`'s axes, as [first, last) pairs; empty
// when `merged` is not such a merge (or a dim that must be known is not).
std::vector<std::pair<size_t, size_t>> merge_groups(const ir::Dims& x, const ir::Dims& merged) {
  std::vector<std::pair<size_t, size_t>> groups;
  size_t at = 0;
  for (const ir::Dim& want : merged) {
    const size_t first = at;
    if (at < x.size() && x[at] == want) {
      ++at;  // one axis, equal even when symbolic
    } else {
      if (!want.known()) return {};
      int64_t product = 1;
      while (at < x.size() && x[at].known() && product < want.value) product *= x[at++].value;
      if (product != want.value || at - first < 2) return {};
    }
    groups.push_back({first, at});
  }
  // Trailing axes of size 1 belong to the last run (they do not change its product).
  while (!groups.empty() && at < x.size() && x[at] == ir::Dim(1)) groups.back().second = ++at;
  if (at != x.size()) return {};
  return groups;
}

}  // namespace

int transpose_before_merge(ir::Graph& graph) {
  int rewritten = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& t = graph.nodes[i];
    if (!t.domain.empty() || t.op != "Transpose" || t.inputs.size() != 1 || t.outputs.size() != 1) continue;
    const int ri = graph.producer(t.inputs[0]);
    if (ri < 0 || !only_feeds_one_input(graph, t.inputs[0])) continue;
    const ir::Node& r = graph.nodes[static_cast<size_t>(ri)];
    if (!r.domain.empty() || r.op != "Reshape" || r.inputs.empty()) continue;
    const ir::TensorType *x = type_of(graph, r.inputs[0]), *merged = type_of(graph, t.inputs[0]),
                         *out = type_of(graph, t.outputs[0]);
    if (!x || !merged || !out || !x->shape || !merged->shape || !out->shape || x->rank() <= merged->rank() ||
        static_cast<size_t>(x->rank()) > kMaxTransposeRank)
      continue;
    const auto groups = merge_groups(*x->shape, *merged->shape);
    if (groups.empty()) continue;
    std::vector<int64_t> perm = t.attrs.get_ints("perm", {});
    if (perm.empty())
      for (int a = merged->rank() - 1; a >= 0; --a) perm.push_back(a);
    if (perm.size() != groups.size()) continue;
    std::vector<int64_t> expanded;
    ir::Dims moved;
    for (int64_t p : perm) {
      if (p < 0 || p >= static_cast<int64_t>(groups.size())) {
        expanded.clear();
        break;
      }
      for (size_t a = groups[static_cast<size_t>(p)].first; a < groups[static_cast<size_t>(p)].second; ++a) {
        expanded.push_back(static_cast<int64_t>(a));
        moved.push_back((*x->shape)[a]);
      }
    }
    if (expanded.size() != static_cast<size_t>(x->rank())) continue;
    // The Reshape back needs the output shape as numbers (-1 for one unknown axis at most).
    std::vector<int64_t> target;
    int unknown = 0;
    for (const ir::Dim& d : *out->shape) {
      target.push_back(d.known() ? d.value : -1);
      unknown += !d.known();
    }
    if (unknown > 1) continue;

    const std::string source = r.inputs[0], result = t.outputs[0], name = t.name;
    ir::Node transpose;
    transpose.name = graph.unique_name(name + "_unmerged");
    transpose.op = "Transpose";
    transpose.attrs.set("perm", expanded);
    transpose.inputs = {source};
    transpose.outputs = {graph.unique_name(result + "_unmerged")};
    ir::Value v;
    v.name = transpose.outputs[0];
    v.type.dtype = x->dtype;
    v.type.shape = moved;
    graph.set_value(std::move(v));
    ir::Node reshape;
    reshape.name = name;
    reshape.op = "Reshape";
    reshape.inputs = {transpose.outputs[0],
                      graph.add_constant(name + "_merged_shape",
                                         Tensor::from_vector<int64_t>({static_cast<int64_t>(target.size())}, target))};
    reshape.outputs = {result};
    // The old Reshape loses its reader and dies; the pair takes the Transpose's place.
    graph.nodes[i] = std::move(reshape);
    graph.nodes.insert(graph.nodes.begin() + static_cast<std::ptrdiff_t>(i), std::move(transpose));
    ++i;
    ++rewritten;
  }
  if (rewritten) eliminate_dead_code(graph);
  return rewritten;
}

}  // namespace kiln::passes
