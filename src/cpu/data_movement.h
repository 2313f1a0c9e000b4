// Byte-level copy helpers shared by the data-movement kernels (Transpose, Slice, Expand,
// DepthToSpace, ...). They work on raw bytes by element size, so one kernel moves every dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::cpu {

// Row-major strides (in elements) of a shape.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

// Fills the contiguous `dst` of shape `out_shape` with dst[i0..ik] = src[offset + sum(ij * strides[j])]
// (offset and strides in elements; strides may be 0 for broadcast or negative for reversed
// slices). Merges dims that stay contiguous, copies contiguous rows with memcpy, and tiles
// transposes whose innermost output dim is strided in the source.
void strided_copy(const void* src, int64_t offset, const std::vector<int64_t>& strides, void* dst,
                  const std::vector<int64_t>& out_shape, size_t elem_size);

// dst = transpose(src, perm): out.shape[i] = in_shape[perm[i]].
void transpose_bytes(const void* src, const std::vector<int64_t>& in_shape,
                     const std::vector<int64_t>& perm, void* dst, size_t elem_size);

// Reads index tensor element i (int32 or int64) as int64.
int64_t index_at(const Tensor& t, int64_t i);

}  // namespace kiln::cpu
