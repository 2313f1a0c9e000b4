// The arithmetic of the small floats (float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz,
// float4e2m1), defined once for the CPU engine (ir/small_types.cc) and the CUDA casts: how a
// format spends its bits, an element's value, and a float rounded to the nearest element.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#include "ir/host_device.h"

namespace kiln {

// How a small float spends its bit patterns on NaN and infinity.
enum class SmallFloatSpecials : uint8_t { kFN, kFNUZ, kIEEE, kNone };

struct SmallFloatFormat {
  int exponent_bits = 0, mantissa_bits = 0, bias = 0;
  SmallFloatSpecials specials = SmallFloatSpecials::kNone;

  KILN_HOST_DEVICE int magnitude_bits() const { return exponent_bits + mantissa_bits; }
  KILN_HOST_DEVICE uint8_t sign_bit() const { return static_cast<uint8_t>(1u << magnitude_bits()); }
  // Every magnitude bit set (without the sign).
  KILN_HOST_DEVICE uint8_t all_ones() const { return static_cast<uint8_t>(sign_bit() - 1u); }
  // The largest finite magnitude's code (without the sign).
  KILN_HOST_DEVICE uint8_t max_code() const {
    switch (specials) {
      case SmallFloatSpecials::kFN: return static_cast<uint8_t>(all_ones() - 1);  // all ones is NaN
      case SmallFloatSpecials::kIEEE:  // the top exponent holds infinity and NaN
        return static_cast<uint8_t>(all_ones() - (1u << mantissa_bits));
      default: return all_ones();
    }
  }
};

KILN_HOST_DEVICE uint32_t small_float_bits_of(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

// The magnitude of a code without its sign (finite codes only).
KILN_HOST_DEVICE double small_float_magnitude(const SmallFloatFormat& f, uint32_t code) {
  const uint32_t e = code >> f.mantissa_bits, m = code & ((1u << f.mantissa_bits) - 1);
  if (e == 0) return ::ldexp(static_cast<double>(m), 1 - f.bias - f.mantissa_bits);
  return ::ldexp(static_cast<double>((1u << f.mantissa_bits) + m), static_cast<int>(e) - f.bias - f.mantissa_bits);
}

// The code of the magnitude nearest `a` (0 <= a, finite), ties to the even code; `overflow`
// when `a` rounds past the largest finite value.
KILN_HOST_DEVICE uint8_t small_float_round_magnitude(const SmallFloatFormat& f, double a, bool& overflow) {
  overflow = false;
  const uint32_t top = f.max_code();
  const double max = small_float_magnitude(f, top), step = max - small_float_magnitude(f, top - 1);
  if (a >= max) {
    const double half_past = max + step / 2;
    overflow = a > half_past || (a == half_past && (top & 1));
    return static_cast<uint8_t>(top);
  }
  // Codes of one sign are ordered like their magnitudes: find the last one not above a.
  uint32_t lo = 0, hi = top;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (small_float_magnitude(f, mid) <= a) lo = mid;
    else hi = mid;
  }
  if (small_float_magnitude(f, hi) <= a) lo = hi;
  if (lo == top) return static_cast<uint8_t>(top);
  const double below = small_float_magnitude(f, lo), above = small_float_magnitude(f, lo + 1);
  if (a - below < above - a) return static_cast<uint8_t>(lo);
  if (a - below > above - a) return static_cast<uint8_t>(lo + 1);
  return static_cast<uint8_t>((lo & 1) ? lo + 1 : lo);
}

// The value of an element's bits (NaN and infinities where the format has them).
KILN_HOST_DEVICE float small_float_decode(const SmallFloatFormat& f, uint8_t bits) {
  const uint32_t code = bits & f.all_ones();
  const bool negative = (bits & f.sign_bit()) != 0;
  const uint32_t e = code >> f.mantissa_bits, top_exponent = (1u << f.exponent_bits) - 1;
  if ((f.specials == SmallFloatSpecials::kFNUZ && negative && code == 0) ||
      (f.specials == SmallFloatSpecials::kFN && code == f.all_ones()))
    return NAN;
  if (f.specials == SmallFloatSpecials::kIEEE && e == top_exponent) {
    if (code & ((1u << f.mantissa_bits) - 1)) return NAN;
    return negative ? -INFINITY : INFINITY;
  }
  const float m = static_cast<float>(small_float_magnitude(f, code));
  return negative ? -m : m;
}

// `value` rounded to the nearest element, ties to even. Out of range: the largest finite value of
// the sign with `saturate` (float4e2m1 always saturates), else infinity (IEEE formats) or NaN.
// NaN stays NaN (float4e2m1, which has none: -0, as ml_dtypes converts it). The FNUZ formats
// have no negative zero.
KILN_HOST_DEVICE uint8_t small_float_encode(const SmallFloatFormat& f, float value, bool saturate) {
  const uint32_t bits = small_float_bits_of(value);
  const uint8_t sign = (bits >> 31) ? f.sign_bit() : 0;
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) {  // NaN
    switch (f.specials) {
      case SmallFloatSpecials::kFNUZ: return 0x80;
      case SmallFloatSpecials::kIEEE:  // a quiet NaN: infinity's code with the top mantissa bit
        return static_cast<uint8_t>(sign | (f.all_ones() - ((1u << f.mantissa_bits) - 1u)) | (1u << (f.mantissa_bits - 1)));
      case SmallFloatSpecials::kFN: return static_cast<uint8_t>(sign | f.all_ones());
      case SmallFloatSpecials::kNone: return f.sign_bit();
    }
  }
  const bool infinite = abs_bits == 0x7f800000u;
  bool overflow = false;
  uint8_t code = infinite ? f.max_code() : small_float_round_magnitude(f, ::fabs(static_cast<double>(value)), overflow);
  overflow = overflow || infinite;
  if (overflow && !saturate && f.specials != SmallFloatSpecials::kNone) {
    switch (f.specials) {
      case SmallFloatSpecials::kIEEE:  // infinity
        return static_cast<uint8_t>(sign | (f.all_ones() - ((1u << f.mantissa_bits) - 1u)));
      case SmallFloatSpecials::kFNUZ: return 0x80;
      default: return static_cast<uint8_t>(sign | f.all_ones());  // NaN
    }
  }
  if (code == 0 && f.specials == SmallFloatSpecials::kFNUZ) return 0;  // no negative zero
  return static_cast<uint8_t>(sign | code);
}

}  // namespace kiln
