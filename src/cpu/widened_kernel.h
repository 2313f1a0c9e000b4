// Running a node whose float16 or bfloat16 values a kernel does not take, on the kernel's float32
// form (engine.cc asks for it when a kernel's check refuses a node).
#pragma once

#include <memory>
#include <string>

#include "cpu/kernel.h"

namespace kiln::cpu {

// The kernel of `entry` for `init` with every float16 and bfloat16 input, constant and output
// taken as float32: inputs are widened (exactly), outputs rounded back to their type (to nearest
// even). Only for elementwise ops, where that is what computing in the narrow type itself gives
// (float32 holds the sum, product, quotient or square root of two float16 or bfloat16 values
// closely enough that rounding it once more lands where rounding the exact result would), and for
// ops whose definition computes in float32 (LinearAttention). nullptr for other ops, a node with
// no float16/bfloat16 value, or a float32 form that is refused too.
std::unique_ptr<Kernel> make_widened_kernel(const KernelEntry& entry, const KernelInit& init);

// Whether make_widened_kernel takes nodes of this op (an ONNX elementwise op, or LinearAttention).
bool widens_narrow_floats(const std::string& domain, const std::string& op);

}  // namespace kiln::cpu
