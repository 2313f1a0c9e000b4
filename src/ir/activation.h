// The activation that a fused op (kiln::FusedConv, kiln::FusedGemm, kiln::FusedMatMul,
// kiln::QConv) applies in its epilogue, stored on the node as attributes:
//   activation        string: "" (none), "Relu", "Clip", "Sigmoid", "SiLU", "HardSwish",
//                     "HardSigmoid", "LeakyRelu", "Tanh", "Gelu", "GeluTanh"
//   activation_alpha  float: Clip's min, LeakyRelu's and HardSigmoid's alpha
//   activation_beta   float: Clip's max, HardSigmoid's beta
// Every backend reads it through this struct, and every backend's kernels (the CPU's and the
// GPU's, which take it by value) compute it with apply(): the meaning is defined once.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "ir/graph.h"
#include "ir/host_device.h"

namespace kiln::ir {

enum class ActivationKind : uint8_t {
  kNone, kRelu, kClip, kSigmoid, kSiLU, kHardSwish, kHardSigmoid, kLeakyRelu, kTanh, kGelu, kGeluTanh
};

struct Activation {
  ActivationKind kind = ActivationKind::kNone;
  float alpha = 0.f;
  float beta = 0.f;

  // The attribute's spelling of each kind ("" for kNone), and back (false: no such activation).
  static const char* name_of(ActivationKind kind);
  static bool parse(const std::string& name, ActivationKind& kind);
  static bool is_known(const std::string& name) {
    ActivationKind unused;
    return parse(name, unused);
  }
  // The activation of this spelling; throws kUnsupported for one this kiln does not know.
  static Activation named(const std::string& name, float alpha = 0.f, float beta = 0.f);
  const char* name() const { return name_of(kind); }
  bool none() const { return kind == ActivationKind::kNone; }

  // Throws kUnsupported naming the node for an activation this kiln does not know (the schema
  // refuses those first). A node with several activations (kiln::ChannelsLastSeparableConv's
  // stages) names the others' attributes with a prefix: "expand_activation", ...
  static Activation from_node(const Node& node, const std::string& prefix = "");
  void store(Node& node, const std::string& prefix = "") const;

  // v limited to [lo, hi]; NaN stays NaN (as ONNX's Clip).
  static KILN_HOST_DEVICE float clamp(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }
  // a * b rounded on its own, on the device too, where nvcc would otherwise fuse it with the sum
  // that follows into one FMA: INT8 epilogues on the GPU then give the CPU engine's integers.
  static KILN_HOST_DEVICE float rounded_product(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
  }

  // The definition, for the host and the device alike.
  KILN_HOST_DEVICE float apply(float x) const {
    switch (kind) {
      case ActivationKind::kNone: return x;
      case ActivationKind::kRelu: return x > 0.f ? x : 0.f;
      case ActivationKind::kClip: return clamp(x, alpha, beta);
      case ActivationKind::kSigmoid: return 1.f / (1.f + expf(-x));
      case ActivationKind::kSiLU: return x / (1.f + expf(-x));
      case ActivationKind::kHardSwish: return x * clamp(x / 6.f + 0.5f, 0.f, 1.f);
      case ActivationKind::kHardSigmoid: return clamp(rounded_product(alpha, x) + beta, 0.f, 1.f);
      case ActivationKind::kLeakyRelu: return x >= 0.f ? x : alpha * x;
      case ActivationKind::kTanh: return tanhf(x);
      case ActivationKind::kGelu: return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
      case ActivationKind::kGeluTanh:
        return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    }
    return x;
  }
};

}  // namespace kiln::ir
