// The float math of kiln's elementwise ops, defined once: the CPU kernels, the CUDA kernels
// compiled with kiln and the kernels kiln generates and compiles with NVRTC at build time
// (src/cuda/layers/fused_elementwise_source.cc) all call these functions, so that a generated
// kernel computes bit for bit what the compiled ones do. It therefore includes nothing under
// NVRTC, which has no standard headers: its math functions (expf, erff, ...) are built in there.
#pragma once

#ifndef __CUDACC_RTC__
#include <cmath>
#endif

#include "ir/host_device.h"

namespace kiln::ir {

enum class UnaryOp : unsigned char {
  // Float math (unary_float below). Abs, Neg and Sign also take signed integers.
  kRelu, kSigmoid, kTanh, kExp, kLog, kSqrt, kReciprocal, kErf, kAbs, kNeg, kFloor, kCeil, kRound,
  kSin, kCos, kTan, kAsin, kAcos, kAtan, kSinh, kCosh, kAsinh, kAcosh, kAtanh, kSign, kSoftsign,
  kSoftplus, kMish, kElu, kCelu, kLeakyRelu, kThresholdedRelu, kSelu, kHardSigmoid, kHardSwish,
  kGelu, kSwish,
  kGeluTanh,  // Gelu with approximate="tanh" (not a name of its own)
  // The others: Identity (any type), Not (bool), IsNaN and IsInf (float to bool).
  kIdentity, kNot, kIsNaN, kIsInf,
};

// The attributes an op's math reads (Selu: alpha, and gamma as beta; HardSigmoid: alpha, beta;
// Elu, Celu, LeakyRelu, ThresholdedRelu, Swish: alpha).
struct UnaryParams {
  float alpha = 0.f, beta = 0.f;
};

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

enum class ElementwiseBinary : unsigned char { kAdd, kSub, kMul, kDiv, kMax, kMin };

// The float math of the binary steps, as the CPU's binary kernels compute it (Max and Min
// propagate NaN from either side).
KILN_HOST_DEVICE float elementwise_binary(ElementwiseBinary op, float a, float b) {
  switch (op) {
    case ElementwiseBinary::kAdd: return a + b;
    case ElementwiseBinary::kSub: return a - b;
    case ElementwiseBinary::kMul: return a * b;
    case ElementwiseBinary::kDiv: return a / b;
    case ElementwiseBinary::kMax: return a >= b || a != a ? a : b;
    case ElementwiseBinary::kMin: return a <= b || a != a ? a : b;
  }
  return a;
}

}  // namespace kiln::ir
