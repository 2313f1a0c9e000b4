#include "ir/small_types.h"

#include <array>
#include <cmath>
#include <limits>

namespace kiln {

namespace {

// How a small float spends its bit patterns on NaN and infinity.
enum class Specials { kFN, kFNUZ, kIEEE, kNone };

struct FloatFormat {
  int exponent_bits = 0, mantissa_bits = 0, bias = 0;
  Specials specials = Specials::kNone;
  int magnitude_bits() const { return exponent_bits + mantissa_bits; }
  uint8_t sign_bit() const { return static_cast<uint8_t>(1u << magnitude_bits()); }
  // The largest finite magnitude's code (without the sign).
  uint8_t max_code() const {
    const uint8_t all = static_cast<uint8_t>((1u << magnitude_bits()) - 1);
    switch (specials) {
      case Specials::kFN: return static_cast<uint8_t>(all - 1);                  // all ones is NaN
      case Specials::kIEEE: return static_cast<uint8_t>(all - (1u << mantissa_bits));  // top exponent: inf, NaN
      default: return all;
    }
  }
};

FloatFormat format_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3FN: return {4, 3, 7, Specials::kFN};
    case DType::kFloat8E4M3FNUZ: return {4, 3, 8, Specials::kFNUZ};
    case DType::kFloat8E5M2: return {5, 2, 15, Specials::kIEEE};
    case DType::kFloat8E5M2FNUZ: return {5, 2, 16, Specials::kFNUZ};
    case DType::kFloat4E2M1: return {2, 1, 1, Specials::kNone};
    default: throw Error(ErrorKind::kInternal, to_string(dtype) + " is not a small float");
  }
}

// The magnitude of a code without its sign (finite codes only).
double magnitude(const FloatFormat& f, uint32_t code) {
  const uint32_t e = code >> f.mantissa_bits, m = code & ((1u << f.mantissa_bits) - 1);
  if (e == 0) return std::ldexp(static_cast<double>(m), 1 - f.bias - f.mantissa_bits);
  return std::ldexp(static_cast<double>((1u << f.mantissa_bits) + m), static_cast<int>(e) - f.bias - f.mantissa_bits);
}

// The code of the magnitude nearest `a` (0 <= a, finite), ties to the even code; `overflow`
// when `a` rounds past the largest finite value.
uint8_t round_magnitude(const FloatFormat& f, double a, bool& overflow) {
  overflow = false;
  const uint32_t top = f.max_code();
  const double max = magnitude(f, top), step = max - magnitude(f, top - 1);
  if (a >= max) {
    const double half_past = max + step / 2;
    overflow = a > half_past || (a == half_past && (top & 1));
    return static_cast<uint8_t>(top);
  }
  // Codes of one sign are ordered like their magnitudes: find the last one not above a.
  uint32_t lo = 0, hi = top;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (magnitude(f, mid) <= a ? lo : hi) = mid;
  }
  if (magnitude(f, hi) <= a) lo = hi;
  if (lo == top) return static_cast<uint8_t>(top);
  const double below = magnitude(f, lo), above = magnitude(f, lo + 1);
  if (a - below < above - a) return static_cast<uint8_t>(lo);
  if (a - below > above - a) return static_cast<uint8_t>(lo + 1);
  return static_cast<uint8_t>((lo & 1) ? lo + 1 : lo);
}

}  // namespace

bool is_small_float(DType d) {
  return d == DType::kFloat8E4M3FN || d == DType::kFloat8E4M3FNUZ || d == DType::kFloat8E5M2 ||
         d == DType::kFloat8E5M2FNUZ || d == DType::kFloat4E2M1;
}

float small_float_to_float(DType dtype, uint8_t bits) {
  if (dtype == DType::kFloat8E4M3FN) return float8e4m3fn_to_float(bits);
  const FloatFormat f = format_of(dtype);
  const uint32_t code = bits & (f.sign_bit() - 1u);
  const bool negative = (bits & f.sign_bit()) != 0;
  const uint32_t e = code >> f.mantissa_bits, top_exponent = (1u << f.exponent_bits) - 1;
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  if (f.specials == Specials::kFNUZ && negative && code == 0) return nan;
  if (f.specials == Specials::kIEEE && e == top_exponent) {
    if (code & ((1u << f.mantissa_bits) - 1)) return nan;
    return negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  }
  const float m = static_cast<float>(magnitude(f, code));
  return negative ? -m : m;
}

uint8_t float_to_small_float(DType dtype, float value, bool saturate) {
  if (dtype == DType::kFloat8E4M3FN) return float_to_float8e4m3fn(value, saturate);
  const FloatFormat f = format_of(dtype);
  const uint8_t sign = std::signbit(value) ? f.sign_bit() : 0;
  const uint8_t all = static_cast<uint8_t>(f.sign_bit() - 1u);
  if (std::isnan(value)) {
    switch (f.specials) {
      case Specials::kFNUZ: return 0x80;
      case Specials::kIEEE:  // a quiet NaN: infinity's code with the top mantissa bit
        return static_cast<uint8_t>(sign | (all - ((1u << f.mantissa_bits) - 1u)) | (1u << (f.mantissa_bits - 1)));
      case Specials::kFN: return static_cast<uint8_t>(sign | all);
      case Specials::kNone: return f.sign_bit();  // float4e2m1 has no NaN: -0, as ml_dtypes converts it
    }
  }
  bool overflow = false;
  uint8_t code = std::isinf(value) ? f.max_code() : round_magnitude(f, std::fabs(static_cast<double>(value)), overflow);
  overflow = overflow || std::isinf(value);
  if (overflow && !saturate && f.specials != Specials::kNone) {
    switch (f.specials) {
      case Specials::kIEEE: return static_cast<uint8_t>(sign | (all - ((1u << f.mantissa_bits) - 1u)));  // infinity
      case Specials::kFNUZ: return 0x80;
      default: return static_cast<uint8_t>(sign | all);  // NaN
    }
  }
  if (code == 0 && f.specials == Specials::kFNUZ) return 0;  // no negative zero
  return static_cast<uint8_t>(sign | code);
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
