// The 8-bit floats besides float8e4m3fn (whose conversions are public, kiln/tensor.h), float4
// E2M1, and the integers narrower than a byte (int4, uint4, int2, uint2): their values, their
// conversion from float, and the packing ONNX files use for the sub-byte types.
#pragma once

#include <cstdint>

#include "ir/small_float.h"
#include "kiln/tensor.h"

namespace kiln {

// float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz, float4e2m1.
bool is_small_float(DType dtype);
// The bit layout of one of them (ir/small_float.h); throws kInternal for any other dtype.
SmallFloatFormat small_float_format(DType dtype);
// The value of an element's bits (NaN and infinities where the type has them).
float small_float_to_float(DType dtype, uint8_t bits);
// `f` rounded to the nearest value, ties to even. Out of range: the largest finite value of the
// sign with `saturate` (float4e2m1 always saturates), else infinity (float8e5m2) or NaN.
// NaN stays NaN (float4e2m1, which has none: 0x8). The FNUZ types have no negative zero.
uint8_t float_to_small_float(DType dtype, float f, bool saturate);

// int4, uint4, int2, uint2: a Tensor holds one per byte.
bool is_sub_byte_integer(DType dtype);
// Bits per element in a file: 4 (int4, uint4, float4e2m1), 2 (int2, uint2), else 0.
int packed_bits(DType dtype);
// Bytes that `elements` packed elements take in a file.
int64_t packed_bytes(DType dtype, int64_t elements);
// Packed bytes -> one element per byte (int4 and int2 sign-extended), and back.
void unpack_elements(DType dtype, const uint8_t* packed, int64_t elements, uint8_t* out);
void pack_elements(DType dtype, const uint8_t* elements_in, int64_t elements, uint8_t* packed);
// The range of a sub-byte integer type.
void sub_byte_range(DType dtype, int64_t& lo, int64_t& hi);
// An integer value wrapped into a sub-byte type (its low bits, as numpy's and ml_dtypes'
// conversions do), as the byte a Tensor stores.
uint8_t wrap_to_sub_byte(DType dtype, int64_t value);

}  // namespace kiln
