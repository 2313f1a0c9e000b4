// The elementwise unary ops, defined once: the table of their names and of the opset from which
// kiln imports each (read by the importer, the op schemas, the CPU kernels and the CUDA layers),
// and (ir/float_math.h) the float math of each, which the CPU kernels and the CUDA kernels both
// call.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "ir/float_math.h"
#include "ir/graph.h"

namespace kiln::ir {

constexpr bool has_float_math(UnaryOp op) { return op <= UnaryOp::kGeluTanh; }
constexpr bool takes_signed_integers(UnaryOp op) { return op == UnaryOp::kAbs || op == UnaryOp::kNeg || op == UnaryOp::kSign; }

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

// The float math a unary node computes (Gelu's approximate="tanh" as kGeluTanh) and its
// attributes with ONNX's defaults; throws kInternal naming the node for one without float math.
UnaryOp float_unary_op_of(const Node& node, UnaryParams& params);

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
