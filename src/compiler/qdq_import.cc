// Explicit quantization (see qdq_import.h).
#include "compiler/qdq_import.h"

#include <cstring>

#include "passes/rewrite.h"

namespace kiln::compiler {

namespace {

// The zero point of a Q/DQ node is absent or an all-zero int8 constant.
bool symmetric_int8(const ir::Graph& g, const ir::Node& n, bool quantize) {
  if (!n.has_input(2)) return !quantize;  // QuantizeLinear without a zero point outputs uint8
  const Tensor* zp = g.constant(n.inputs[2]);
  if (!zp || zp->dtype() != DType::kInt8) return false;
  for (int64_t i = 0; i < zp->numel(); ++i)
    if (zp->data<int8_t>()[i] != 0) return false;
  return true;
}

const Tensor* float_scale(const ir::Graph& g, const ir::Node& n) {
  const Tensor* s = n.inputs.size() > 1 ? g.constant(n.inputs[1]) : nullptr;
  if (!s || s->dtype() != DType::kFloat32 || s->numel() < 1) return nullptr;
  for (int64_t i = 0; i < s->numel(); ++i)
    if (!(s->data<float>()[i] > 0.f)) return nullptr;
  return s;
}

}  // namespace

QdqScales absorb_qdq(ir::Graph& g) {
  QdqScales out;
  std::vector<bool> remove(g.nodes.size(), false);

  // Constant weights behind DequantizeLinear become float constants.
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    if (n.op != "DequantizeLinear" || !n.domain.empty()) continue;
    const Tensor* w = g.constant(n.inputs[0]);
    const Tensor* s = float_scale(g, n);
    if (!w || w->dtype() != DType::kInt8 || w->rank() < 2 || !s || !symmetric_int8(g, n, false)) continue;
    if (n.attrs.get_int("block_size", 0) != 0) continue;  // blocked scales: the CPU kernel dequantizes them
    int64_t axis = n.attrs.get_int("axis", 1);
    if (axis < 0) axis += w->rank();
    const int64_t channels = w->dim(0);
    if (s->numel() != 1 && !(axis == 0 && s->numel() == channels)) continue;  // per-channel on another axis: keep
    QdqWeight q;
    q.values = Tensor(DType::kFloat32, w->shape());
    const int64_t inner = w->numel() / channels;
    for (int64_t c = 0; c < channels; ++c) q.scales.push_back(s->data<float>()[s->numel() == 1 ? 0 : c]);
    for (int64_t e = 0; e < w->numel(); ++e)
      q.values.data<float>()[e] = static_cast<float>(w->data<int8_t>()[e]) * q.scales[static_cast<size_t>(e / inner)];
    passes::make_constant(g, n.outputs[0], q.values);
    out.weights[n.outputs[0]] = std::move(q);
    remove[i] = true;
  }

  // Activation pairs: x -> Q(s, 0) -> DQ(s, 0) -> readers.
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& q = g.nodes[i];
    if (remove[i] || q.op != "QuantizeLinear" || !q.domain.empty()) continue;
    const Tensor* s = float_scale(g, q);
    const ir::Value* x = g.find_value(q.inputs[0]);
    if (!s || s->numel() != 1 || !x || x->constant || x->type.dtype != DType::kFloat32 || !symmetric_int8(g, q, true) ||
        g.is_graph_output(q.outputs[0]))
      continue;
    const float scale = s->data<float>()[0];
    std::vector<int> readers = g.consumers(q.outputs[0]);
    bool pairs = !readers.empty();
    for (int r : readers) {
      const ir::Node& d = g.nodes[static_cast<size_t>(r)];
      const Tensor* ds = d.op == "DequantizeLinear" ? float_scale(g, d) : nullptr;
      pairs = pairs && ds && ds->numel() == 1 && ds->data<float>()[0] == scale && symmetric_int8(g, d, false) &&
              d.inputs[0] == q.outputs[0] && !g.is_graph_output(d.outputs[0]);
    }
    if (!pairs) continue;
    for (int r : readers) {
      g.replace_uses(g.nodes[static_cast<size_t>(r)].outputs[0], q.inputs[0]);
      remove[static_cast<size_t>(r)] = true;
    }
    remove[i] = true;
    out.activations[q.inputs[0]] = scale;
  }
  passes::erase_nodes(g, remove);
  for (const ir::Node& n : g.nodes) out.pairs_left += (n.op == "QuantizeLinear" || n.op == "DequantizeLinear");
  g.prune_values();
  return out;
}

}  // namespace kiln::compiler
