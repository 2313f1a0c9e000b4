// CPU kernel of Col2Im (float32, float64): every block element added to the image position it
// came from; positions in the padding are dropped.
#include <vector>

#include "cpu/kernel.h"
#include "ops/col2im.h"

namespace kiln::cpu {

namespace {

template <class T>
void col2im(const Tensor& x, const ir::Col2ImGeometry& g, Tensor& y) {
  const size_t dims = g.image.size();
  const int64_t n = x.dim(0), channels = x.dim(1) / g.block_size;
  int64_t image_size = 1;
  for (int64_t v : g.image) image_size *= v;
  const T* in = x.data<T>();
  T* out = y.data<T>();
  for (int64_t i = 0; i < y.numel(); ++i) out[i] = T(0);
  std::vector<int64_t> offset(dims), place(dims);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t k = 0; k < g.block_size; ++k) {
        // The element's offset inside its block (row-major over block_shape).
        for (int64_t d = static_cast<int64_t>(dims) - 1, r = k; d >= 0; --d) {
          offset[static_cast<size_t>(d)] = r % g.block[static_cast<size_t>(d)];
          r /= g.block[static_cast<size_t>(d)];
        }
        const T* row = in + ((b * channels + c) * g.block_size + k) * g.blocks;
        T* image = out + (b * channels + c) * image_size;
        for (int64_t l = 0; l < g.blocks; ++l) {
          // The block's place (row-major over the blocks per dim), then the image position.
          for (int64_t d = static_cast<int64_t>(dims) - 1, r = l; d >= 0; --d) {
            place[static_cast<size_t>(d)] = r % g.per_dim[static_cast<size_t>(d)];
            r /= g.per_dim[static_cast<size_t>(d)];
          }
          int64_t at = 0;
          bool inside = true;
          for (size_t d = 0; d < dims && inside; ++d) {
            const int64_t p = place[d] * g.strides[d] + offset[d] * g.dilations[d] - g.pads[d];
            inside = p >= 0 && p < g.image[d];
            at = at * g.image[d] + p;
          }
          if (inside) image[at] += row[l];
        }
      }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(col2im) {
  KernelEntry e;
  e.op = "Col2Im";
  e.check = accept_dtypes({DType::kFloat32, DType::kFloat64});
  e.dtypes = "float32, float64";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      std::vector<int64_t> image, block;
      for (int64_t i = 0; i < in[1]->numel(); ++i) image.push_back(in[1]->value_as_int(i));
      for (int64_t i = 0; i < in[2]->numel(); ++i) block.push_back(in[2]->value_as_int(i));
      const ir::Col2ImGeometry g = ir::col2im_geometry(*node, image, block);
      if (in[0]->dtype() == DType::kFloat64) col2im<double>(*in[0], g, out[0]);
      else col2im<float>(*in[0], g, out[0]);
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
