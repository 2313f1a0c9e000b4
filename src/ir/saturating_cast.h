// A real value as an integer type without undefined behaviour: truncated toward zero, NaN as 0,
// a value outside the type's range as the nearest bound. C++ leaves such conversions undefined
// and ONNX leaves them unspecified; Cast and the integer reductions (ReduceL2, ReduceLogSum)
// of the CPU engine, and Resize's fill of integer tensors on both engines, convert through this.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

namespace kiln::ir {

template <class D>
D saturating_integer(double v) {
  static_assert(std::is_integral_v<D>);
  if (std::isnan(v)) return D(0);
  if (v <= static_cast<double>(std::numeric_limits<D>::lowest())) return std::numeric_limits<D>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
  return static_cast<D>(v);
}

}  // namespace kiln::ir
