// QuantizeLinear's reference arithmetic per tensor, for the CPU kernels that quantize their own
// output (kiln::QuantizingLayerNorm): y = saturate(round_half_even(x / scale) + zero_point) for
// int8 and uint8, y = float8(x / scale + zero_point) rounded to nearest even (saturating unless
// `saturate` is false) for the float8 types, as QuantizeLinear's kernel computes them.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cpu {

// x float32; y of x's size and the quantized type; zero_point one value of y's type.
void quantize_per_tensor(const Tensor& x, float scale, const Tensor& zero_point, bool saturate, Tensor& y);

}  // namespace kiln::cpu
