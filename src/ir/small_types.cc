#include "ir/small_types.h"

#include <array>
#include <cmath>
#include <limits>

namespace kiln {

namespace {

SmallFloatFormat format_of(DType dtype) {
  using S = SmallFloatSpecials;
  switch (dtype) {
    case DType::kFloat8E4M3FN: return {4, 3, 7, S::kFN};
    case DType::kFloat8E4M3FNUZ: return {4, 3, 8, S::kFNUZ};
    case DType::kFloat8E5M2: return {5, 2, 15, S::kIEEE};
    case DType::kFloat8E5M2FNUZ: return {5, 2, 16, S::kFNUZ};
    case DType::kFloat4E2M1: return {2, 1, 1, S::kNone};
    default: throw Error(ErrorKind::kInternal, to_string(dtype) + " is not a small float");
  }
}

}  // namespace

SmallFloatFormat small_float_format(DType dtype) { return format_of(dtype); }

bool is_small_float(DType d) {
  return d == DType::kFloat8E4M3FN || d == DType::kFloat8E4M3FNUZ || d == DType::kFloat8E5M2 ||
         d == DType::kFloat8E5M2FNUZ || d == DType::kFloat4E2M1;
}

float small_float_to_float(DType dtype, uint8_t bits) {
  if (dtype == DType::kFloat8E4M3FN) return float8e4m3fn_to_float(bits);
  return small_float_decode(format_of(dtype), bits);
}

uint8_t float_to_small_float(DType dtype, float value, bool saturate) {
  if (dtype == DType::kFloat8E4M3FN) return float_to_float8e4m3fn(value, saturate);
  return small_float_encode(format_of(dtype), value, saturate);
}

bool is_sub_byte_integer(DType d) {
  return d == DType::kInt4 || d == DType::kUInt4 || d == DType::kInt2 || d == DType::kUInt2;
}

int packed_bits(DType d) {
  switch (d) {
    case DType::kInt4: case DType::kUInt4: case DType::kFloat4E2M1: return 4;
    case DType::kInt2: case DType::kUInt2: return 2;
    default: return 0;
  }
}

int64_t packed_bytes(DType dtype, int64_t elements) {
  const int bits = packed_bits(dtype);
  const int64_t per_byte = 8 / bits;
  return (elements + per_byte - 1) / per_byte;
}

void unpack_elements(DType dtype, const uint8_t* packed, int64_t elements, uint8_t* out) {
  const int bits = packed_bits(dtype);
  const int per_byte = 8 / bits;
  const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1);
  const bool sign_extend = dtype == DType::kInt4 || dtype == DType::kInt2;
  for (int64_t i = 0; i < elements; ++i) {
    uint8_t v = static_cast<uint8_t>((packed[i / per_byte] >> ((i % per_byte) * bits)) & mask);
    if (sign_extend && (v >> (bits - 1))) v = static_cast<uint8_t>(v | ~mask);
    out[i] = v;
  }
}

void pack_elements(DType dtype, const uint8_t* in, int64_t elements, uint8_t* packed) {
  const int bits = packed_bits(dtype);
  const int per_byte = 8 / bits;
  const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1);
  for (int64_t b = 0; b < packed_bytes(dtype, elements); ++b) packed[b] = 0;
  for (int64_t i = 0; i < elements; ++i)
    packed[i / per_byte] = static_cast<uint8_t>(packed[i / per_byte] | ((in[i] & mask) << ((i % per_byte) * bits)));
}

void sub_byte_range(DType dtype, int64_t& lo, int64_t& hi) {
  switch (dtype) {
    case DType::kInt4: lo = -8, hi = 7; return;
    case DType::kUInt4: lo = 0, hi = 15; return;
    case DType::kInt2: lo = -2, hi = 1; return;
    case DType::kUInt2: lo = 0, hi = 3; return;
    default: throw Error(ErrorKind::kInternal, to_string(dtype) + " is not a sub-byte integer");
  }
}

uint8_t wrap_to_sub_byte(DType dtype, int64_t value) {
  const int bits = packed_bits(dtype);
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  uint64_t low = static_cast<uint64_t>(value) & mask;
  if ((dtype == DType::kInt4 || dtype == DType::kInt2) && (low >> (bits - 1))) low |= ~mask;  // sign-extended
  return static_cast<uint8_t>(low);
}

}  // namespace kiln
