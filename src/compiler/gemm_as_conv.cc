// Gemm / MatMul layers as 1x1 convolutions for the INT8 pass (see gemm_as_conv.h).
#include "compiler/gemm_as_conv.h"

#include <optional>
#include <vector>

#include "ir/activation.h"

namespace kiln::compiler {

namespace {

// A matrix product the rewrite handles: y = act(a @ W^T + bias), W as [N, K] rows.
struct Product {
  std::string a, y;
  int64_t k = 0, n = 0;
  std::vector<float> weights;  // [N, K]
  std::optional<std::vector<float>> bias;
  std::string residual;  // Z, "" when absent: exactly the output's shape
  // The output's shape for the final Reshape (-1 for the one dim to infer); empty when several
  // dims are dynamic (batch and sequence): then A's leading dims and N, taken at run time.
  std::vector<int64_t> out_shape;
};

bool is(const ir::Node& n, const char* op, const char* domain) { return n.op == op && n.domain == domain; }

const Tensor* float_constant(const ir::Graph& g, const std::string& name, int rank) {
  const Tensor* t = name.empty() ? nullptr : g.constant(name);
  return t && t->dtype() == DType::kFloat32 && (rank < 0 || t->rank() == rank) ? t : nullptr;
}

// The product of node n, if it is one the rewrite can take.
std::optional<Product> match(const ir::Graph& g, const ir::Node& n) {
  const bool gemm = is(n, "Gemm", "") || is(n, "FusedGemm", "kiln");
  const bool matmul = is(n, "MatMul", "") || is(n, "FusedMatMul", "kiln");
  if ((!gemm && !matmul) || n.inputs.size() < 2 || n.outputs.size() != 1) return std::nullopt;
  const ir::Value* a = g.find_value(n.inputs[0]);
  const ir::Value* y = g.find_value(n.outputs[0]);
  const Tensor* b = float_constant(g, n.inputs[1], 2);
  if (!a || !y || !b || a->type.dtype != DType::kFloat32 || !a->type.shape || !y->type.shape) return std::nullopt;
  Product p;
  p.a = n.inputs[0];
  p.y = n.outputs[0];
  bool b_is_nk = false;
  if (gemm) {
    if (a->type.rank() != 2 || n.attrs.get_int("transA", 0) != 0 || n.attrs.get_float("alpha", 1.f) != 1.f) return std::nullopt;
    b_is_nk = n.attrs.get_int("transB", 0) != 0;
    p.out_shape = {-1, b_is_nk ? b->dim(0) : b->dim(1)};
  } else {
    if (a->type.rank() < 2 || y->type.rank() != a->type.rank()) return std::nullopt;
    int unknown = 0;
    for (const ir::Dim& d : *y->type.shape) {
      unknown += !d.known();
      p.out_shape.push_back(d.known() ? d.value : -1);
    }
    if (unknown > 1) p.out_shape.clear();
  }
  p.k = b_is_nk ? b->dim(1) : b->dim(0);
  p.n = b_is_nk ? b->dim(0) : b->dim(1);
  const ir::Dim a_k = a->type.shape->back();
  if (!a_k.known() || a_k.value != p.k) return std::nullopt;
  p.weights.resize(static_cast<size_t>(p.n * p.k));
  for (int64_t r = 0; r < p.n; ++r)
    for (int64_t c = 0; c < p.k; ++c)
      p.weights[static_cast<size_t>(r * p.k + c)] = b_is_nk ? b->data<float>()[r * p.k + c] : b->data<float>()[c * p.n + r];
  if (n.has_input(2)) {
    const Tensor* c = float_constant(g, n.inputs[2], -1);
    if (!c || c->numel() != p.n || (c->rank() == 2 && c->dim(0) != 1) || c->rank() > 2) return std::nullopt;
    const float beta = gemm ? n.attrs.get_float("beta", 1.f) : 1.f;
    p.bias.emplace(static_cast<size_t>(p.n));
    for (int64_t i = 0; i < p.n; ++i) (*p.bias)[static_cast<size_t>(i)] = beta * c->data<float>()[i];
  }
  if (n.has_input(3)) {
    const ir::Value* z = g.find_value(n.inputs[3]);
    if (!z || z->type.dtype != DType::kFloat32 || !z->type.shape || z->type.shape != y->type.shape) return std::nullopt;
    p.residual = n.inputs[3];
  }
  return p;
}

// Why product `p` of node `n` stays float ("" when it is rewritten).
std::string why_float(const ir::Node& n, const Product& p, const std::map<std::string, float>& scales,
                      const std::set<std::string>& pinned_float, bool (*quantizable)(const std::string& activation)) {
  if (pinned_float.count(n.name)) return "pinned to float";
  if (!quantizable(ir::Activation::from_node(n).name())) return "activation has no INT8 epilogue";
  if (p.k % 16 != 0) return std::to_string(p.k) + " input features (INT8 needs multiples of 16)";
  if (!p.residual.empty() && p.n % 16 != 0)
    return "a residual over " + std::to_string(p.n) + " output features (INT8 pads them to a multiple of 16)";
  if (!scales.count(p.a)) return "no calibrated scale for its input " + p.a;
  return "";
}

std::string reshape(ir::Graph& g, const std::string& x, const std::vector<int64_t>& shape, const std::string& out,
                    std::vector<ir::Node>& nodes) {
  ir::Node r;
  r.op = "Reshape";
  r.name = g.unique_name(out + "_reshape");
  r.inputs = {x, g.add_constant(out + "_shape", Tensor::from_vector<int64_t>({static_cast<int64_t>(shape.size())}, shape))};
  r.outputs = {out};
  nodes.push_back(std::move(r));
  return out;
}

}  // namespace

int rewrite_gemms_as_convs(ir::Graph& g, std::map<std::string, float>& scales, const std::set<std::string>& pinned_float,
                           bool (*quantizable)(const std::string& activation), std::vector<std::string>& kept_float) {
  int rewritten = 0;
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  const std::vector<ir::Node> nodes = g.nodes;
  // The products rewritten, by node index.
  std::set<int> rewritten_nodes;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (std::optional<Product> p = match(g, nodes[i]); p && why_float(nodes[i], *p, scales, pinned_float, quantizable).empty())
      rewritten_nodes.insert(static_cast<int>(i));
  // A product's output read only by rewritten products (as A or as the residual Z) goes to them
  // as the image it is, without the Reshapes back and forth: the INT8 pass then sees one
  // convolution feeding others, and the first writes the value quantized (a transformer's
  // feed-forward products: the GELU's output in int8 / E4M3 straight from the first product's
  // epilogue, not a float tensor and a quantize layer).
  auto read_only_by_products = [&](const std::string& v) {
    if (g.is_graph_output(v) || g.consumers(v).empty()) return false;
    for (int c : g.consumers(v)) {
      if (!rewritten_nodes.count(c)) return false;
      const ir::Node& r = nodes[static_cast<size_t>(c)];
      for (size_t k = 0; k < r.inputs.size(); ++k)
        if (r.inputs[k] == v && k != 0 && k != 3) return false;
    }
    return true;
  };
  // One image view of each activation, however many products read it, so that the INT8 pass
  // quantizes it once (a transformer's Q, K and V products share theirs).
  std::map<std::string, std::string> as_image;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    std::optional<Product> p = match(g, n);
    const ir::Activation act = ir::Activation::from_node(n);
    std::string why = !p ? "-" : rewritten_nodes.count(static_cast<int>(i)) ? "" : why_float(n, *p, scales, pinned_float, quantizable);
    if (!why.empty()) {
      if (why != "-") kept_float.push_back(n.name + ": " + why);
      kept.push_back(n);
      continue;
    }
    // M one-pixel images of K channels.
    const ir::Value& a = g.value(p->a);
    ir::Dim m = 1;
    for (size_t d = 0; d + 1 < a.type.shape->size(); ++d) {
      const ir::Dim& dim = (*a.type.shape)[d];
      m = m.known() && dim.known() ? ir::Dim(m.value * dim.value) : ir::Dim::unknown();
    }
    // A value of M images of `channels` channels, with the scale of `like` when it has one.
    auto image_value = [&](const std::string& name, int64_t channels, const std::string& like) {
      ir::Value v;
      v.name = name;
      v.type.dtype = DType::kFloat32;
      v.type.shape = ir::Dims{m, channels, 1, 1};
      g.set_value(v);
      if (auto s = scales.find(like); s != scales.end()) scales[name] = s->second;
      return name;
    };
    std::vector<ir::Node> added;
    std::string& x4 = as_image[p->a];
    if (x4.empty())
      x4 = image_value(reshape(g, p->a, {-1, p->k, 1, 1}, g.unique_name(p->a + "_as_image"), added), p->k, p->a);

    ir::Node conv;
    conv.op = "FusedConv";
    conv.domain = "kiln";
    conv.name = n.name;  // --layer-precision and the accuracy budget name the layer as before
    conv.attrs.set("kernel_shape", std::vector<int64_t>{1, 1});
    act.store(conv);
    // Output features padded to a multiple of 16 (the INT8 convolution's channel granularity)
    // with zero weights and biases; the extra channels are sliced off after it.
    const int64_t padded = (p->n + 15) / 16 * 16;
    p->weights.resize(static_cast<size_t>(padded * p->k), 0.f);
    const std::string w = g.add_constant(n.name + "_as_conv_weight", Tensor::from_vector<float>({padded, p->k, 1, 1}, p->weights));
    conv.inputs = {x4, w, ""};
    if (p->bias) {
      p->bias->resize(static_cast<size_t>(padded), 0.f);
      conv.inputs[2] = g.add_constant(n.name + "_as_conv_bias", Tensor::from_vector<float>({padded}, *p->bias));
    }
    if (!p->residual.empty()) {  // the skip connection, as images of the output's channels
      std::string& z4 = as_image[p->residual];
      if (z4.empty())
        z4 = image_value(reshape(g, p->residual, {-1, p->n, 1, 1}, g.unique_name(p->residual + "_as_image"), added), p->n,
                         p->residual);
      conv.inputs.push_back(z4);
    }
    if (conv.inputs.back().empty()) conv.inputs.pop_back();
    std::string y4 = image_value(g.unique_name(p->y + "_as_image"), padded, p->y);
    conv.outputs = {y4};
    added.push_back(std::move(conv));
    if (padded != p->n) {
      ir::Node slice;
      slice.op = "Slice";
      slice.name = g.unique_name(n.name + "_unpad");
      auto i64 = [&](const std::string& hint, int64_t v) { return g.add_constant(hint, Tensor::from_vector<int64_t>({1}, {v})); };
      slice.inputs = {y4, i64(slice.name + "_starts", 0), i64(slice.name + "_ends", p->n), i64(slice.name + "_axes", 1)};
      y4 = image_value(g.unique_name(p->y + "_unpadded"), p->n, p->y);
      slice.outputs = {y4};
      added.push_back(std::move(slice));
    }
    if (padded == p->n && read_only_by_products(p->y)) {
      as_image[p->y] = y4;
    } else if (!p->out_shape.empty()) {
      reshape(g, y4, p->out_shape, p->y, added);
    } else {
      // Shape(A)[:-1] ++ [N]: A's leading dims are the output's.
      ir::Node lead;
      lead.op = "Shape";
      lead.name = g.unique_name(n.name + "_leading_dims");
      lead.inputs = {p->a};
      lead.outputs = {g.unique_name(p->a + "_leading_dims")};
      lead.attrs.set("end", int64_t{-1});
      ir::Node cat;
      cat.op = "Concat";
      cat.name = g.unique_name(n.name + "_output_shape");
      cat.inputs = {lead.outputs[0], g.add_constant(cat.name + "_features", Tensor::from_vector<int64_t>({1}, {p->n}))};
      cat.outputs = {g.unique_name(p->y + "_shape")};
      cat.attrs.set("axis", int64_t{0});
      ir::Node r;
      r.op = "Reshape";
      r.name = g.unique_name(p->y + "_reshape");
      r.inputs = {y4, cat.outputs[0]};
      r.outputs = {p->y};
      added.push_back(std::move(lead));
      added.push_back(std::move(cat));
      added.push_back(std::move(r));
    }
    kept.insert(kept.end(), added.begin(), added.end());
    ++rewritten;
  }
  g.nodes = std::move(kept);
  return rewritten;
}

}  // namespace kiln::compiler
