// BatchNormalization at inference is a per-channel affine map y = x * s + t with
//   s = gamma / sqrt(var + eps),  t = beta - mean * s.
// After a layer with constant weights that is linear in its output channels (Conv,
// ConvTranspose, Gemm, 2-D MatMul) it folds into the weights and bias:
//   W' = W * s (per output channel),  b' = b * s + t.
// A BatchNormalization that cannot fold but has constant parameters becomes Mul + Add, which
// the backends fuse or run as cheap elementwise ops.
#include <cmath>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

struct Affine {
  std::vector<float> scale;  // s per channel
  std::vector<float> shift;  // t per channel
};

// The BN's per-channel affine map, or nullopt when its parameters are not constant float32
// vectors of one length or it runs in training mode.
std::optional<Affine> batchnorm_affine(const ir::Graph& g, const ir::Node& bn) {
  if (bn.attrs.get_int("training_mode", 0) != 0) return std::nullopt;
  if (bn.outputs.size() > 1)
    for (size_t o = 1; o < bn.outputs.size(); ++o)
      if (!bn.outputs[o].empty()) return std::nullopt;  // running stats are training outputs
  if (bn.inputs.size() < 5) return std::nullopt;
  const Tensor* gamma = float_constant(g, bn.inputs[1]);
  const Tensor* beta = float_constant(g, bn.inputs[2]);
  const Tensor* mean = float_constant(g, bn.inputs[3]);
  const Tensor* var = float_constant(g, bn.inputs[4]);
  if (!gamma || !beta || !mean || !var) return std::nullopt;
  int64_t c = gamma->numel();
  for (const Tensor* t : {gamma, beta, mean, var})
    if (t->rank() != 1 || t->numel() != c) return std::nullopt;
  float eps = bn.attrs.get_float("epsilon", 1e-5f);
  Affine a;
  for (int64_t i = 0; i < c; ++i) {
    // Computed in double: the folded weights should be as close as possible to the original
    // two-step computation.
    double s = gamma->data<float>()[i] / std::sqrt(static_cast<double>(var->data<float>()[i]) + eps);
    a.scale.push_back(static_cast<float>(s));
    a.shift.push_back(static_cast<float>(beta->data<float>()[i] - mean->data<float>()[i] * s));
  }
  return a;
}

// Conv weights [M, C/group, k...]: output channel m is W[m].
// ConvTranspose weights [C, M/group, k...]: output channel g*(M/group) + j is W[c, j] for c in
// group g.
bool scale_conv_weights(const ir::Node& layer, const Tensor& w, const Affine& a, Tensor& out) {
  if (w.rank() < 3) return false;
  int64_t out_channels = static_cast<int64_t>(a.scale.size());
  int64_t inner = 1;
  for (int d = 2; d < w.rank(); ++d) inner *= w.dim(d);
  out = w.clone();
  float* p = out.data<float>();
  if (layer.op == "Conv") {
    if (w.dim(0) != out_channels) return false;
    for (int64_t m = 0; m < w.dim(0); ++m)
      for (int64_t k = 0; k < w.dim(1) * inner; ++k) p[m * w.dim(1) * inner + k] *= a.scale[static_cast<size_t>(m)];
    return true;
  }
  int64_t group = layer.attrs.get_int("group", 1);
  if (group <= 0 || w.dim(0) % group != 0 || w.dim(1) * group != out_channels) return false;
  int64_t c_per_group = w.dim(0) / group;
  for (int64_t c = 0; c < w.dim(0); ++c)
    for (int64_t j = 0; j < w.dim(1); ++j) {
      float s = a.scale[static_cast<size_t>((c / c_per_group) * w.dim(1) + j)];
      for (int64_t k = 0; k < inner; ++k) p[(c * w.dim(1) + j) * inner + k] *= s;
    }
  return true;
}

// The layer's existing per-channel bias as a vector (zeros when absent), or nullopt when it
// is not a constant float32 vector of the right length.
std::optional<std::vector<float>> per_channel_bias(const ir::Graph& g, const std::string& name, size_t channels) {
  std::vector<float> b(channels, 0.f);
  if (name.empty()) return b;
  const Tensor* t = float_constant(g, name);
  if (!t || static_cast<size_t>(t->numel()) != channels) return std::nullopt;
  for (int d = 0; d + 1 < t->rank(); ++d)
    if (t->dim(d) != 1) return std::nullopt;
  for (size_t i = 0; i < channels; ++i) b[i] = t->data<float>()[i];
  return b;
}

Tensor fold_bias(const std::vector<float>& b, const Affine& a, float bias_scale = 1.f) {
  std::vector<float> out(b.size());
  for (size_t i = 0; i < b.size(); ++i) out[i] = bias_scale * b[i] * a.scale[i] + a.shift[i];
  return Tensor::from_vector<float>({static_cast<int64_t>(b.size())}, out);
}

// Folds `bn` into the node producing its input; returns false when the pattern does not fit.
bool fold_into_producer(ir::Graph& g, size_t bn_index, const Affine& a) {
  const ir::Node& bn = g.nodes[bn_index];
  const std::string x = bn.inputs[0];
  int p = g.producer(x);
  if (p < 0 || !only_feeds_one_input(g, x)) return false;
  ir::Node& layer = g.nodes[static_cast<size_t>(p)];
  if (!layer.domain.empty() || layer.outputs.size() != 1) return false;
  const ir::TensorType* xt = type_of(g, x);
  if (!xt || xt->dtype != DType::kFloat32 || xt->rank() < 2) return false;
  size_t channels = a.scale.size();
  const std::string y = bn.outputs[0];

  if (layer.op == "Conv" || layer.op == "ConvTranspose") {
    const Tensor* w = float_constant(g, layer.inputs.size() > 1 ? layer.inputs[1] : "");
    if (!w) return false;
    auto b = per_channel_bias(g, layer.has_input(2) ? layer.inputs[2] : "", channels);
    Tensor w2;
    if (!b || !scale_conv_weights(layer, *w, a, w2)) return false;
    std::string wname = g.add_constant(layer.inputs[1] + "_bnfolded", std::move(w2));
    std::string bname = g.add_constant(layer.name + "_bnfolded_bias", fold_bias(*b, a));
    layer.inputs.resize(3);
    layer.inputs[1] = wname;
    layer.inputs[2] = bname;
  } else if (layer.op == "Gemm") {
    // Y = alpha * A' B' + beta * C; channels are the columns of Y (BN's axis 1 of [M, N]).
    if (xt->rank() != 2) return false;
    const Tensor* w = float_constant(g, layer.inputs.size() > 1 ? layer.inputs[1] : "");
    if (!w || w->rank() != 2) return false;
    bool trans_b = layer.attrs.get_int("transB", 0) != 0;
    int64_t n = trans_b ? w->dim(0) : w->dim(1);
    int64_t k_dim = trans_b ? w->dim(1) : w->dim(0);
    if (n != static_cast<int64_t>(channels)) return false;
    auto c = per_channel_bias(g, layer.has_input(2) ? layer.inputs[2] : "", channels);
    if (!c) return false;
    Tensor w2 = w->clone();
    float* pw = w2.data<float>();
    for (int64_t k = 0; k < k_dim; ++k)
      for (int64_t j = 0; j < n; ++j) {
        size_t idx = static_cast<size_t>(trans_b ? j * k_dim + k : k * n + j);
        pw[idx] *= a.scale[static_cast<size_t>(j)];
      }
    float beta = layer.attrs.get_float("beta", 1.f);
    std::string wname = g.add_constant(layer.inputs[1] + "_bnfolded", std::move(w2));
    // beta is folded into the new C, which is then added with beta = 1.
    std::string cname = g.add_constant(layer.name + "_bnfolded_bias", fold_bias(*c, a, beta));
    layer.inputs.resize(3);
    layer.inputs[1] = wname;
    layer.inputs[2] = cname;
    layer.attrs.set("beta", 1.f);
  } else if (layer.op == "MatMul") {
    // Only a 2-D product has its columns on BN's channel axis.
    if (xt->rank() != 2) return false;
    const Tensor* w = float_constant(g, layer.inputs[1]);
    if (!w || w->rank() != 2 || w->dim(1) != static_cast<int64_t>(channels)) return false;
    Tensor w2 = w->clone();
    float* pw = w2.data<float>();
    for (int64_t k = 0; k < w->dim(0); ++k)
      for (int64_t j = 0; j < w->dim(1); ++j) pw[k * w->dim(1) + j] *= a.scale[static_cast<size_t>(j)];
    std::string wname = g.add_constant(layer.inputs[1] + "_bnfolded", std::move(w2));
    std::string bname = g.add_constant(layer.name + "_bnfolded_bias", Tensor::from_vector<float>({static_cast<int64_t>(channels)}, a.shift));
    layer.inputs[1] = wname;
    // The BN node becomes the bias Add (fuse_epilogue turns MatMul + Add into FusedMatMul).
    ir::Node& add = g.nodes[bn_index];
    add.op = "Add";
    add.attrs = ir::Attributes();
    add.inputs = {x, bname};
    add.outputs = {y};
    return true;
  } else {
    return false;
  }
  // The layer now writes the BN's output; the BN node goes.
  layer.outputs[0] = y;
  g.nodes[bn_index].op.clear();  // marked for removal by the caller
  return true;
}

// BN(x) -> Mul(x, s) + t with s, t shaped [C, 1, ..., 1] to broadcast over axis 1.
bool to_mul_add(ir::Graph& g, size_t bn_index, const Affine& a) {
  ir::Node bn = g.nodes[bn_index];
  const ir::TensorType* xt = type_of(g, bn.inputs[0]);
  if (!xt || xt->dtype != DType::kFloat32 || xt->rank() < 2) return false;
  std::vector<int64_t> shape(static_cast<size_t>(xt->rank() - 1), 1);
  shape[0] = static_cast<int64_t>(a.scale.size());
  std::string s = g.add_constant(bn.name + "_scale", Tensor::from_vector<float>(shape, a.scale));
  std::string t = g.add_constant(bn.name + "_shift", Tensor::from_vector<float>(shape, a.shift));
  std::string mid = g.unique_name(bn.outputs[0] + "_scaled");
  ir::Value mv;
  mv.name = mid;
  mv.type = *xt;
  g.set_value(mv);
  ir::Node mul;
  mul.name = g.unique_name(bn.name + "_mul");
  mul.op = "Mul";
  mul.inputs = {bn.inputs[0], s};
  mul.outputs = {mid};
  ir::Node add;
  add.name = g.unique_name(bn.name + "_add");
  add.op = "Add";
  add.inputs = {mid, t};
  add.outputs = {bn.outputs[0]};
  g.nodes[bn_index] = std::move(add);
  g.nodes.insert(g.nodes.begin() + static_cast<std::ptrdiff_t>(bn_index), std::move(mul));
  return true;
}

}  // namespace

int fold_batchnorm(ir::Graph& graph) {
  int folded = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    ir::Node& bn = graph.nodes[i];
    if (!bn.domain.empty() || bn.op != "BatchNormalization" || bn.inputs.empty() || bn.outputs.empty()) continue;
    std::optional<Affine> a = batchnorm_affine(graph, bn);
    if (!a) continue;
    if (fold_into_producer(graph, i, *a)) {
      if (graph.nodes[i].op.empty()) {
        graph.nodes.erase(graph.nodes.begin() + static_cast<std::ptrdiff_t>(i));
        --i;
      }
      ++folded;
    } else if (to_mul_add(graph, i, *a)) {
      ++i;  // skip the Add just inserted after the Mul
      ++folded;
    }
  }
  if (folded) graph.prune_values();
  return folded;
}

}  // namespace kiln::passes
