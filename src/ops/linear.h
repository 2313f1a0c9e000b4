// Shape inference shared by Gemm / kiln::FusedGemm and MatMul / kiln::FusedMatMul.
#pragma once

#include "ir/op_schema.h"

namespace kiln::ir {

// Gemm: A (M x K, or K x M with transA), B (K x N, or N x K with transB), optional C
// unidirectionally broadcastable to M x N. Output M x N.
void infer_gemm(InferContext& ctx);
int64_t gemm_flops(const FlopsContext& ctx);

// MatMul with numpy semantics: 1-D operands get a dim prepended (A) / appended (B) that is
// removed again; batch dims broadcast.
void infer_matmul(InferContext& ctx);
// The output dims of numpy's matmul of inputs a_input and b_input (nullopt: a rank unknown);
// fails naming the node when they do not multiply.
std::optional<Dims> matmul_dims(InferContext& ctx, size_t a_input, size_t b_input);
int64_t matmul_flops(const FlopsContext& ctx);

}  // namespace kiln::ir
