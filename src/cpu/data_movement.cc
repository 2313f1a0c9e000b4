#include "cpu/data_movement.h"

#include <algorithm>
#include <cstring>

#include "cpu/gemm_util.h"
#include "cpu/parallel.h"

namespace kiln::cpu {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

int64_t index_at(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::kInt32) return t.data<int32_t>()[i];
  return t.data<int64_t>()[i];
}

namespace {

// Elementwise strided copy of one row, typed by element size so the compiler can vectorize.
template <class T>
void copy_row(const unsigned char* src, int64_t stride, unsigned char* dst, int64_t n) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  if (stride == 0) {
    T v = s[0];
    for (int64_t i = 0; i < n; ++i) d[i] = v;
    return;
  }
  for (int64_t i = 0; i < n; ++i) d[i] = s[i * stride];
}

void copy_row_any(const unsigned char* src, int64_t stride, unsigned char* dst, int64_t n, size_t es) {
  switch (es) {
    case 1: copy_row<uint8_t>(src, stride, dst, n); return;
    case 2: copy_row<uint16_t>(src, stride, dst, n); return;
    case 4: copy_row<uint32_t>(src, stride, dst, n); return;
    case 8: copy_row<uint64_t>(src, stride, dst, n); return;
    default:
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(dst + i * es, src + i * stride * static_cast<int64_t>(es), es);
  }
}

// A 2-D block transpose: dst[a * dst_a + b] = src[a + b * src_b] for a < rows, b < cols.
// Tiles keep both the reads and the writes within a few cache lines.
template <class T>
void tile_transpose(const unsigned char* src, int64_t src_b, unsigned char* dst, int64_t dst_a,
                    int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  for (int64_t a0 = 0; a0 < rows; a0 += kTile) {
    int64_t a1 = std::min(rows, a0 + kTile);
    for (int64_t b0 = 0; b0 < cols; b0 += kTile) {
      int64_t b1 = std::min(cols, b0 + kTile);
      for (int64_t a = a0; a < a1; ++a)
        for (int64_t b = b0; b < b1; ++b) d[a * dst_a + b] = s[a + b * src_b];
    }
  }
}

void tile_transpose_any(const unsigned char* src, int64_t src_b, unsigned char* dst, int64_t dst_a,
                        int64_t rows, int64_t cols, size_t es) {
  switch (es) {
    case 1: tile_transpose<uint8_t>(src, src_b, dst, dst_a, rows, cols); return;
    case 2: tile_transpose<uint16_t>(src, src_b, dst, dst_a, rows, cols); return;
    case 4: tile_transpose<uint32_t>(src, src_b, dst, dst_a, rows, cols); return;
    case 8: tile_transpose<uint64_t>(src, src_b, dst, dst_a, rows, cols); return;
    default:
      for (int64_t a = 0; a < rows; ++a)
        for (int64_t b = 0; b < cols; ++b)
          std::memcpy(dst + (a * dst_a + b) * static_cast<int64_t>(es), src + (a + b * src_b) * static_cast<int64_t>(es), es);
  }
}

}  // namespace

void strided_copy(const void* src_v, int64_t offset, const std::vector<int64_t>& strides_in, void* dst_v,
                  const std::vector<int64_t>& out_shape, size_t es) {
  const auto* src = static_cast<const unsigned char*>(src_v) + offset * static_cast<int64_t>(es);
  auto* dst = static_cast<unsigned char*>(dst_v);
  const int64_t ies = static_cast<int64_t>(es);

  // Simplify: drop size-1 dims, then merge neighbours that are contiguous in the source.
  std::vector<int64_t> shape, strides;
  for (size_t i = 0; i < out_shape.size(); ++i) {
    if (out_shape[i] == 0) return;
    if (out_shape[i] == 1) continue;
    if (!shape.empty() && strides.back() == strides_in[i] * out_shape[i]) {
      shape.back() *= out_shape[i];
      strides.back() = strides_in[i];
      continue;
    }
    shape.push_back(out_shape[i]);
    strides.push_back(strides_in[i]);
  }
  if (shape.empty()) {
    std::memcpy(dst, src, es);
    return;
  }
  const size_t rank = shape.size();
  const int64_t inner = shape.back();
  const int64_t inner_stride = strides.back();

  // Float matrices transposed, one per leading index (NCHW <-> NHWC: [C x HW] <-> [HW x C]): in
  // 8 x 8 register blocks on every thread.
  if (es == 4 && (rank == 2 || rank == 3)) {
    const size_t r = rank - 2;  // the matrix's axes: out [shape[r] x shape[r + 1]] reads src [shape[r + 1] x shape[r]]
    const int64_t matrix = shape[r] * shape[r + 1];
    if (strides[r] == 1 && strides[r + 1] == shape[r] && (rank == 2 || strides[0] == matrix)) {
      const int64_t batches = rank == 3 ? shape[0] : 1;
      for (int64_t b = 0; b < batches; ++b)
        transpose_floats(reinterpret_cast<const float*>(src) + b * matrix, shape[r + 1], shape[r],
                         reinterpret_cast<float*>(dst) + b * matrix);
      return;
    }
  }

  // A transpose whose last output dim is strided but another output dim reads contiguously:
  // copy 2-D tiles of (that dim x last dim).
  int tile_axis = -1;
  if (inner_stride != 1 && inner_stride != 0 && rank >= 2)
    for (size_t j = 0; j + 1 < rank; ++j)
      if (strides[j] == 1) tile_axis = static_cast<int>(j);

  // The remaining "outer" dims, iterated by a linear index so the loop can run in parallel.
  std::vector<int64_t> outer_shape, outer_src, outer_dst;
  std::vector<int64_t> dst_strides = contiguous_strides(shape);
  for (size_t j = 0; j + 1 < rank; ++j) {
    if (static_cast<int>(j) == tile_axis) continue;
    outer_shape.push_back(shape[j]);
    outer_src.push_back(strides[j]);
    outer_dst.push_back(dst_strides[j]);
  }
  int64_t outer = 1;
  for (int64_t d : outer_shape) outer *= d;
  const int64_t total = outer * inner * (tile_axis >= 0 ? shape[static_cast<size_t>(tile_axis)] : 1);

  parallel_for_each(outer, total > (1 << 16), [&](int64_t o) {
    int64_t rem = o, s_off = 0, d_off = 0;
    for (size_t k = outer_shape.size(); k-- > 0;) {
      int64_t idx = rem % outer_shape[k];
      rem /= outer_shape[k];
      s_off += idx * outer_src[k];
      d_off += idx * outer_dst[k];
    }
    const unsigned char* s = src + s_off * ies;
    unsigned char* d = dst + d_off * ies;
    if (tile_axis >= 0) {
      size_t t = static_cast<size_t>(tile_axis);
      tile_transpose_any(s, inner_stride, d, dst_strides[t], shape[t], inner, es);
    } else if (inner_stride == 1) {
      std::memcpy(d, s, static_cast<size_t>(inner) * es);
    } else {
      copy_row_any(s, inner_stride, d, inner, es);
    }
  });
}

void transpose_bytes(const void* src, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& perm,
                     void* dst, size_t elem_size) {
  std::vector<int64_t> in_strides = contiguous_strides(in_shape);
  std::vector<int64_t> out_shape(perm.size()), strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    out_shape[i] = in_shape[static_cast<size_t>(perm[i])];
    strides[i] = in_strides[static_cast<size_t>(perm[i])];
  }
  strided_copy(src, 0, strides, dst, out_shape, elem_size);
}

}  // namespace kiln::cpu
