// Epilogue fusion: the elementwise work after a Conv / Gemm / MatMul (bias, residual add,
// activation) runs inside the producing kernel, while the result is still in registers,
// instead of as separate passes over memory:
//   Conv [+ Add of a per-channel constant] [+ Add of a same-shape tensor] [+ activation]
//     -> kiln::FusedConv(X, W, B, Z)
//   Gemm [+ Add of a constant bias when Gemm has none] [+ Add of a same-shape tensor]
//     [+ activation] -> kiln::FusedGemm(A, B, C, Z)
//   MatMul [+ Add of a constant bias [N]] [+ Add of a same-shape tensor] [+ activation]
//     -> kiln::FusedMatMul(A, B, bias, Z)
// A residual Add that reads a product through a Reshape (the product's rows regrouped, as after
// an attention's output projection) is first moved before the Reshape, the residual reshaped
// to the product's shape instead (Reshapes cost nothing on the GPU: they are views).
// The activations are those of ir::Activation, including the SiLU (x * Sigmoid(x)) and
// erf-Gelu (x * 0.5 * (1 + Erf(x / sqrt 2))) patterns exporters write out as several nodes.
// A node is absorbed only when nothing else reads the values it consumes from the chain.
#include <cmath>
#include <limits>

#include "ir/activation.h"
#include "ir/op_schema.h"
#include "passes/match_activation.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

bool same_type(const ir::TensorType* a, const ir::TensorType* b) {
  if (!a || !b || a->dtype != b->dtype || !a->shape || !b->shape || a->shape->size() != b->shape->size()) return false;
  for (size_t i = 0; i < a->shape->size(); ++i)
    if ((*a->shape)[i] != (*b->shape)[i]) return false;
  return true;
}

// A constant that, added to a tensor of rank `rank`, varies only along `axis` (which has
// `channels` entries): its values per channel, or nullopt.
std::optional<std::vector<float>> per_axis_constant(const ir::Graph& g, const std::string& name, int rank, int axis,
                                                    int64_t channels) {
  const Tensor* t = float_constant(g, name);
  if (!t || t->rank() > rank || channels <= 0) return std::nullopt;
  int offset = rank - t->rank();
  for (int d = 0; d < t->rank(); ++d)
    if (t->dim(d) != 1 && !(d + offset == axis && t->dim(d) == channels)) return std::nullopt;
  std::vector<float> out(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) out[static_cast<size_t>(c)] = t->data<float>()[t->numel() == 1 ? 0 : c];
  return out;
}

// Adds `extra` to the 1-D bias `bias` ("" = zeros); returns the new constant's name.
std::string add_to_bias(ir::Graph& g, const std::string& bias, const std::vector<float>& extra, const std::string& hint) {
  std::vector<float> b = extra;
  if (const Tensor* old = float_constant(g, bias))
    for (size_t i = 0; i < b.size(); ++i) b[i] += old->data<float>()[i];
  return g.add_constant(hint, Tensor::from_vector<float>({static_cast<int64_t>(b.size())}, b));
}

// A sole-reader Add of `x`, returning the node index and its other input.
int sole_add(const ir::Graph& g, const std::string& x, std::string& other) {
  int c = sole_consumer(g, x);
  const ir::Node* n = node_at(g, c);
  if (!is_onnx(n, "Add") || n->outputs.size() != 1) return -1;
  other = other_input(*n, x);
  return other.empty() || other == x ? -1 : c;
}

// Replaces `first` and the absorbed nodes by `fused`, placed where the last absorbed node
// was (every input of the chain is computed by then).
void commit(ir::Graph& g, size_t first, const std::vector<int>& absorbed, ir::Node fused) {
  while (!fused.inputs.empty() && fused.inputs.back().empty()) fused.inputs.pop_back();
  size_t last = first;
  for (int i : absorbed) last = std::max(last, static_cast<size_t>(i));
  std::vector<bool> remove(g.nodes.size(), false);
  remove[first] = true;
  for (int i : absorbed) remove[static_cast<size_t>(i)] = true;
  remove[last] = false;
  g.nodes[last] = std::move(fused);
  erase_nodes(g, remove);
}

// The end every fusion shares: absorbs an activation reading `cur`, then replaces node i and
// the absorbed nodes by `fused` (whose op, inputs and attributes the caller set). False, and
// the graph untouched, when there is nothing to absorb.
bool finish_fusion(ir::Graph& g, size_t i, std::vector<int> absorbed, std::string cur, ir::Node fused) {
  std::optional<ActivationMatch> act = match_activation(g, cur);
  if (act) {
    absorbed.insert(absorbed.end(), act->nodes.begin(), act->nodes.end());
    cur = act->output;
  }
  if (absorbed.empty()) return false;
  fused.name = g.nodes[i].name;
  fused.domain = "kiln";
  fused.outputs = {cur};
  (act ? act->act : ir::Activation{}).store(fused);
  commit(g, i, absorbed, std::move(fused));
  return true;
}

bool fuse_conv(ir::Graph& g, size_t i) {
  const ir::Node& conv = g.nodes[i];
  if (conv.inputs.size() < 2 || conv.outputs.size() != 1) return false;
  std::string cur = conv.outputs[0];
  const ir::TensorType* out_type = type_of(g, cur);
  if (!out_type || !is_float(out_type->dtype) || out_type->rank() < 3) return false;
  const ir::Dim channels = (*out_type->shape)[1];
  std::vector<int> absorbed;
  std::string bias = conv.has_input(2) ? conv.inputs[2] : "";
  std::string residual;
  std::string other;
  int add = sole_add(g, cur, other);
  if (add >= 0 && channels.known() && (bias.empty() || float_constant(g, bias))) {
    if (auto extra = per_axis_constant(g, other, out_type->rank(), 1, channels.value)) {
      bias = add_to_bias(g, bias, *extra, conv.name + "_fused_bias");
      absorbed.push_back(add);
      cur = out0(node_at(g, add));
      add = sole_add(g, cur, other);
    }
  }
  if (add >= 0 && same_type(type_of(g, other), out_type)) {
    residual = other;
    absorbed.push_back(add);
    cur = out0(node_at(g, add));
  }
  ir::Node fused;
  fused.op = "FusedConv";
  fused.inputs = {conv.inputs[0], conv.inputs[1], bias, residual};
  fused.attrs = conv.attrs;
  return finish_fusion(g, i, std::move(absorbed), cur, std::move(fused));
}

bool fuse_gemm(ir::Graph& g, size_t i) {
  const ir::Node& gemm = g.nodes[i];
  if (gemm.inputs.size() < 2 || gemm.outputs.size() != 1) return false;
  std::string cur = gemm.outputs[0];
  const ir::TensorType* out_type = type_of(g, cur);
  if (!out_type || !is_float(out_type->dtype) || out_type->rank() != 2) return false;
  std::vector<int> absorbed;
  ir::Node fused;
  fused.attrs = gemm.attrs;
  std::string c = gemm.has_input(2) ? gemm.inputs[2] : "";
  std::string other;
  int add = sole_add(g, cur, other);
  const ir::Dim n = (*out_type->shape)[1];
  if (add >= 0 && c.empty() && n.known()) {
    if (auto bias = per_axis_constant(g, other, 2, 1, n.value)) {
      c = g.add_constant(gemm.name + "_fused_bias", Tensor::from_vector<float>({n.value}, *bias));
      fused.attrs.set("beta", 1.f);
      absorbed.push_back(add);
      cur = out0(node_at(g, add));
    }
  }
  // A residual, when C is at most a row of biases (it becomes the epilogue's bias).
  const Tensor* c_const = c.empty() ? nullptr : float_constant(g, c);
  const bool c_is_bias = c.empty() || (c_const && n.known() && c_const->numel() == n.value &&
                                       (c_const->rank() == 1 || (c_const->rank() == 2 && c_const->dim(0) == 1)));
  std::string residual;
  add = sole_add(g, cur, other);
  if (add >= 0 && c_is_bias && same_type(type_of(g, other), out_type)) {
    residual = other;
    absorbed.push_back(add);
    cur = out0(node_at(g, add));
  }
  fused.op = "FusedGemm";
  fused.inputs = {gemm.inputs[0], gemm.inputs[1], c, residual};
  return finish_fusion(g, i, std::move(absorbed), cur, std::move(fused));
}

bool fuse_matmul(ir::Graph& g, size_t i) {
  const ir::Node& mm = g.nodes[i];
  if (mm.inputs.size() != 2 || mm.outputs.size() != 1) return false;
  std::string cur = mm.outputs[0];
  const ir::TensorType* out_type = type_of(g, cur);
  const ir::TensorType* b_type = type_of(g, mm.inputs[1]);
  // A 1-D B has no column axis for a bias to run along.
  if (!out_type || !is_float(out_type->dtype) || out_type->rank() < 1 || !b_type || b_type->rank() < 2) return false;
  const ir::Dim n = b_type->shape->back();
  std::vector<int> absorbed;
  std::string bias;
  std::string other;
  int add = sole_add(g, cur, other);
  if (add >= 0 && n.known()) {
    if (auto b = per_axis_constant(g, other, out_type->rank(), out_type->rank() - 1, n.value)) {
      // A bias broadcast along the last axis only; a scalar would also qualify but is rare.
      const Tensor* t = g.constant(other);
      if (t->numel() == n.value) {
        bias = t->rank() == 1 ? other : g.add_constant(other + "_1d", Tensor::from_vector<float>({n.value}, *b));
        absorbed.push_back(add);
        cur = out0(node_at(g, add));
      }
    }
  }
  std::string residual;
  add = sole_add(g, cur, other);
  if (add >= 0 && same_type(type_of(g, other), out_type)) {
    residual = other;
    absorbed.push_back(add);
    cur = out0(node_at(g, add));
  }
  ir::Node fused;
  fused.op = "FusedMatMul";
  fused.inputs = {mm.inputs[0], mm.inputs[1], bias, residual};
  return finish_fusion(g, i, std::move(absorbed), cur, std::move(fused));
}

// Add(Reshape(P), X) with P a product read only by that Reshape and X of the Reshape's shape
// -> Reshape(Add(P, Reshape(X))): addition is elementwise, so it commutes with the regrouping,
// and the Add can join P's epilogue.
int move_residuals_before_reshapes(ir::Graph& g) {
  int moved = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& add = g.nodes[i];
    if (!is_onnx(&add, "Add") || add.inputs.size() != 2 || add.outputs.size() != 1) continue;
    for (int side = 0; side < 2; ++side) {
      const std::string r = add.inputs[static_cast<size_t>(side)], x = add.inputs[static_cast<size_t>(1 - side)];
      const int ri = g.producer(r);
      const ir::Node* reshape = node_at(g, ri);
      if (!is_onnx(reshape, "Reshape") || reshape->inputs.empty() || !only_feeds_one_input(g, r)) continue;
      const std::string p = reshape->inputs[0];
      const ir::Node* product = node_at(g, g.producer(p));
      if (!(is_onnx(product, "Gemm") || is_onnx(product, "MatMul")) || !only_feeds_one_input(g, p)) continue;
      const ir::TensorType *p_type = type_of(g, p), *r_type = type_of(g, r);
      if (!same_type(type_of(g, x), r_type) || !p_type || !p_type->shape || !ir::all_known(*p_type->shape) ||
          x == r)
        continue;
      const std::vector<int64_t> p_shape = ir::known_values(*p_type->shape);
      const std::string out = add.outputs[0], base = add.name;
      ir::Node x_rows;
      x_rows.name = g.unique_name(base + "_residual_rows");
      x_rows.op = "Reshape";
      x_rows.inputs = {x, g.add_constant(base + "_rows_shape",
                                         Tensor::from_vector<int64_t>({static_cast<int64_t>(p_shape.size())}, p_shape))};
      x_rows.outputs = {g.unique_name(x + "_rows")};
      ir::Value xv;
      xv.name = x_rows.outputs[0];
      xv.type = *p_type;
      g.set_value(std::move(xv));
      ir::Value sum;
      sum.name = g.unique_name(out + "_rows");
      sum.type = *p_type;
      g.set_value(sum);
      g.nodes[i].inputs = {p, x_rows.outputs[0]};
      g.nodes[i].outputs = {sum.name};
      ir::Node& moved_reshape = g.nodes[static_cast<size_t>(ri)];
      moved_reshape.inputs[0] = sum.name;
      moved_reshape.outputs[0] = out;
      g.nodes.push_back(std::move(x_rows));
      ++moved;
      break;
    }
  }
  if (moved) g.topological_sort();
  return moved;
}

}  // namespace

int fuse_epilogue(ir::Graph& graph) {
  const ir::OpRegistry& ops = ir::OpRegistry::instance();
  bool conv_ok = ops.find("FusedConv", "kiln") != nullptr;
  bool gemm_ok = ops.find("FusedGemm", "kiln") != nullptr;
  bool matmul_ok = ops.find("FusedMatMul", "kiln") != nullptr;
  int fused = 0;
  if ((gemm_ok || matmul_ok) && move_residuals_before_reshapes(graph)) ir::infer_shapes(graph);
  for (size_t i = 0; i < graph.nodes.size();) {
    const ir::Node& n = graph.nodes[i];
    bool done = false;
    if (n.domain.empty()) {
      if (n.op == "Conv" && conv_ok) done = fuse_conv(graph, i);
      else if (n.op == "Gemm" && gemm_ok) done = fuse_gemm(graph, i);
      else if (n.op == "MatMul" && matmul_ok) done = fuse_matmul(graph, i);
    }
    // After a fusion node i is gone and the next one has moved into its place.
    if (done) ++fused;
    else ++i;
  }
  if (fused) graph.prune_values();
  return fused;
}

}  // namespace kiln::passes
