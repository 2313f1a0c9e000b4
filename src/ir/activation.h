// The activation that a fused op (kiln::FusedConv, kiln::FusedGemm, kiln::FusedMatMul)
// applies in its epilogue, stored on the node as attributes:
//   activation        string: "" (none), "Relu", "Clip", "Sigmoid", "SiLU", "HardSwish",
//                     "HardSigmoid", "LeakyRelu", "Tanh", "Gelu", "GeluTanh"
//   activation_alpha  float: Clip's min, LeakyRelu's and HardSigmoid's alpha
//   activation_beta   float: Clip's max, HardSigmoid's beta
// Every backend reads it through this struct so the meaning is defined once.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "ir/graph.h"

namespace kiln::ir {

struct Activation {
  std::string kind;  // "" = identity
  float alpha = 0.f;
  float beta = 0.f;

  static Activation from_node(const Node& node) {
    Activation a;
    a.kind = node.attrs.get_string("activation", "");
    a.alpha = node.attrs.get_float("activation_alpha", 0.f);
    a.beta = node.attrs.get_float("activation_beta", 0.f);
    return a;
  }
  void store(Node& node) const {
    node.attrs.set("activation", kind);
    node.attrs.set("activation_alpha", alpha);
    node.attrs.set("activation_beta", beta);
  }
  static bool is_known(const std::string& kind) {
    for (const char* k : {"", "Relu", "Clip", "Sigmoid", "SiLU", "HardSwish", "HardSigmoid",
                          "LeakyRelu", "Tanh", "Gelu", "GeluTanh"})
      if (kind == k) return true;
    return false;
  }

  // The reference definition (the CPU engine uses it directly).
  float apply(float x) const {
    switch (kind.empty() ? '\0' : kind[0]) {
      case '\0': return x;
      case 'R': return x > 0.f ? x : 0.f;                                   // Relu
      case 'C': return std::min(std::max(x, alpha), beta);                   // Clip
      case 'S':
        if (kind == "Sigmoid") return 1.f / (1.f + std::exp(-x));
        return x / (1.f + std::exp(-x));                                     // SiLU
      case 'H':
        if (kind == "HardSwish") return x * std::clamp(x / 6.f + 0.5f, 0.f, 1.f);
        return std::clamp(alpha * x + beta, 0.f, 1.f);                       // HardSigmoid
      case 'L': return x >= 0.f ? x : alpha * x;                            // LeakyRelu
      case 'T': return std::tanh(x);                                         // Tanh
      case 'G':
        if (kind == "GeluTanh")
          return 0.5f * x * (1.f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
        return 0.5f * x * (1.f + std::erf(x * 0.7071067811865476f));       // Gelu
    }
    return x;
  }
};

}  // namespace kiln::ir
