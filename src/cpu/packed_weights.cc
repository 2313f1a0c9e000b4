#include "cpu/packed_weights.h"

#include <algorithm>
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

// A layout: 32-column panels (bf16, view), PackedA's rows (mr, groups) or Int8PackedA's (int8,
// groups).
struct Layout {
  bool rows = false;
  bool bf16 = false;
  PackView view = PackView::kRows;
  int mr = 0;
  int64_t groups = 0;
  Int8GemmIsa int8 = Int8GemmIsa::kNone;
  DType transposed = DType::kUndefined;  // a product's B held transposed: its int8 or uint8 type
};

std::string transposed_layout_name(Int8GemmIsa isa, DType dtype) {
  return std::string(dtype == DType::kUInt8 ? "u8." : "i8.") + (isa == Int8GemmIsa::kAmx ? "amx" : "vnni") + ".kn";
}

std::string int8_layout_prefix(Int8GemmIsa isa) { return isa == Int8GemmIsa::kAmx ? "i8.amx.g" : "i8.vnni.g"; }
std::string int8_layout_name(Int8GemmIsa isa, int64_t groups) { return int8_layout_prefix(isa) + std::to_string(groups); }

// The groups of a name "<prefix><digits>" written as std::to_string writes them, or 0.
int64_t parse_groups(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return 0;
  const std::string digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > 12 || digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  const int64_t groups = std::stoll(digits);
  return std::to_string(groups) == digits ? groups : 0;
}

std::string layout_name(bool bf16, PackView view) { return std::string(bf16 ? "bf16" : "f32") + ".cols32." + view_name(view); }
std::string rows_layout_name(int mr, int64_t groups) { return "f32.rows" + std::to_string(mr) + ".g" + std::to_string(groups); }

bool parse_layout(const std::string& name, Layout& out) {
  for (bool bf16 : {false, true})
    for (PackView view : {PackView::kRows, PackView::kTransposed, PackView::kConvTaps})
      if (name == layout_name(bf16, view)) {
        out = {false, bf16, view, 0, 0, Int8GemmIsa::kNone, DType::kUndefined};
        return true;
      }
  for (Int8GemmIsa isa : {Int8GemmIsa::kAvx512Vnni, Int8GemmIsa::kAmx}) {
    if (const int64_t groups = parse_groups(name, int8_layout_prefix(isa)); groups > 0) {
      out = {true, false, PackView::kRows, 0, groups, isa, DType::kUndefined};
      return true;
    }
    for (DType dtype : {DType::kInt8, DType::kUInt8})
      if (name == transposed_layout_name(isa, dtype)) {
        out = {true, false, PackView::kRows, 0, 1, isa, dtype};
        return true;
      }
  }
  // "f32.rows<MR>.g<G>", MR one of the sgemm micro-kernels' heights.
  for (SgemmIsa isa : {SgemmIsa::kPlain, SgemmIsa::kAvx2, SgemmIsa::kAvx512})
    if (const int64_t groups = parse_groups(name, "f32.rows" + std::to_string(sgemm_mr(isa)) + ".g"); groups > 0) {
      out = {true, false, PackView::kRows, sgemm_mr(isa), groups, Int8GemmIsa::kNone, DType::kUndefined};
      return true;
    }
  return false;
}

// The bytes of `layout` for a constant of `shape`, or -1 where it does not fit.
int64_t layout_bytes(const Layout& layout, const std::vector<int64_t>& shape) {
  if (layout.transposed != DType::kUndefined)  // B [K, N]: N rows of K
    return shape.size() == 2 ? Int8PackedA::bytes_for(layout.int8, shape[1], shape[0]) : -1;
  if (layout.rows) {
    // At most one group per row: a forged count cannot make the loops over groups run long.
    if (shape.size() < 2 || layout.groups > std::max<int64_t>(shape[0], 1) || shape[0] % layout.groups != 0) return -1;
    int64_t k = 1;
    for (size_t i = 1; i < shape.size(); ++i) k *= shape[i];
    if (layout.int8 != Int8GemmIsa::kNone) return layout.groups * Int8PackedA::bytes_for(layout.int8, shape[0] / layout.groups, k);
    return layout.groups * PackedA::floats_for(shape[0] / layout.groups, k, layout.mr) * int64_t{sizeof(float)};
  }
  int64_t k = 0, n = 0;
  if (!pack_matrix_dims(layout.view, shape, k, n)) return -1;
  return layout.bf16 ? Bf16PackedColumns::bytes_for(k, n) : PackedColumns::bytes_for(k, n);
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
  // The dimensions multiply to a shape kiln accepted (at most kMaxTensorBytes), so the panels'
  // size fits in int64: padding rows and K to the panels multiplies it at most 2048-fold (a 1 x 1
  // int8 matrix in AMX's 32 rows of 64).
  const DType holds = layout.transposed != DType::kUndefined ? layout.transposed
                     : layout.int8 != Int8GemmIsa::kNone   ? DType::kInt8
                                                           : DType::kFloat32;
  const int64_t need = dtype == holds ? layout_bytes(layout, shape) : -1;
  if (need < 0)
    throw Error(ErrorKind::kInvalidModel, "constant '" + name + "' (" + to_string(dtype) + ", shape " +
                                              shape_to_string(shape) + ") cannot be packed in layout " + pack.layout);
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
  if (!parse_layout(pack.layout, layout) || layout_bytes(layout, shape) < 0)
    throw Error(ErrorKind::kInternal, "unpacking layout '" + pack.layout + "' for shape " + shape_to_string(shape));
  if (layout.transposed != DType::kUndefined) {
    Tensor out = Tensor::uninitialized(layout.transposed, shape);
    const int64_t k = shape[0], n = shape[1];
    const Int8PackedA bt = int8_adopt_a(layout.int8, pack.data, 0, n, k);
    const int rows = bt.rows, shift = layout.transposed == DType::kUInt8 ? 128 : 0;
    for (int64_t col = 0; col < n; ++col) {
      const int8_t* panel = bt.panel(col / rows);
      const int64_t r = col % rows;
      for (int64_t i = 0; i < k; ++i) {
        const int v = panel[int8_panel_offset(layout.int8, rows, r, i)] + shift;
        if (shift) out.data<uint8_t>()[i * n + col] = static_cast<uint8_t>(v);
        else out.data<int8_t>()[i * n + col] = static_cast<int8_t>(v);
      }
    }
    return out;
  }
  if (layout.int8 != Int8GemmIsa::kNone) {
    Tensor out = Tensor::uninitialized(DType::kInt8, shape);
    int8_t* values = out.data<int8_t>();
    const int8_t* bytes = static_cast<const int8_t*>(pack.data.raw());
    const int64_t mg = shape[0] / layout.groups, k = out.numel() / std::max<int64_t>(shape[0], 1);
    const int64_t per_group = Int8PackedA::bytes_for(layout.int8, mg, k);
    const int rows = int8_gemm_tile_rows(layout.int8);
    const int64_t k_padded = int8_gemm_round_k(layout.int8, k);
    for (int64_t g = 0; g < layout.groups; ++g)
      for (int64_t row = 0; row < mg; ++row) {
        const int8_t* panel = bytes + g * per_group + (row / rows) * k_padded * rows;
        const int64_t r = row % rows;
        for (int64_t i = 0; i < k; ++i) values[(g * mg + row) * k + i] = panel[int8_panel_offset(layout.int8, rows, r, i)];
      }
    return out;
  }
  Tensor out = Tensor::uninitialized(DType::kFloat32, shape);
  float* values = out.data<float>();
  const float* floats = static_cast<const float*>(pack.data.raw());
  if (layout.rows) {
    const int64_t mg = shape[0] / layout.groups, k = out.numel() / std::max<int64_t>(shape[0], 1), mr = layout.mr;
    const int64_t per_group = PackedA::floats_for(mg, k, layout.mr);
    for (int64_t g = 0; g < layout.groups; ++g)
      for (int64_t row = 0; row < mg; ++row)
        for (int64_t kk = 0; kk < k; ++kk)
          values[(g * mg + row) * k + kk] = floats[g * per_group + (row / mr) * k * mr + kk * mr + row % mr];
    return out;
  }
  int64_t k = 0, n = 0;
  pack_matrix_dims(layout.view, shape, k, n);
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
        v = floats[panel + r * kCols + col];
      }
      values[constant_index(layout.view, shape, k, n, r, c)] = v;
    }
  }
  return out;
}

ir::PackedConstant packed_constant(const std::vector<PackedA>& groups) {
  const PackedA& first = groups.at(0);
  const int64_t bytes = static_cast<int64_t>(groups.size()) * PackedA::floats_for(first.rows(), first.depth(), first.mr()) *
                        int64_t{sizeof(float)};
  return {rows_layout_name(first.mr(), static_cast<int64_t>(groups.size())), exact_bytes(first.storage(), bytes)};
}

void share_one_buffer(std::vector<PackedA>& groups) {
  int64_t total = 0;
  for (const PackedA& g : groups) total += PackedA::floats_for(g.rows(), g.depth(), g.mr());
  Tensor shared = Tensor::uninitialized(DType::kFloat32, {std::max<int64_t>(1, total)});
  int64_t offset = 0;
  for (PackedA& g : groups) {
    const int64_t floats = PackedA::floats_for(g.rows(), g.depth(), g.mr());
    std::memcpy(shared.data<float>() + offset, g.panel(0), static_cast<size_t>(floats) * sizeof(float));
    g.adopt(shared, offset, g.rows(), g.depth(), g.isa());
    offset += floats;
  }
}

bool adopt_packed(const ir::PackedConstant& pack, const std::vector<int64_t>& shape, int64_t groups,
                  std::vector<PackedA>& out) {
  Layout layout;
  const SgemmIsa isa = sgemm_isa();
  if (!parse_layout(pack.layout, layout) || !layout.rows || layout.groups != groups || layout.mr != sgemm_mr(isa) ||
      layout_bytes(layout, shape) < 0)
    return false;
  const int64_t mg = shape[0] / groups, k = shape_numel(shape) / std::max<int64_t>(shape[0], 1);
  out.clear();
  out.resize(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g)
    out[static_cast<size_t>(g)].adopt(pack.data, g * PackedA::floats_for(mg, k, layout.mr), mg, k, isa);
  return true;
}

ir::PackedConstant packed_constant(const std::vector<Int8PackedA>& groups) {
  const Int8PackedA& first = groups.at(0);
  const int64_t bytes = static_cast<int64_t>(groups.size()) * Int8PackedA::bytes_for(first.isa, first.m, first.k);
  return {int8_layout_name(first.isa, static_cast<int64_t>(groups.size())), exact_bytes(first.storage, bytes)};
}

void share_one_buffer(std::vector<Int8PackedA>& groups) {
  int64_t total = 0;
  for (const Int8PackedA& g : groups) total += Int8PackedA::bytes_for(g.isa, g.m, g.k);
  Tensor shared = Tensor::uninitialized(DType::kInt8, {std::max<int64_t>(1, total)});
  int64_t offset = 0;
  for (Int8PackedA& g : groups) {
    const int64_t bytes = Int8PackedA::bytes_for(g.isa, g.m, g.k);
    std::memcpy(shared.data<int8_t>() + offset, g.panels, static_cast<size_t>(bytes));
    g.storage = shared;
    g.offset = offset;
    g.panels = shared.data<int8_t>() + offset;
    offset += bytes;
  }
}

bool adopt_packed(const ir::PackedConstant& pack, const std::vector<int64_t>& shape, int64_t groups, Int8GemmIsa isa,
                  std::vector<Int8PackedA>& out) {
  Layout layout;
  if (isa == Int8GemmIsa::kNone || !parse_layout(pack.layout, layout) || layout.int8 != int8_panels_of(isa) || layout.groups != groups ||
      layout_bytes(layout, shape) < 0)
    return false;
  const int64_t mg = shape[0] / groups, k = shape_numel(shape) / std::max<int64_t>(shape[0], 1);
  out.clear();
  for (int64_t g = 0; g < groups; ++g) out.push_back(int8_adopt_a(isa, pack.data, g * Int8PackedA::bytes_for(isa, mg, k), mg, k));
  return true;
}

ir::PackedConstant packed_constant_transposed(const Int8PackedA& transposed, bool unsigned_values) {
  return {transposed_layout_name(transposed.isa, unsigned_values ? DType::kUInt8 : DType::kInt8),
          exact_bytes(transposed.storage, Int8PackedA::bytes_for(transposed.isa, transposed.m, transposed.k))};
}

bool adopt_packed_transposed(const ir::PackedConstant& pack, DType dtype, const std::vector<int64_t>& shape,
                             Int8GemmIsa isa, Int8PackedA& out) {
  Layout layout;
  if (isa == Int8GemmIsa::kNone || !parse_layout(pack.layout, layout) || layout.transposed != dtype || layout.int8 != int8_panels_of(isa) ||
      layout_bytes(layout, shape) < 0)
    return false;
  out = int8_adopt_a(isa, pack.data, 0, shape[1], shape[0]);
  return true;
}

Tensor constant_values(const Tensor& constant, const ir::PackedConstant* pack) {
  return pack ? unpack_constant(*pack, constant.shape()) : constant;
}

}  // namespace kiln::cpu
