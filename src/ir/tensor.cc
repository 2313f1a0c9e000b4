#include "kiln/tensor.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>

#include "ir/sizes.h"
#include "ir/small_types.h"

namespace kiln {

std::string to_string(DType dtype) {
  switch (dtype) {
    case DType::kUndefined: return "undefined";
    case DType::kFloat32: return "float32";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kUInt16: return "uint16";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kString: return "string";
    case DType::kBool: return "bool";
    case DType::kFloat16: return "float16";
    case DType::kFloat64: return "float64";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat8E4M3FN: return "float8e4m3fn";
    case DType::kFloat8E4M3FNUZ: return "float8e4m3fnuz";
    case DType::kFloat8E5M2: return "float8e5m2";
    case DType::kFloat8E5M2FNUZ: return "float8e5m2fnuz";
    case DType::kUInt4: return "uint4";
    case DType::kInt4: return "int4";
    case DType::kFloat4E2M1: return "float4e2m1";
    case DType::kUInt2: return "uint2";
    case DType::kInt2: return "int2";
  }
  return "dtype(" + std::to_string(static_cast<int32_t>(dtype)) + ")";
}

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: case DType::kInt32: case DType::kUInt32: return 4;
    case DType::kUInt8: case DType::kInt8: case DType::kBool: case DType::kFloat8E4M3FN: case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2: case DType::kFloat8E5M2FNUZ:
    // Sub-byte types take a byte per element in memory (packed only in files).
    case DType::kUInt4: case DType::kInt4: case DType::kFloat4E2M1: case DType::kUInt2: case DType::kInt2: return 1;
    case DType::kUInt16: case DType::kInt16: case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kInt64: case DType::kUInt64: case DType::kFloat64: return 8;
    case DType::kString: case DType::kUndefined: return 0;
  }
  return 0;
}

bool is_known_dtype(int32_t code) {
  return element_size(static_cast<DType>(code)) > 0;
}

bool is_float(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16 ||
         d == DType::kFloat64;
}

bool is_integer(DType d) {
  switch (d) {
    case DType::kUInt8: case DType::kInt8: case DType::kUInt16: case DType::kInt16:
    case DType::kInt32: case DType::kInt64: case DType::kUInt32: case DType::kUInt64:
      return true;
    default:
      return false;
  }
}

namespace {
// The product of a shape's non-zero dimensions times `unit` bytes, or -1 when it is above
// kMaxTensorBytes (checked before each multiplication, so nothing overflows).
int64_t extent_bytes(const std::vector<int64_t>& shape, int64_t unit) {
  int64_t extent = unit;
  for (int64_t d : shape) {
    if (d < 0) throw Error(ErrorKind::kInvalidArgument, "negative dimension in shape " + shape_to_string(shape));
    if (d == 0) continue;
    if (d > kMaxTensorBytes / extent) return -1;
    extent *= d;
  }
  return extent;
}

[[noreturn]] void throw_too_large(const std::vector<int64_t>& shape, DType dtype) {
  throw Error(ErrorKind::kInvalidArgument,
              "shape " + shape_to_string(shape) + (dtype == DType::kUndefined ? "" : " of " + to_string(dtype)) +
                  " is larger than kiln allows for one tensor (" + std::to_string(kMaxTensorBytes >> 30) + " GiB)");
}
}  // namespace

int64_t shape_numel(const std::vector<int64_t>& shape) {
  if (extent_bytes(shape, 1) < 0) throw_too_large(shape, DType::kUndefined);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t shape_bytes(const std::vector<int64_t>& shape, DType dtype) {
  const size_t esize = element_size(dtype);
  if (esize == 0) throw Error(ErrorKind::kUnsupported, "tensors of type " + to_string(dtype) + " are not supported");
  if (extent_bytes(shape, static_cast<int64_t>(esize)) < 0) throw_too_large(shape, dtype);
  return static_cast<size_t>(shape_numel(shape)) * esize;
}

void throw_size_overflow(const char* what) {
  throw Error(ErrorKind::kInvalidModel, std::string(what) + " overflows 64-bit arithmetic");
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", bytes, units[u]);
  return text;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += "x";
    s += std::to_string(shape[i]);
  }
  return s;
}

namespace {
constexpr size_t kAlignment = 64;

std::shared_ptr<unsigned char[]> allocate(size_t bytes, bool zero = true) {
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  auto* p = static_cast<unsigned char*>(::operator new[](rounded, std::align_val_t(kAlignment)));
  if (zero) std::memset(p, 0, rounded);
  return std::shared_ptr<unsigned char[]>(
      p, [](unsigned char* q) { ::operator delete[](q, std::align_val_t(kAlignment)); });
}
}  // namespace

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) { allocate_storage(dtype, std::move(shape), true); }

Tensor Tensor::uninitialized(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.allocate_storage(dtype, std::move(shape), false);
  return t;
}

Tensor Tensor::over_storage(DType dtype, std::vector<int64_t> shape, std::shared_ptr<unsigned char[]> storage) {
  Tensor t;
  shape_bytes(shape, dtype);  // throws for a dtype kiln cannot store or a shape too large
  t.dtype_ = dtype;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.storage_ = std::move(storage);
  return t;
}

void Tensor::allocate_storage(DType dtype, std::vector<int64_t> shape, bool zero) {
  const size_t bytes = shape_bytes(shape, dtype);
  const int64_t numel = shape_numel(shape);
  storage_ = allocate(bytes, zero);
  dtype_ = dtype;
  shape_ = std::move(shape);
  numel_ = numel;
}

void Tensor::check_type(DType expected) const {
  if (dtype_ != expected)
    throw Error(ErrorKind::kInvalidArgument,
                "tensor holds " + to_string(dtype_) + ", accessed as " + to_string(expected));
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
  if (shape_numel(shape) != numel_)
    throw Error(ErrorKind::kInvalidArgument,
                "cannot reshape " + shape_to_string(shape_) + " to " + shape_to_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::bitcast(DType dtype) const {
  if (element_size(dtype) != element_size(dtype_) || element_size(dtype) == 0)
    throw Error(ErrorKind::kInvalidArgument, "cannot view " + to_string(dtype_) + " as " + to_string(dtype));
  Tensor t = *this;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::clone() const {
  if (!defined()) return Tensor();
  Tensor t(dtype_, shape_);
  if (nbytes()) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

double Tensor::value_as_double(int64_t i) const {
  if (i < 0 || i >= numel_) throw Error(ErrorKind::kInvalidArgument, "element index out of range");
  const void* p = raw();
  switch (dtype_) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat64: return static_cast<const double*>(p)[i];
    case DType::kFloat16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kBFloat16: return bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kFloat8E4M3FN: return float8e4m3fn_to_float(static_cast<const uint8_t*>(p)[i]);
    case DType::kFloat8E4M3FNUZ: case DType::kFloat8E5M2: case DType::kFloat8E5M2FNUZ: case DType::kFloat4E2M1:
      return small_float_to_float(dtype_, static_cast<const uint8_t*>(p)[i]);
    case DType::kInt8: case DType::kInt4: case DType::kInt2: return static_cast<const int8_t*>(p)[i];
    case DType::kUInt4: case DType::kUInt2: return static_cast<const uint8_t*>(p)[i];
    case DType::kUInt8: return static_cast<const uint8_t*>(p)[i];
    case DType::kInt16: return static_cast<const int16_t*>(p)[i];
    case DType::kUInt16: return static_cast<const uint16_t*>(p)[i];
    case DType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DType::kUInt32: return static_cast<const uint32_t*>(p)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kUInt64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DType::kBool: return static_cast<const uint8_t*>(p)[i] ? 1.0 : 0.0;
    default: break;
  }
  throw Error(ErrorKind::kUnsupported, "value_as_double on " + to_string(dtype_));
}

int64_t Tensor::value_as_int(int64_t i) const {
  if (i < 0 || i >= numel_) throw Error(ErrorKind::kInvalidArgument, "element index out of range");
  const void* p = raw();
  switch (dtype_) {
    case DType::kInt8: case DType::kInt4: case DType::kInt2: return static_cast<const int8_t*>(p)[i];
    case DType::kUInt8: case DType::kUInt4: case DType::kUInt2: return static_cast<const uint8_t*>(p)[i];
    case DType::kInt16: return static_cast<const int16_t*>(p)[i];
    case DType::kUInt16: return static_cast<const uint16_t*>(p)[i];
    case DType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DType::kUInt32: return static_cast<const uint32_t*>(p)[i];
    case DType::kInt64: return static_cast<const int64_t*>(p)[i];
    case DType::kUInt64: return static_cast<int64_t>(static_cast<const uint64_t*>(p)[i]);
    case DType::kBool: return static_cast<const uint8_t*>(p)[i] ? 1 : 0;
    default: {
      double v = value_as_double(i);
      if (!std::isfinite(v)) throw Error(ErrorKind::kInvalidArgument, "non-finite value where an integer is needed");
      return static_cast<int64_t>(v);
    }
  }
}

std::vector<int64_t> Tensor::to_int_vector() const {
  std::vector<int64_t> out(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) out[static_cast<size_t>(i)] = value_as_int(i);
  return out;
}

Tensor Tensor::to_float32() const {
  if (dtype_ == DType::kFloat32) return *this;
  Tensor t(DType::kFloat32, shape_);
  float* out = t.data<float>();
  for (int64_t i = 0; i < numel_; ++i) out[i] = static_cast<float>(value_as_double(i));
  return t;
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) { mant <<= 1; --exp; }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx >= 0x7f800000) return static_cast<uint16_t>(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));
  if (absx >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (absx < 0x38800000) {  // subnormal or zero in half
    if (absx < 0x33000000) return static_cast<uint16_t>(sign);
    uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e;  // 113 - e + 13
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half_m & 1))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t e = (absx >> 23) - 127 + 15;
  uint32_t m = absx & 0x7fffff;
  uint32_t h = (e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // round to nearest even
  return static_cast<uint16_t>(sign | h);
}

float bfloat16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  uint32_t rounding = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float float8e4m3fn_to_float(uint8_t b) {
  const float sign = (b & 0x80) ? -1.f : 1.f;
  const int e = (b >> 3) & 0xf, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);  // subnormal: m / 8 * 2^-6
  return sign * std::ldexp(static_cast<float>(8 + m), e - 10);       // (1 + m / 8) * 2^(e - 7)
}

uint8_t float_to_float8e4m3fn(float f, bool saturate) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80);
  const uint32_t absx = x & 0x7fffffff;
  const uint8_t overflow = saturate ? static_cast<uint8_t>(sign | 0x7e) : static_cast<uint8_t>(sign | 0x7f);
  if (absx > 0x7f800000) return static_cast<uint8_t>(sign | 0x7f);  // NaN
  if (absx == 0x7f800000) return overflow;
  const int e = static_cast<int>(absx >> 23) - 127;
  if (e > 8) return overflow;
  const uint32_t mant = (absx & 0x7fffff) | (absx >= 0x800000 ? 0x800000u : 0u);  // float32 subnormals: ~0
  auto round_shift = [](uint32_t v, int shift) {  // v >> shift, rounded to nearest, ties to even
    if (shift >= 32) return 0u;
    const uint32_t q = v >> shift, rem = v & ((1u << shift) - 1), mid = 1u << (shift - 1);
    return q + ((rem > mid || (rem == mid && (q & 1))) ? 1u : 0u);
  };
  uint32_t h;
  if (e < -6) {
    // Subnormal (or zero): |f| * 2^9 rounded, in units of the smallest subnormal 2^-9; a carry
    // into 8 is the smallest normal's encoding.
    h = absx < 0x800000 ? 0u : round_shift(mant, 14 - e);
  } else {
    // Normal: exponent e + 7, the top 3 mantissa bits rounded (a carry moves into the exponent).
    h = (static_cast<uint32_t>(e + 7) << 3) + round_shift(mant & 0x7fffff, 20);
  }
  if (h > 0x7e) return overflow;  // 0x7f is NaN; larger exponents do not exist
  return static_cast<uint8_t>(sign | h);
}

}  // namespace kiln
