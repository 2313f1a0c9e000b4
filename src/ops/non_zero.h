// NonZero's test, shared by the schema, which counts the nonzero elements to size the output
// [rank, count], and the CPU kernel, which writes their coordinates: a value is nonzero unless it
// equals zero (-0.0 is zero, NaN is not). The common dtypes are tested in their own type over the
// raw elements; a test through value_as_double cost about 6 ns an element, which on a detection
// model's score maps (millions of elements a level) was most of its box selection on the CPU.
#pragma once

#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::ir {

namespace non_zero_detail {

// Elements read through value_as_double: the float8 and float4 kinds.
struct ByValue {
  const Tensor* t;
  double operator[](int64_t i) const { return t->value_as_double(i); }
};

// Calls test(elements, is_nonzero): elements[i] for i below t.numel(), in the type it is tested in.
template <class Test>
auto with_elements(const Tensor& t, Test test) {
  const void* p = t.raw();
  switch (t.dtype()) {
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kUInt4:  // (one value a byte: zero is a zero byte)
    case DType::kInt4:
    case DType::kUInt2:
    case DType::kInt2:
      return test(static_cast<const uint8_t*>(p), [](uint8_t v) { return v != 0; });
    case DType::kUInt16:
    case DType::kInt16:
      return test(static_cast<const uint16_t*>(p), [](uint16_t v) { return v != 0; });
    case DType::kFloat16:
    case DType::kBFloat16:  // every bit but the sign: -0.0 is zero; NaN and infinity are not
      return test(static_cast<const uint16_t*>(p), [](uint16_t v) { return (v & 0x7fff) != 0; });
    case DType::kUInt32:
    case DType::kInt32:
      return test(static_cast<const uint32_t*>(p), [](uint32_t v) { return v != 0; });
    case DType::kUInt64:
    case DType::kInt64:
      return test(static_cast<const uint64_t*>(p), [](uint64_t v) { return v != 0; });
    case DType::kFloat32:
      return test(static_cast<const float*>(p), [](float v) { return v != 0.0f; });
    case DType::kFloat64:
      return test(static_cast<const double*>(p), [](double v) { return v != 0.0; });
    default:
      return test(ByValue{&t}, [](double v) { return v != 0.0; });
  }
}

}  // namespace non_zero_detail

// The number of nonzero elements of `t`.
inline int64_t count_nonzero(const Tensor& t) {
  const int64_t n = t.numel();
  return non_zero_detail::with_elements(t, [n](const auto& elements, auto is_nonzero) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) count += is_nonzero(elements[i]) ? 1 : 0;
    return count;
  });
}

// Calls visit(i) with the flat index of each nonzero element of `t`, in order, until it returns false.
template <class Visit>
void for_each_nonzero(const Tensor& t, Visit visit) {
  const int64_t n = t.numel();
  non_zero_detail::with_elements(t, [n, &visit](const auto& elements, auto is_nonzero) {
    for (int64_t i = 0; i < n; ++i)
      if (is_nonzero(elements[i]) && !visit(i)) return;
  });
}

}  // namespace kiln::ir
