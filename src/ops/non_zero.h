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
    // Counted in 32 bits a chunk, which vectorizes (an int64 count of bytes did not: 3 GB/s).
    constexpr int64_t kChunk = int64_t{1} << 20;
    int64_t count = 0;
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t end = n - i < kChunk ? n : i + kChunk;
      uint32_t part = 0;
      for (int64_t k = i; k < end; ++k) part += is_nonzero(elements[k]) ? 1u : 0u;
      count += part;
    }
    return count;
  });
}

// Writes the flat index of each nonzero element of `t`, in order, into `out`, which has room for
// `limit` of them; returns how many it wrote (at most limit). Blocks of zeros are skipped whole, and
// where a block's indices all fit, each is written and kept only when nonzero, without a branch
// (a branch per element mispredicts on score maps whose half passes).
inline int64_t nonzero_flat_indices(const Tensor& t, int64_t* out, int64_t limit) {
  const int64_t n = t.numel();
  return non_zero_detail::with_elements(t, [n, out, limit](const auto& elements, auto is_nonzero) {
    constexpr int64_t kBlock = 64;
    int64_t i = 0, j = 0;
    for (; i + kBlock <= n && j + kBlock <= limit; i += kBlock) {
      unsigned any = 0;  // (a sum, not ||, so that the test vectorizes)
      for (int64_t k = 0; k < kBlock; ++k) any += is_nonzero(elements[i + k]) ? 1u : 0u;
      if (any == 0) continue;
      for (int64_t k = 0; k < kBlock; ++k) {
        out[j] = i + k;
        j += is_nonzero(elements[i + k]) ? 1 : 0;
      }
    }
    for (; i < n && j < limit; ++i)
      if (is_nonzero(elements[i])) out[j++] = i;
    return j;
  });
}

}  // namespace kiln::ir
