// CPU kernel of CenterCropPad (any dtype): output element i takes input element i - pad + crop
// along each axis (pad and crop centred, the odd element at the end, as ONNX's reference
// slices), zero where that falls outside the input.
#include <cstring>
#include <vector>

#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(center_crop_pad) {
  KernelEntry e;
  e.op = "CenterCropPad";
  e.dtypes = "all";
  e.create = [](const KernelInit&) {
    return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      Tensor& y = out[0];
      const size_t rank = static_cast<size_t>(x.rank()), es = element_size(x.dtype());
      // shift[d]: input index = output index + shift (crop: > 0, pad: < 0).
      std::vector<int64_t> shift(rank, 0);
      for (size_t d = 0; d < rank; ++d) {
        const int64_t dim = x.dim(static_cast<int>(d)), size = y.dim(static_cast<int>(d));
        shift[d] = size < dim ? (dim - size) / 2 : -((size - dim) / 2);
      }
      if (y.nbytes()) std::memset(y.raw(), 0, y.nbytes());
      std::vector<int64_t> in_stride(rank, 1);
      for (size_t d = rank; d-- > 1;) in_stride[d - 1] = in_stride[d] * x.dim(static_cast<int>(d));
      const auto* src = static_cast<const unsigned char*>(x.raw());
      auto* dst = static_cast<unsigned char*>(y.raw());
      std::vector<int64_t> index(rank, 0);
      for (int64_t o = 0; o < y.numel(); ++o) {
        int64_t off = 0;
        bool inside = true;
        for (size_t d = 0; d < rank && inside; ++d) {
          const int64_t i = index[d] + shift[d];
          inside = i >= 0 && i < x.dim(static_cast<int>(d));
          off += i * in_stride[d];
        }
        if (inside) std::memcpy(dst + static_cast<size_t>(o) * es, src + static_cast<size_t>(off) * es, es);
        for (size_t d = rank; d-- > 0;) {
          if (++index[d] < y.dim(static_cast<int>(d))) break;
          index[d] = 0;
        }
      }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
