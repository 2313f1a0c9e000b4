// CPU kernel of Resize. Nearest works on raw bytes (any dtype) through one index table per
// axis. Linear and cubic (float32) are separable: one 1-D interpolation pass per resized
// axis, each output index reading a few weighted source indices (more with antialias when
// downscaling), so any rank works.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/data_movement.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "ops/resize_params.h"
#include "ops/resize_taps.h"

namespace kiln::cpu {

namespace {

using Options = ir::ResizeOptions;
using Taps = ir::ResizeTaps;

// One interpolation pass along `axis`: x has shape `shape`, y gets shape[axis] = the filter's
// output length.
void interpolate_axis(const float* x, const std::vector<int64_t>& shape, size_t axis, const ir::ResizeFilter& filter,
                      float extrapolation, float* y) {
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  int64_t in_len = shape[axis], out_len = static_cast<int64_t>(filter.outside.size());
  parallel_for_each(outer, outer * out_len * inner > (1 << 15), [&](int64_t o) {
    const float* xs = x + o * in_len * inner;
    for (int64_t j = 0; j < out_len; ++j) {
      float* yr = y + (o * out_len + j) * inner;
      if (filter.outside[static_cast<size_t>(j)]) {
        for (int64_t i = 0; i < inner; ++i) yr[i] = extrapolation;
        continue;
      }
      for (int64_t i = 0; i < inner; ++i) yr[i] = 0.f;
      for (int64_t k = filter.first[static_cast<size_t>(j)]; k < filter.first[static_cast<size_t>(j) + 1]; ++k) {
        const float* xr = xs + filter.idx[static_cast<size_t>(k)] * inner;
        const float w = filter.w[static_cast<size_t>(k)];
        for (int64_t i = 0; i < inner; ++i) yr[i] += w * xr[i];
      }
    }
  });
}

// Output rows [begin, end) of a nearest resize, elements of type T (raw bits of the element size):
// each row reads one source row (or is all fill) through the last axis's index table, and a row
// whose source is the previous row's (an upscaled axis before the last) copies that row whole.
template <class T>
void nearest_rows(const T* src, T* dst, const std::vector<int64_t>& out_shape, const std::vector<int64_t>& in_strides,
                  const std::vector<std::vector<Taps>>& taps, const std::vector<int64_t>& last_from, T fill, int64_t begin,
                  int64_t end) {
  const size_t rank = out_shape.size();
  const int64_t row = out_shape.back();
  std::vector<int64_t> c(rank - 1, 0);  // the output coordinates of row `begin`
  for (int64_t r = begin, k = static_cast<int64_t>(rank) - 2; k >= 0; --k) {
    c[static_cast<size_t>(k)] = r % out_shape[static_cast<size_t>(k)];
    r /= out_shape[static_cast<size_t>(k)];
  }
  int64_t previous = -2;  // the source row of the row before (-1: outside, all fill)
  for (int64_t r = begin; r < end; ++r) {
    int64_t from = 0;
    for (size_t k = 0; k + 1 < rank && from >= 0; ++k) {
      const Taps& t = taps[k][static_cast<size_t>(c[k])];
      from = t.outside ? -1 : from + t.idx[0] * in_strides[k];
    }
    T* d = dst + r * row;
    if (from == previous && r > begin) {
      std::memcpy(d, d - row, static_cast<size_t>(row) * sizeof(T));
    } else if (from < 0) {
      std::fill(d, d + row, fill);
    } else {
      const T* s = src + from;
      for (int64_t j = 0; j < row; ++j) {
        const int64_t at = last_from[static_cast<size_t>(j)];
        d[j] = at < 0 ? fill : s[at];
      }
    }
    previous = from;
    for (size_t k = c.size(); k-- > 0;) {
      if (++c[k] < out_shape[k]) break;
      c[k] = 0;
    }
  }
}

template <class T>
void resize_nearest_as(const Tensor& x, Tensor& y, const std::vector<std::vector<Taps>>& taps, const Options& o) {
  T fill{};
  const uint64_t fill_bits = ir::resize_fill_bits(o, x.dtype());
  std::memcpy(&fill, &fill_bits, sizeof(T));
  const std::vector<int64_t>& os = y.shape();
  std::vector<int64_t> last_from;  // the source index of each element of a row along the last axis, -1 outside
  for (const Taps& t : taps.back()) last_from.push_back(t.outside ? -1 : t.idx[0]);
  const std::vector<int64_t> in_strides = contiguous_strides(x.shape());
  const auto* src = static_cast<const T*>(x.raw());
  auto* dst = static_cast<T*>(y.raw());
  const int64_t rows = y.numel() / os.back();
  parallel_for(rows, [&](int64_t begin, int64_t end) {
    nearest_rows<T>(src, dst, os, in_strides, taps, last_from, fill, begin, end);
  }, y.numel() > (1 << 15));
}

void resize_nearest(const Tensor& x, Tensor& y, const std::vector<std::vector<Taps>>& taps, const Options& o) {
  if (y.numel() == 0) return;
  if (y.shape().empty()) {
    std::memcpy(y.raw(), x.raw(), element_size(x.dtype()));
    return;
  }
  switch (element_size(x.dtype())) {
    case 1: resize_nearest_as<uint8_t>(x, y, taps, o); break;
    case 2: resize_nearest_as<uint16_t>(x, y, taps, o); break;
    case 4: resize_nearest_as<uint32_t>(x, y, taps, o); break;
    case 8: resize_nearest_as<uint64_t>(x, y, taps, o); break;
    default: throw Error(ErrorKind::kUnsupported, "Resize: nearest mode on " + to_string(x.dtype()) + " is not supported");
  }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(resize) {
  KernelEntry e;
  e.op = "Resize";
  e.dtypes = "all (nearest); float32 (linear, cubic)";
  e.check = [](const KernelInit& init) -> std::string {
    const ir::Attributes& a = init.node.attrs;
    if (a.get_string("mode", "nearest") != "nearest" && init.dtype(0) != DType::kFloat32)
      return a.get_string("mode", "nearest") + " mode on " + to_string(init.dtype(0)) + " is not supported (float32 only)";
    return "";
  };
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    const Options o = ir::resize_options(init.node);
    return make_kernel([node, o](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      // Nothing to compute. The taps below (and the linear passes' buffers) are sized by each
      // output dim: an empty [0, 2^31] output asked for 120 GB of taps (fuzz_graph).
      if (out[0].numel() == 0) return;
      const Tensor& x = *in[0];
      auto present = [&](size_t i) { return i < in.size() && in[i] && in[i]->numel() > 0; };
      std::optional<ir::Dims> sizes;
      if (present(3)) sizes = ir::dims_of(in[3]->to_int_vector());
      ir::ResizePlan p = ir::resize_plan(*node, ir::dims_of(x.shape()), present(1) ? in[1] : nullptr,
                                         present(2) ? in[2] : nullptr, sizes);
      const auto& is = x.shape();
      if (o.mode == "nearest") {
        std::vector<std::vector<Taps>> taps;
        for (size_t d = 0; d < is.size(); ++d)
          taps.push_back(ir::resize_axis_taps(o, is[d], out[0].shape()[d], p.scale[d], p.roi_start[d], p.roi_end[d]));
        resize_nearest(x, out[0], taps, o);
        return;
      }
      // One pass per axis that changes, ping-ponging between buffers.
      std::vector<int64_t> shape = is;
      Tensor cur = x;
      for (size_t d = 0; d < is.size(); ++d) {
        const ir::ResizeFilter filter =
            ir::resize_axis_filter(o, is[d], out[0].shape()[d], p.scale[d], p.roi_start[d], p.roi_end[d]);
        if (filter.identity(is[d])) continue;
        std::vector<int64_t> next_shape = shape;
        next_shape[d] = out[0].shape()[d];
        Tensor next(DType::kFloat32, next_shape);
        interpolate_axis(cur.data<float>(), shape, d, filter, o.extrapolation, next.data<float>());
        cur = next;
        shape = next_shape;
      }
      std::memcpy(out[0].raw(), cur.raw(), out[0].nbytes());
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
