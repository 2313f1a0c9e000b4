// ReduceMean over the two spatial axes of an [N, C, H, W] float32 value (PyTorch's x.mean((2, 3)),
// MnasNet's pooling) -> GlobalAveragePool, followed by Flatten(axis 1) where keepdims is 0:
//
//   X -> ReduceMean(axes [2, 3] or [-2, -1], keepdims 1) -> Y   =>   X -> GlobalAveragePool -> Y
//   X -> ReduceMean(axes [2, 3], keepdims 0) -> Y   =>   X -> GlobalAveragePool -> Flatten(1) -> Y
//
// The CPU engine's layout pass keeps a GlobalAveragePool in its chain of channels-last
// convolutions (its Transpose back then moves C values an image); a ReduceMean ended the chain
// with a Transpose of the whole activation: MnasNet's last 1x1 layer, Transpose, ReduceMean and
// classifier 0.32 -> 0.26 ms on two threads (docs/design/cpu-gemm.md, "Spatial means as
// GlobalAveragePool"). The axes are a constant (input 1); Y keeps its name.
#include <algorithm>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// The normalized axes of a ReduceMean node on a rank-4 input (the IR's input 1, where the importer
// moves the attribute of opsets before 18), or empty where they are not a constant.
std::vector<int64_t> reduced_axes(const ir::Graph& g, const ir::Node& n) {
  const Tensor* t = n.has_input(1) ? g.constant(n.inputs[1]) : nullptr;
  if (!t || t->dtype() != DType::kInt64 || t->rank() != 1) return {};
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < t->numel(); ++i) axes.push_back(t->value_as_int(i));
  for (int64_t& a : axes) a = a < 0 ? a + 4 : a;
  std::sort(axes.begin(), axes.end());
  return axes;
}

}  // namespace

int reduce_mean_to_global_pool(ir::Graph& graph) {
  int rewritten = 0;
  NodeNames node_names(graph);
  std::vector<ir::Node> nodes;
  nodes.reserve(graph.nodes.size() + 4);
  for (ir::Node& n : graph.nodes) {
    const ir::TensorType* x = n.inputs.empty() ? nullptr : type_of(graph, n.inputs[0]);
    const bool matches = n.domain.empty() && n.op == "ReduceMean" && n.outputs.size() == 1 && x &&
                         x->dtype == DType::kFloat32 && x->rank() == 4 && reduced_axes(graph, n) == std::vector<int64_t>{2, 3};
    if (!matches) {
      nodes.push_back(std::move(n));
      continue;
    }
    const bool keepdims = n.attrs.get_int("keepdims", 1) != 0;
    ir::Node pool;
    pool.name = n.name;
    pool.op = "GlobalAveragePool";
    pool.inputs = {n.inputs[0]};
    pool.outputs = {n.outputs[0]};
    if (!keepdims) {
      ir::Value pooled;
      pooled.name = graph.unique_name(n.outputs[0] + "_pooled");
      pooled.type.dtype = DType::kFloat32;
      graph.set_value(pooled);
      pool.outputs = {pooled.name};
      ir::Node flatten;
      flatten.name = node_names.fresh(n.name + "_flatten");
      flatten.op = "Flatten";
      flatten.inputs = {pooled.name};
      flatten.outputs = {n.outputs[0]};
      flatten.attrs.set("axis", int64_t{1});
      nodes.push_back(std::move(pool));
      nodes.push_back(std::move(flatten));
    } else {
      nodes.push_back(std::move(pool));
    }
    ++rewritten;
  }
  graph.nodes = std::move(nodes);
  if (rewritten > 0) eliminate_dead_code(graph);
  return rewritten;
}

}  // namespace kiln::passes
