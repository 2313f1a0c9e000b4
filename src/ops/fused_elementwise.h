// kiln::FusedElementwise: a group of elementwise float ops computed in one pass over memory (the
// pass passes/fuse_elementwise.cc forms the groups; the CPU kernel and the CUDA layer run them).
//
//   kiln::FusedElementwise(X0, X1, ...) -> Y
//     A program of steps over registers. Registers 0 .. k-1 are the inputs: with concat_parts = p
//     > 0, register 0 is Concat(X0 .. X{p-1}, axis = concat_axis) and register r > 0 is node
//     input p + r - 1; with p = 0, register r is input r. Step s writes register k + s; Y is the
//     last step's register. Every step's result has Y's shape; inputs broadcast to it (numpy
//     rules). Everything is float32, computed in float32.
//     Attributes:
//       steps        strings: each step's op: Add Sub Mul Div Max Min, or a unary op with float
//                    math (ir/unary_ops.h), Gelu's tanh form spelled "GeluTanh"
//       operands     ints, two per step: the registers it reads (-1 for a unary step's second)
//       alphas, betas floats, one each per step: the unary op's parameters (ir::UnaryParams)
//       concat_parts int (0: none), concat_axis int (non-negative)
//       members      strings: the names of the nodes the group replaced, in their order (the
//                    Concat first), for inspection
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/host_device.h"
#include "ir/unary_ops.h"

namespace kiln::ir {

struct ElementwiseStep {
  bool binary = false;
  ElementwiseBinary binary_op = ElementwiseBinary::kAdd;
  UnaryOp unary_op = UnaryOp::kRelu;
  UnaryParams params;
  int a = -1, b = -1;  // operand registers
};

struct ElementwiseProgram {
  int inputs = 0;  // registers that are inputs (the concatenation counts once)
  int concat_parts = 0;
  int concat_axis = 0;
  std::vector<ElementwiseStep> steps;
  std::vector<std::string> members;

  int registers() const { return inputs + static_cast<int>(steps.size()); }
  // The most step results alive at once between steps (the last step's, the output, not
  // counted): the registers a kernel that reads the inputs from memory as the steps need them
  // must hold.
  int live_results() const;
  // The program of a FusedElementwise node with `node_inputs` inputs; throws kInvalidModel naming
  // the node when its attributes do not make one (an operand that is not yet computed, an op
  // without float math, lengths that disagree).
  static ElementwiseProgram of(const Node& node);
  void store(Node& node) const;
};

// The op of a step's spelling (true), or false when it is not one FusedElementwise computes.
bool parse_elementwise_op(const std::string& name, ElementwiseStep& step);
std::string elementwise_op_name(const ElementwiseStep& step);

}  // namespace kiln::ir
