// kiln's own float32 GEMM for convolution: C[M x N] = epilogue(A[M x K] @ B[K x N]).
//
// BLIS-style. A (the weights) is packed once, when the kernel is created, into panels of MR
// rows stored K-major, so the micro-kernel reads MR consecutive floats per k. B (the input side)
// is packed on every call into panels of NR columns, KC rows at a time, straight from the
// input: either a row-major matrix (a 1x1 stride-1 conv reads X itself) or the im2col matrix of
// a convolution, built while packing so there is no separate im2col pass over memory. A
// register-blocked micro-kernel computes MR x NR tiles with FMAs; on the last K block it adds
// the residual and applies Relu/Clip in registers before storing, and any other activation
// runs on the tile right after, while it is in L1.
//
// Micro-kernels: AVX-512 (8 x 32, two zmm per row), AVX2 (6 x 16) and plain C++ (4 x 16),
// picked at run time from what the CPU supports (the AVX-512 code is compiled with function
// target attributes, so the library still runs on CPUs without it). A PackedA remembers the
// kernel it was packed for, since the panel height depends on it.
//
// Narrow outputs (N <= kNarrowN, e.g. ResNet's 14x14 and 7x7 layers) can run transposed on
// AVX-512: C^T = B^T A^T on a 7 x 32 kernel, so N = 49 or 196 fill every tile, when the
// PackedA also holds 32-row panels (add_wide_panels) and a cost model says it pays.
//
// Threads: wide outputs, and narrow ones where A is smaller than B, are split by column chunks,
// each thread packing its own B; other narrow ones pack B once, together, and split the rows of A.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "cpu/gemm_util.h"
#include "kiln/tensor.h"

namespace kiln::cpu {

enum class SgemmIsa { kPlain = 0, kAvx2 = 1, kAvx512 = 2 };

const char* sgemm_isa_name(SgemmIsa isa);
// The best kernel this CPU runs.
SgemmIsa sgemm_best_isa();
// The kernel that new PackedA objects use: the best one unless a test forced another.
SgemmIsa sgemm_isa();
// Test hook: use `isa` (or the best the CPU has, if that is lower) for packs made from now
// on. sgemm_reset_isa() undoes it.
void sgemm_force_isa(SgemmIsa isa);
void sgemm_reset_isa();

// A float buffer aligned to 64 bytes (one cache line, one zmm) that only grows.
class AlignedFloats {
 public:
  float* data() const { return p_.get(); }
  int64_t size() const { return size_; }
  // Makes room for n floats; the contents are not kept.
  float* reserve(int64_t n);

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> p_;
  int64_t size_ = 0;
};

// A [M x K] (row-major, leading dimension lda) in MR-row panels: panel i holds rows
// [i*MR, i*MR + MR) as K groups of MR floats; rows past M are zero. The panels live in a Tensor
// (from an offset), so a convolution's groups can share one that an engine file stores.
class PackedA {
 public:
  PackedA() = default;
  PackedA(const float* a, int64_t m, int64_t k, int64_t lda) { pack(a, m, k, lda); }
  void pack(const float* a, int64_t m, int64_t k, int64_t lda);
  // Takes panels packed before for `isa`: floats_for(m, k, sgemm_mr(isa)) floats of `storage`'s
  // bytes from float `offset` on, kept alive here.
  void adopt(Tensor storage, int64_t offset, int64_t m, int64_t k, SgemmIsa isa);
  static int64_t floats_for(int64_t m, int64_t k, int mr) { return (m + mr - 1) / mr * k * mr; }
  // Adds a second copy in 32-row panels, made from the MR-row ones, for the transposed product of
  // narrow outputs (N up to kNarrowN), which uses A as the vector side. AVX-512 packs only;
  // packed_sgemm uses it when present. Must not run concurrently with packed_sgemm on this PackedA.
  void add_wide_panels();
  bool has_wide_panels() const { return has_wide_; }
  const float* wide_panel(int64_t i) const { return wide_.data() + i * k_ * 32; }

  bool empty() const { return m_ == 0 && k_ == 0; }
  int64_t rows() const { return m_; }
  int64_t depth() const { return k_; }
  SgemmIsa isa() const { return isa_; }
  int mr() const { return mr_; }
  const float* panel(int64_t i) const { return data_ + i * k_ * mr_; }
  // The panels: floats_for(rows(), depth(), mr()) floats of storage() from storage_offset() on.
  const Tensor& storage() const { return buf_; }
  int64_t storage_offset() const { return offset_; }

 private:
  int64_t m_ = 0, k_ = 0;
  SgemmIsa isa_ = SgemmIsa::kPlain;
  int mr_ = 1;
  Tensor buf_;
  int64_t offset_ = 0;
  const float* data_ = nullptr;
  AlignedFloats wide_;
  bool has_wide_ = false;
};

// The rows of a PackedA's panels on `isa`'s micro-kernel.
int sgemm_mr(SgemmIsa isa);

// W [K x N] (row-major, leading dimension ldw) in 32-column panels: panel q holds columns
// [32q, 32q + 32) as K rows of 32 floats, columns past N zero. The vector side of rows_sgemm,
// packed once for a layer's constant weights. The panels live in a Tensor, so an engine can
// store them as they are and a loaded engine's kernel can take an engine file's panels without
// a copy (cpu/packed_weights.h).
class PackedColumns {
 public:
  void pack(const float* w, int64_t k, int64_t n, int64_t ldw);
  // Takes panels packed before: `panels` holds bytes_for(k, n) bytes, kept alive here.
  void adopt(Tensor panels, int64_t k, int64_t n);
  // Bytes of the panels of a K x N matrix.
  static int64_t bytes_for(int64_t k, int64_t n) { return (n + 31) / 32 * k * 32 * int64_t{sizeof(float)}; }
  bool empty() const { return n_ == 0; }
  int64_t depth() const { return k_; }
  int64_t cols() const { return n_; }
  const float* panel(int64_t q) const { return data_ + q * k_ * 32; }
  // The panels (bytes_for(depth(), cols()) bytes at the start of the tensor's storage).
  const Tensor& storage() const { return buf_; }

 private:
  int64_t k_ = 0, n_ = 0;
  Tensor buf_;
  const float* data_ = nullptr;
};

// Outputs up to this many columns can use the transposed product (PackedA::add_wide_panels).
constexpr int64_t kNarrowN = 256;

// Test/benchmark hook: when the transposed product runs, given wide panels. kAuto weighs the
// padding it saves against its transposed stores; kAlways/kNever force the choice.
enum class NarrowPolicy { kAuto, kAlways, kNever };
void sgemm_set_narrow_policy(NarrowPolicy policy);

// The im2col matrix of one image and channel group of a convolution, as B: row r is
// (c, kd, kh, kw), column p the output position (od, oh, ow); taps in the padding read 0.
// 1-D and 2-D convolutions use leading sizes of 1.
struct Im2col {
  const float* x = nullptr;  // [C, D, H, W]
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1};
  int64_t s[3] = {1, 1, 1}, d[3] = {1, 1, 1}, p[3] = {0, 0, 0};
};

// B [K x N]: a row-major matrix (data, ld), or the im2col matrix of `conv` when set.
struct SgemmB {
  const float* data = nullptr;
  int64_t ld = 0;
  const Im2col* conv = nullptr;
};

// What happens to C after the product: C = act(A @ B + row_bias[r] + residual[r, c]).
// Every pointer may be null.
struct SgemmEpilogue {
  const float* row_bias = nullptr;  // [M]
  const float* residual = nullptr;  // [M x N], leading dimension ld_residual
  int64_t ld_residual = 0;
  const Epilogue* act = nullptr;
};

// C[M x N] (leading dimension ldc) = epilogue(A @ B), M and K from `a`. Runs on up to
// `threads` OpenMP threads; with threads > 1 it must be called outside a parallel region.
void packed_sgemm(const PackedA& a, int64_t n, const SgemmB& b, float* c, int64_t ldc, const SgemmEpilogue& ep,
                  int threads);

// Y [rows x N] (leading dimension ldy) = act(X [rows x K] @ W + col_bias[c] + residual[r, c]),
// W packed: a layer's product by constant weights (MatMul, kiln::FusedMatMul). X's rows, 8 at a
// time, are the broadcast side of the AVX-512 8 x 32 kernel and W's panels the vector side, so Y
// comes out row-major (computing Y^T = W^T X^T on packed_sgemm needs X and Y transposed around
// it). Each sum starts from the bias and adds the products in the order of k, as packed_sgemm's
// do. Needs AVX-512 (sgemm_isa() == SgemmIsa::kAvx512). col_bias, residual and act may be null.
void rows_sgemm(const PackedColumns& w, int64_t rows, const float* x, int64_t ldx, float* y, int64_t ldy,
                const float* col_bias, const float* residual, int64_t ld_residual, const Epilogue* act, int threads);

}  // namespace kiln::cpu
