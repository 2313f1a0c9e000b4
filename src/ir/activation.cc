#include "ir/activation.h"

namespace kiln::ir {

namespace {

struct Spelling {
  ActivationKind kind;
  const char* name;
};

constexpr Spelling kSpellings[] = {
    {ActivationKind::kNone, ""},           {ActivationKind::kRelu, "Relu"},
    {ActivationKind::kClip, "Clip"},       {ActivationKind::kSigmoid, "Sigmoid"},
    {ActivationKind::kSiLU, "SiLU"},       {ActivationKind::kHardSwish, "HardSwish"},
    {ActivationKind::kHardSigmoid, "HardSigmoid"}, {ActivationKind::kLeakyRelu, "LeakyRelu"},
    {ActivationKind::kTanh, "Tanh"},       {ActivationKind::kGelu, "Gelu"},
    {ActivationKind::kGeluTanh, "GeluTanh"},
};

}  // namespace

const char* Activation::name_of(ActivationKind kind) {
  for (const Spelling& s : kSpellings)
    if (s.kind == kind) return s.name;
  return "?";
}

bool Activation::parse(const std::string& name, ActivationKind& kind) {
  for (const Spelling& s : kSpellings)
    if (name == s.name) {
      kind = s.kind;
      return true;
    }
  return false;
}

Activation Activation::named(const std::string& name, float alpha, float beta) {
  Activation a{ActivationKind::kNone, alpha, beta};
  if (!parse(name, a.kind)) throw Error(ErrorKind::kUnsupported, "unknown epilogue activation '" + name + "'");
  return a;
}

Activation Activation::from_node(const Node& node, const std::string& prefix) {
  Activation a;
  const std::string name = node.attrs.get_string(prefix + "activation", "");
  if (!parse(name, a.kind)) throw node.error(ErrorKind::kUnsupported, "unknown epilogue activation '" + name + "'");
  a.alpha = node.attrs.get_float(prefix + "activation_alpha", 0.f);
  a.beta = node.attrs.get_float(prefix + "activation_beta", 0.f);
  return a;
}

void Activation::store(Node& node, const std::string& prefix) const {
  node.attrs.set(prefix + "activation", std::string(name()));
  node.attrs.set(prefix + "activation_alpha", alpha);
  node.attrs.set(prefix + "activation_beta", beta);
}

}  // namespace kiln::ir
