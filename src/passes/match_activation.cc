#include "passes/match_activation.h"

#include <cmath>
#include <limits>

#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

bool near(std::optional<float> v, double want) {
  return v && std::fabs(*v - want) <= 1e-4 * std::fabs(want);
}

// x * 0.5 * (1 + Erf(x / sqrt 2)) in the arrangements exporters write. `x` has exactly two
// readers: the x / sqrt 2 node and a Mul.
std::optional<ActivationMatch> match_erf_gelu(const ir::Graph& g, const std::string& x) {
  std::vector<int> readers = g.consumers(x);
  if (readers.size() != 2 || use_count(g, x) != 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    const ir::Node* scale = node_at(g, readers[static_cast<size_t>(k)]);
    const ir::Node* other = node_at(g, readers[static_cast<size_t>(1 - k)]);
    bool scaled = (is_onnx(scale, "Div") && scale->inputs.size() == 2 && scale->inputs[0] == x &&
                   near(scalar_constant(g, scale->inputs[1]), std::sqrt(2.0))) ||
                  (is_onnx(scale, "Mul") && near(scalar_constant(g, other_input(*scale, x)), std::sqrt(0.5)));
    if (!scaled || !is_onnx(other, "Mul")) continue;
    int erf_i = sole_consumer(g, out0(scale));
    const ir::Node* erf = node_at(g, erf_i);
    if (!is_onnx(erf, "Erf")) continue;
    int add_i = sole_consumer(g, out0(erf));
    const ir::Node* add = node_at(g, add_i);
    if (!is_onnx(add, "Add") || !near(scalar_constant(g, other_input(*add, out0(erf))), 1.0)) continue;
    const int other_i = readers[static_cast<size_t>(1 - k)];
    const std::string one_plus = out0(add);
    ActivationMatch m;
    m.act.kind = ir::ActivationKind::kGelu;
    m.nodes = {readers[static_cast<size_t>(k)], erf_i, add_i, other_i};
    std::string other_rest = other_input(*other, x);
    if (other_rest == one_plus) {
      // (x * (1 + erf)) * 0.5
      int half_i = sole_consumer(g, out0(other));
      const ir::Node* half = node_at(g, half_i);
      if (!is_onnx(half, "Mul") || !near(scalar_constant(g, other_input(*half, out0(other))), 0.5)) continue;
      m.nodes.push_back(half_i);
      m.output = out0(half);
      return m;
    }
    if (near(scalar_constant(g, other_rest), 0.5)) {
      // (x * 0.5) * (1 + erf)
      int last_i = sole_consumer(g, out0(other));
      if (last_i < 0 || last_i != sole_consumer(g, one_plus)) continue;
      const ir::Node* last = node_at(g, last_i);
      if (!is_onnx(last, "Mul") || other_input(*last, one_plus) != out0(other)) continue;
      m.nodes.push_back(last_i);
      m.output = out0(last);
      return m;
    }
    // x * ((1 + erf) * 0.5)
    int half_i = sole_consumer(g, one_plus);
    const ir::Node* half = node_at(g, half_i);
    if (!is_onnx(half, "Mul") || !near(scalar_constant(g, other_input(*half, one_plus)), 0.5)) continue;
    if (other_rest != out0(half)) continue;
    m.nodes = {readers[static_cast<size_t>(k)], erf_i, add_i, half_i, other_i};
    m.output = out0(other);
    return m;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ActivationMatch> match_activation(const ir::Graph& g, const std::string& x) {
  if (x.empty() || g.is_graph_output(x)) return std::nullopt;
  int uses = use_count(g, x);
  if (uses == 2) {
    // SiLU: Mul(x, Sigmoid(x)).
    std::vector<int> readers = g.consumers(x);
    if (readers.size() == 2) {
      for (int k = 0; k < 2; ++k) {
        int sig_i = readers[static_cast<size_t>(k)];
        int mul_i = readers[static_cast<size_t>(1 - k)];
        const ir::Node* sig = node_at(g, sig_i);
        const ir::Node* mul = node_at(g, mul_i);
        if (is_onnx(sig, "Sigmoid") && is_onnx(mul, "Mul") && sole_consumer(g, out0(sig)) == mul_i &&
            other_input(*mul, x) == out0(sig)) {
          ActivationMatch m;
          m.act.kind = ir::ActivationKind::kSiLU;
          m.nodes = {sig_i, mul_i};
          m.output = out0(mul);
          return m;
        }
      }
    }
    return match_erf_gelu(g, x);
  }
  int c = sole_consumer(g, x);
  const ir::Node* n = node_at(g, c);
  if (!n || !n->domain.empty() || n->inputs.empty() || n->inputs[0] != x || n->outputs.size() != 1) return std::nullopt;
  ActivationMatch m;
  m.nodes = {c};
  m.output = n->outputs[0];
  const std::string& op = n->op;
  if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "HardSwish") {
    ir::Activation::parse(op, m.act.kind);
  } else if (op == "LeakyRelu") {
    m.act.kind = ir::ActivationKind::kLeakyRelu;
    m.act.alpha = n->attrs.get_float("alpha", 0.01f);
  } else if (op == "HardSigmoid") {
    m.act.kind = ir::ActivationKind::kHardSigmoid;
    m.act.alpha = n->attrs.get_float("alpha", 0.2f);
    m.act.beta = n->attrs.get_float("beta", 0.5f);
  } else if (op == "Gelu") {
    std::string approx = n->attrs.get_string("approximate", "none");
    if (approx == "none") m.act.kind = ir::ActivationKind::kGelu;
    else if (approx == "tanh") m.act.kind = ir::ActivationKind::kGeluTanh;
    else return std::nullopt;
  } else if (op == "Clip") {
    // Missing bounds are unbounded; a computed bound cannot be baked into the kernel.
    m.act.kind = ir::ActivationKind::kClip;
    m.act.alpha = std::numeric_limits<float>::lowest();
    m.act.beta = std::numeric_limits<float>::max();
    if (n->has_input(1)) {
      auto lo = scalar_constant(g, n->inputs[1]);
      if (!lo) return std::nullopt;
      m.act.alpha = *lo;
    }
    if (n->has_input(2)) {
      auto hi = scalar_constant(g, n->inputs[2]);
      if (!hi) return std::nullopt;
      m.act.beta = *hi;
    }
  } else {
    return std::nullopt;
  }
  return m;
}

}  // namespace kiln::passes
