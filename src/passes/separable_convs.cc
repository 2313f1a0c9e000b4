// Depthwise-separable blocks of channels-last convolutions -> one kiln::ChannelsLastSeparableConv:
//
//   X -> ChannelsLastConv 1x1 (expand) -> ChannelsLastConv depthwise -> ChannelsLastConv 1x1 (project, Z?) -> Y
//   X -> ChannelsLastConv depthwise -> ChannelsLastConv 1x1 (project, Z?) -> Y
//
// becomes ChannelsLastSeparableConv(X, We, Be, Wd, Bd, Wp, Bp, Z) -> Y, whose CPU kernel streams the
// block row by row. A block is fused when the tensor the depthwise convolution reads holds at
// least `min_depthwise_input_bytes` per image: smaller ones stay in the caches between the
// unfused kernels anyway, and the fused kernel's row bands expand a few rows twice. The values
// between the convolutions must have no other reader and must not be graph outputs; the expansion
// and the depthwise convolution must have no residual of their own.
#include "ir/activation.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// A kiln::ChannelsLastConv whose X is channels-last too (not a first convolution reading its
// input channels-first).
bool is_channels_last_conv(const ir::Node* n) {
  return n && n->domain == "kiln" && n->op == "ChannelsLastConv" && n->attrs.get_int("input_channels_first", 0) == 0;
}

bool has_residual(const ir::Node& n) { return n.inputs.size() > 3 && !n.inputs[3].empty(); }

bool all_equal(const std::vector<int64_t>& values, int64_t v) {
  for (int64_t x : values)
    if (x != v) return false;
  return true;
}

// A 1x1 convolution of stride 1 without padding: each output pixel reads its own input pixel.
bool is_pointwise(const ir::Graph& g, const ir::Node* n) {
  if (!is_channels_last_conv(n) || n->inputs.size() < 2) return false;
  const Tensor* w = float_constant(g, n->inputs[1]);
  if (!w || w->rank() != 4 || w->dim(2) != 1 || w->dim(3) != 1) return false;
  const std::string auto_pad = n->attrs.get_string("auto_pad", "NOTSET");
  return n->attrs.get_int("group", 1) == 1 && all_equal(n->attrs.get_ints("strides"), 1) &&
         all_equal(n->attrs.get_ints("pads"), 0) && (auto_pad == "NOTSET" || auto_pad == "VALID" || auto_pad.empty());
}

// One input channel per group, weights [C, 1, kH, kW].
bool is_depthwise(const ir::Graph& g, const ir::Node* n) {
  if (!is_channels_last_conv(n) || n->inputs.size() < 2) return false;
  const Tensor* w = float_constant(g, n->inputs[1]);
  return w && w->rank() == 4 && w->dim(1) == 1 && n->attrs.get_int("group", 1) == w->dim(0) && w->dim(0) > 1;
}

std::string input_or_empty(const ir::Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : std::string(); }

// Bytes of one image of a float32 value (0 where a dim past the first is unknown).
int64_t image_bytes(const ir::Graph& g, const std::string& value) {
  const ir::TensorType* t = type_of(g, value);
  if (!t || !t->shape) return 0;
  int64_t n = 4;
  for (size_t i = 1; i < t->shape->size(); ++i) {
    if (!(*t->shape)[i].known()) return 0;
    n *= (*t->shape)[i].value;
  }
  return n;
}

}  // namespace

int separable_convs(ir::Graph& graph, int64_t min_depthwise_input_bytes) {
  std::vector<bool> remove(graph.nodes.size(), false);
  int fused = 0;
  for (size_t p = 0; p < graph.nodes.size(); ++p) {
    const ir::Node& project = graph.nodes[p];
    if (remove[p] || !is_pointwise(graph, &project)) continue;
    const std::string& between = project.inputs[0];
    const int d = graph.producer(between);
    const ir::Node* depthwise = node_at(graph, d);
    if (!is_depthwise(graph, depthwise) || has_residual(*depthwise) || remove[static_cast<size_t>(d)] ||
        sole_consumer(graph, between) != static_cast<int>(p))
      continue;
    if (image_bytes(graph, depthwise->inputs[0]) < min_depthwise_input_bytes) continue;
    const int e = graph.producer(depthwise->inputs[0]);
    const ir::Node* expand = node_at(graph, e);
    if (!is_pointwise(graph, expand) || has_residual(*expand) || remove[static_cast<size_t>(e)] ||
        sole_consumer(graph, depthwise->inputs[0]) != d)
      expand = nullptr;

    ir::Node block;
    block.name = project.name;
    block.op = "ChannelsLastSeparableConv";
    block.domain = "kiln";
    for (const char* attr : {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
      if (depthwise->attrs.has(attr)) block.attrs.set(attr, depthwise->attrs.all().at(attr));
    if (expand) ir::Activation::from_node(*expand).store(block, "expand_");
    ir::Activation::from_node(*depthwise).store(block, "depthwise_");
    ir::Activation::from_node(project).store(block);
    block.inputs = {expand ? expand->inputs[0] : depthwise->inputs[0],
                    expand ? expand->inputs[1] : std::string(),
                    expand ? input_or_empty(*expand, 2) : std::string(),
                    depthwise->inputs[1],
                    input_or_empty(*depthwise, 2),
                    project.inputs[1],
                    input_or_empty(project, 2),
                    input_or_empty(project, 3)};
    while (!block.inputs.empty() && block.inputs.back().empty()) block.inputs.pop_back();
    block.outputs = project.outputs;
    remove[static_cast<size_t>(d)] = true;
    if (expand) remove[static_cast<size_t>(e)] = true;
    graph.nodes[p] = std::move(block);  // where the projection was: every input is made before it
    ++fused;
  }
  if (fused > 0) erase_nodes(graph, remove);
  return fused;
}

}  // namespace kiln::passes
