// kiln's bfloat16 GEMM, the products of a CPU engine built with bfloat16 products (kiln build
// --device cpu --bf16):
//   Y [rows x N] = act(X [rows x K] @ W [K x N] + bias + residual)
// with X and W rounded to bfloat16 (to nearest even) and every product summed in float32. A
// product of two bfloat16 values is exact in float32; what differs from the float32 kernels is
// the rounding of the operands (8 significant bits), not the sums.
//
// Two kernels, picked at run time from what the CPU has (compiled with function target
// attributes, so the library still runs on CPUs without them):
// - AMX-BF16 (Sapphire Rapids and later): tdpbf16ps multiplies a 16 x 32 tile of A by a 32 x 16
//   tile of B into 16 x 16 float32 sums; the kernel keeps a 32 x 32 block of Y in four tiles.
// - AVX512-BF16: vdpbf16ps multiplies pairs of bfloat16 values and adds both products to a
//   float32 lane; an 8 x 32 block of Y in 16 zmm registers, A's pairs broadcast.
// Both denormal bfloat16 operands read as zero and denormal sums flush to zero (the
// instructions' fixed behavior), as on the GPU's tensor cores.
//
// W is packed once, when the kernel is created, in panels of 32 columns: per pair of rows of K,
// each column's two values side by side (32 x 2 bfloat16, 128 bytes), which is at once the
// AVX512-BF16 kernel's two zmm loads and two rows of AMX's B tiles. X is rounded per call into
// rows of K padded to 32.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "cpu/aligned_vector.h"
#include "kiln/tensor.h"

namespace kiln::cpu {

class Epilogue;

enum class Bf16GemmIsa { kNone = 0, kAvx512Bf16 = 1, kAmx = 2 };

const char* bf16_gemm_isa_name(Bf16GemmIsa isa);
// The best bfloat16 GEMM this CPU (and its operating system, for AMX) runs; kNone: none, and
// the kernels compute in float32.
Bf16GemmIsa bf16_gemm_best_isa();
// What new packings use: the best one unless a test forced a lower one.
Bf16GemmIsa bf16_gemm_isa();
// Test hook: use `isa` (or the best the CPU has, if that is lower) from now on.
void bf16_gemm_force_isa(Bf16GemmIsa isa);
void bf16_gemm_reset_isa();
// What a kernel of an engine that asks for bfloat16 products (KernelInit::bfloat16_products)
// packs for: bf16_gemm_isa(), or kNone (float32) where the engine does not ask or the CPU lacks them.
inline Bf16GemmIsa bf16_products_isa(bool requested) { return requested ? bf16_gemm_isa() : Bf16GemmIsa::kNone; }
// Kernel::tactic of a layer on `isa`: "bf16 amx-bf16", "bf16 avx512-bf16", or "" for kNone.
std::string bf16_tactic(Bf16GemmIsa isa);

constexpr int kBf16GemmCols = 32;    // columns of W per panel
constexpr int kBf16GemmRows = 32;    // rows of Y per block
constexpr int kBf16GemmKStep = 32;   // K is padded to a multiple of this (one AMX A tile's width)

// W [K x N] (row-major, leading dimension ldw) rounded to bfloat16 (as bf16_round_floats), in
// the panels above: [panel][K padded / 2][32 columns][2]. The panels live in a Tensor, as
// PackedColumns' do (an engine file stores them as they are).
class Bf16PackedColumns {
 public:
  // Packs for `isa` (not kNone).
  void pack(Bf16GemmIsa isa, const float* w, int64_t k, int64_t n, int64_t ldw);
  // Takes panels packed before, for `isa`: `panels` holds bytes_for(k, n) bytes, kept alive here.
  void adopt(Bf16GemmIsa isa, Tensor panels, int64_t k, int64_t n);
  static int64_t padded_depth(int64_t k) { return (k + kBf16GemmKStep - 1) / kBf16GemmKStep * kBf16GemmKStep; }
  // Bytes of the panels of a K x N matrix.
  static int64_t bytes_for(int64_t k, int64_t n) {
    return (n + kBf16GemmCols - 1) / kBf16GemmCols * padded_depth(k) * kBf16GemmCols * int64_t{sizeof(uint16_t)};
  }
  bool empty() const { return n_ == 0; }
  Bf16GemmIsa isa() const { return isa_; }
  int64_t depth() const { return k_; }
  int64_t depth_padded() const { return k_padded_; }
  int64_t cols() const { return n_; }
  int64_t panel_count() const { return (n_ + kBf16GemmCols - 1) / kBf16GemmCols; }
  const uint16_t* panel(int64_t q) const { return data_ + q * k_padded_ * kBf16GemmCols; }
  // The panels (bytes_for(depth(), cols()) bytes at the start of the tensor's storage).
  const Tensor& storage() const { return buf_; }

 private:
  Bf16GemmIsa isa_ = Bf16GemmIsa::kNone;
  int64_t k_ = 0, k_padded_ = 0, n_ = 0;
  Tensor buf_;
  const uint16_t* data_ = nullptr;
};

// dst[0, n) = src[0, n) rounded to bfloat16 (to nearest even, as vcvtneps2bf16: denormals to
// zero). Needs bf16_gemm_isa() != kNone.
void bf16_round_floats(const float* src, int64_t n, uint16_t* dst);

// Writes rows [first, first + count) of the product's left operand X, row r at
// dst + (r - first) * depth_padded(): K values rounded to bfloat16 (as bf16_round_floats), then
// zeros up to the weights' depth_padded(). A convolution's source gathers its taps there (an
// implicit im2col).
using Bf16RowSource = std::function<void(int64_t first, int64_t count, uint16_t* dst)>;

// Y = act(X @ W + col_bias + residual) for `rows` rows of X, over `threads` of kiln's threads.
// col_bias [N], residual (ld_residual) and act may be null. Rows of X are rounded into blocks
// that stay in L2 while they meet W's panels (all of X first where it fits in 2 MB, shared by the
// threads; otherwise each task rounds the rows it multiplies).
void bf16_rows_gemm(const Bf16PackedColumns& w, int64_t rows, const Bf16RowSource& x, float* y, int64_t ldy,
                    const float* col_bias, const float* residual, int64_t ld_residual, const Epilogue* act,
                    int threads);
// The same for a float matrix X (ldx floats apart).
void bf16_rows_gemm(const Bf16PackedColumns& w, int64_t rows, const float* x, int64_t ldx, float* y, int64_t ldy,
                    const float* col_bias, const float* residual, int64_t ld_residual, const Epilogue* act,
                    int threads);

}  // namespace kiln::cpu
