// Running a node whose float16 or bfloat16 values a kernel does not take, on the kernel's float32
// form (engine.cc asks for it when a kernel's check refuses a node).
#pragma once

#include <memory>
#include <string>

#include "cpu/kernel.h"

namespace kiln::cpu {

// The kernel of `entry` for `init` with every float16 and bfloat16 input, constant and output
// taken as float32: inputs are widened (exactly), outputs rounded back to their type once (to
// nearest even). For elementwise ops that is computing in the narrow type itself, bit for bit
// (float32 holds the sum, product, quotient or square root of two float16 or bfloat16 values
// closely enough that rounding it once more lands where rounding the exact result would). Ops
// that sum many terms (products, convolutions, reductions, normalizations, attention) sum in
// float32 and round once, as ONNX Runtime's CPU kernels and the GPU's tensor cores do; ONNX's
// reference rounds their partial sums in the narrow type instead, so the two differ in the last
// places now and then, and the widened result is the closer one to the exact value. nullptr for
// a node with no float16/bfloat16 value, a kernel that makes its own outputs (control flow: its
// subgraphs keep their declared types), or a float32 form that is refused too.
std::unique_ptr<Kernel> make_widened_kernel(const KernelEntry& entry, const KernelInit& init);

// Whether make_widened_kernel takes the nodes of this kernel (every kernel but control flow's).
bool widens_narrow_floats(const KernelEntry& entry);

}  // namespace kiln::cpu
