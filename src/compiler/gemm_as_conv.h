// INT8 matrix products through the INT8 convolution: a product of activations [M, K] and a
// constant weight matrix is a 1x1 convolution of M one-pixel images of K channels, so the INT8
// pass quantizes Gemm and MatMul layers by rewriting them as one, with everything the INT8
// convolution has (per-channel weights, the fused epilogue, the exact CPU reference, the GPU
// kernels), instead of a second INT8 operator:
//   Gemm / kiln::FusedGemm (A [M, K], constant B, optional constant bias C, activation)
//   MatMul / kiln::FusedMatMul (A [..., K], constant B [K, N], optional bias, activation)
//     -> Reshape(A, [-1, K, 1, 1]) -> kiln::FusedConv(1x1) -> Reshape(back to the output's shape)
// A residual Z in the epilogue (kiln::FusedGemm / FusedMatMul input 3, a transformer block's
// skip connection) becomes the convolution's residual, reshaped the same way.
// K must be a multiple of 16; N need not: the convolution's output channels are padded to the
// next multiple of 16 (zero weights and biases) and a Slice drops the padding after it (a
// classifier's 1000 classes run as 1008 channels); a product with a residual and such N stays
// float.
// Only layers the INT8 pass will quantize are rewritten (see quantize_graph.h).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::compiler {

// Rewrites every eligible Gemm / MatMul; adds the scales of the new values (a reshape keeps
// its input's scale) to `scales`. `quantizable(activation)` says whether the INT8 epilogue has
// the layer's activation. Products with constant weights left as they are go to kept_float as
// "name: why". Returns how many were rewritten.
int rewrite_gemms_as_convs(ir::Graph& graph, std::map<std::string, float>& scales, const std::set<std::string>& pinned_float,
                           bool (*quantizable)(const std::string& activation), std::vector<std::string>& kept_float);

}  // namespace kiln::compiler
