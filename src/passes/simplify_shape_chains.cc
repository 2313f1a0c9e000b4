// PyTorch exports x.view(x.size(0), -1) and friends for a dynamic batch as
// Shape -> Gather -> Unsqueeze -> Concat -> Reshape. Shape inference already knows the
// computed shape symbolically (e.g. [N, 512]); this pass writes it as a constant the op
// understands without the chain ([0, 512]: 0 copies the input's dim), so the chain dies
// (eliminate_dead_code removes it) and backends see a static op.
//   Reshape: a symbolic dim equal to the input's dim at the same position -> 0 (copy);
//            one remaining unknown -> -1 (exact: the element count determines it).
//   Expand:  a symbolic dim equal to the input's dim at the aligned position -> 1
//            (broadcasting 1 against that dim yields the dim).
// ConstantOfShape, Tile and Range need the runtime value itself; fully known shapes for
// them are constant-folded instead.
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// The computed (non-constant) shape input's symbolic value, when there is one.
const ir::Dims* computed_shape(const ir::Graph& g, const ir::Node& n, size_t index) {
  if (!n.has_input(index) || g.constant(n.inputs[index])) return nullptr;
  const ir::Value* v = g.find_value(n.inputs[index]);
  if (!v || !v->symbolic_value || v->type.rank() != 1) return nullptr;
  return &*v->symbolic_value;
}

std::optional<std::vector<int64_t>> reshape_constant(const ir::Graph& g, const ir::Node& n) {
  const ir::Dims* target = computed_shape(g, n, 1);
  const ir::TensorType* in = type_of(g, n.inputs[0]);
  if (!target || !in || !in->shape) return std::nullopt;
  // With allowzero a 0 means an empty dim, so it cannot stand for "copy".
  bool allowzero = n.attrs.get_int("allowzero", 0) != 0;
  std::vector<int64_t> out;
  int unknown = 0;
  for (size_t i = 0; i < target->size(); ++i) {
    const ir::Dim& d = (*target)[i];
    if (d.known()) {
      out.push_back(d.value);
      continue;
    }
    if (!allowzero && d.symbolic() && i < in->shape->size() && (*in->shape)[i] == d) {
      out.push_back(0);
      continue;
    }
    // An unknown element (a literal -1 in the exported shape looks like this too).
    ++unknown;
    out.push_back(-1);
  }
  if (unknown > 1) return std::nullopt;
  return out;
}

std::optional<std::vector<int64_t>> expand_constant(const ir::Graph& g, const ir::Node& n) {
  const ir::Dims* target = computed_shape(g, n, 1);
  const ir::TensorType* in = type_of(g, n.inputs[0]);
  if (!target || !in || !in->shape) return std::nullopt;
  const size_t in_rank = in->shape->size();
  std::vector<int64_t> out;
  for (size_t i = 0; i < target->size(); ++i) {
    const ir::Dim& d = (*target)[i];
    if (d.known()) {
      out.push_back(d.value);
      continue;
    }
    // Dims align from the right in broadcasting.
    size_t offset = target->size() >= in_rank ? target->size() - in_rank : 0;
    if (d.symbolic() && i >= offset && i - offset < in_rank && (*in->shape)[i - offset] == d) {
      out.push_back(1);
      continue;
    }
    return std::nullopt;
  }
  return out;
}

}  // namespace

int simplify_shape_chains(ir::Graph& graph) {
  int rewritten = 0;
  for (ir::Node& n : graph.nodes) {
    if (!n.domain.empty() || n.inputs.size() < 2 || n.inputs[0].empty()) continue;
    std::optional<std::vector<int64_t>> shape;
    if (n.op == "Reshape") shape = reshape_constant(graph, n);
    else if (n.op == "Expand") shape = expand_constant(graph, n);
    if (!shape) continue;
    std::vector<int64_t> dims = {static_cast<int64_t>(shape->size())};
    n.inputs[1] = graph.add_constant(n.name + "_shape", Tensor::from_vector<int64_t>(dims, *shape));
    ++rewritten;
  }
  return rewritten;
}

}  // namespace kiln::passes
