#include "cpu/packed_weights.h"

#include <cstring>

namespace kiln::cpu {

namespace {

constexpr int64_t kCols = 32;  // columns per panel, both element types
static_assert(kBf16GemmCols == kCols);

const char* view_name(PackView view) {
  switch (view) {
    case PackView::kRows: return "kn";
    case PackView::kTransposed: return "nk";
    case PackView::kConvTaps: return "taps";
  }
  return "?";
}

struct Layout {
  bool bf16 = false;
  PackView view = PackView::kRows;
};

std::string layout_name(bool bf16, PackView view) { return std::string(bf16 ? "bf16" : "f32") + ".cols32." + view_name(view); }

bool parse_layout(const std::string& name, Layout& out) {
  for (bool bf16 : {false, true})
    for (PackView view : {PackView::kRows, PackView::kTransposed, PackView::kConvTaps})
      if (name == layout_name(bf16, view)) {
        out = {bf16, view};
        return true;
      }
  return false;
}

// The exact bytes a pack's tensor shares with the panels: the storage itself where it is that
// size (a kernel's pack), else a copy of the panels' bytes.
Tensor exact_bytes(const Tensor& storage, int64_t bytes) {
  if (static_cast<int64_t>(storage.nbytes()) == bytes) return storage;
  Tensor out = Tensor::uninitialized(DType::kUInt8, {bytes});
  std::memcpy(out.raw(), storage.raw(), static_cast<size_t>(bytes));
  return out;
}

// The constant's element of matrix entry (r, c) under `view`.
int64_t constant_index(PackView view, const std::vector<int64_t>& shape, int64_t k, int64_t n, int64_t r, int64_t c) {
  switch (view) {
    case PackView::kRows: return r * n + c;
    case PackView::kTransposed: return c * k + r;
    case PackView::kConvTaps: {
      const int64_t channels = shape[1], taps = shape[2] * shape[3];
      const int64_t tap = r / channels, channel = r % channels;
      return (c * channels + channel) * taps + tap;
    }
  }
  return 0;
}

}  // namespace

bool pack_matrix_dims(PackView view, const std::vector<int64_t>& shape, int64_t& k, int64_t& n) {
  switch (view) {
    case PackView::kRows:
      if (shape.size() != 2) return false;
      k = shape[0];
      n = shape[1];
      return true;
    case PackView::kTransposed:
      if (shape.size() < 2) return false;
      n = shape[0];
      k = 1;
      for (size_t i = 1; i < shape.size(); ++i) k *= shape[i];
      return true;
    case PackView::kConvTaps:
      if (shape.size() != 4) return false;
      n = shape[0];
      k = shape[1] * shape[2] * shape[3];
      return true;
  }
  return false;
}

std::vector<float> pack_matrix(PackView view, const float* values, const std::vector<int64_t>& shape) {
  int64_t k = 0, n = 0;
  if (!pack_matrix_dims(view, shape, k, n))
    throw Error(ErrorKind::kInternal, std::string("pack view ") + view_name(view) + " does not fit shape " + shape_to_string(shape));
  std::vector<float> matrix(static_cast<size_t>(k * n));
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c) matrix[static_cast<size_t>(r * n + c)] = values[constant_index(view, shape, k, n, r, c)];
  return matrix;
}

ir::PackedConstant packed_constant(const PackedColumns& panels, PackView view) {
  return {layout_name(false, view), exact_bytes(panels.storage(), PackedColumns::bytes_for(panels.depth(), panels.cols()))};
}

ir::PackedConstant packed_constant(const Bf16PackedColumns& panels, PackView view) {
  return {layout_name(true, view),
          exact_bytes(panels.storage(), Bf16PackedColumns::bytes_for(panels.depth(), panels.cols()))};
}

void check_packed_constant(const std::string& name, const ir::PackedConstant& pack, DType dtype,
                           const std::vector<int64_t>& shape) {
  Layout layout;
  if (!parse_layout(pack.layout, layout))
    throw Error(ErrorKind::kInvalidModel, "constant '" + name + "' is packed in layout '" + pack.layout +
                                              "', which this kiln does not know")
        .hint("rebuild the engine with this kiln (kiln build)");
  int64_t k = 0, n = 0;
  if (dtype != DType::kFloat32 || !pack_matrix_dims(layout.view, shape, k, n))
    throw Error(ErrorKind::kInvalidModel, "constant '" + name + "' (" + to_string(dtype) + ", shape " +
                                              shape_to_string(shape) + ") cannot be packed in layout " + pack.layout);
  // k and n multiply dimensions of a shape kiln accepted (at most kMaxTensorBytes), so the panels'
  // size, at most 32 times that with the padding, fits in int64.
  const int64_t need = layout.bf16 ? Bf16PackedColumns::bytes_for(k, n) : PackedColumns::bytes_for(k, n);
  if (static_cast<int64_t>(pack.data.nbytes()) != need || (need > 0 && !pack.data.raw()))
    throw Error(ErrorKind::kInvalidModel, "constant '" + name + "' has " + std::to_string(pack.data.nbytes()) +
                                              " bytes packed in layout " + pack.layout + ", which needs " +
                                              std::to_string(need) + " for shape " + shape_to_string(shape));
}

bool adopt_packed(const ir::PackedConstant& pack, PackView view, const std::vector<int64_t>& shape, PackedColumns& out) {
  int64_t k = 0, n = 0;
  if (pack.layout != layout_name(false, view) || !pack_matrix_dims(view, shape, k, n)) return false;
  out.adopt(pack.data, k, n);
  return true;
}

bool adopt_packed(const ir::PackedConstant& pack, PackView view, const std::vector<int64_t>& shape, Bf16GemmIsa isa,
                  Bf16PackedColumns& out) {
  int64_t k = 0, n = 0;
  if (isa == Bf16GemmIsa::kNone || pack.layout != layout_name(true, view) || !pack_matrix_dims(view, shape, k, n))
    return false;
  out.adopt(isa, pack.data, k, n);
  return true;
}

Tensor unpack_constant(const ir::PackedConstant& pack, const std::vector<int64_t>& shape) {
  Layout layout;
  int64_t k = 0, n = 0;
  if (!parse_layout(pack.layout, layout) || !pack_matrix_dims(layout.view, shape, k, n))
    throw Error(ErrorKind::kInternal, "unpacking layout '" + pack.layout + "' for shape " + shape_to_string(shape));
  Tensor out = Tensor::uninitialized(DType::kFloat32, shape);
  float* values = out.data<float>();
  const int64_t kp = layout.bf16 ? Bf16PackedColumns::padded_depth(k) : k;
  for (int64_t c = 0; c < n; ++c) {
    const int64_t panel = c / kCols * kp * kCols, col = c % kCols;
    for (int64_t r = 0; r < k; ++r) {
      float v = 0.f;
      if (layout.bf16) {
        // [K padded / 2][32][2]: rows r and r + 1 of a column side by side.
        const uint16_t bits = static_cast<const uint16_t*>(pack.data.raw())[panel + (r / 2) * 2 * kCols + col * 2 + r % 2];
        const uint32_t wide = static_cast<uint32_t>(bits) << 16;
        std::memcpy(&v, &wide, sizeof v);
      } else {
        v = static_cast<const float*>(pack.data.raw())[panel + r * kCols + col];
      }
      values[constant_index(layout.view, shape, k, n, r, c)] = v;
    }
  }
  return out;
}

Tensor constant_values(const Tensor& constant, const ir::PackedConstant* pack) {
  return pack ? unpack_constant(*pack, constant.shape()) : constant;
}

}  // namespace kiln::cpu
