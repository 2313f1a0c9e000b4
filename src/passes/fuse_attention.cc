// Attention fusion: scaled dot-product attention as exporters write it out becomes one ONNX
// Attention node (opset 23 semantics, ops/attention_params.h), which each backend runs as one
// layer instead of two batched products, a scale, a mask, a softmax and a transpose:
//
//   S = MatMul(Q', K')     Q' = Q [* c]...          K' = K^T [* c]..., K^T = Transpose(X [* c]...)
//                          or any value whose last two axes swapped are K
//   S' = S [* c | / c]... [+ mask]                  c: scalar constants, their product the scale
//   P = Softmax(S', axis = last)
//   Y = MatMul(P, V)
//   -> Y = Attention(Q, K, V, mask, scale = the product of the c's)
//
// 4-D products [batch, heads, seq, size] map to Attention's 4-D form (key/value heads of one
// broadcast over the query heads are its kv_num_heads = 1), or to its 3-D form when Q, K and V
// are heads split from [batch, seq, heads * size] projections and Y is merged back so (the
// Reshapes and Transposes around attention then go); 3-D products [batch, seq, size] to its
// 3-D form with one head. The intermediate values S, S' and P must have no other reader
// (they would be computed twice). A Softmax that sits between two MatMuls but does not match
// gets a note saying which element failed, so no attention is missed silently.
//
// One difference in meaning: a row whose mask hides every key gives zeros (Attention's
// definition) where the unfused softmax gives NaN.
#include <cmath>
#include <numeric>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// The element of a float constant holding one element (of any rank), or nullopt.
std::optional<double> scalar_of(const ir::Graph& g, const std::string& name) {
  const Tensor* t = name.empty() ? nullptr : g.constant(name);
  if (!t || !is_float(t->dtype()) || t->numel() != 1) return std::nullopt;
  return t->value_as_double(0);
}

// Walks back from `value` through Mul / Div by scalar constants whose result keeps `value`'s
// shape, multiplying `scale` by their factors; returns the value before them.
std::string strip_scalar_factors(const ir::Graph& g, std::string value, double& scale) {
  for (;;) {
    const ir::Node* n = producer_node(g, value);
    if (!n || n->inputs.size() != 2 || (!is_onnx(n, "Mul") && !is_onnx(n, "Div"))) return value;
    const ir::TensorType* out = type_of(g, value);
    std::string rest;
    std::optional<double> c;
    if (auto c1 = scalar_of(g, n->inputs[1])) {
      rest = n->inputs[0];
      c = n->op == "Div" ? 1.0 / *c1 : *c1;
    } else if (auto c0 = scalar_of(g, n->inputs[0]); c0 && n->op == "Mul") {
      rest = n->inputs[1];
      c = c0;
    } else {
      return value;
    }
    const ir::TensorType* in = type_of(g, rest);
    // The constant must not broadcast the tensor to a higher rank.
    if (!in || !out || !in->shape || !out->shape || in->rank() != out->rank()) return value;
    scale *= *c;
    value = rest;
  }
}

// A dim every binding makes equal to `want` (known and equal, or the same symbol).
bool dim_equal(const ir::Dim& d, const ir::Dim& want) { return d == want; }

class AttentionFuser {
 public:
  AttentionFuser(ir::Graph& g, std::vector<std::string>& notes) : g_(g), notes_(notes) {}

  // Tries the Softmax at `softmax_index`; true when it was fused.
  bool try_softmax(size_t softmax_index) {
    const ir::Node& sm = g_.nodes[softmax_index];
    if (sm.outputs.size() != 1) return false;
    const std::string probs = sm.outputs[0];
    // Only a Softmax whose probabilities feed a MatMul's left side is an attention candidate.
    std::vector<int> readers = g_.consumers(probs);
    int pv = -1;
    for (int r : readers) {
      const ir::Node& n = g_.nodes[static_cast<size_t>(r)];
      if (is_onnx(&n, "MatMul") && n.inputs.size() == 2 && n.inputs[0] == probs) pv = r;
    }
    if (pv < 0) {
      // Not a candidate; but probabilities that reach a MatMul's left side through a few
      // one-reader nodes (a Cast to another type, a Mul) are an attention kiln does not fuse:
      // say so and say where.
      std::string path, value = probs;
      for (int hop = 0; hop < 3; ++hop) {
        const std::vector<int> next = g_.consumers(value);
        if (next.size() != 1 || g_.is_graph_output(value)) break;
        const ir::Node& n = g_.nodes[static_cast<size_t>(next[0])];
        if (is_onnx(&n, "MatMul") && n.inputs.size() == 2 && n.inputs[0] == value) {
          notes_.push_back("attention at Softmax '" + sm.name + "' not fused: its probabilities reach MatMul '" + n.name +
                           "' through " + path + ", not directly");
          break;
        }
        if (n.outputs.size() != 1) break;
        path += (path.empty() ? "" : ", ") + n.op + " '" + n.name + "'";
        value = n.outputs[0];
      }
      return false;
    }
    std::string why = fuse(softmax_index, static_cast<size_t>(pv));
    if (why.empty()) return true;
    notes_.push_back("attention at Softmax '" + sm.name + "' not fused: " + why);
    return false;
  }

 private:
  std::string fuse(size_t softmax_index, size_t pv_index) {
    const ir::Node sm = g_.nodes[softmax_index];
    const ir::Node pv = g_.nodes[pv_index];
    const std::string probs = sm.outputs[0];
    if (readers_other_than(probs, pv_index)) return "the probabilities are also read elsewhere";
    const ir::TensorType* p_type = type_of(g_, probs);
    if (!p_type || !p_type->shape) return "the probabilities' shape is unknown";
    const int rank = p_type->rank();
    if (rank != 3 && rank != 4) return "the probabilities have rank " + std::to_string(rank) + " (3 or 4 fuse)";
    const int64_t axis = sm.attrs.get_int("axis", -1);
    if (axis != -1 && axis != rank - 1) return "the softmax runs along axis " + std::to_string(axis) + ", not the last";
    if (!is_float(p_type->dtype)) return "the scores are " + to_string(p_type->dtype) + ", not floating point";

    // Back from the softmax: an optional mask Add, then scalar factors, then Q.K^T.
    double scale = 1.0;
    std::string scores = sm.inputs.empty() ? "" : sm.inputs[0];
    std::string mask;
    std::vector<std::string> chain;  // values between Q.K^T and the softmax
    if (const ir::Node* add = producer_node(g_, scores); is_onnx(add, "Add") && add->inputs.size() == 2) {
      // The mask is the operand that does not come from the product (through scalar factors).
      for (int side = 0; side < 2 && mask.empty(); ++side) {
        double s = 1.0;
        const std::string from = strip_scalar_factors(g_, add->inputs[static_cast<size_t>(side)], s);
        if (is_onnx(producer_node(g_, from), "MatMul")) {
          chain.push_back(scores);
          mask = add->inputs[static_cast<size_t>(1 - side)];
          scores = add->inputs[static_cast<size_t>(side)];
        }
      }
      if (mask.empty()) return "the softmax reads an Add of which neither side is a MatMul of queries and keys";
    }
    const std::string product_scaled = scores;
    const std::string product = strip_scalar_factors(g_, scores, scale);
    for (std::string v = product_scaled; v != product;) {
      chain.push_back(v);
      v = producer_node(g_, v)->inputs[scalar_of(g_, producer_node(g_, v)->inputs[1]) ? 0 : 1];
    }
    const ir::Node* qk = producer_node(g_, product);
    if (!is_onnx(qk, "MatMul") || qk->inputs.size() != 2) return "the softmax's input is not a MatMul (of queries and keys), through an optional scale and mask";
    chain.push_back(product);
    for (const std::string& v : chain)
      if (g_.is_graph_output(v) || g_.consumers(v).size() != 1 || use_count(g_, v) != 1)
        return "the scores '" + v + "' are also read elsewhere";

    // Q and K^T, through their scalar factors.
    const std::string q = strip_scalar_factors(g_, qk->inputs[0], scale);
    const std::string k_t = strip_scalar_factors(g_, qk->inputs[1], scale);
    // K^T as a Transpose of (scaled) keys: the keys before the transpose and its permutation.
    std::string k_source = k_t;
    std::vector<int64_t> k_perm;
    if (const ir::Node* t = producer_node(g_, k_t); is_onnx(t, "Transpose") && t->inputs.size() == 1) {
      k_perm = t->attrs.get_ints("perm", {});
      const ir::TensorType* in = type_of(g_, t->inputs[0]);
      if (k_perm.empty() && in && in->shape)  // the default reverses the axes
        for (int i = in->rank() - 1; i >= 0; --i) k_perm.push_back(i);
      if (k_perm.size() == static_cast<size_t>(rank)) k_source = strip_scalar_factors(g_, t->inputs[0], scale);
      else k_perm.clear();
    }
    const std::string v = pv.inputs[1];
    const ir::TensorType *q_type = type_of(g_, q), *kt_type = type_of(g_, k_t), *v_type = type_of(g_, v);
    const ir::TensorType* y_type = type_of(g_, pv.outputs[0]);
    for (const ir::TensorType* t : {q_type, kt_type, v_type, y_type})
      if (!t || !t->shape || t->rank() != rank) return "queries, keys and values are not all of rank " + std::to_string(rank);
    if (q_type->dtype != p_type->dtype || kt_type->dtype != p_type->dtype || v_type->dtype != p_type->dtype)
      return "queries, keys and values differ in type";
    if (!(scale > 0.0) || !std::isfinite(scale)) return "the scale " + std::to_string(scale) + " is not positive and finite";

    // Shapes: Q [B, H, S, D], K^T [B, Hk, D, T], V [B, Hk, T, Dv] (4-D; 3-D without H), with
    // Hk equal to H or 1 and K and V agreeing.
    const ir::Dims &qs = *q_type->shape, &ks = *kt_type->shape, &vs = *v_type->shape;
    if (!dim_equal(ks[0], qs[0]) || !dim_equal(vs[0], qs[0])) return "queries, keys and values differ in batch";
    if (rank == 4) {
      if (!dim_equal(ks[1], vs[1])) return "keys and values differ in heads";
      if (!dim_equal(ks[1], qs[1]) && ks[1] != ir::Dim(1)) return "key heads are neither the query heads nor 1";
    }
    if (!dim_equal(ks[static_cast<size_t>(rank - 1)], vs[static_cast<size_t>(rank - 2)]))
      return "keys and values differ in sequence length";
    if (!mask.empty()) {
      std::string why = check_mask(mask, *p_type, rank);
      if (!why.empty()) return why;
    }

    ir::Node att;
    att.name = g_.unique_name(sm.name + "_attention");
    att.op = "Attention";
    att.attrs.set("scale", static_cast<float>(scale));
    std::vector<ir::Node> inserted;
    if (rank == 4 && merged_heads(q, k_source, k_perm, v, pv_index, qs, ks, att)) {
      // The heads' Reshapes and Transposes die with the chain: Attention's 3-D form reads
      // [batch, seq, heads * size] as the projections wrote them and writes Y that way.
      if (!mask.empty()) att.inputs.push_back(mask);
      g_.nodes[pv_index] = std::move(att);
      return "";
    }
    // K itself: undo the transpose of its last two axes.
    std::string k = untransposed_keys(k_source, k_perm, rank, sm.name, inserted);
    att.inputs = {q, k, v};
    if (!mask.empty()) att.inputs.push_back(mask);
    att.outputs = {pv.outputs[0]};
    if (rank == 3) {
      att.attrs.set("q_num_heads", int64_t{1});
      att.attrs.set("kv_num_heads", int64_t{1});
      if (!mask.empty() && type_of(g_, mask)->rank() == 3) {
        // [B, S, T] masks need the head axis 4-D masks have: [B, 1, S, T].
        ir::Node unsq;
        unsq.name = g_.unique_name(sm.name + "_mask_heads");
        unsq.op = "Unsqueeze";
        unsq.inputs = {mask, g_.add_constant(sm.name + "_mask_axes", Tensor::from_vector<int64_t>({1}, {1}))};
        unsq.outputs = {g_.unique_name(mask + "_heads")};
        ir::Value val;
        val.name = unsq.outputs[0];
        val.type.dtype = type_of(g_, mask)->dtype;
        ir::Dims d = *type_of(g_, mask)->shape;
        d.insert(d.begin() + 1, ir::Dim(1));
        val.type.shape = d;
        g_.set_value(std::move(val));
        att.inputs[3] = unsq.outputs[0];
        inserted.push_back(std::move(unsq));
      }
    }
    // The Attention node takes the place of P.V; the nodes it replaces die as dead code.
    g_.nodes[pv_index] = std::move(att);
    g_.nodes.insert(g_.nodes.begin() + static_cast<std::ptrdiff_t>(pv_index), inserted.begin(), inserted.end());
    return "";
  }

  // X [B, S, H * D] when `split` [B, S, H, D] is Reshape(X), else "".
  std::string split_source(const std::string& split) const {
    const ir::Node* r = producer_node(g_, split);
    if (!is_onnx(r, "Reshape") || r->inputs.empty()) return "";
    const ir::TensorType *x = type_of(g_, r->inputs[0]), *t = type_of(g_, split);
    if (!x || !t || !x->shape || !t->shape || x->rank() != 3 || t->rank() != 4) return "";
    const ir::Dims &xd = *x->shape, &td = *t->shape;
    if (!dim_equal(xd[0], td[0]) || !dim_equal(xd[1], td[1]) || !xd[2].known() || !td[2].known() || !td[3].known() ||
        xd[2].value != td[2].value * td[3].value)
      return "";
    return r->inputs[0];
  }

  // X [B, S, H * D] when `heads` [B, H, S, D] is Transpose(Reshape(X, [B, S, H, D]), (0, 2, 1, 3)).
  std::string heads_source(const std::string& heads) const {
    const ir::Node* t = producer_node(g_, heads);
    if (!is_onnx(t, "Transpose") || t->inputs.size() != 1 ||
        t->attrs.get_ints("perm", {}) != std::vector<int64_t>{0, 2, 1, 3})
      return "";
    return split_source(t->inputs[0]);
  }

  // Attention's 3-D form for a 4-D chain whose Q, K and V are heads split from [B, S, H * D]
  // projections (Reshape, Transpose) and whose Y is merged back the same way (Transpose,
  // Reshape), as BERT- and GPT-style exports write them: `att` gets the 3-D inputs, head counts
  // and the merged output, and the Reshape that wrote that output loses it. False (nothing
  // changed) when any of the four is written otherwise.
  bool merged_heads(const std::string& q, const std::string& k_source, const std::vector<int64_t>& k_perm,
                    const std::string& v, size_t pv_index, const ir::Dims& qs, const ir::Dims& ks, ir::Node& att) {
    if (!qs[1].known() || !ks[1].known()) return false;
    const std::string q3 = heads_source(q), v3 = heads_source(v);
    std::string k3;
    if (k_perm == std::vector<int64_t>{0, 2, 3, 1}) k3 = split_source(k_source);       // [B,T,H,D] -> [B,H,D,T]
    else if (k_perm == std::vector<int64_t>{0, 1, 3, 2}) k3 = heads_source(k_source);  // K^T of K's heads
    if (q3.empty() || k3.empty() || v3.empty()) return false;
    // Y [B, H, S, Dv] -> Transpose (0, 2, 1, 3) -> Reshape [B, S, H * Dv].
    const std::string y4 = g_.nodes[pv_index].outputs[0];
    const int t = sole_consumer(g_, y4);
    if (t < 0) return false;
    const ir::Node& tn = g_.nodes[static_cast<size_t>(t)];
    if (!is_onnx(&tn, "Transpose") || tn.attrs.get_ints("perm", {}) != std::vector<int64_t>{0, 2, 1, 3}) return false;
    const int r = sole_consumer(g_, tn.outputs[0]);
    if (r < 0 || !is_onnx(&g_.nodes[static_cast<size_t>(r)], "Reshape")) return false;
    ir::Node& rn = g_.nodes[static_cast<size_t>(r)];
    if (!merged_shape_ok(tn.outputs[0], rn.outputs[0])) return false;
    att.inputs = {q3, k3, v3};
    att.attrs.set("q_num_heads", qs[1].value);
    att.attrs.set("kv_num_heads", ks[1].value);
    att.outputs = {rn.outputs[0]};
    rn.outputs[0] = g_.unique_name(rn.outputs[0] + "_unmerged");  // dies with the Transpose before it
    ir::Value dead;
    dead.name = rn.outputs[0];
    dead.type = *type_of(g_, att.outputs[0]);
    g_.set_value(std::move(dead));
    return true;
  }

  // Whether `merged` is `split` [B, S, H, Dv] with its last two axes merged.
  bool merged_shape_ok(const std::string& split, const std::string& merged) const {
    const ir::TensorType *t = type_of(g_, split), *m = type_of(g_, merged);
    if (!t || !m || !t->shape || !m->shape || t->rank() != 4 || m->rank() != 3) return false;
    const ir::Dims &td = *t->shape, &md = *m->shape;
    return dim_equal(md[0], td[0]) && dim_equal(md[1], td[1]) && md[2].known() && td[2].known() && td[3].known() &&
           md[2].value == td[2].value * td[3].value;
  }

  bool readers_other_than(const std::string& value, size_t reader) const {
    if (g_.is_graph_output(value)) return true;
    for (int c : g_.consumers(value))
      if (static_cast<size_t>(c) != reader) return true;
    return use_count(g_, value) != 1;
  }

  // "" when `mask` (read by an Add with the scores) broadcasts to the scores without
  // enlarging them, else why not.
  std::string check_mask(const std::string& mask, const ir::TensorType& scores, int rank) const {
    const ir::TensorType* m = type_of(g_, mask);
    if (!m || !m->shape) return "the mask's shape is unknown";
    if (m->dtype != scores.dtype) return "the mask is " + to_string(m->dtype) + ", not the scores' type";
    if (m->rank() > rank) return "the mask has a higher rank than the scores";
    // Attention masks keys past the mask's last axis, where Add would broadcast it.
    if (m->rank() == 0 || !dim_equal(m->shape->back(), scores.shape->back()))
      return "the mask is broadcast along the keys";
    const ir::Dims& ms = *m->shape;
    const ir::Dims& ss = *scores.shape;
    for (size_t i = 0; i < ms.size(); ++i) {
      const ir::Dim& md = ms[ms.size() - 1 - i];
      const ir::Dim& sd = ss[ss.size() - 1 - i];
      if (md != ir::Dim(1) && !dim_equal(md, sd))
        return "the mask's shape " + ir::dims_to_string(ms) + " does not broadcast to the scores' " + ir::dims_to_string(ss);
    }
    return "";
  }

  // K from K^T = Transpose(source, perm) (perm empty: K^T is source itself): the source when
  // the permutation only swaps the last two axes, else a new Transpose of it by the
  // permutation composed with that swap.
  std::string untransposed_keys(const std::string& source, std::vector<int64_t> perm, int rank, const std::string& hint,
                                std::vector<ir::Node>& inserted) {
    if (perm.empty()) {
      perm.resize(static_cast<size_t>(rank));
      std::iota(perm.begin(), perm.end(), 0);
    }
    std::swap(perm[static_cast<size_t>(rank - 2)], perm[static_cast<size_t>(rank - 1)]);
    bool identity = true;
    for (int i = 0; i < rank; ++i) identity = identity && perm[static_cast<size_t>(i)] == i;
    if (identity) return source;
    ir::Node tr;
    tr.name = g_.unique_name(hint + "_keys");
    tr.op = "Transpose";
    tr.inputs = {source};
    tr.attrs.set("perm", perm);
    tr.outputs = {g_.unique_name(hint + "_keys")};
    ir::Value val;
    val.name = tr.outputs[0];
    const ir::TensorType* st = type_of(g_, source);
    val.type.dtype = st->dtype;
    ir::Dims d(static_cast<size_t>(rank));
    for (int i = 0; i < rank; ++i) d[static_cast<size_t>(i)] = (*st->shape)[static_cast<size_t>(perm[static_cast<size_t>(i)])];
    val.type.shape = d;
    g_.set_value(std::move(val));
    std::string out = tr.outputs[0];
    inserted.push_back(std::move(tr));
    return out;
  }

  ir::Graph& g_;
  std::vector<std::string>& notes_;
};

}  // namespace

int fuse_attention(ir::Graph& graph, std::vector<std::string>& notes) {
  AttentionFuser fuser(graph, notes);
  int fused = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& n = graph.nodes[i];
    if (is_onnx(&n, "Softmax") && fuser.try_softmax(i)) ++fused;
  }
  if (fused) {
    eliminate_dead_code(graph);
    graph.prune_values();
  }
  return fused;
}

}  // namespace kiln::passes
