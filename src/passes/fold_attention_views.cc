// Attention views: the layers between an Attention node and the tensors its Q, K and V come
// from (Reshape, Transpose, Squeeze, Unsqueeze, Flatten, a Gather of one index, Slice, Split)
// and between its Y and the tensor the layers after it make of Y (Transpose, Reshape,
// Squeeze, Unsqueeze, Flatten) only move elements. With every shape known, each such chain is
// one strided view of a tensor, so the Attention becomes kiln::StridedAttention
// (ops/attention_params.h): it reads Q, K and V where the chains start and writes Y where its
// chain ends, and the copies die as dead code.
//
// nn.MultiheadAttention (torchvision's ViT) writes the heads this way: one projection
// [S, B, 3E] reshaped, transposed, split into Q, K and V by Gathers and reshaped into heads
// through a merged batch-and-heads axis [S, B * H, D]; each of those layers copies.
//
// The same exports put the heads' layout change on the other side of the projections: Q, K and
// V are projected from the input transposed to [S, B, E] (a Transpose before the projection),
// and Y's rows leave the output projection in [S * B] order to be transposed back afterwards.
// A projection (MatMul or Gemm by a matrix, a bias along the last axis) acts on each row alone,
// so a layout change of the leading axes commutes with it: the pass moves those Transposes
// across the projections next to an attention, where they join the views (and copy nothing).
//
// A view is an offset and, per axis, a list of modes (size, stride), outer first: an axis
// that merged axes not adjacent in memory (batch and heads above) keeps one mode for each,
// so a reshape that splits them again later is still a view. Reshapes split and merge modes;
// a chain that needs to split a mode where its size does not divide stops the fold there
// (a shorter chain, from a later tensor, may still fold).
#include <algorithm>
#include <deque>
#include <numeric>

#include "ir/op_schema.h"
#include "ops/attention_params.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

struct Mode {
  int64_t size = 1, stride = 0;
};

struct View {
  int64_t offset = 0;
  std::vector<std::vector<Mode>> axes;  // modes of size 1 are left out
};

View contiguous_view(const std::vector<int64_t>& shape) {
  View v;
  v.axes.resize(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1) v.axes[i] = {{shape[i], stride}};
    stride *= shape[i];
  }
  return v;
}

// Adjacent modes that step evenly merge into one.
void coalesce(std::vector<Mode>& axis) {
  std::vector<Mode> out;
  for (const Mode& m : axis) {
    if (!out.empty() && out.back().stride == m.stride * m.size) out.back() = {out.back().size * m.size, m.stride};
    else out.push_back(m);
  }
  axis = std::move(out);
}

// The view with the same elements in row-major order laid out as `shape`.
bool reshape(View& v, const std::vector<int64_t>& shape) {
  std::vector<Mode> flat;
  for (const auto& axis : v.axes) flat.insert(flat.end(), axis.begin(), axis.end());
  coalesce(flat);
  std::deque<Mode> modes(flat.begin(), flat.end());
  View out;
  out.offset = v.offset;
  out.axes.resize(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t n = shape[i];
    if (n < 1) return false;
    int64_t have = 1;
    while (have < n) {
      if (modes.empty() || n % have) return false;
      const int64_t need = n / have;
      const Mode m = modes.front();
      modes.pop_front();
      if (m.size <= need) {
        if (need % m.size) return false;
        out.axes[i].push_back(m);
        have *= m.size;
      } else {
        if (m.size % need) return false;
        out.axes[i].push_back({need, m.stride * (m.size / need)});
        modes.push_front({m.size / need, m.stride});
        have = n;
      }
    }
  }
  if (!modes.empty()) return false;
  v = std::move(out);
  return true;
}

bool transpose(View& v, const std::vector<int64_t>& perm) {
  if (perm.size() != v.axes.size()) return false;
  View out;
  out.offset = v.offset;
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(v.axes.size())) return false;
    out.axes.push_back(v.axes[static_cast<size_t>(p)]);
  }
  v = std::move(out);
  return true;
}

int64_t axis_size(const std::vector<Mode>& axis) {
  int64_t n = 1;
  for (const Mode& m : axis) n *= m.size;
  return n;
}

// Element `index` of `axis` (kept as an axis of size 1, or dropped).
bool select(View& v, size_t axis, int64_t index, bool keep) {
  if (axis >= v.axes.size()) return false;
  std::vector<Mode>& modes = v.axes[axis];
  const int64_t size = axis_size(modes);
  if (index < 0) index += size;
  if (index < 0 || index >= size) return false;
  for (size_t m = modes.size(); m-- > 0;) {
    v.offset += (index % modes[m].size) * modes[m].stride;
    index /= modes[m].size;
  }
  if (keep) modes.clear();
  else v.axes.erase(v.axes.begin() + static_cast<std::ptrdiff_t>(axis));
  return true;
}

// Elements start, start + step, ... of `axis`, `count` of them.
bool slice(View& v, size_t axis, int64_t start, int64_t count, int64_t step) {
  if (axis >= v.axes.size() || step < 1 || count < 1 || start < 0) return false;
  std::vector<Mode>& modes = v.axes[axis];
  coalesce(modes);
  if (count == 1) return select(v, axis, start, true);
  if (modes.size() != 1 || start + (count - 1) * step >= modes[0].size) return false;
  v.offset += start * modes[0].stride;
  modes[0] = {count, modes[0].stride * step};
  return true;
}

// The shape of `value` when every dimension is known and at least 1 (views of an empty tensor
// are not folded: a mode of size 0 has no stride to step by).
std::optional<std::vector<int64_t>> known_shape(const ir::Graph& g, const std::string& value) {
  const ir::TensorType* t = type_of(g, value);
  if (!t || !t->shape || !ir::all_known(*t->shape)) return std::nullopt;
  std::vector<int64_t> shape = ir::known_values(*t->shape);
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 1; })) return std::nullopt;
  return shape;
}

std::optional<std::vector<int64_t>> constant_ints(const ir::Graph& g, const std::string& name) {
  const Tensor* t = name.empty() ? nullptr : g.constant(name);
  if (!t || !is_integer(t->dtype())) return std::nullopt;
  return t->to_int_vector();
}

std::vector<int64_t> transpose_perm(const ir::Node& n, size_t rank) {
  std::vector<int64_t> perm = n.attrs.get_ints("perm", {});
  if (perm.empty())
    for (size_t i = rank; i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  return perm;
}

// One element-moving layer of an input's chain: `output` of `node`, read from its input 0.
struct Step {
  const ir::Node* node = nullptr;
  std::string output;
};

// Applies the layer to the view of its input; false when the result is not a view.
bool apply(const ir::Graph& g, const Step& s, View& v) {
  const ir::Node& n = *s.node;
  const auto in_shape = known_shape(g, n.inputs[0]);
  const auto out_shape = known_shape(g, s.output);
  if (!in_shape || !out_shape) return false;
  if (reshapes_only(n)) return reshape(v, *out_shape);
  if (n.op == "Transpose") return transpose(v, transpose_perm(n, in_shape->size()));
  const int64_t rank = static_cast<int64_t>(in_shape->size());
  auto axis_of = [&](int64_t a) { return static_cast<size_t>(a < 0 ? a + rank : a); };
  if (n.op == "Gather") {
    const Tensor* idx = n.inputs.size() == 2 ? g.constant(n.inputs[1]) : nullptr;
    if (!idx || !is_integer(idx->dtype()) || idx->numel() != 1 || idx->rank() > 1) return false;
    return select(v, axis_of(n.attrs.get_int("axis", 0)), idx->to_int_vector()[0], idx->rank() == 1);
  }
  if (n.op == "Slice") {
    const auto starts = constant_ints(g, n.inputs.size() > 1 ? n.inputs[1] : "");
    if (!starts) return false;
    std::vector<int64_t> axes(starts->size()), steps(starts->size(), 1);
    std::iota(axes.begin(), axes.end(), 0);
    if (n.inputs.size() > 3 && !n.inputs[3].empty()) {
      auto a = constant_ints(g, n.inputs[3]);
      if (!a || a->size() != starts->size()) return false;
      axes = *a;
    }
    if (n.inputs.size() > 4 && !n.inputs[4].empty()) {
      auto st = constant_ints(g, n.inputs[4]);
      if (!st || st->size() != starts->size()) return false;
      steps = *st;
    }
    for (size_t i = 0; i < starts->size(); ++i) {
      const size_t axis = axis_of(axes[i]);
      if (axis >= in_shape->size()) return false;
      const int64_t dim = (*in_shape)[axis];
      int64_t start = (*starts)[i] < 0 ? (*starts)[i] + dim : (*starts)[i];
      start = std::clamp<int64_t>(start, 0, dim);
      if (!slice(v, axis, start, (*out_shape)[axis], steps[i])) return false;
    }
    return true;
  }
  if (n.op == "Split") {
    const size_t axis = axis_of(n.attrs.get_int("axis", 0));
    if (axis >= in_shape->size()) return false;
    int64_t start = 0;
    for (const std::string& o : n.outputs) {
      if (o == s.output) break;
      const auto shape = known_shape(g, o);
      if (!shape) return false;
      start += (*shape)[axis];
    }
    return slice(v, axis, start, (*out_shape)[axis], 1);
  }
  return false;
}

// Q, K or V [B, H, S, D] (from Attention's 3-D form [B, S, H * D]: split and transposed) as
// one stride per axis; false when an axis is not one stride or the head size is not adjacent.
bool head_layout(View v, bool three_d, int64_t heads, ir::HeadLayout& out) {
  int64_t sizes[4] = {};
  if (three_d) {
    if (v.axes.size() != 3) return false;
    const int64_t b = axis_size(v.axes[0]), s = axis_size(v.axes[1]), hd = axis_size(v.axes[2]);
    if (heads < 1 || hd % heads || !reshape(v, {b, s, heads, hd / heads}) || !transpose(v, {0, 2, 1, 3})) return false;
  }
  if (v.axes.size() != 4) return false;
  int64_t strides[4];
  for (size_t i = 0; i < 4; ++i) {
    coalesce(v.axes[i]);
    if (v.axes[i].size() > 1) return false;
    strides[i] = v.axes[i].empty() ? 0 : v.axes[i][0].stride;
    sizes[i] = axis_size(v.axes[i]);
  }
  if (strides[3] != 1 && !v.axes[3].empty()) return false;
  out = {v.offset, strides[0], strides[1], strides[2]};
  ir::settle_unit_axes(out, sizes[0], sizes[1], sizes[2], sizes[3]);
  return true;
}


// --- moving layout changes of the leading axes across projections ---------------------------

// Transpose(from, perm) -> to: a layout change the pass moved.
ir::Node layout_transpose(ir::Graph& g, const std::string& from, const std::vector<int64_t>& perm, const std::string& to) {
  ir::Node n;
  n.name = g.unique_name(to + "_layout");
  n.op = "Transpose";
  n.attrs.set("perm", perm);
  n.inputs = {from};
  n.outputs = {to};
  return n;
}

bool keeps_last_axis(const std::vector<int64_t>& perm) {
  return !perm.empty() && perm.back() == static_cast<int64_t>(perm.size()) - 1;
}

ir::Value typed_value(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  ir::Value v;
  v.name = name;
  v.type.dtype = dtype;
  v.type.shape = ir::dims_of(shape);
  return v;
}

// A bias Add after a projection: the operand that is not `from` is one constant along the last
// axis (rank 0 or 1).
bool is_bias_add(const ir::Graph& g, const ir::Node& n, const std::string& from) {
  if (!n.domain.empty() || n.op != "Add" || n.inputs.size() != 2) return false;
  const std::string& other = n.inputs[0] == from ? n.inputs[1] : n.inputs[0];
  const Tensor* c = g.constant(other);
  return (n.inputs[0] == from) != (n.inputs[1] == from) && c && c->rank() <= 1;
}

// A projection reading rows: MatMul(X, W) with a 2-D W, or Gemm(X, W, C) without transA and
// a C of one row at most.
bool is_row_projection(const ir::Graph& g, const ir::Node& n, const std::string& x) {
  if (!n.domain.empty() || n.inputs.size() < 2 || n.inputs[0] != x || n.inputs[1] == x) return false;
  const ir::TensorType* w = type_of(g, n.inputs[1]);
  if (!w || !w->shape || w->rank() != 2) return false;
  if (n.op == "MatMul") return true;
  if (n.op != "Gemm" || n.attrs.get_int("transA", 0) != 0) return false;
  if (n.inputs.size() < 3 || n.inputs[2].empty()) return true;
  const ir::TensorType* c = type_of(g, n.inputs[2]);
  return c && c->shape && (c->rank() <= 1 || (c->rank() == 2 && (*c->shape)[0] == ir::Dim(1)));
}

// kiln::FusedMatMul(X, W [, bias]) with a 2-D W, a bias along the last axis and no residual:
// fuse_epilogue's form of a projection (an engine's graph is optimized again once its shapes
// are bound, after the first optimization fused the projections). Its activation acts on each
// element alone, so it commutes with a layout change too.
bool is_fused_row_projection(const ir::Graph& g, const ir::Node& n, const std::string& x) {
  if (n.domain != "kiln" || n.op != "FusedMatMul" || n.inputs.size() < 2 || n.inputs[0] != x || n.inputs[1] == x)
    return false;
  if (n.inputs.size() > 3 && !n.inputs[3].empty()) return false;  // a residual has the output's layout
  const ir::TensorType* w = type_of(g, n.inputs[1]);
  if (!w || !w->shape || w->rank() != 2) return false;
  if (n.inputs.size() < 3 || n.inputs[2].empty()) return true;
  const ir::TensorType* bias = type_of(g, n.inputs[2]);
  return bias && bias->shape && bias->rank() <= 1;
}

// `value` = [Add bias](MatMul(Transpose(X, perm), W)), or FusedMatMul(Transpose(X, perm), W
// [, bias]), with perm keeping the last axis, each read once -> the same projection of X,
// transposed by perm after it: the projection reads X as it is, and its output's transpose can
// join the views after it.
bool lift_transpose_above_projection(ir::Graph& g, const std::string& value) {
  const int last = g.producer(value);
  if (last < 0) return false;
  const ir::Node* add = &g.nodes[static_cast<size_t>(last)];
  const ir::Node* mm = add;
  if (add->op == "Add") {
    for (const std::string& in : add->inputs) {
      const ir::Node* p = producer_node(g, in);
      if (p && p->op == "MatMul" && is_bias_add(g, *add, in) && only_feeds_one_input(g, in)) mm = p;
    }
    if (mm == add) return false;
  } else {
    add = nullptr;
  }
  const bool fused = !add && mm->inputs.size() >= 2 && is_fused_row_projection(g, *mm, mm->inputs[0]);
  if (!fused && (mm->op != "MatMul" || mm->inputs.size() != 2)) return false;
  const ir::Node* tr = producer_node(g, mm->inputs[0]);
  if (!tr || tr->op != "Transpose" || !tr->domain.empty() || !only_feeds_one_input(g, mm->inputs[0]) ||
      !(fused || is_row_projection(g, *mm, mm->inputs[0])))
    return false;
  const auto x_shape = known_shape(g, tr->inputs[0]);
  const auto out_shape = known_shape(g, value);
  if (!x_shape || !out_shape || x_shape->size() != out_shape->size()) return false;
  const std::vector<int64_t> perm = transpose_perm(*tr, x_shape->size());
  if (!keeps_last_axis(perm)) return false;
  std::vector<int64_t> unpermuted = *x_shape;
  unpermuted.back() = out_shape->back();
  const DType dtype = type_of(g, value)->dtype;
  const std::string old_product = mm->outputs[0];
  const size_t mm_index = static_cast<size_t>(g.producer(old_product));
  const std::string x = tr->inputs[0];
  const std::string product = g.unique_name(value + "_rows");
  g.set_value(typed_value(product, dtype, unpermuted));
  g.nodes[mm_index].inputs[0] = x;
  g.nodes[mm_index].outputs[0] = product;
  std::string projected = product;
  if (add) {
    ir::Node& a = g.nodes[static_cast<size_t>(last)];
    for (std::string& in : a.inputs)
      if (in == old_product) in = product;
    projected = g.unique_name(value + "_biased");
    g.set_value(typed_value(projected, dtype, unpermuted));
    a.outputs[0] = projected;
  }
  g.nodes.push_back(layout_transpose(g, projected, perm, value));
  g.topological_sort();
  return true;
}

// `z` [R, K] read only by a row projection P (output [R, N]) whose output is only reshaped to
// [A..., N] and transposed by a perm keeping the last axis: P then reads z laid out as the
// transposed rows (Reshape, Transpose, Reshape: views attention can write through), and its
// output is reshaped to the transposed shape in place of the Transpose.
bool sink_transpose_below_projection(ir::Graph& g, const std::string& z) {
  const int p_index = sole_consumer(g, z);
  if (p_index < 0) return false;
  const ir::Node& p = g.nodes[static_cast<size_t>(p_index)];
  if (!is_row_projection(g, p, z) || p.outputs.size() != 1) return false;
  const int r_index = sole_consumer(g, p.outputs[0]);
  if (r_index < 0) return false;
  const ir::Node& r = g.nodes[static_cast<size_t>(r_index)];
  if (r.op != "Reshape" || !r.domain.empty() || r.inputs[0] != p.outputs[0]) return false;
  const int t_index = sole_consumer(g, r.outputs[0]);
  if (t_index < 0) return false;
  const ir::Node& t = g.nodes[static_cast<size_t>(t_index)];
  if (t.op != "Transpose" || !t.domain.empty()) return false;
  const auto z_shape = known_shape(g, z), p_shape = known_shape(g, p.outputs[0]), split = known_shape(g, r.outputs[0]),
             final_shape = known_shape(g, t.outputs[0]);
  if (!z_shape || !p_shape || !split || !final_shape || z_shape->size() != 2 || p_shape->size() != 2) return false;
  const std::vector<int64_t> perm = transpose_perm(t, split->size());
  if (!keeps_last_axis(perm) || split->back() != p_shape->back()) return false;
  const int64_t rows = (*z_shape)[0], width = (*z_shape)[1];
  std::vector<int64_t> z_split = *split;
  z_split.back() = width;
  std::vector<int64_t> z_moved(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) z_moved[i] = z_split[static_cast<size_t>(perm[i])];
  const DType z_type = type_of(g, z)->dtype, out_type = type_of(g, t.outputs[0])->dtype;
  const std::string out = t.outputs[0];
  const std::string t_name = t.name;
  auto reshape_node = [&](const std::string& from, const std::vector<int64_t>& shape, const std::string& to) {
    ir::Node n;
    n.name = to == out ? t_name : g.unique_name(to + "_node");
    n.op = "Reshape";
    n.inputs = {from, g.add_constant(to + "_shape", Tensor::from_vector<int64_t>({static_cast<int64_t>(shape.size())}, shape))};
    n.outputs = {to};
    return n;
  };
  const std::string zs = g.unique_name(z + "_split"), zt = g.unique_name(z + "_moved"), zr = g.unique_name(z + "_rows");
  const std::string projected = g.unique_name(out + "_rows");
  g.set_value(typed_value(zs, z_type, z_split));
  g.set_value(typed_value(zt, z_type, z_moved));
  g.set_value(typed_value(zr, z_type, {rows, width}));
  g.set_value(typed_value(projected, out_type, {rows, p_shape->back()}));
  std::vector<ir::Node> added;
  added.push_back(reshape_node(z, z_split, zs));
  added.push_back(layout_transpose(g, zs, perm, zt));
  added.push_back(reshape_node(zt, {rows, width}, zr));
  added.push_back(reshape_node(projected, *final_shape, out));
  ir::Node& proj = g.nodes[static_cast<size_t>(p_index)];
  proj.inputs[0] = zr;
  proj.outputs[0] = projected;
  std::vector<bool> remove(g.nodes.size(), false);
  remove[static_cast<size_t>(r_index)] = remove[static_cast<size_t>(t_index)] = true;
  erase_nodes(g, remove);
  for (ir::Node& n : added) g.nodes.push_back(std::move(n));
  g.topological_sort();
  return true;
}

// The layout changes on the far side of the projections around the attention writing `y`
// brought next to it. Returns the number of layers moved.
int move_layouts_next_to(ir::Graph& g, const std::string& y) {
  int moved = 0;
  for (size_t i = 0; i < 3; ++i) {
    const int a = g.producer(y);
    if (a < 0 || g.nodes[static_cast<size_t>(a)].inputs.size() <= i) return moved;
    moved += lift_transpose_above_projection(g, chain_root(g, g.nodes[static_cast<size_t>(a)].inputs[i]));
  }
  std::string end = y;
  for (int steps = 0; steps < 64; ++steps) {
    const int c = sole_consumer(g, end);
    if (c < 0) break;
    const ir::Node& n = g.nodes[static_cast<size_t>(c)];
    if (n.inputs[0] != end || n.outputs.size() != 1 || !(reshapes_only(n) || (n.domain.empty() && n.op == "Transpose")))
      break;
    end = n.outputs[0];
  }
  moved += sink_transpose_below_projection(g, end);
  return moved;
}

class ViewFolder {
 public:
  explicit ViewFolder(ir::Graph& g) : g_(g) {}

  bool fold(size_t index) {
    const ir::Node att = g_.nodes[index];
    if (att.inputs.size() < 3 || att.inputs.size() > 4) return false;  // no KV cache or nonpad_kv_seqlen
    for (size_t o = 1; o < att.outputs.size(); ++o)
      if (!att.outputs[o].empty()) return false;
    auto q_shape = known_shape(g_, att.inputs[0]), k_shape = known_shape(g_, att.inputs[1]),
         v_shape = known_shape(g_, att.inputs[2]);
    if (!q_shape || !k_shape || !v_shape) return false;
    std::string why;
    const ir::AttentionShape s = ir::attention_shape(att, *q_shape, *k_shape, *v_shape, {}, why);
    if (!why.empty()) return false;

    ir::HeadLayout layouts[3];
    std::string sources[3];
    bool changed = false;
    for (size_t i = 0; i < 3; ++i) {
      const int64_t heads = i == 0 ? s.q_heads : s.kv_heads;
      if (!input_view(att.inputs[i], s.three_d, heads, sources[i], layouts[i])) return false;
      changed |= sources[i] != att.inputs[i];
    }
    ir::HeadLayout y_layout;
    std::string z;
    std::vector<size_t> y_chain;
    if (!output_view(att.outputs[0], s, z, y_layout, y_chain)) return false;
    if (!changed && y_chain.empty()) return false;
    const auto z_shape = known_shape(g_, z);

    ir::Node n;
    n.name = att.name;
    n.op = "StridedAttention";
    n.domain = "kiln";
    n.inputs = {sources[0], sources[1], sources[2]};
    if (att.inputs.size() > 3) n.inputs.push_back(att.inputs[3]);
    for (const char* a : {"scale", "is_causal", "left_window_size", "right_window_size", "softcap"})
      if (att.attrs.has(a)) n.attrs.set(a, att.attrs.all().at(a));
    n.attrs.set("q_shape", std::vector<int64_t>{s.batch, s.q_heads, s.q_seq, s.head_size});
    n.attrs.set("k_shape", std::vector<int64_t>{s.batch, s.kv_heads, s.kv_seq, s.head_size});
    n.attrs.set("v_shape", std::vector<int64_t>{s.batch, s.kv_heads, s.kv_seq, s.v_head_size});
    const char* names[4] = {"q_view", "k_view", "v_view", "y_view"};
    const ir::HeadLayout* all[4] = {&layouts[0], &layouts[1], &layouts[2], &y_layout};
    for (size_t i = 0; i < 4; ++i) n.attrs.set(names[i], std::vector<int64_t>{all[i]->offset, all[i]->batch, all[i]->head, all[i]->row});
    n.attrs.set("y_shape", *z_shape);
    // Z holds the values of Y and of every layer after it that it replaces, laid out anew: their
    // names, for what looks values up by name (an INT8 build's calibrated scales).
    if (!y_chain.empty()) {
      std::vector<std::string> same = {att.outputs[0]};
      for (size_t c : y_chain)
        if (g_.nodes[c].outputs[0] != z) same.push_back(g_.nodes[c].outputs[0]);
      n.attrs.set("same_values_as", same);
    }
    n.outputs = {z};
    // The layers after Y lose their output: they die with Y.
    if (!y_chain.empty()) {
      ir::Node& last = g_.nodes[y_chain.back()];
      last.outputs[0] = g_.unique_name(z + "_unviewed");
      ir::Value dead;
      dead.name = last.outputs[0];
      dead.type = *type_of(g_, z);
      g_.set_value(std::move(dead));
    }
    // The node writes Z, so it goes where the last layer after it was (its readers follow).
    const size_t at = y_chain.empty() ? index : y_chain.back();
    g_.nodes[at] = std::move(n);
    return true;
  }

 private:
  // The tensor `value` is a view of, as far back as the layers before it stay a view.
  bool input_view(const std::string& value, bool three_d, int64_t heads, std::string& source, ir::HeadLayout& layout) {
    std::vector<Step> chain;  // from the source forwards
    for (std::string v = value; chain.size() < 64;) {
      const ir::Node* p = producer_node(g_, v);
      if (!p || !moves_elements(*p) || p->inputs.empty() || p->inputs[0].empty()) break;
      chain.insert(chain.begin(), Step{p, v});
      v = p->inputs[0];
    }
    for (size_t first = 0; first <= chain.size(); ++first) {
      const std::string root = first < chain.size() ? chain[first].node->inputs[0] : value;
      const auto shape = known_shape(g_, root);
      if (!shape) continue;
      View view = contiguous_view(*shape);
      bool ok = true;
      for (size_t i = first; ok && i < chain.size(); ++i) ok = apply(g_, chain[i], view);
      if (ok && head_layout(view, three_d, heads, layout)) {
        source = root;
        return true;
      }
    }
    return false;
  }

  // Where Y lies in the tensor the layers after it make (Z; Y itself when none follows).
  bool output_view(const std::string& y, const ir::AttentionShape& s, std::string& z, ir::HeadLayout& layout,
                   std::vector<size_t>& chain) {
    std::vector<size_t> after;
    for (std::string v = y; after.size() < 64;) {
      const int c = sole_consumer(g_, v);
      if (c < 0) break;
      const ir::Node& n = g_.nodes[static_cast<size_t>(c)];
      if (n.inputs[0] != v || n.outputs.size() != 1 || !(reshapes_only(n) || (n.domain.empty() && n.op == "Transpose")))
        break;
      after.push_back(static_cast<size_t>(c));
      v = n.outputs[0];
    }
    // The longest chain whose inverse is a view of its end.
    for (size_t len = after.size() + 1; len-- > 0;) {
      const std::string end = len ? g_.nodes[after[len - 1]].outputs[0] : y;
      const auto end_shape = known_shape(g_, end);
      if (!end_shape) continue;
      View view = contiguous_view(*end_shape);
      bool ok = true;
      for (size_t i = len; ok && i-- > 0;) {
        const ir::Node& n = g_.nodes[after[i]];
        const auto in_shape = known_shape(g_, n.inputs[0]);
        if (!in_shape) ok = false;
        else if (n.op == "Transpose") ok = transpose(view, inverse(transpose_perm(n, in_shape->size())));
        else ok = reshape(view, *in_shape);
      }
      if (ok && head_layout(view, s.three_d, s.q_heads, layout)) {
        z = end;
        chain.assign(after.begin(), after.begin() + static_cast<std::ptrdiff_t>(len));
        return true;
      }
    }
    return false;
  }

  static std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
    std::vector<int64_t> inv(perm.size(), -1);
    for (size_t i = 0; i < perm.size(); ++i)
      if (perm[i] >= 0 && perm[i] < static_cast<int64_t>(perm.size())) inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
    return inv;
  }

  ir::Graph& g_;
};

}  // namespace

int fold_attention_views(ir::Graph& graph) {
  // Attentions by the value they write: moving layouts reorders the nodes.
  std::vector<std::string> attentions;
  for (const ir::Node& n : graph.nodes)
    if (n.domain.empty() && n.op == "Attention" && !n.outputs.empty() && !n.outputs[0].empty())
      attentions.push_back(n.outputs[0]);
  ViewFolder folder(graph);
  int folded = 0;
  for (const std::string& y : attentions) {
    if (move_layouts_next_to(graph, y)) ir::infer_shapes(graph);
    const int at = graph.producer(y);
    if (at >= 0 && folder.fold(static_cast<size_t>(at))) ++folded;
  }
  if (folded) {
    eliminate_dead_code(graph);
    graph.prune_values();
  }
  return folded;
}

}  // namespace kiln::passes
