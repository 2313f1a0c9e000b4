// CPU kernels of Cast, CastLike, BitCast, Clip and Dropout.
//
// Cast converts between every numeric type and bool: float to integer truncates toward zero
// and saturates, anything to bool is "!= 0", float16, bfloat16, the float8 types and
// float4e2m1 go through float32 (to float8: rounding to nearest even, saturating unless
// saturate = 0). The sub-byte integers wrap instead, as ONNX's reference converts them.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <cmath>
#include <limits>

#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "ir/saturating_cast.h"
#include "ir/small_types.h"

namespace kiln::cpu {

namespace {

// Calls fn(T{}) for the C++ type of every natively stored numeric dtype (bool as uint8_t).
template <class Fn>
bool dispatch_storage(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(float{}); return true;
    case DType::kFloat64: fn(double{}); return true;
    case DType::kInt8: fn(int8_t{}); return true;
    case DType::kInt16: fn(int16_t{}); return true;
    case DType::kInt32: fn(int32_t{}); return true;
    case DType::kInt64: fn(int64_t{}); return true;
    case DType::kUInt8: fn(uint8_t{}); return true;
    case DType::kUInt16: fn(uint16_t{}); return true;
    case DType::kUInt32: fn(uint32_t{}); return true;
    case DType::kUInt64: fn(uint64_t{}); return true;
    case DType::kBool: fn(bool{}); return true;
    default: return false;
  }
}

template <class S, class D>
void convert(const void* src, void* dst, int64_t n) {
  const S* s = static_cast<const S*>(src);
  D* d = static_cast<D*>(dst);
  if constexpr (std::is_same_v<D, bool>) {
    // Written as bytes so a bool tensor always holds 0 or 1.
    uint8_t* b = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n; ++i) b[i] = s[i] != S(0) ? 1 : 0;
  } else if constexpr (std::is_same_v<S, bool>) {
    const uint8_t* b = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; ++i) d[i] = b[i] ? D(1) : D(0);
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    parallel_for_each(n, n > 65536, [&](int64_t i) {
      d[i] = ir::saturating_integer<D>(static_cast<double>(s[i]));
    });
  } else {
    parallel_for_each(n, n > 65536, [&](int64_t i) {
      d[i] = static_cast<D>(s[i]);
    });
  }
}

// 16-bit and smaller floats: converted through float32.
bool is_narrow_float(DType d) { return d == DType::kFloat16 || d == DType::kBFloat16 || is_small_float(d); }

void cast_tensor(const Tensor& in, Tensor& out, bool saturate) {
  const int64_t n = in.numel();
  if (in.dtype() == out.dtype()) {
    if (in.nbytes()) std::memcpy(out.raw(), in.raw(), in.nbytes());
    return;
  }
  if (is_narrow_float(in.dtype())) {
    Tensor f(DType::kFloat32, in.shape());
    float* p = f.data<float>();
    if (is_small_float(in.dtype())) {
      const uint8_t* b = static_cast<const uint8_t*>(in.raw());
      for (int64_t i = 0; i < n; ++i) p[i] = small_float_to_float(in.dtype(), b[i]);
    } else {
      const uint16_t* h = static_cast<const uint16_t*>(in.raw());
      for (int64_t i = 0; i < n; ++i) p[i] = in.dtype() == DType::kFloat16 ? half_to_float(h[i]) : bfloat16_to_float(h[i]);
    }
    cast_tensor(f, out, saturate);
    return;
  }
  // Sub-byte integers: their values as int8 / uint8, which they are stored as.
  if (is_sub_byte_integer(in.dtype())) {
    const bool is_signed = in.dtype() == DType::kInt4 || in.dtype() == DType::kInt2;
    Tensor wide(is_signed ? DType::kInt8 : DType::kUInt8, in.shape());
    if (in.nbytes()) std::memcpy(wide.raw(), in.raw(), in.nbytes());
    cast_tensor(wide, out, saturate);
    return;
  }
  if (is_sub_byte_integer(out.dtype())) {
    // Truncated toward zero, then wrapped to the type's bits (as numpy and ml_dtypes convert,
    // which ONNX's reference uses); NaN and infinities give 0.
    uint8_t* b = static_cast<uint8_t*>(out.raw());
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = 0;
      if (is_float(in.dtype())) {
        const double d = in.value_as_double(i);
        v = std::isfinite(d) ? static_cast<int64_t>(std::clamp(std::trunc(d), -9.2e18, 9.2e18)) : 0;
      } else {
        v = in.value_as_int(i);
      }
      b[i] = wrap_to_sub_byte(out.dtype(), v);
    }
    return;
  }
  if (is_narrow_float(out.dtype())) {
    Tensor f(DType::kFloat32, out.shape());
    cast_tensor(in, f, saturate);
    const float* p = f.data<float>();
    if (is_small_float(out.dtype())) {
      uint8_t* b = static_cast<uint8_t*>(out.raw());
      for (int64_t i = 0; i < n; ++i) b[i] = float_to_small_float(out.dtype(), p[i], saturate);
      return;
    }
    uint16_t* h = static_cast<uint16_t*>(out.raw());
    for (int64_t i = 0; i < n; ++i)
      h[i] = out.dtype() == DType::kFloat16 ? float_to_half(p[i]) : float_to_bfloat16(p[i]);
    return;
  }
  dispatch_storage(in.dtype(), [&](auto s) {
    dispatch_storage(out.dtype(), [&](auto d) { convert<decltype(s), decltype(d)>(in.raw(), out.raw(), n); });
  });
}

bool castable(DType d) { return is_narrow_float(d) || is_sub_byte_integer(d) || dispatch_storage(d, [](auto) {}); }

template <class T>
void clip_loop(const std::vector<const Tensor*>& in, Tensor& out) {
  T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
  if (in.size() > 1 && in[1]) lo = in[1]->data<T>()[0];
  if (in.size() > 2 && in[2]) hi = in[2]->data<T>()[0];
  const T* x = in[0]->data<T>();
  T* y = out.data<T>();
  const int64_t n = out.numel();
  // min > max: ONNX Runtime yields max everywhere; the min-then-max order below does the same.
  parallel_for_each(n, n > 65536, [&](int64_t i) {
    T v = x[i] < lo ? lo : x[i];
    y[i] = v > hi ? hi : v;
  });
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(cast) {
  for (const char* op : {"Cast", "CastLike"}) {
    KernelEntry e;
    e.op = op;
    e.check = [](const KernelInit& init) -> std::string {
      DType to = init.output_types[0] ? init.output_types[0]->dtype : DType::kUndefined;
      if (!castable(init.dtype(0))) return "cannot cast from " + to_string(init.dtype(0));
      if (!castable(to)) return "cannot cast to " + to_string(to);
      return "";
    };
    e.dtypes = "float16, bfloat16, the float8 types, float4e2m1, float32, float64, int2..int64, uint2..uint64, bool";
    e.create = [](const KernelInit& init) {
      const bool saturate = init.node.attrs.get_int("saturate", 1) != 0;
      return make_kernel([saturate](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        cast_tensor(*in[0], out[0], saturate);
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "BitCast";
    e.dtypes = "all of one width";
    e.create = [](const KernelInit&) {
      return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (in[0]->nbytes() != out[0].nbytes())
          throw Error(ErrorKind::kInternal, "BitCast between types of different widths");
        if (in[0]->nbytes()) std::memcpy(out[0].raw(), in[0]->raw(), in[0]->nbytes());
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Clip";
    e.check = [](const KernelInit& init) -> std::string {
      if (init.dtype(0) != DType::kBool && dispatch_storage(init.dtype(0), [](auto) {})) return "";
      return "input type " + to_string(init.dtype(0)) + " is not supported (supported: float32, float64, integers)";
    };
    e.dtypes = "float32, float64, int8..int64, uint8..uint64";
    e.create = [](const KernelInit& init) {
      RunFn fn;
      dispatch_storage(init.dtype(0), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, bool>)
          fn = [](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) { clip_loop<T>(in, out[0]); };
      });
      return make_kernel(std::move(fn));
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Dropout";
    e.dtypes = "all";
    e.create = [](const KernelInit&) {
      return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (in.size() > 2 && in[2] && in[2]->numel() == 1 && in[2]->value_as_int(0) != 0)
          throw Error(ErrorKind::kUnsupported, "training_mode is true; kiln runs inference only");
        if (in[0]->nbytes()) std::memcpy(out[0].raw(), in[0]->raw(), in[0]->nbytes());
        if (out.size() > 1 && out[1].defined() && out[1].nbytes()) std::memset(out[1].raw(), 1, out[1].nbytes());
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
