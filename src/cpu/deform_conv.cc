// CPU kernel of DeformConv (float32, float64; 2-D): per image and group, the sampled columns
// (each kernel tap at its place moved by its offset, bilinear with zero outside the image, times
// the mask), then one product with the group's weights, as Conv's im2col; float32 through
// kiln's sgemm, float64 in a plain loop. Sampling follows ONNX's reference (GridSample with
// align_corners on pixel coordinates, zeros padding).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <optional>
#include <vector>

#include "cpu/gemm_util.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "ops/deform_conv.h"

namespace kiln::cpu {

namespace {

// X[y, x] of one channel plane, bilinearly, corners outside the image counting as zero; NaN at
// a NaN coordinate.
template <class T>
double sample(const T* plane, int64_t height, int64_t width, double y, double x) {
  if (std::isnan(y) || std::isnan(x)) return NAN;
  if (y <= -1 || y >= static_cast<double>(height) || x <= -1 || x >= static_cast<double>(width)) return 0;
  const double y0 = std::floor(y), x0 = std::floor(x);
  const double ly = y - y0, lx = x - x0;
  const int64_t r0 = static_cast<int64_t>(y0), c0 = static_cast<int64_t>(x0);
  auto at = [&](int64_t r, int64_t c) {
    return r >= 0 && r < height && c >= 0 && c < width ? static_cast<double>(plane[r * width + c]) : 0.0;
  };
  return (1 - ly) * ((1 - lx) * at(r0, c0) + lx * at(r0, c0 + 1)) + ly * ((1 - lx) * at(r0 + 1, c0) + lx * at(r0 + 1, c0 + 1));
}

template <class T>
void deform_conv(const ir::DeformConvParams& p, const Tensor& x, const Tensor& w, const Tensor& offset, const Tensor* bias,
                 const Tensor* mask, Tensor& y) {
  const ir::ConvGeometry& g = p.geometry;
  const int64_t kh = g.kernel[0], kw = g.kernel[1], taps = kh * kw;
  const int64_t group = g.group, cg = p.channels / group, ocg = p.out_channels / group;
  const int64_t per_offset_group = p.channels / p.offset_group;
  const int64_t positions = p.out_height * p.out_width, rows = cg * taps;
  const T* xd = x.data<T>();
  const T* wd = w.data<T>();
  const T* od = offset.data<T>();
  const T* md = mask ? mask->data<T>() : nullptr;
  T* yd = y.data<T>();
  // The columns of a block of output positions at a time: at most kColumnElements values
  // (a column, rows values, at least), however large the image.
  constexpr int64_t kColumnElements = int64_t{1} << 22;
  const int64_t block = std::max<int64_t>(1, std::min<int64_t>(positions, kColumnElements / std::max<int64_t>(rows, 1)));
  std::vector<T> columns(static_cast<size_t>(rows * block));
  for (int64_t n = 0; n < p.batch; ++n)
    for (int64_t grp = 0; grp < group; ++grp)
      for (int64_t q0 = 0; q0 < positions; q0 += block) {
        const int64_t nb = std::min(block, positions - q0);
        parallel_for_each(rows, rows * nb > 65536, [&](int64_t row) {
          const int64_t c = grp * cg + row / taps, tap = row % taps, i = tap / kw, j = tap % kw;
          const int64_t og = c / per_offset_group;
          const T* plane = xd + (n * p.channels + c) * p.height * p.width;
          const T* dy = od + ((n * p.offset_group + og) * 2 * taps + 2 * tap) * positions;
          const T* dx = dy + positions;
          const T* m = md ? md + ((n * p.offset_group + og) * taps + tap) * positions : nullptr;
          T* col = columns.data() + row * nb;
          for (int64_t q = 0; q < nb; ++q) {
            const int64_t at = q0 + q, oh = at / p.out_width, ow = at % p.out_width;
            const double sy = static_cast<double>(oh * g.strides[0] - g.pad_begin[0] + i * g.dilations[0]) + static_cast<double>(dy[at]);
            const double sx = static_cast<double>(ow * g.strides[1] - g.pad_begin[1] + j * g.dilations[1]) + static_cast<double>(dx[at]);
            const double v = sample(plane, p.height, p.width, sy, sx);
            col[q] = static_cast<T>(m ? v * static_cast<double>(m[at]) : v);
          }
        });
        const T* wg = wd + grp * ocg * rows;
        T* out = yd + (n * p.out_channels + grp * ocg) * positions + q0;
        if constexpr (std::is_same_v<T, float>) {
          parallel_sgemm(false, false, ocg, nb, rows, 1.f, wg, rows, columns.data(), nb, 0.f, out, positions);
        } else {
          for (int64_t o = 0; o < ocg; ++o)
            for (int64_t q = 0; q < nb; ++q) {
              double sum = 0;
              for (int64_t r = 0; r < rows; ++r)
                sum += static_cast<double>(wg[o * rows + r]) * static_cast<double>(columns[static_cast<size_t>(r * nb + q)]);
              out[o * positions + q] = static_cast<T>(sum);
            }
        }
        if (bias)
          for (int64_t o = 0; o < ocg; ++o) {
            const T b = bias->data<T>()[grp * ocg + o];
            for (int64_t q = 0; q < nb; ++q) out[o * positions + q] += b;
          }
      }
}

std::optional<std::vector<int64_t>> shape_of(const Tensor* t) {
  if (!t) return std::nullopt;
  return t->shape();
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(deform_conv) {
  KernelEntry e;
  e.op = "DeformConv";
  e.check = accept_dtypes({DType::kFloat32, DType::kFloat64});
  e.dtypes = "float32, float64";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor* bias = in.size() > 3 ? in[3] : nullptr;
      const Tensor* mask = in.size() > 4 ? in[4] : nullptr;
      const ir::DeformConvParams p =
          ir::deform_conv_params(*node, in[0]->shape(), in[1]->shape(), in[2]->shape(), shape_of(mask), shape_of(bias));
      if (in[0]->dtype() == DType::kFloat64) deform_conv<double>(p, *in[0], *in[1], *in[2], bias, mask, out[0]);
      else deform_conv<float>(p, *in[0], *in[1], *in[2], bias, mask, out[0]);
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
