// The elementwise unary ops, defined once: the table of their names and of the opset from which
// kiln imports each (read by the importer, the op schemas, the CPU kernels and the CUDA layers),
// and the float math of each, which the CPU kernels and the CUDA kernels both call.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ir/graph.h"
#include "ir/host_device.h"

namespace kiln::ir {

enum class UnaryOp : uint8_t {
  // Float math (unary_float below). Abs, Neg and Sign also take signed integers.
  kRelu, kSigmoid, kTanh, kExp, kLog, kSqrt, kReciprocal, kErf, kAbs, kNeg, kFloor, kCeil, kRound,
  kSin, kCos, kTan, kAsin, kAcos, kAtan, kSinh, kCosh, kAsinh, kAcosh, kAtanh, kSign, kSoftsign,
  kSoftplus, kMish, kElu, kCelu, kLeakyRelu, kThresholdedRelu, kSelu, kHardSigmoid, kHardSwish,
  kGelu, kSwish,
  kGeluTanh,  // Gelu with approximate="tanh" (not a name of its own)
  // The others: Identity (any type), Not (bool), IsNaN and IsInf (float to bool).
  kIdentity, kNot, kIsNaN, kIsInf,
};

struct UnaryOpInfo {
  const char* name;
  // The first opset whose meaning of the op is the one kiln implements: the legacy
  // consumed_inputs attribute left in 6; the trigonometric ops, Erf, Sign and IsNaN arrived in 7
  // and 9, IsInf and ThresholdedRelu in 10; Round is read from 11, the first opset of kiln's
  // importers.
  int since_opset;
  UnaryOp op;
};

inline constexpr UnaryOpInfo kUnaryOps[] = {
    {"Relu", 7, UnaryOp::kRelu},         {"Sigmoid", 7, UnaryOp::kSigmoid},     {"Tanh", 7, UnaryOp::kTanh},
    {"Exp", 7, UnaryOp::kExp},           {"Log", 7, UnaryOp::kLog},             {"Sqrt", 7, UnaryOp::kSqrt},
    {"Reciprocal", 7, UnaryOp::kReciprocal}, {"Erf", 9, UnaryOp::kErf},         {"Abs", 7, UnaryOp::kAbs},
    {"Neg", 7, UnaryOp::kNeg},           {"Floor", 7, UnaryOp::kFloor},         {"Ceil", 7, UnaryOp::kCeil},
    {"Round", 11, UnaryOp::kRound},      {"Sin", 7, UnaryOp::kSin},             {"Cos", 7, UnaryOp::kCos},
    {"Tan", 7, UnaryOp::kTan},           {"Asin", 7, UnaryOp::kAsin},           {"Acos", 7, UnaryOp::kAcos},
    {"Atan", 7, UnaryOp::kAtan},         {"Sinh", 9, UnaryOp::kSinh},           {"Cosh", 9, UnaryOp::kCosh},
    {"Asinh", 9, UnaryOp::kAsinh},       {"Acosh", 9, UnaryOp::kAcosh},         {"Atanh", 9, UnaryOp::kAtanh},
    {"Sign", 9, UnaryOp::kSign},         {"Softsign", 7, UnaryOp::kSoftsign},   {"Softplus", 7, UnaryOp::kSoftplus},
    {"Mish", 18, UnaryOp::kMish},        {"Elu", 7, UnaryOp::kElu},             {"Celu", 12, UnaryOp::kCelu},
    {"LeakyRelu", 7, UnaryOp::kLeakyRelu}, {"ThresholdedRelu", 10, UnaryOp::kThresholdedRelu},
    {"Selu", 7, UnaryOp::kSelu},         {"HardSigmoid", 7, UnaryOp::kHardSigmoid},
    {"HardSwish", 14, UnaryOp::kHardSwish}, {"Gelu", 20, UnaryOp::kGelu},  {"Swish", 24, UnaryOp::kSwish},
    {"Identity", 7, UnaryOp::kIdentity}, {"Not", 7, UnaryOp::kNot},             {"IsNaN", 9, UnaryOp::kIsNaN},
    {"IsInf", 10, UnaryOp::kIsInf},
};

// The entry of an op name; nullptr when it is not a unary op of this table.
inline const UnaryOpInfo* find_unary_op(const std::string& name) {
  for (const UnaryOpInfo& u : kUnaryOps)
    if (name == u.name) return &u;
  return nullptr;
}

constexpr bool has_float_math(UnaryOp op) { return op <= UnaryOp::kGeluTanh; }
constexpr bool takes_signed_integers(UnaryOp op) { return op == UnaryOp::kAbs || op == UnaryOp::kNeg || op == UnaryOp::kSign; }

// The attributes an op's math reads (Selu: alpha, and gamma as beta; HardSigmoid: alpha, beta;
// Elu, Celu, LeakyRelu, ThresholdedRelu, Swish: alpha).
struct UnaryParams {
  float alpha = 0.f, beta = 0.f;
};

// The float math a unary node computes (Gelu's approximate="tanh" as kGeluTanh) and its
// attributes with ONNX's defaults; throws kInternal naming the node for one without float math.
UnaryOp float_unary_op_of(const Node& node, UnaryParams& params);

// std::min and std::max exactly, NaN included (the result depends on the argument order).
KILN_HOST_DEVICE float std_min(float a, float b) { return b < a ? b : a; }
KILN_HOST_DEVICE float std_max(float a, float b) { return a < b ? b : a; }

// The float math of each op with float math, for the host and the device alike.
template <UnaryOp kOp>
KILN_HOST_DEVICE float unary_float(float x, UnaryParams p) {
  const float alpha = p.alpha, beta = p.beta;
  if constexpr (kOp == UnaryOp::kRelu) return x > 0.f ? x : 0.f;
  else if constexpr (kOp == UnaryOp::kSigmoid) return 1.f / (1.f + expf(-x));
  else if constexpr (kOp == UnaryOp::kTanh) return tanhf(x);
  else if constexpr (kOp == UnaryOp::kExp) return expf(x);
  else if constexpr (kOp == UnaryOp::kLog) return logf(x);
  else if constexpr (kOp == UnaryOp::kSqrt) return sqrtf(x);
  else if constexpr (kOp == UnaryOp::kReciprocal) return 1.f / x;
  else if constexpr (kOp == UnaryOp::kErf) return erff(x);
  else if constexpr (kOp == UnaryOp::kAbs) return fabsf(x);
  else if constexpr (kOp == UnaryOp::kNeg) return -x;
  else if constexpr (kOp == UnaryOp::kFloor) return floorf(x);
  else if constexpr (kOp == UnaryOp::kCeil) return ceilf(x);
  else if constexpr (kOp == UnaryOp::kRound) return rintf(x);  // half to even
  else if constexpr (kOp == UnaryOp::kSin) return sinf(x);
  else if constexpr (kOp == UnaryOp::kCos) return cosf(x);
  else if constexpr (kOp == UnaryOp::kTan) return tanf(x);
  else if constexpr (kOp == UnaryOp::kAsin) return asinf(x);
  else if constexpr (kOp == UnaryOp::kAcos) return acosf(x);
  else if constexpr (kOp == UnaryOp::kAtan) return atanf(x);
  else if constexpr (kOp == UnaryOp::kSinh) return sinhf(x);
  else if constexpr (kOp == UnaryOp::kCosh) return coshf(x);
  else if constexpr (kOp == UnaryOp::kAsinh) return asinhf(x);
  else if constexpr (kOp == UnaryOp::kAcosh) return acoshf(x);
  else if constexpr (kOp == UnaryOp::kAtanh) return atanhf(x);
  else if constexpr (kOp == UnaryOp::kSign) return x > 0.f ? 1.f : (x < 0.f ? -1.f : 0.f);
  else if constexpr (kOp == UnaryOp::kSoftsign) return x / (1.f + fabsf(x));
  else if constexpr (kOp == UnaryOp::kSoftplus) return log1pf(expf(-fabsf(x))) + std_max(x, 0.f);
  else if constexpr (kOp == UnaryOp::kMish) return x * tanhf(log1pf(expf(-fabsf(x))) + std_max(x, 0.f));
  else if constexpr (kOp == UnaryOp::kElu) return x >= 0.f ? x : alpha * (expf(x) - 1.f);
  else if constexpr (kOp == UnaryOp::kCelu) return std_max(0.f, x) + std_min(0.f, alpha * (expf(x / alpha) - 1.f));
  else if constexpr (kOp == UnaryOp::kLeakyRelu) return x >= 0.f ? x : alpha * x;
  else if constexpr (kOp == UnaryOp::kThresholdedRelu) return x > alpha ? x : 0.f;
  else if constexpr (kOp == UnaryOp::kSelu) return x > 0.f ? beta * x : beta * (alpha * expf(x) - alpha);  // beta: gamma
  else if constexpr (kOp == UnaryOp::kHardSigmoid) {
    // NaN gives 1, as std::min(1.f, NaN) does; said explicitly, since nvcc turns the clamp into
    // a saturating instruction that maps NaN to 0.
    const float v = alpha * x + beta;
    return v != v ? 1.f : std_max(0.f, std_min(1.f, v));
  }
  else if constexpr (kOp == UnaryOp::kHardSwish) return x * std_max(0.f, std_min(1.f, x / 6.f + 0.5f));
  else if constexpr (kOp == UnaryOp::kGelu) return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
  else if constexpr (kOp == UnaryOp::kSwish) return x * (1.f / (1.f + expf(-alpha * x)));
  else if constexpr (kOp == UnaryOp::kGeluTanh) return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  else static_assert(kOp == UnaryOp::kRelu, "no float math for this op");
}

// Expands X(kOp) for every op with float math: what a switch instantiating unary_float per op
// lists (with_float_unary_op below; the CUDA kernels' switches on the device).
#define KILN_FLOAT_UNARY_OPS(X)                                                                                   \
  X(kRelu) X(kSigmoid) X(kTanh) X(kExp) X(kLog) X(kSqrt) X(kReciprocal) X(kErf) X(kAbs) X(kNeg) X(kFloor)         \
  X(kCeil) X(kRound) X(kSin) X(kCos) X(kTan) X(kAsin) X(kAcos) X(kAtan) X(kSinh) X(kCosh) X(kAsinh) X(kAcosh)      \
  X(kAtanh) X(kSign) X(kSoftsign) X(kSoftplus) X(kMish) X(kElu) X(kCelu) X(kLeakyRelu) X(kThresholdedRelu)        \
  X(kSelu) X(kHardSigmoid) X(kHardSwish) X(kGelu) X(kSwish) X(kGeluTanh)

// Calls f(std::integral_constant<UnaryOp, op>{}) for an op with float math, so that the caller
// instantiates its loop or kernel for that op's unary_float; throws kInternal for any other op.
template <class F>
decltype(auto) with_float_unary_op(UnaryOp op, F&& f) {
  switch (op) {
#define KILN_UNARY_CASE(k) \
  case UnaryOp::k: return f(std::integral_constant<UnaryOp, UnaryOp::k>{});
    KILN_FLOAT_UNARY_OPS(KILN_UNARY_CASE)
#undef KILN_UNARY_CASE
    default: break;
  }
  throw Error(ErrorKind::kInternal, "unary op " + std::to_string(static_cast<int>(op)) + " has no float math");
}

}  // namespace kiln::ir
