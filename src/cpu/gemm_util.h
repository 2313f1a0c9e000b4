// Helpers shared by the CPU compute kernels (Conv, ConvTranspose, Gemm, MatMul and the fused
// forms): a float32 GEMM on OpenBLAS split over kiln's threads, the epilogue that adds biases /
// a residual and applies the fused activation in one pass over an output block, and a matrix
// transpose.
//
// Threading: kiln's kernels own the parallelism (cpu/parallel.h) and call OpenBLAS
// single-threaded from inside their parallel loops, so one pool of threads runs at a time and a
// thread can run im2col, GEMM and epilogue on its own slice of the output while it is in cache.
// Two pools spinning on two cores (OpenBLAS's own threads and kiln's) cost more than they give.
#pragma once

#include <cstdint>

#include "ir/activation.h"

namespace kiln::cpu {

// Makes OpenBLAS run each call on the calling thread. Idempotent; kernels call it at creation.
void use_single_threaded_blas();

// Row-major C[M x N] = alpha * op(A) @ op(B) + beta * C on the calling thread.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The same, split over kiln's threads (by columns when N is wide, else by rows).
void parallel_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// dst [cols x rows] = src [rows x cols] transposed (8 x 8 blocks in AVX registers), over kiln's
// threads when it is large.
void transpose_floats(const float* src, int64_t rows, int64_t cols, float* dst);
// dst[c * ld_dst + r] = src[r * ld_src + c] for one 8 x 8 block, in AVX registers.
void transpose_8x8(const float* src, int64_t ld_src, float* dst, int64_t ld_dst);

// y[i] = Gelu(y[i]) = 0.5 y (1 + erf(y / sqrt 2)) for n floats in place, 8 at a time, erf from a
// rational fit (relative error at most 4e-7 in float32 against erf; the Epilogue's Gelu).
void gelu_erf_in_place(float* y, int64_t n);

// y = act(y) in place over a rows x cols block, rows ld floats apart: 16 floats at a time on
// AVX-512 and 8 on AVX2 for Sigmoid (1 / (1 + e^-y)), SiLU (y / (1 + e^-y)), HardSwish and
// HardSigmoid, e^x within 3 ulp (cpu/vector_exp.h), the rest as ir::Activation::apply; other
// kinds one value at a time through ir::Activation::apply.
void activation_block(const ir::Activation& act, float* y, int64_t ld, int64_t rows, int64_t cols);

// y = act(y + row_bias[r] + col_bias[c] + residual[r, c]) over a rows x cols block.
// Any of row_bias, col_bias, residual may be null; the pointers are already offset to the
// block's first row / column.
class Epilogue {
 public:
  Epilogue() = default;
  explicit Epilogue(ir::Activation act);
  bool is_identity() const { return kind_ == Kind::kNone; }
  // How a vector kernel can apply the activation itself: 0 none, 1 Relu (x > 0 ? x : 0),
  // 2 Clip to [lo, hi]; -1 for the others, which apply() runs afterwards.
  int clamp_mode(float& lo, float& hi) const;
  void apply(float* y, int64_t ld, int64_t rows, int64_t cols, const float* row_bias, const float* col_bias,
             const float* residual, int64_t ld_residual) const;

 private:
  enum class Kind { kNone, kRelu, kClip, kLeakyRelu, kGelu, kSigmoid, kSiLU, kHardSwish, kHardSigmoid, kOther };
  Kind kind_ = Kind::kNone;
  ir::Activation act_;
};

}  // namespace kiln::cpu
