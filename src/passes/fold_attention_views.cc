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
// A view is an offset and, per axis, a list of modes (size, stride), outer first: an axis
// that merged axes not adjacent in memory (batch and heads above) keeps one mode for each,
// so a reshape that splits them again later is still a view. Reshapes split and merge modes;
// a chain that needs to split a mode where its size does not divide stops the fold there
// (a shorter chain, from a later tensor, may still fold).
#include <deque>
#include <numeric>

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

const ir::Node* producer_node(const ir::Graph& g, const std::string& value) {
  const int p = value.empty() ? -1 : g.producer(value);
  return p < 0 ? nullptr : &g.nodes[static_cast<size_t>(p)];
}

std::optional<std::vector<int64_t>> known_shape(const ir::Graph& g, const std::string& value) {
  const ir::TensorType* t = type_of(g, value);
  if (!t || !t->shape || !ir::all_known(*t->shape)) return std::nullopt;
  return ir::known_values(*t->shape);
}

std::optional<std::vector<int64_t>> constant_ints(const ir::Graph& g, const std::string& name) {
  const Tensor* t = name.empty() ? nullptr : g.constant(name);
  if (!t || !is_integer(t->dtype())) return std::nullopt;
  return t->to_int_vector();
}

bool reshapes_only(const ir::Node& n) {
  return n.domain.empty() && (n.op == "Reshape" || n.op == "Squeeze" || n.op == "Unsqueeze" || n.op == "Flatten");
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

bool moves_elements(const ir::Node& n) {
  return reshapes_only(n) || (n.domain.empty() && (n.op == "Transpose" || n.op == "Gather" || n.op == "Slice" || n.op == "Split"));
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
  ViewFolder folder(graph);
  int folded = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& n = graph.nodes[i];
    if (n.domain.empty() && n.op == "Attention" && folder.fold(i)) ++folded;
  }
  if (folded) {
    eliminate_dead_code(graph);
    graph.prune_values();
  }
  return folded;
}

}  // namespace kiln::passes
