// CPU kernel of Resize. Nearest works on raw bytes (any dtype) through one index table per
// axis. Linear and cubic (float32) are separable: one 1-D interpolation pass per resized
// axis, each output index reading a few weighted source indices (more with antialias when
// downscaling), so any rank works.
#include <cmath>
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

void resize_nearest(const Tensor& x, Tensor& y, const std::vector<std::vector<Taps>>& taps, const Options& o) {
  size_t es = element_size(x.dtype());
  const auto& os = y.shape();
  size_t rank = os.size();
  if (y.numel() == 0) return;
  std::vector<int64_t> in_strides = contiguous_strides(x.shape());
  std::vector<unsigned char> fill(es, 0);
  if (x.dtype() == DType::kFloat32) std::memcpy(fill.data(), &o.extrapolation, es);
  const auto* src = static_cast<const unsigned char*>(x.raw());
  auto* dst = static_cast<unsigned char*>(y.raw());
  if (rank == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  int64_t row = os.back();
  int64_t rows = y.numel() / row;
  const std::vector<Taps>& last = taps.back();
  std::vector<int64_t> c(rank - 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t s = 0;
    bool outside = false;
    for (size_t k = 0; k + 1 < rank; ++k) {
      const Taps& t = taps[k][static_cast<size_t>(c[k])];
      outside = outside || t.outside;
      s += t.idx[0] * in_strides[k];
    }
    unsigned char* d = dst + static_cast<size_t>(r * row) * es;
    for (int64_t j = 0; j < row; ++j) {
      const Taps& t = last[static_cast<size_t>(j)];
      const unsigned char* from = (outside || t.outside) ? fill.data() : src + static_cast<size_t>(s + t.idx[0]) * es;
      std::memcpy(d + static_cast<size_t>(j) * es, from, es);
    }
    for (size_t k = c.size(); k-- > 0;) {
      if (++c[k] < os[k]) break;
      c[k] = 0;
    }
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
