// A Mul by a constant that scales the output columns of a product by constant weights folds
// into those weights and the product's bias:
//   Mul(Transpose?(Add?(MatMul(X, W), b)), s)  ->  Transpose?(Add?(MatMul(X, W * s), b * s))
// where s scales only the axis that is the product's last (its columns), through the Transpose
// when there is one. ConvNeXt and CaiT-style blocks end with such a "layer scale" after their
// second product (ConvNeXt: after transposing back to NCHW, s shaped [C, 1, 1]); folded, it is
// no longer a pass over the block's whole output. The product's rows are unchanged and every
// column is scaled once, so the result differs from the unfolded one only by rounding (as
// BatchNormalization folding does).
#include <cmath>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// The per-column scale of `s` when it broadcasts against an output of rank `rank` along axis
// `axis` alone (every other dimension of s is 1), as `columns` values; nullopt otherwise.
std::optional<std::vector<float>> scale_along(const Tensor& s, int64_t rank, int64_t axis, int64_t columns) {
  if (s.rank() > rank || s.numel() != columns) return std::nullopt;
  const int64_t offset = rank - s.rank();  // numpy broadcasting aligns the trailing dimensions
  for (int64_t d = 0; d < s.rank(); ++d) {
    const int64_t dim = s.dim(static_cast<int>(d));
    if (d + offset == axis ? dim != columns : dim != 1) return std::nullopt;
  }
  if (axis < offset) return std::nullopt;  // s does not reach the axis
  std::vector<float> out(s.data<float>(), s.data<float>() + columns);
  for (float v : out)
    if (!std::isfinite(v)) return std::nullopt;
  return out;
}

// Folds the Mul at `mul_index` into the product behind it; false when the pattern does not fit.
bool fold(ir::Graph& g, size_t mul_index) {
  const ir::Node& mul = g.nodes[mul_index];
  if (mul.inputs.size() != 2 || mul.outputs.size() != 1) return false;
  for (int side = 0; side < 2; ++side) {
    const Tensor* s = float_constant(g, mul.inputs[static_cast<size_t>(1 - side)]);
    std::string v = mul.inputs[static_cast<size_t>(side)];
    if (!s || v == mul.inputs[static_cast<size_t>(1 - side)]) continue;
    const ir::TensorType* vt = type_of(g, v);
    const ir::TensorType* yt = type_of(g, mul.outputs[0]);
    // The Mul must not broadcast v up (its output has v's shape: equal dims, or the same
    // symbol, such as a dynamic batch), and v must be float32.
    if (!vt || !yt || !vt->shape || !yt->shape || vt->dtype != DType::kFloat32 || *vt->shape != *yt->shape)
      continue;
    const int64_t rank = vt->rank();
    if (rank < 1) continue;
    // Walk back through an optional Transpose: the scaled axis of v is axis perm[a] of its input.
    int64_t axis = rank - 1;
    int transpose_i = -1;
    if (const ir::Node* t = producer_node(g, v); t && t->domain.empty() && t->op == "Transpose" &&
                                                 only_feeds_one_input(g, v)) {
      std::vector<int64_t> perm = t->attrs.get_ints("perm");
      if (perm.empty())
        for (int64_t d = rank; d-- > 0;) perm.push_back(d);
      if (static_cast<int64_t>(perm.size()) != rank) continue;
      // The axis of v that is the input's last axis.
      axis = -1;
      for (int64_t a = 0; a < rank; ++a)
        if (perm[static_cast<size_t>(a)] == rank - 1) axis = a;
      if (axis < 0) continue;
      transpose_i = g.producer(v);
      v = t->inputs[0];
    }
    const ir::Dim& column_dim = (*vt->shape)[static_cast<size_t>(axis)];
    if (!column_dim.known()) continue;
    const int64_t columns = column_dim.value;
    std::optional<std::vector<float>> scale = scale_along(*s, rank, axis, columns);
    if (!scale) continue;
    // An optional bias Add of a constant along the last axis, then the MatMul by constant 2-D W.
    if (!only_feeds_one_input(g, v)) continue;
    int add_i = -1;
    const Tensor* bias = nullptr;
    std::string bias_name;
    if (const ir::Node* add = producer_node(g, v); add && add->domain.empty() && add->op == "Add" &&
                                                   add->inputs.size() == 2) {
      for (int k = 0; k < 2; ++k) {
        const Tensor* b = float_constant(g, add->inputs[static_cast<size_t>(1 - k)]);
        if (b && b->numel() == columns && scale_along(*b, rank, rank - 1, columns)) {
          bias = b;
          bias_name = add->inputs[static_cast<size_t>(1 - k)];
          add_i = g.producer(v);
          v = add->inputs[static_cast<size_t>(k)];
          break;
        }
      }
      if (add_i < 0) continue;
      if (!only_feeds_one_input(g, v)) continue;
    }
    const ir::Node* matmul = producer_node(g, v);
    if (!matmul || !matmul->domain.empty() || matmul->op != "MatMul" || matmul->inputs.size() != 2) continue;
    const Tensor* w = float_constant(g, matmul->inputs[1]);
    if (!w || w->rank() != 2 || w->dim(1) != columns) continue;
    const ir::TensorType* mt = type_of(g, v);
    if (!mt || !mt->shape || mt->rank() != rank) continue;  // the product's last axis is v's last axis

    // Rewrite: W * s, b * s, and the Transpose (or the last node of the chain) writes the Mul's output.
    Tensor w2 = w->clone();
    float* pw = w2.data<float>();
    for (int64_t k = 0; k < w->dim(0); ++k)
      for (int64_t j = 0; j < columns; ++j) pw[k * columns + j] *= (*scale)[static_cast<size_t>(j)];
    const int matmul_i = g.producer(v);
    const std::string scaled_w = g.add_constant(g.nodes[static_cast<size_t>(matmul_i)].inputs[1] + "_scaled", std::move(w2));
    g.nodes[static_cast<size_t>(matmul_i)].inputs[1] = scaled_w;
    if (bias) {
      Tensor b2 = bias->clone();
      for (int64_t j = 0; j < columns; ++j) b2.data<float>()[j] *= (*scale)[static_cast<size_t>(j)];
      const std::string scaled_b = g.add_constant(bias_name + "_scaled", std::move(b2));
      for (std::string& in : g.nodes[static_cast<size_t>(add_i)].inputs)
        if (in == bias_name) in = scaled_b;
    }
    const int last = transpose_i >= 0 ? transpose_i : add_i >= 0 ? add_i : matmul_i;
    g.nodes[static_cast<size_t>(last)].outputs[0] = mul.outputs[0];
    ir::Node& removed = g.nodes[mul_index];  // removed by the caller; it reads and writes nothing now
    removed.op.clear();
    removed.inputs.clear();
    removed.outputs.clear();
    return true;
  }
  return false;
}

}  // namespace

int fold_channel_scale(ir::Graph& graph) {
  int folded = 0;
  std::vector<bool> remove(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& n = graph.nodes[i];
    if (!n.domain.empty() || n.op != "Mul") continue;
    if (fold(graph, i)) {
      remove[i] = true;
      ++folded;
    }
  }
  if (folded) {
    erase_nodes(graph, remove);
    graph.prune_values();
  }
  return folded;
}

}  // namespace kiln::passes
