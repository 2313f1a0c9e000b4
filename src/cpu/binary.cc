// CPU kernels of broadcasting elementwise ops: binary arithmetic, comparisons, logic,
// BitShift, the bitwise ops (and BitwiseNot), PRelu, variadic Max/Min/Sum/Mean and Where.
//
// Arithmetic and comparisons: float32, float64, int32, int64 (Equal also bool); logic: bool;
// BitShift and the bitwise ops: integers. Integer Div truncates toward zero, as ONNX Runtime does.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu/broadcast.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "cpu/wrapping.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kParallelElements = 1 << 16;

// Calls fn(T{}) for the C++ type of `dtype`, or returns false when it is not in the list.
template <class Fn>
bool dispatch_numeric(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(float{}); return true;
    case DType::kFloat64: fn(double{}); return true;
    case DType::kInt32: fn(int32_t{}); return true;
    case DType::kInt64: fn(int64_t{}); return true;
    case DType::kInt8: fn(int8_t{}); return true;
    case DType::kInt16: fn(int16_t{}); return true;
    case DType::kUInt8: fn(uint8_t{}); return true;
    case DType::kUInt16: fn(uint16_t{}); return true;
    case DType::kUInt32: fn(uint32_t{}); return true;
    case DType::kUInt64: fn(uint64_t{}); return true;
    default: return false;
  }
}

// The types Pow's base may have (the exponent may be any numeric type).
template <class Fn>
bool dispatch_pow_base(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(float{}); return true;
    case DType::kFloat64: fn(double{}); return true;
    case DType::kInt32: fn(int32_t{}); return true;
    case DType::kInt64: fn(int64_t{}); return true;
    default: return false;
  }
}

template <class Fn>
bool dispatch_integer(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kInt8: fn(int8_t{}); return true;
    case DType::kInt16: fn(int16_t{}); return true;
    case DType::kInt32: fn(int32_t{}); return true;
    case DType::kInt64: fn(int64_t{}); return true;
    case DType::kUInt8: fn(uint8_t{}); return true;
    case DType::kUInt16: fn(uint16_t{}); return true;
    case DType::kUInt32: fn(uint32_t{}); return true;
    case DType::kUInt64: fn(uint64_t{}); return true;
    default: return false;
  }
}

const std::vector<DType> kIntegers = {DType::kInt8,  DType::kInt16,  DType::kInt32,  DType::kInt64,
                                      DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64};

// y[i] = f(a[i * sa], b[i * sb]) for i < n, where sa and sb are 1 (a row) or 0 (one value
// broadcast along it). The only loops each op and type instantiate: binary_loop's cases all
// come down to these four, which keeps this file's compile time (over 200 instantiations, in
// CI's three builds, two of them sanitized) in check.
template <class A, class B, class U, class F>
void binary_row(const A* a, const B* b, U* y, int64_t n, int64_t sa, int64_t sb, F f) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
  } else if (sa == 1) {
    const B bv = b[0];
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], bv);
  } else if (sb == 1) {
    const A av = a[0];
    for (int64_t i = 0; i < n; ++i) y[i] = f(av, b[i]);
  } else {
    const U v = f(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) y[i] = v;
  }
}

// y = f(a, b) with broadcasting; A, B, U are the element types of a, b and y.
template <class A, class B, class U, class F>
void binary_loop(const Tensor& ta, const Tensor& tb, Tensor& ty, F f) {
  const A* a = static_cast<const A*>(ta.raw());
  const B* b = static_cast<const B*>(tb.raw());
  U* y = static_cast<U*>(ty.raw());
  const int64_t total = ty.numel();
  if (total == 0) return;
  // The residual-add and scalar cases: one flat row, split into ranges. Only when y has the
  // inputs' shape too: the variadic ops fold two inputs into the broadcast of all of them
  // (fuzz_graph: Min of [1, 1, 1], [1, 1, 1] and [3, 3, 4] read the first two past their end).
  int64_t flat_sa = -1, flat_sb = -1;
  if (ta.shape() == tb.shape() && ta.numel() == total) flat_sa = 1, flat_sb = 1;
  else if (tb.numel() == 1 && ta.numel() == total) flat_sa = 1, flat_sb = 0;
  else if (ta.numel() == 1 && tb.numel() == total) flat_sa = 0, flat_sb = 1;
  const bool flat = flat_sa >= 0;
  BroadcastPlan plan;
  if (!flat) plan = plan_broadcast(ty.shape(), {&ta.shape(), &tb.shape()});
  const int64_t inner = flat ? total : plan.inner();
  const int64_t sa = flat ? flat_sa : plan.strides[0].back(), sb = flat ? flat_sb : plan.strides[1].back();
  parallel_for(flat ? total : plan.rows(), [&](int64_t begin, int64_t end) {
    if (flat) {
      binary_row(a + begin * sa, b + begin * sb, y + begin, end - begin, sa, sb, f);
      return;
    }
    BroadcastCursor rows(plan, begin);
    for (int64_t r = begin; r < end; ++r, rows.next()) binary_row(a + rows.offset(0), b + rows.offset(1), y + r * inner, inner, sa, sb, f);
  }, total > kParallelElements);
}

// Integer division by zero would kill the process: refuse it up front (the loop itself may
// run in parallel, where an exception cannot escape).
template <class T>
void check_no_zero_divisor(const Tensor& divisor, const char* op) {
  if constexpr (std::is_integral_v<T>) {
    const T* d = static_cast<const T*>(divisor.raw());
    for (int64_t i = 0; i < divisor.numel(); ++i)
      if (d[i] == 0)
        throw Error(ErrorKind::kInvalidArgument,
                    std::string("integer ") + op + " by zero (element " + std::to_string(i) + " of the divisor)");
  }
}

template <class T>
T divide(T a, T b) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    // a / -1 overflows for the most negative value; negate through unsigned to wrap instead.
    if (b == -1) return static_cast<T>(0 - static_cast<std::make_unsigned_t<T>>(a));
  }
  return a / b;
}

// Mod with fmod=0: the result takes the divisor's sign (Python's %); fmod=1: the dividend's (C).
template <class T>
T modulo(T a, T b, bool c_style) {
  T r;
  if constexpr (std::is_integral_v<T>) {
    if constexpr (std::is_signed_v<T>)
      if (b == -1) return 0;  // a % -1 overflows for the most negative value
    r = static_cast<T>(a % b);
  } else {
    r = std::fmod(a, b);
  }
  if constexpr (std::is_signed_v<T>)
    if (!c_style && r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
  return r;
}

template <class T>
RunFn arithmetic_kernel(const ir::Node& node) {
  const std::string op = node.op;
  if (op == "Add") return [](auto& in, auto& out) { binary_loop<T, T, T>(*in[0], *in[1], out[0], [](T a, T b) { return wrapping_add(a, b); }); };
  if (op == "Sub") return [](auto& in, auto& out) { binary_loop<T, T, T>(*in[0], *in[1], out[0], [](T a, T b) { return wrapping_sub(a, b); }); };
  if (op == "Mul") return [](auto& in, auto& out) { binary_loop<T, T, T>(*in[0], *in[1], out[0], [](T a, T b) { return wrapping_mul(a, b); }); };
  if (op == "Div")
    return [](auto& in, auto& out) {
      check_no_zero_divisor<T>(*in[1], "Div");
      binary_loop<T, T, T>(*in[0], *in[1], out[0], [](T a, T b) { return divide(a, b); });
    };
  if (op == "Mod") {
    bool c_style = node.attrs.get_int("fmod", 0) != 0;
    return [c_style](auto& in, auto& out) {
      check_no_zero_divisor<T>(*in[1], "Mod");
      binary_loop<T, T, T>(*in[0], *in[1], out[0], [c_style](T a, T b) { return modulo(a, b, c_style); });
    };
  }
  if (op == "PRelu")
    return [](auto& in, auto& out) {
      binary_loop<T, T, T>(*in[0], *in[1], out[0], [](T x, T slope) { return x < T(0) ? wrapping_mul(x, slope) : x; });
    };
  if (op == "Max" || op == "Min" || op == "Sum" || op == "Mean") {
    // Folds the inputs pairwise into the output, which has the broadcast shape of all of them.
    return [op](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      Tensor& y = out[0];
      auto fold = [&](const Tensor& acc, const Tensor& x) {
        if (op == "Max") binary_loop<T, T, T>(acc, x, y, [](T a, T b) { return a >= b || a != a ? a : b; });
        else if (op == "Min") binary_loop<T, T, T>(acc, x, y, [](T a, T b) { return a <= b || a != a ? a : b; });
        else binary_loop<T, T, T>(acc, x, y, [](T a, T b) { return wrapping_add(a, b); });
      };
      if (in.size() == 1) {
        if (y.nbytes()) std::memcpy(y.raw(), in[0]->raw(), y.nbytes());
      } else {
        fold(*in[0], *in[1]);
        for (size_t i = 2; i < in.size(); ++i) fold(y, *in[i]);  // y[i] reads only y[i]: safe in place
      }
      if (op == "Mean") {
        T* p = y.data<T>();
        const T n = static_cast<T>(in.size());
        for (int64_t i = 0; i < y.numel(); ++i) p[i] = static_cast<T>(p[i] / n);
      }
    };
  }
  return nullptr;
}

template <class T>
RunFn comparison_kernel(const std::string& op) {
  using B = uint8_t;  // bool storage
  if (op == "Equal") return [](auto& in, auto& out) { binary_loop<T, T, B>(*in[0], *in[1], out[0], [](T a, T b) { return B(a == b); }); };
  if (op == "Less") return [](auto& in, auto& out) { binary_loop<T, T, B>(*in[0], *in[1], out[0], [](T a, T b) { return B(a < b); }); };
  if (op == "LessOrEqual") return [](auto& in, auto& out) { binary_loop<T, T, B>(*in[0], *in[1], out[0], [](T a, T b) { return B(a <= b); }); };
  if (op == "Greater") return [](auto& in, auto& out) { binary_loop<T, T, B>(*in[0], *in[1], out[0], [](T a, T b) { return B(a > b); }); };
  return [](auto& in, auto& out) { binary_loop<T, T, B>(*in[0], *in[1], out[0], [](T a, T b) { return B(a >= b); }); };
}

RunFn logic_kernel(const std::string& op) {
  using B = uint8_t;
  if (op == "And") return [](auto& in, auto& out) { binary_loop<B, B, B>(*in[0], *in[1], out[0], [](B a, B b) { return B(a && b); }); };
  if (op == "Or") return [](auto& in, auto& out) { binary_loop<B, B, B>(*in[0], *in[1], out[0], [](B a, B b) { return B(a || b); }); };
  return [](auto& in, auto& out) { binary_loop<B, B, B>(*in[0], *in[1], out[0], [](B a, B b) { return B(!a != !b); }); };
}

// double -> integer without undefined behaviour: NaN gives 0, out-of-range values saturate
// (an integer base with a fractional or negative exponent can produce either).
template <class X>
X saturate_to(double v) {
  if (std::isnan(v)) return X(0);
  if (v <= static_cast<double>(std::numeric_limits<X>::lowest())) return std::numeric_limits<X>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<X>::max())) return std::numeric_limits<X>::max();
  return static_cast<X>(v);
}

// Pow: the base's type decides the result; the exponent may have another numeric type.
template <class X, class Y>
void pow_loop(const Tensor& x, const Tensor& y, Tensor& z) {
  if constexpr (std::is_floating_point_v<X>)
    binary_loop<X, Y, X>(x, y, z, [](X a, Y b) { return static_cast<X>(std::pow(a, static_cast<X>(b))); });
  else
    binary_loop<X, Y, X>(x, y, z, [](X a, Y b) { return saturate_to<X>(std::pow(static_cast<double>(a), static_cast<double>(b))); });
}

// BitShift as ONNX's reference defines it: a shift by less than 0 or by the bit width or more
// gives 0 (a right shift of a negative signed value: -1); a left shift wraps (the bits of the
// unsigned type); a right shift of a signed value is arithmetic.
template <class T>
RunFn bitshift_kernel(bool left) {
  using U = std::make_unsigned_t<T>;
  constexpr int64_t kBits = static_cast<int64_t>(sizeof(T) * 8);
  auto out_of_range = [](T s) { return static_cast<int64_t>(s) < 0 || static_cast<int64_t>(s) >= kBits; };
  if (left)
    return [out_of_range](auto& in, auto& out) {
      binary_loop<T, T, T>(*in[0], *in[1], out[0], [out_of_range](T a, T s) {
        return out_of_range(s) ? T(0) : static_cast<T>(static_cast<U>(static_cast<U>(a) << static_cast<int>(s)));
      });
    };
  return [out_of_range](auto& in, auto& out) {
    binary_loop<T, T, T>(*in[0], *in[1], out[0], [out_of_range](T a, T s) {
      if (out_of_range(s)) return a < T(0) ? static_cast<T>(-1) : T(0);
      return static_cast<T>(a >> static_cast<int>(s));
    });
  };
}

template <class T>
RunFn bitwise_kernel(const std::string& op) {
  if (op == "BitwiseAnd") return [](auto& in, auto& out) { binary_loop<T, T, T>(*in[0], *in[1], out[0], [](T a, T b) { return T(a & b); }); };
  if (op == "BitwiseOr") return [](auto& in, auto& out) { binary_loop<T, T, T>(*in[0], *in[1], out[0], [](T a, T b) { return T(a | b); }); };
  return [](auto& in, auto& out) { binary_loop<T, T, T>(*in[0], *in[1], out[0], [](T a, T b) { return T(a ^ b); }); };
}

// Where: a 3-way broadcast that only moves bytes, so one loop per element size serves all types.
template <class T>
void where_loop(const Tensor& cond, const Tensor& x, const Tensor& y, Tensor& z) {
  const uint8_t* c = static_cast<const uint8_t*>(cond.raw());
  const T* px = static_cast<const T*>(x.raw());
  const T* py = static_cast<const T*>(y.raw());
  T* pz = static_cast<T*>(z.raw());
  if (z.numel() == 0) return;
  const BroadcastPlan plan = plan_broadcast(z.shape(), {&cond.shape(), &x.shape(), &y.shape()});
  const int64_t inner = plan.inner(), rows = plan.rows();
  const int64_t sc = plan.strides[0].back(), sx = plan.strides[1].back(), sy = plan.strides[2].back();
  parallel_for(rows, [&](int64_t begin, int64_t end) {
    BroadcastCursor cursor(plan, begin);
    for (int64_t r = begin; r < end; ++r, cursor.next()) {
      const int64_t* off = cursor.offsets();
      T* out = pz + r * inner;
      for (int64_t i = 0; i < inner; ++i)
        out[i] = c[off[0] + i * sc] ? px[off[1] + i * sx] : py[off[2] + i * sy];
    }
  }, z.numel() > kParallelElements);
}

std::string check_same_numeric(const KernelInit& init, bool allow_bool) {
  DType d = init.dtype(0);
  if (dispatch_numeric(d, [](auto) {}) || (allow_bool && d == DType::kBool)) return "";
  return "input type " + to_string(d) + " is not supported (supported: float32, float64, integers" +
         (allow_bool ? std::string(", bool") : std::string()) + ")";
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(binary) {
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Mod", "PRelu", "Max", "Min", "Sum", "Mean"}) {
    KernelEntry e;
    e.op = op;
    e.check = [](const KernelInit& init) { return check_same_numeric(init, false); };
    e.dtypes = "float32, float64, int8..int64, uint8..uint64";
    e.create = [](const KernelInit& init) {
      RunFn fn;
      dispatch_numeric(init.dtype(0), [&](auto tag) { fn = arithmetic_kernel<decltype(tag)>(init.node); });
      return make_kernel(std::move(fn));
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Pow";
    e.check = [](const KernelInit& init) -> std::string {
      if (!dispatch_pow_base(init.dtype(0), [](auto) {}))
        return "base type " + to_string(init.dtype(0)) + " is not supported (supported: float32, float64, int32, int64)";
      if (!dispatch_numeric(init.dtype(1), [](auto) {}))
        return "exponent type " + to_string(init.dtype(1)) + " is not supported (supported: float32, float64, integers)";
      return "";
    };
    e.dtypes = "base float32, float64, int32, int64; exponent also other integers";
    e.create = [](const KernelInit& init) {
      RunFn fn;
      dispatch_pow_base(init.dtype(0), [&](auto xtag) {
        dispatch_numeric(init.dtype(1), [&](auto ytag) {
          fn = [](auto& in, auto& out) { pow_loop<decltype(xtag), decltype(ytag)>(*in[0], *in[1], out[0]); };
        });
      });
      return make_kernel(std::move(fn));
    };
    registry.add(std::move(e));
  }
  for (const char* op : {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}) {
    KernelEntry e;
    e.op = op;
    e.check = [](const KernelInit& init) { return check_same_numeric(init, init.node.op == "Equal"); };
    e.dtypes = std::string(op) == "Equal" ? "float32, float64, integers, bool" : "float32, float64, integers";
    e.create = [](const KernelInit& init) {
      RunFn fn;
      if (init.dtype(0) == DType::kBool) fn = comparison_kernel<uint8_t>(init.node.op);
      else dispatch_numeric(init.dtype(0), [&](auto tag) { fn = comparison_kernel<decltype(tag)>(init.node.op); });
      return make_kernel(std::move(fn));
    };
    registry.add(std::move(e));
  }
  for (const char* op : {"And", "Or", "Xor"}) {
    KernelEntry e;
    e.op = op;
    e.check = accept_dtypes({DType::kBool});
    e.dtypes = "bool";
    e.create = [](const KernelInit& init) { return make_kernel(logic_kernel(init.node.op)); };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "BitShift";
    e.check = accept_dtypes(kIntegers);
    e.dtypes = "int8..int64, uint8..uint64";
    e.create = [](const KernelInit& init) {
      bool left = init.node.attrs.get_string("direction", "") == "LEFT";
      RunFn fn;
      dispatch_integer(init.dtype(0), [&](auto tag) { fn = bitshift_kernel<decltype(tag)>(left); });
      return make_kernel(std::move(fn));
    };
    registry.add(std::move(e));
  }
  for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"}) {
    KernelEntry e;
    e.op = op;
    e.check = accept_dtypes(kIntegers);
    e.dtypes = "int8..int64, uint8..uint64";
    e.create = [](const KernelInit& init) {
      RunFn fn;
      dispatch_integer(init.dtype(0), [&](auto tag) { fn = bitwise_kernel<decltype(tag)>(init.node.op); });
      return make_kernel(std::move(fn));
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "SwiGLU";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) {
      const float alpha = init.node.attrs.get_float("alpha", 1.f);
      return make_kernel([alpha](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (in[0]->shape() != in[1]->shape()) throw Error(ErrorKind::kInvalidArgument, "SwiGLU's A and B must have one shape");
        binary_loop<float, float, float>(*in[0], *in[1], out[0],
                                         [alpha](float a, float b) { return a * (1.f / (1.f + std::exp(-alpha * a))) * b; });
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "BitwiseNot";
    e.check = accept_dtypes(kIntegers);
    e.dtypes = "int8..int64, uint8..uint64";
    e.create = [](const KernelInit& init) {
      RunFn fn;
      dispatch_integer(init.dtype(0), [&](auto tag) {
        using T = decltype(tag);
        fn = [](auto& in, auto& out) {
          const T* x = in[0]->template data<T>();
          T* y = out[0].template data<T>();
          for (int64_t i = 0; i < in[0]->numel(); ++i) y[i] = static_cast<T>(~x[i]);
        };
      });
      return make_kernel(std::move(fn));
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Where";
    e.check = [](const KernelInit& init) -> std::string {
      size_t size = element_size(init.dtype(1));
      if (size == 1 || size == 2 || size == 4 || size == 8) return "";
      return "input type " + to_string(init.dtype(1)) + " is not supported";
    };
    e.dtypes = "all numeric types, bool";
    e.create = [](const KernelInit& init) {
      size_t size = element_size(init.dtype(1));
      return make_kernel([size](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        switch (size) {
          case 1: where_loop<uint8_t>(*in[0], *in[1], *in[2], out[0]); break;
          case 2: where_loop<uint16_t>(*in[0], *in[1], *in[2], out[0]); break;
          case 4: where_loop<uint32_t>(*in[0], *in[1], *in[2], out[0]); break;
          default: where_loop<uint64_t>(*in[0], *in[1], *in[2], out[0]); break;
        }
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
