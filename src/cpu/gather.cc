// CPU kernels of Gather, GatherElements, GatherND, Compress (raw bytes, any dtype), ScatterElements and ScatterND
// (any dtype without reduction; float32/float64/int32/int64 with add/mul/max/min).
// Indices are checked: an out-of-range index is the caller's error, not a crash.
#include <algorithm>
#include <cstring>

#include "cpu/data_movement.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "cpu/wrapping.h"

namespace kiln::cpu {

namespace {

int64_t checked_index(int64_t i, int64_t dim) {
  if (i < -dim || i >= dim)
    throw Error(ErrorKind::kInvalidArgument, "index " + std::to_string(i) + " is out of range for a dimension of size " +
                                                 std::to_string(dim));
  return i < 0 ? i + dim : i;
}

// GatherElements/ScatterElements: off the axis, indices may not reach past the data.
void check_within(const Tensor& data, const Tensor& idx, size_t axis) {
  if (idx.rank() != data.rank())
    throw Error(ErrorKind::kInvalidArgument, "indices and data must have the same rank");
  for (size_t d = 0; d < idx.shape().size(); ++d)
    if (d != axis && idx.shape()[d] > data.shape()[d])
      throw Error(ErrorKind::kInvalidArgument, "indices " + shape_to_string(idx.shape()) + " reach past data " +
                                                   shape_to_string(data.shape()) + " off the axis");
}

int64_t axis_of(const ir::Node& n, int64_t rank) {
  int64_t a = n.attrs.get_int("axis", 0);
  return a < 0 ? a + rank : a;
}

void gather(const ir::Node& node, const Tensor& data, const Tensor& idx, Tensor& out) {
  const auto& s = data.shape();
  size_t axis = static_cast<size_t>(axis_of(node, data.rank()));
  size_t es = element_size(data.dtype());
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= s[d];
  for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  int64_t dim = s[axis], n = idx.numel();
  size_t row = static_cast<size_t>(inner) * es;
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) pos[static_cast<size_t>(j)] = checked_index(index_at(idx, j), dim);
  const auto* x = static_cast<const unsigned char*>(data.raw());
  auto* y = static_cast<unsigned char*>(out.raw());
  if (!row) return;
  parallel_for_each(outer, outer * n * inner > (1 << 16), [&](int64_t o) {
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(y + static_cast<size_t>(o * n + j) * row, x + static_cast<size_t>(o * dim + pos[static_cast<size_t>(j)]) * row, row);
  });
}

// GatherElements/ScatterElements: calls element(linear index in idx, offset of the element it
// addresses in data: contiguous, idx's coordinates with the axis' one from idx) for every element
// of idx, in order. The coordinates advance a row of idx's last dimension at a time and int64
// indices are read in place: coordinate arithmetic and index conversion per element cost more
// than the copy (17 ns an element in MultiScaleRoIAlign's ScatterElements).
template <class Element>
void for_each_element_offset(const Tensor& data, const Tensor& idx, size_t axis, Element element) {
  const std::vector<int64_t>& is = idx.shape();
  const std::vector<int64_t> ds = contiguous_strides(data.shape());
  const int64_t dim = data.shape()[axis], n = idx.numel(), stride = ds[axis];
  if (n == 0) return;
  const size_t last = is.size() - 1;
  const int64_t width = is[last], rows = n / width, along = axis == last ? 0 : 1;
  const int64_t* i64 = idx.dtype() == DType::kInt64 ? idx.data<int64_t>() : nullptr;
  std::vector<int64_t> c(is.size(), 0);  // the row's coordinates (c[last] stays 0)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t base = 0;
    for (size_t d = 0; d < last; ++d)
      if (d != axis) base += c[d] * ds[d];
    const int64_t first = r * width;
    for (int64_t j = 0; j < width; ++j) {
      int64_t v = i64 ? i64[first + j] : index_at(idx, first + j);
      if (v < 0 || v >= dim) v = checked_index(v, dim);
      element(first + j, base + v * stride + along * j);
    }
    for (size_t d = last; d-- > 0;) {
      if (++c[d] < is[d]) break;
      c[d] = 0;
    }
  }
}

// Copies `es` bytes, at the widths elements have, without a call per element.
inline void copy_element(unsigned char* dst, const unsigned char* src, size_t es) {
  switch (es) {
    case 1: *dst = *src; break;
    case 2: std::memcpy(dst, src, 2); break;
    case 4: std::memcpy(dst, src, 4); break;
    case 8: std::memcpy(dst, src, 8); break;
    default: std::memcpy(dst, src, es);
  }
}

void gather_elements(const ir::Node& node, const Tensor& data, const Tensor& idx, Tensor& out) {
  size_t axis = static_cast<size_t>(axis_of(node, data.rank()));
  check_within(data, idx, axis);
  if (idx.rank() == 0) throw Error(ErrorKind::kInvalidArgument, "GatherElements needs indices of rank 1 or more");
  size_t es = element_size(data.dtype());
  const auto* x = static_cast<const unsigned char*>(data.raw());
  auto* y = static_cast<unsigned char*>(out.raw());
  for_each_element_offset(data, idx, axis, [&](int64_t i, int64_t off) {
    copy_element(y + static_cast<size_t>(i) * es, x + static_cast<size_t>(off) * es, es);
  });
}

void gather_nd(const ir::Node& node, const Tensor& data, const Tensor& idx, Tensor& out) {
  const auto& s = data.shape();
  size_t b = static_cast<size_t>(node.attrs.get_int("batch_dims", 0));
  size_t k = static_cast<size_t>(idx.shape().back());
  size_t es = element_size(data.dtype());
  std::vector<int64_t> ds = contiguous_strides(s);
  int64_t slice = 1;
  for (size_t d = b + k; d < s.size(); ++d) slice *= s[d];
  int64_t batch = 1;
  for (size_t d = 0; d < b; ++d) batch *= s[d];
  int64_t tuples = idx.numel() / static_cast<int64_t>(k ? k : 1);
  if (k == 0) tuples = shape_numel(std::vector<int64_t>(idx.shape().begin(), idx.shape().end() - 1));
  // No index tuples (an empty batch dim makes batch 0 too): nothing to gather or divide by.
  if (tuples == 0) return;
  int64_t per_batch = tuples / batch;
  int64_t batch_stride = b ? ds[b - 1] : 0;
  const int64_t* iv = idx.data<int64_t>();
  const auto* x = static_cast<const unsigned char*>(data.raw());
  auto* y = static_cast<unsigned char*>(out.raw());
  size_t row = static_cast<size_t>(slice) * es;
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t off = (t / per_batch) * batch_stride;
    for (size_t j = 0; j < k; ++j) off += checked_index(iv[static_cast<size_t>(t) * k + j], s[b + j]) * ds[b + j];
    if (row) std::memcpy(y + static_cast<size_t>(t) * row, x + static_cast<size_t>(off) * es, row);
  }
}

// Integer add and mul wrap around (cpu/wrapping.h; fuzz_graph: int64 add past INT64_MIN).
template <class T>
void scatter_reduce(T* y, int64_t off, T u, const std::string& r) {
  if (r == "add") y[off] = wrapping_add(y[off], u);
  else if (r == "mul") y[off] = wrapping_mul(y[off], u);
  else if (r == "max") y[off] = std::max(y[off], u);
  else y[off] = std::min(y[off], u);
}

// ScatterElements along axis 0 whose indices hold one value per row (an index broadcast by
// Expand over whole rows of data: torchvision's MultiScaleRoIAlign merges its levels' pooled
// regions so) is ScatterND of whole rows: a copy per row, in index order. Checks every index
// first and writes nothing unless they all qualify; false then, and the element walk runs.
bool scatter_whole_rows(const Tensor& data, const Tensor& idx, const Tensor& upd, size_t axis, unsigned char* y) {
  if (axis != 0 || idx.dtype() != DType::kInt64 || idx.rank() < 2 || idx.numel() == 0 ||
      !std::equal(idx.shape().begin() + 1, idx.shape().end(), data.shape().begin() + 1))
    return false;
  const int64_t rows = idx.dim(0), width = idx.numel() / rows, dim = data.dim(0);
  const int64_t* iv = idx.data<int64_t>();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t* row = iv + i * width;
    const int64_t first = row[0];
    bool same = true;
    for (int64_t j = 1; j < width; ++j) same &= row[j] == first;  // no early exit: the loop vectorizes
    if (!same) return false;
    checked_index(first, dim);  // an index out of range: the error, before anything is written
  }
  const size_t bytes = static_cast<size_t>(width) * element_size(data.dtype());
  const auto* u = static_cast<const unsigned char*>(upd.raw());
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(y + static_cast<size_t>(checked_index(iv[i * width], dim)) * bytes, u + static_cast<size_t>(i) * bytes, bytes);
  return true;
}

void scatter_elements(const ir::Node& node, const Tensor& data, const Tensor& idx, const Tensor& upd, Tensor& out) {
  if (idx.shape() != upd.shape())
    throw Error(ErrorKind::kInvalidArgument, "indices " + shape_to_string(idx.shape()) + " and updates " +
                                                 shape_to_string(upd.shape()) + " must have the same shape");
  size_t axis = static_cast<size_t>(axis_of(node, data.rank()));
  check_within(data, idx, axis);
  if (idx.rank() == 0) throw Error(ErrorKind::kInvalidArgument, "ScatterElements needs indices of rank 1 or more");
  const std::string r = node.attrs.get_string("reduction", "none");
  size_t es = element_size(data.dtype());
  if (data.nbytes()) std::memcpy(out.raw(), data.raw(), data.nbytes());
  auto* y = static_cast<unsigned char*>(out.raw());
  const auto* u = static_cast<const unsigned char*>(upd.raw());
  // In index order, so that a later update of the same element wins (reduction none) and
  // reductions apply in a fixed order.
  if (r == "none") {
    if (scatter_whole_rows(data, idx, upd, axis, y)) return;
    for_each_element_offset(data, idx, axis, [&](int64_t i, int64_t off) {
      copy_element(y + static_cast<size_t>(off) * es, u + static_cast<size_t>(i) * es, es);
    });
    return;
  }
  for_each_element_offset(data, idx, axis, [&](int64_t i, int64_t off) {
    switch (data.dtype()) {
      case DType::kFloat32: scatter_reduce(out.data<float>(), off, upd.data<float>()[i], r); break;
      case DType::kFloat64: scatter_reduce(out.data<double>(), off, upd.data<double>()[i], r); break;
      case DType::kInt32: scatter_reduce(out.data<int32_t>(), off, upd.data<int32_t>()[i], r); break;
      default: scatter_reduce(out.data<int64_t>(), off, upd.data<int64_t>()[i], r); break;
    }
  });
}

// Each index tuple (the last dim of indices, k values, negative ones counted from the end) picks
// a slice of data's dims from k on; its update is written, or reduced into it, in index order.
void scatter_nd(const ir::Node& node, const Tensor& data, const Tensor& idx, const Tensor& upd, Tensor& out) {
  const auto& s = data.shape();
  const size_t k = static_cast<size_t>(idx.shape().back());
  const std::string r = node.attrs.get_string("reduction", "none");
  const size_t es = element_size(data.dtype());
  const std::vector<int64_t> ds = contiguous_strides(s);
  int64_t slice = 1;
  for (size_t d = k; d < s.size(); ++d) slice *= s[d];
  const int64_t tuples = shape_numel(std::vector<int64_t>(idx.shape().begin(), idx.shape().end() - 1));
  if (data.nbytes()) std::memcpy(out.raw(), data.raw(), data.nbytes());
  const int64_t* iv = idx.data<int64_t>();
  auto* y = static_cast<unsigned char*>(out.raw());
  const auto* u = static_cast<const unsigned char*>(upd.raw());
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t off = 0;
    for (size_t j = 0; j < k; ++j) off += checked_index(iv[static_cast<size_t>(t) * k + j], s[j]) * ds[j];
    if (r == "none") {
      if (slice) std::memcpy(y + static_cast<size_t>(off) * es, u + static_cast<size_t>(t * slice) * es, static_cast<size_t>(slice) * es);
      continue;
    }
    for (int64_t e = 0; e < slice; ++e) {
      switch (data.dtype()) {
        case DType::kFloat32: scatter_reduce(out.data<float>(), off + e, upd.data<float>()[t * slice + e], r); break;
        case DType::kFloat64: scatter_reduce(out.data<double>(), off + e, upd.data<double>()[t * slice + e], r); break;
        case DType::kInt32: scatter_reduce(out.data<int32_t>(), off + e, upd.data<int32_t>()[t * slice + e], r); break;
        default: scatter_reduce(out.data<int64_t>(), off + e, upd.data<int64_t>()[t * slice + e], r); break;
      }
    }
  }
}

// Compress: the output (shaped by the schema from the actual condition) gets the slices whose
// condition is true, in order; without an axis the input is taken flat.
void compress(const ir::Node& node, const Tensor& x, const Tensor& condition, Tensor& y) {
  int64_t outer = 1, along = x.numel(), inner = 1;
  if (node.attrs.has("axis")) {
    int64_t axis = node.attrs.get_int("axis", 0);
    if (axis < 0) axis += x.rank();
    along = x.dim(static_cast<size_t>(axis));
    for (int64_t d = 0; d < axis; ++d) outer *= x.dim(static_cast<size_t>(d));
    for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dim(static_cast<size_t>(d));
  }
  std::vector<int64_t> taken;
  for (int64_t i = 0; i < condition.numel() && i < along; ++i)
    if (condition.value_as_int(i) != 0) taken.push_back(i);
  const size_t es = element_size(x.dtype());
  const size_t row = static_cast<size_t>(inner) * es;
  const auto* src = static_cast<const unsigned char*>(x.raw());
  auto* dst = static_cast<unsigned char*>(y.raw());
  const int64_t count = static_cast<int64_t>(taken.size());
  if (y.numel() != outer * count * inner) throw node.error(ErrorKind::kInternal, "Compress's output has the wrong size");
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < count; ++k)
      std::memcpy(dst + static_cast<size_t>(o * count + k) * row, src + static_cast<size_t>(o * along + taken[static_cast<size_t>(k)]) * row, row);
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(gather) {
  for (const char* op : {"Gather", "GatherElements", "GatherND"}) {
    KernelEntry e;
    e.op = op;
    e.dtypes = "all";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (node->op == "Gather") gather(*node, *in[0], *in[1], out[0]);
        else if (node->op == "GatherElements") gather_elements(*node, *in[0], *in[1], out[0]);
        else gather_nd(*node, *in[0], *in[1], out[0]);
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Compress";
    e.dtypes = "all";
    e.check = [](const KernelInit& init) -> std::string {
      return init.dtype(1) == DType::kBool ? "" : "the condition must be bool";
    };
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        compress(*node, *in[0], *in[1], out[0]);
      });
    };
    registry.add(std::move(e));
  }
  for (const char* op : {"ScatterElements", "ScatterND"}) {
    KernelEntry e;
    e.op = op;
    e.dtypes = "all (reduction none); float32, float64, int32, int64 (add, mul, max, min)";
    e.check = [](const KernelInit& init) -> std::string {
      if (init.node.attrs.get_string("reduction", "none") == "none") return "";
      DType d = init.dtype(0);
      if (d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kInt32 || d == DType::kInt64) return "";
      return "reduction on " + to_string(d) + " is not supported";
    };
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (node->op == "ScatterND") scatter_nd(*node, *in[0], *in[1], *in[2], out[0]);
        else scatter_elements(*node, *in[0], *in[1], *in[2], out[0]);
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
