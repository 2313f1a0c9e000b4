// Constant weights in the CPU kernels' own layouts, as an engine holds them and its engine file
// stores them (docs/engine-format.md, "Packed weights").
//
// A kernel that multiplies by a constant matrix packs it once (PackedColumns, Bf16PackedColumns,
// PackedA, Int8PackedA). Where that kernel is the constant's only reader, the engine keeps the
// pack alone: the graph's value keeps the constant's dtype and shape, its values live in the pack
// (ir::Value::packed), the engine file stores the pack's bytes, and loading hands them to the
// kernel as they are (no second copy, no packing at load). A layout name says how the bytes are
// read back into the constant.
//
// Layout names, as engine files carry them: "<element>.cols32.<view>", element "f32"
// (PackedColumns) or "bf16" (Bf16PackedColumns, the values rounded to bfloat16), view
//   "kn"    the constant is the K x N matrix (MatMul's B, Gemm's B);
//   "nk"    the constant is [N, ...], its rows the matrix's columns, K the product of the rest
//           (Gemm's B with transB, a convolution's OIHW filters read as (c, ky, kx) x M);
//   "taps"  the constant is [M, C, kH, kW] filters, K = (ky, kx, c), N = M (a channels-last
//           convolution's gathered taps);
// "f32.rows<MR>.g<G>": the constant [M, ...] as G groups of M / G rows (K the product of the
// rest), each group's rows in PackedA's panels of MR rows for the sgemm micro-kernel of that
// height, the groups one after another (the channels-first convolution's); and
// "i8.<vnni|amx>.g<G>": an int8 constant so, in Int8PackedA's panels for that int8 GEMM (QConv's);
// "<i8|u8>.<vnni|amx>.kn": an int8 or uint8 constant B [K, N] whose transpose, uint8 values less
// 128, is in those panels (MatMulInteger's and QLinearMatMul's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/bf16_gemm.h"
#include "cpu/int8_gemm.h"
#include "cpu/sgemm.h"
#include "ir/graph.h"

namespace kiln::cpu {

enum class PackView { kRows, kTransposed, kConvTaps };

// The K x N matrix of a constant of `shape` under `view`; false where the view does not fit the
// shape (rank).
bool pack_matrix_dims(PackView view, const std::vector<int64_t>& shape, int64_t& k, int64_t& n);
// That matrix, row-major, from the constant's values.
std::vector<float> pack_matrix(PackView view, const float* values, const std::vector<int64_t>& shape);

// The pack an engine keeps and stores for a kernel's panels.
ir::PackedConstant packed_constant(const PackedColumns& panels, PackView view);
ir::PackedConstant packed_constant(const Bf16PackedColumns& panels, PackView view);

// The same for a convolution's groups, whose panels share one buffer (share_one_buffer).
ir::PackedConstant packed_constant(const std::vector<PackedA>& groups);
// Moves the groups' panels into one buffer, one group after another.
void share_one_buffer(std::vector<PackedA>& groups);

// The same for the int8 GEMM's panels.
ir::PackedConstant packed_constant(const std::vector<Int8PackedA>& groups);
void share_one_buffer(std::vector<Int8PackedA>& groups);

// The same for a product's B [K, N] (int8, or uint8 when `unsigned_values`) held as the panels of
// its transpose, uint8 values less 128.
ir::PackedConstant packed_constant_transposed(const Int8PackedA& transposed, bool unsigned_values);

// Throws kInvalidModel, naming the constant, unless `pack` is a layout kiln knows for a constant
// of `dtype` and `shape`, holding the bytes that layout needs (an engine file's packs pass here
// before a kernel sees them).
void check_packed_constant(const std::string& name, const ir::PackedConstant& pack, DType dtype,
                           const std::vector<int64_t>& shape);

// Takes `pack` (checked) into `out` when it is the layout `view` of float32 panels; false otherwise.
bool adopt_packed(const ir::PackedConstant& pack, PackView view, const std::vector<int64_t>& shape, PackedColumns& out);
// The same for bfloat16 panels, which `isa` (not kNone) runs.
bool adopt_packed(const ir::PackedConstant& pack, PackView view, const std::vector<int64_t>& shape, Bf16GemmIsa isa,
                  Bf16PackedColumns& out);

// Takes `pack` (checked) into `groups` PackedA when it is rows of this CPU's micro-kernel height
// (sgemm_mr(sgemm_isa())) in that many groups; false otherwise.
bool adopt_packed(const ir::PackedConstant& pack, const std::vector<int64_t>& shape, int64_t groups,
                  std::vector<PackedA>& out);

// The same for an int8 constant in the panels of `isa`'s int8 GEMM.
bool adopt_packed(const ir::PackedConstant& pack, const std::vector<int64_t>& shape, int64_t groups, Int8GemmIsa isa,
                  std::vector<Int8PackedA>& out);

// The same for B [K, N] of `dtype` (int8 or uint8) held as its transpose's panels for `isa`.
bool adopt_packed_transposed(const ir::PackedConstant& pack, DType dtype, const std::vector<int64_t>& shape,
                             Int8GemmIsa isa, Int8PackedA& out);

// The constant's values from its pack (checked): exactly the constant's, but for bfloat16 panels
// the values rounded to bfloat16. For a kernel that takes the pack in another form, or an engine
// whose kernel does not hold it.
Tensor unpack_constant(const ir::PackedConstant& pack, const std::vector<int64_t>& shape);

// A kernel's constant input as KernelInit gives it: its values (unpacked from the pack where it
// came as one), for kernels that pack it in their own way.
Tensor constant_values(const Tensor& constant, const ir::PackedConstant* pack);

}  // namespace kiln::cpu
