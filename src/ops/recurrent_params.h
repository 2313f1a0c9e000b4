// The activations of RNN, GRU and LSTM (their `activations`, `activation_alpha` and
// `activation_beta` attributes), read once and shared by every backend: the CPU kernel and the
// GPU layer apply the same functions with the same parameters.
#pragma once

#include <math.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/host_device.h"

namespace kiln::ir {

enum class RecurrentActivationKind : int {
  kSigmoid, kTanh, kRelu, kLeakyRelu, kThresholdedRelu, kScaledTanh, kHardSigmoid, kElu, kSoftsign, kSoftplus, kAffine,
};

struct RecurrentActivation {
  RecurrentActivationKind kind = RecurrentActivationKind::kSigmoid;
  float alpha = 0.f, beta = 0.f;

  KILN_HOST_DEVICE float operator()(float x) const {
    switch (kind) {
      case RecurrentActivationKind::kSigmoid: return 1.f / (1.f + expf(-x));
      case RecurrentActivationKind::kTanh: return tanhf(x);
      case RecurrentActivationKind::kRelu: return x < 0.f ? 0.f : x;  // std::max(x, 0.f)
      case RecurrentActivationKind::kLeakyRelu: return x >= 0.f ? x : alpha * x;
      case RecurrentActivationKind::kThresholdedRelu: return x > alpha ? x : 0.f;
      case RecurrentActivationKind::kScaledTanh: return alpha * tanhf(beta * x);
      case RecurrentActivationKind::kHardSigmoid: {
        const float v = alpha * x + beta;
        const float below_one = v < 1.f ? v : 1.f;  // std::min(1.f, v)
        return 0.f < below_one ? below_one : 0.f;   // std::max(0.f, ...)
      }
      case RecurrentActivationKind::kElu: return x >= 0.f ? x : alpha * (expf(x) - 1.f);
      case RecurrentActivationKind::kSoftsign: return x / (1.f + fabsf(x));
      case RecurrentActivationKind::kSoftplus: return log1pf(expf(-fabsf(x))) + (x < 0.f ? 0.f : x);
      case RecurrentActivationKind::kAffine: break;
    }
    return alpha * x + beta;
  }
};

// Activations per gate function: RNN 1 (f), GRU 2 (f, g), LSTM 3 (f, g, h).
inline int recurrent_functions(const std::string& op) { return op == "LSTM" ? 3 : op == "GRU" ? 2 : 1; }

// The activations of each direction: the attribute's list (the forward direction's first), with
// alpha and beta taken in order by those that use them; ONNX's defaults where absent. Throws,
// naming the node, for an unknown function or a list of the wrong length.
inline std::vector<std::vector<RecurrentActivation>> recurrent_activations(const Node& node, int dirs) {
  static const char* const kNames[] = {"Sigmoid", "Tanh", "Relu", "LeakyRelu", "ThresholdedRelu", "ScaledTanh",
                                       "HardSigmoid", "Elu", "Softsign", "Softplus", "Affine"};
  const int per_direction = recurrent_functions(node.op);
  std::vector<std::string> names = node.attrs.get_strings("activations");
  if (names.empty()) {
    const std::vector<std::string> defaults = node.op == "RNN"   ? std::vector<std::string>{"Tanh"}
                                              : node.op == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                                 : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
    for (int d = 0; d < dirs; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  }
  if (static_cast<int>(names.size()) != per_direction * dirs)
    throw node.error(ErrorKind::kInvalidModel, "activations lists " + std::to_string(names.size()) + " functions, " +
                                                   std::to_string(per_direction * dirs) + " are needed");
  const std::vector<float> alphas = node.attrs.get_floats("activation_alpha"), betas = node.attrs.get_floats("activation_beta");
  size_t next_alpha = 0, next_beta = 0;
  std::vector<std::vector<RecurrentActivation>> out(static_cast<size_t>(dirs));
  for (size_t k = 0; k < names.size(); ++k) {
    const std::string& name = names[k];
    const auto known = std::find(std::begin(kNames), std::end(kNames), name);
    if (known == std::end(kNames)) throw node.error(ErrorKind::kUnsupported, "activation '" + name + "' is not supported");
    RecurrentActivation fn;
    fn.kind = static_cast<RecurrentActivationKind>(known - std::begin(kNames));
    const bool uses_alpha = name == "LeakyRelu" || name == "ThresholdedRelu" || name == "ScaledTanh" ||
                            name == "HardSigmoid" || name == "Elu" || name == "Affine";
    const bool uses_beta = name == "ScaledTanh" || name == "HardSigmoid" || name == "Affine";
    if (uses_alpha)
      fn.alpha = next_alpha < alphas.size() ? alphas[next_alpha++] : (name == "LeakyRelu" ? 0.01f : name == "HardSigmoid" ? 0.2f : 1.f);
    if (uses_beta)
      fn.beta = next_beta < betas.size() ? betas[next_beta++] : (name == "HardSigmoid" ? 0.5f : name == "Affine" ? 0.f : 1.f);
    out[k / static_cast<size_t>(per_direction)].push_back(fn);
  }
  return out;
}

}  // namespace kiln::ir
