// Integer arithmetic that wraps around (two's complement), as NumPy and ONNX Runtime compute
// integer Add, Sub, Mul, Neg, Abs, CumSum and the reductions. Signed overflow is undefined
// behaviour in C++, and so is overflow after promotion (uint16 * uint16 is computed as int,
// where 65535 * 65535 overflows): these compute in the unsigned type of T's width, or of
// int's when T is narrower. Floating-point types compute as they are.
#pragma once

#include <type_traits>

namespace kiln::cpu {

template <class T>
using WrapUnsigned = std::make_unsigned_t<std::common_type_t<T, int>>;

template <class T>
T wrapping_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<WrapUnsigned<T>>(a) + static_cast<WrapUnsigned<T>>(b));
  else return a + b;
}

template <class T>
T wrapping_sub(T a, T b) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<WrapUnsigned<T>>(a) - static_cast<WrapUnsigned<T>>(b));
  else return a - b;
}

template <class T>
T wrapping_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<WrapUnsigned<T>>(a) * static_cast<WrapUnsigned<T>>(b));
  else return a * b;
}

// -lowest wraps to lowest.
template <class T>
T wrapping_neg(T a) {
  return wrapping_sub(T(0), a);
}

}  // namespace kiln::cpu
