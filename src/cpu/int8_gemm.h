// kiln's int8 GEMM for the INT8 convolutions (kiln::QConv): C[M x N] = A[M x K] @ B[K x N] with
// int8 A (the weights) and B (the input side), summed exactly in int32.
//
// On AVX-512 VNNI, vpdpbusd multiplies four unsigned bytes by four signed bytes and adds the
// four products to an int32 lane. B is signed, so it is packed as B + 128 (a flip of the sign
// bit) and the tile subtracts 128 * sum_k A[m, k] per row: sum A (B + 128) - 128 sum A =
// sum A B. Nothing saturates (a lane adds four products of at most 255 * 128), so the sums are
// the same integers as the reference kernel's for every K below kInt8GemmMaxK.
//
// A is packed once, when the kernel is created, into panels of 8 rows; per step of 4 along K a
// panel holds 8 rows x 4 bytes, which the micro-kernel broadcasts one row at a time. B is
// packed per call into panels of 32 columns; per step of 4 along K a panel holds 32 columns x
// 4 bytes (the four rows of a column side by side), two zmm registers. The micro-kernel keeps
// an 8 x 32 tile in 16 zmm accumulators.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::cpu {

enum class Int8GemmIsa { kNone = 0, kAvx512Vnni = 1 };

const char* int8_gemm_isa_name(Int8GemmIsa isa);
// The best int8 GEMM this CPU runs (kNone: the callers keep their portable loops).
Int8GemmIsa int8_gemm_best_isa();
// What callers use: the best one unless a test forced kNone.
Int8GemmIsa int8_gemm_isa();
// Test hook: use `isa` (or the best the CPU has, if that is lower) from now on.
void int8_gemm_force_isa(Int8GemmIsa isa);
void int8_gemm_reset_isa();

constexpr int kInt8GemmRows = 8;     // rows of A per panel, of C per tile
constexpr int kInt8GemmCols = 32;    // columns of B per panel, of C per tile
// K beyond which a sum of shifted products might leave int32 (K * 255 * 128 < 2^31).
constexpr int64_t kInt8GemmMaxK = 65536;

inline int64_t int8_gemm_round_k(int64_t k) { return (k + 3) / 4 * 4; }

// A (row-major, lda) in panels of 8 rows, K rounded up to 4 with zeros; rows past M are zeros.
struct Int8PackedA {
  int64_t m = 0, k = 0, k4 = 0;  // k4 = K rounded up to 4
  std::vector<int8_t> panels;     // [ceil(M / 8)][k4 / 4][8][4]
  std::vector<int32_t> shift;     // 128 * sum_k A[m, k], per row (padded to the panels)

  int64_t panel_count() const { return (m + kInt8GemmRows - 1) / kInt8GemmRows; }
  const int8_t* panel(int64_t p) const { return panels.data() + p * k4 * kInt8GemmRows; }
};
Int8PackedA int8_pack_a(const int8_t* a, int64_t m, int64_t k, int64_t lda);

// Bytes of one packed B panel of K rows.
inline int64_t int8_b_panel_bytes(int64_t k) { return int8_gemm_round_k(k) * kInt8GemmCols; }

// Packs B[0:k, n0:n0+cols] (row-major, ldb; cols <= 32, columns past cols are filled with
// anything the tile may compute but the caller does not read) into one panel, as B + 128.
void int8_pack_b_panel(const int8_t* b, int64_t ldb, int64_t k, int64_t n0, int64_t cols, uint8_t* dst);

// c[r * 32 + j] = sum_k A[8 * a_panel + r, k] * B[k, panel column j], exactly.
void int8_tile(const Int8PackedA& a, int64_t a_panel, const uint8_t* b_panel, int32_t* c);

}  // namespace kiln::cpu
