// CPU kernel of GridSample (ops/grid_sample_params.h), float32, any number of spatial
// dimensions: each output point's neighbours and their separable weights, then a weighted sum
// over every channel.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/kernel.h"
#include "ops/grid_sample_params.h"

namespace kiln::cpu {

namespace {

using ir::GridSampleMode;
using ir::GridSamplePadding;

void grid_sample(const ir::Node& node, const Tensor& x, const Tensor& grid, Tensor& y) {
  const std::string m = node.attrs.get_string("mode", "linear"), p = node.attrs.get_string("padding_mode", "zeros");
  const GridSampleMode mode = m == "nearest" ? GridSampleMode::kNearest : m == "cubic" ? GridSampleMode::kCubic : GridSampleMode::kLinear;
  const GridSamplePadding padding = p == "border" ? GridSamplePadding::kBorder
                                    : p == "reflection" ? GridSamplePadding::kReflection : GridSamplePadding::kZeros;
  const bool align = node.attrs.get_int("align_corners", 0) != 0;
  const int64_t N = x.dim(0), C = x.dim(1), R = x.rank() - 2;
  if (grid.dim(0) != N) throw node.error(ErrorKind::kInvalidArgument, "X and grid must have the same batch");
  std::vector<int64_t> dims(x.shape().begin() + 2, x.shape().end());
  std::vector<double> lo(static_cast<size_t>(R)), hi(static_cast<size_t>(R));
  for (int64_t d = 0; d < R; ++d) ir::grid_borders(dims[d], align, lo[d], hi[d]);
  int64_t spatial = 1;
  for (int64_t d : dims) spatial *= d;
  const int64_t points = grid.numel() / std::max<int64_t>(N * R, 1);
  const int taps = mode == GridSampleMode::kNearest ? 1 : mode == GridSampleMode::kLinear ? 2 : 4;
  const float* xp = x.data<float>();
  const float* gp = grid.data<float>();
  float* yp = y.data<float>();
  // Per point: for each spatial dimension its `taps` neighbour indices (-1: a zero) and weights.
  std::vector<int64_t> index(static_cast<size_t>(R * taps));
  std::vector<double> weight(static_cast<size_t>(R * taps));
  std::vector<int> tap(static_cast<size_t>(R));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t q = 0; q < points; ++q) {
      const float* g = gp + (n * points + q) * R;
      for (int64_t d = 0; d < R; ++d)  // the grid lists the innermost dimension first (x, then y, ...)
        ir::grid_neighbours(g[R - 1 - d], dims[d], align, mode, padding, lo[d], hi[d], index.data() + d * taps,
                            weight.data() + d * taps);
      // The weighted sum over every combination of taps (taps^R neighbours).
      for (int64_t c = 0; c < C; ++c) {
        const float* xc = xp + (n * C + c) * spatial;
        double sum = 0;
        std::fill(tap.begin(), tap.end(), 0);
        while (true) {
          double w = 1;
          int64_t offset = 0;
          bool zero = false;
          for (int64_t d = 0; d < R; ++d) {
            const int64_t i = index[static_cast<size_t>(d * taps + tap[d])];
            if (i < 0) zero = true;
            w *= weight[static_cast<size_t>(d * taps + tap[d])];
            offset = offset * dims[d] + i;
          }
          if (!zero) sum += w * xc[offset];
          int64_t d = R - 1;
          while (d >= 0 && ++tap[d] == taps) tap[d--] = 0;
          if (d < 0) break;
        }
        yp[(n * C + c) * points + q] = static_cast<float>(sum);
      }
    }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(grid_sample) {
  KernelEntry e;
  e.op = "GridSample";
  e.check = [](const KernelInit& init) -> std::string {
    if (init.dtype(0) != DType::kFloat32 || init.dtype(1) != DType::kFloat32)
      return "input types " + to_string(init.dtype(0)) + ", " + to_string(init.dtype(1)) + " are not supported (supported: float32)";
    return "";
  };
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      grid_sample(*node, *in[0], *in[1], out[0]);
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
