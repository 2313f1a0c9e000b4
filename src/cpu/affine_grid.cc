// CPU kernel of AffineGrid (float32, float64): each output location's normalized coordinates
// (x along the last dim, then y, then z; from -1 to 1 at the pixels' corners with
// align_corners, at their centers without) times theta.
#include <vector>

#include "cpu/kernel.h"

namespace kiln::cpu {

namespace {

// The normalized coordinate of pixel i of n. A single pixel with align_corners is ill-defined
// (-1 and 1 would both be its center): ONNX's Python reference puts it at -1, which kiln
// follows; PyTorch's affine_grid puts it at 0 and ONNX Runtime at 1.
double coordinate(int64_t i, int64_t n, bool align_corners) {
  if (align_corners) return n > 1 ? -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(n - 1) : -1.0;
  return (2.0 * static_cast<double>(i) + 1.0) / static_cast<double>(n) - 1.0;
}

template <class T>
void affine_grid(const Tensor& theta, Tensor& grid, bool align_corners) {
  const int64_t dims = theta.dim(1), n = theta.dim(0);
  std::vector<int64_t> sizes;  // D, H, W (or H, W)
  for (int64_t d = 1; d <= dims; ++d) sizes.push_back(grid.dim(d));
  int64_t points = 1;
  for (int64_t s : sizes) points *= s;
  const T* t = theta.data<T>();
  T* out = grid.data<T>();
  std::vector<double> base(static_cast<size_t>(dims + 1), 1.0);  // x, y(, z), 1
  for (int64_t b = 0; b < n; ++b)
    for (int64_t p = 0; p < points; ++p) {
      // base[0] follows the last dim (W), base[1] the one before (H), base[2] D.
      for (int64_t d = 0, r = p; d < dims; ++d) {
        const int64_t size = sizes[static_cast<size_t>(dims - 1 - d)];
        base[static_cast<size_t>(d)] = coordinate(r % size, size, align_corners);
        r /= size;
      }
      for (int64_t row = 0; row < dims; ++row) {
        double v = 0.0;
        for (int64_t k = 0; k <= dims; ++k)
          v += static_cast<double>(t[(b * dims + row) * (dims + 1) + k]) * base[static_cast<size_t>(k)];
        out[(b * points + p) * dims + row] = static_cast<T>(v);
      }
    }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(affine_grid) {
  KernelEntry e;
  e.op = "AffineGrid";
  e.check = accept_dtypes({DType::kFloat32, DType::kFloat64});
  e.dtypes = "float32, float64";
  e.create = [](const KernelInit& init) {
    const bool align_corners = init.node.attrs.get_int("align_corners", 0) != 0;
    return make_kernel([align_corners](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      if (in[0]->dtype() == DType::kFloat64) affine_grid<double>(*in[0], out[0], align_corners);
      else affine_grid<float>(*in[0], out[0], align_corners);
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
