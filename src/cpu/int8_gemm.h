// kiln's int8 GEMM for the INT8 convolutions (kiln::QConv): C[M x N] = A[M x K] @ B[K x N] with
// int8 A (the weights) and B (the input side), summed exactly in int32.
//
// Four kernels, picked at run time from what the CPU has (the code is compiled with function
// target attributes, so the library still runs on CPUs without them):
// - AVX2 (CPUs without AVX-512 VNNI): vpdpbusd's sums made exactly from vpmaddubsw and
//   vpmaddwd (YmmStep in int8_gemm.cc says how; one step fewer where A has no -128, as
//   symmetric weights have not), in the VNNI kernel's panels, a quarter of the 8 x 32 tile at a
//   time (16 ymm registers hold no more).
// - AVX-VNNI (CPUs with vpdpbusd on ymm but without AVX-512): the same tile as AVX2's, a quarter
//   at a time, with one vpdpbusd per four products.
// - AVX-512 VNNI: vpdpbusd multiplies four unsigned bytes by four signed bytes and adds the
//   four products to an int32 lane; the micro-kernel keeps an 8 x 32 tile of C in 16 zmm
//   registers and broadcasts 4 bytes of a row of A at a time.
// - AMX (Sapphire Rapids and later): tdpbsud multiplies a 16 x 64 tile of signed bytes by a
//   64 x 16 tile of unsigned bytes into a 16 x 16 tile of int32 sums; the kernel keeps a 32 x 32
//   tile of C in four tile registers, with two of A and two of B.
// All read B as unsigned bytes: it is packed as B + 128 (a flip of the sign bit), and the
// caller subtracts 128 * sum_k A[m, k] (Int8PackedA::shift) from row m of each tile:
// sum A (B + 128) - 128 sum A = sum A B. Nothing saturates (four products of at most 255 * 128
// per step), so the sums are the same integers as the reference kernel's for every K below
// kInt8GemmMaxK.
//
// A is packed once, when the kernel is created, in the layout of the kernel chosen then; B is
// packed per call into panels of 32 columns: per step of 4 along K, 32 columns x 4 bytes (the
// four rows of a column side by side), which is at once the VNNI kernel's two zmm loads and two
// rows of AMX's B tiles.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/aligned_vector.h"
#include "kiln/tensor.h"

namespace kiln::cpu {

// In order of speed: a test may force any one below the best (int8_gemm_force_isa).
enum class Int8GemmIsa { kNone = 0, kAvx2 = 1, kAvxVnni = 2, kAvx512Vnni = 3, kAmx = 4 };

const char* int8_gemm_isa_name(Int8GemmIsa isa);
// The best int8 GEMM this CPU (and its operating system, for AMX) runs; kNone: the callers
// keep their portable loops.
Int8GemmIsa int8_gemm_best_isa();
// What new packings use: the best one unless a test forced a lower one.
Int8GemmIsa int8_gemm_isa();
// Test hook: use `isa` (or the best the CPU has, if that is lower) from now on.
void int8_gemm_force_isa(Int8GemmIsa isa);
void int8_gemm_reset_isa();

constexpr int kInt8GemmCols = 32;  // columns of B per panel, of C per tile
constexpr int kInt8GemmMaxRows = 32;  // the most rows of C in a tile (AMX's)
// K beyond which a sum of shifted products might leave int32 (K * 255 * 128 < 2^31).
constexpr int64_t kInt8GemmMaxK = 65536;

// The kernels that need no more than AVX2 beside their tile (no AVX-512): their callers finish
// the tiles with AVX2 epilogues.
inline bool int8_gemm_on_ymm(Int8GemmIsa isa) { return isa == Int8GemmIsa::kAvx2 || isa == Int8GemmIsa::kAvxVnni; }

// The kernel whose panels `isa` reads: AVX2 and AVX-VNNI read AVX-512 VNNI's, so an engine file
// packed for one runs on the others as it is.
inline Int8GemmIsa int8_panels_of(Int8GemmIsa isa) { return int8_gemm_on_ymm(isa) ? Int8GemmIsa::kAvx512Vnni : isa; }

// Rows of C per tile and the step K is padded to, per kernel.
int int8_gemm_tile_rows(Int8GemmIsa isa);
int64_t int8_gemm_round_k(Int8GemmIsa isa, int64_t k);

// A (row-major, lda) in the panels of one kernel, K padded with zeros; rows past M are zeros.
// The panels live in a Tensor (from a byte offset), so a convolution's groups can share one
// that an engine file stores (cpu/packed_weights.h).
struct Int8PackedA {
  Int8GemmIsa isa = Int8GemmIsa::kNone;
  int64_t m = 0, k = 0, k_padded = 0;
  int rows = 0;                    // rows per panel: int8_gemm_tile_rows(isa)
  Tensor storage;                  // the panels, from byte `offset` on
  int64_t offset = 0;
  const int8_t* panels = nullptr;  // VNNI, AVX-VNNI, AVX2: [panel][k / 4][8][4]; AMX: [panel][k / 64][2][16][64]
  AlignedVector<int32_t> shift;    // 128 * sum_k A[m, k], per row (padded to the panels)
  bool above_int8_min = false;     // no value of A is -128 (symmetric weights): AVX2's faster form

  int64_t panel_count() const { return (m + rows - 1) / rows; }
  const int8_t* panel(int64_t p) const { return panels + p * k_padded * rows; }
  // Bytes of the panels of an m x k matrix for `isa`.
  static int64_t bytes_for(Int8GemmIsa isa, int64_t m, int64_t k);
};
// Where A[r, i] of a panel's row r (< rows) lies in the panel, for `isa`.
inline int64_t int8_panel_offset(Int8GemmIsa isa, int rows, int64_t r, int64_t i) {
  return isa == Int8GemmIsa::kAmx ? ((i / 64 * 2 + r / 16) * 16 + r % 16) * 64 + i % 64  // [k / 64][r / 16][r % 16][k % 64]
                                  : (i / 4) * rows * 4 + r * 4 + i % 4;                   // [k / 4][r][k % 4]
}
// Packs for `isa` (not kNone).
Int8PackedA int8_pack_a(Int8GemmIsa isa, const int8_t* a, int64_t m, int64_t k, int64_t lda);
// Takes panels packed before for `isa` (not kNone): Int8PackedA::bytes_for(isa, m, k) bytes of
// `storage` from byte `offset` on, kept alive; the shifts are summed from them.
Int8PackedA int8_adopt_a(Int8GemmIsa isa, Tensor storage, int64_t offset, int64_t m, int64_t k);

// Bytes of one packed B panel of K rows for A's kernel.
inline int64_t int8_b_panel_bytes(const Int8PackedA& a) { return a.k_padded * kInt8GemmCols; }

// Packs B[0:k, n0:n0+cols] (row-major, ldb; cols <= 32) into one panel of `k_padded` rows, as
// B + 128; rows past k and columns past cols hold values the tile multiplies by A's zeros or
// that the caller does not read.
void int8_pack_b_panel(const int8_t* b, int64_t ldb, int64_t k, int64_t k_padded, int64_t n0, int64_t cols,
                       uint8_t* dst);

// The same panel from B's transpose: B[k, n] = bt[n * ldbt + k] (rows of bt are B's columns,
// as the rows of a matrix product's left operand are), each column's four bytes per step of K
// copied as one word.
void int8_pack_b_panel_transposed(const int8_t* bt, int64_t ldbt, int64_t k, int64_t k_padded, int64_t n0,
                                  int64_t cols, uint8_t* dst);

// c[r * 32 + j] = sum_k A[rows * a_panel + r, k] * (B[k, panel column j] + 128), for r below
// a.rows (subtract a.shift to get sum A B). Inside an AmxTileScope (cpu/amx.h) active for AMX.
void int8_tile(const Int8PackedA& a, int64_t a_panel, const uint8_t* b_panel, int32_t* c);

}  // namespace kiln::cpu
