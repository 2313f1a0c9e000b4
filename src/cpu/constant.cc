// CPU kernels of ConstantOfShape (any dtype: the value's bytes repeated), EyeLike (any dtype)
// and Range (float32, float64, int16, int32, int64).
#include <algorithm>
#include <cstring>

#include "cpu/kernel.h"

namespace kiln::cpu {

namespace {

template <class T>
void range(const Tensor& start, const Tensor& delta, Tensor& out) {
  T s = start.data<T>()[0], d = delta.data<T>()[0];
  T* y = out.data<T>();
  // start + i * delta, not repeated addition, so float ranges do not drift.
  for (int64_t i = 0; i < out.numel(); ++i) y[i] = static_cast<T>(s + static_cast<T>(i) * d);
}

void fill_one(void* dst, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: *static_cast<float*>(dst) = 1.f; break;
    case DType::kFloat64: *static_cast<double*>(dst) = 1.0; break;
    case DType::kFloat16: *static_cast<uint16_t*>(dst) = float_to_half(1.f); break;
    case DType::kBFloat16: *static_cast<uint16_t*>(dst) = float_to_bfloat16(1.f); break;
    default: {
      // Integers and bool: 1 in the low byte of a little-endian value.
      std::memset(dst, 0, element_size(dtype));
      *static_cast<uint8_t*>(dst) = 1;
    }
  }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(constant) {
  {
    KernelEntry e;
    e.op = "ConstantOfShape";
    e.dtypes = "all";
    e.create = [](const KernelInit& init) {
      const Tensor* v = init.node.attrs.get_tensor("value");
      Tensor value = v ? *v : Tensor::scalar<float>(0.f);
      return make_kernel([value](const std::vector<const Tensor*>&, std::vector<Tensor>& out) {
        const size_t es = element_size(value.dtype()), bytes = out[0].nbytes();
        auto* y = static_cast<unsigned char*>(out[0].raw());
        if (!bytes) return;
        const auto* v = static_cast<const unsigned char*>(value.raw());
        if (std::all_of(v, v + es, [](unsigned char b) { return b == 0; })) {
          std::memset(y, 0, bytes);
          return;
        }
        // The value once, then the filled part copied onto the rest, doubling: a copy per
        // element cost 4 ns (a [150, 256, 7, 7] fill in a detection model: 8 ms).
        std::memcpy(y, v, es);
        for (size_t filled = es; filled < bytes; filled *= 2) std::memcpy(y + filled, y, std::min(filled, bytes - filled));
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "EyeLike";
    e.dtypes = "all";
    e.create = [](const KernelInit& init) {
      int64_t k = init.node.attrs.get_int("k", 0);
      return make_kernel([k](const std::vector<const Tensor*>&, std::vector<Tensor>& out) {
        Tensor& y = out[0];
        size_t es = element_size(y.dtype());
        int64_t rows = y.dim(0), cols = y.dim(1);
        std::memset(y.raw(), 0, y.nbytes());
        // The diagonal c = r + k crosses the matrix only for -rows < k < cols; k is any int64
        // from the file, where r + k could overflow.
        if (k <= -rows || k >= cols) return;
        for (int64_t r = std::max<int64_t>(0, -k); r < rows && r + k < cols; ++r)
          fill_one(static_cast<unsigned char*>(y.raw()) + static_cast<size_t>(r * cols + r + k) * es, y.dtype());
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Range";
    e.check = accept_dtypes({DType::kFloat32, DType::kFloat64, DType::kInt16, DType::kInt32, DType::kInt64});
    e.dtypes = "float32, float64, int16, int32, int64";
    e.create = [](const KernelInit&) {
      return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        switch (in[0]->dtype()) {
          case DType::kFloat32: range<float>(*in[0], *in[2], out[0]); break;
          case DType::kFloat64: range<double>(*in[0], *in[2], out[0]); break;
          case DType::kInt16: range<int16_t>(*in[0], *in[2], out[0]); break;
          case DType::kInt32: range<int32_t>(*in[0], *in[2], out[0]); break;
          default: range<int64_t>(*in[0], *in[2], out[0]); break;
        }
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
