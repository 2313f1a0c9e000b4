// kiln::Tensor: a dense host tensor with a data type and a concrete shape.
//
// Copies share the same storage (like a shared_ptr); use clone() for a deep copy.
// Storage is 64-byte aligned so kernels may use aligned vector loads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln {

// The numeric codes are ONNX's TensorProto.DataType codes, so conversion is a cast.
enum class DType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kBFloat16 = 16,
  kFloat8E4M3FN = 17,  // 8-bit float: 4 exponent bits (bias 7), 3 mantissa bits, no infinity,
                       // largest finite 448, NaN 0x7f/0xff (ONNX's FLOAT8E4M3FN, CUDA's E4M3)
  kFloat8E4M3FNUZ = 18,  // bias 8, no infinity, no negative zero, NaN 0x80, largest 240
  kFloat8E5M2 = 19,      // 5 exponent bits (bias 15), 2 mantissa bits, IEEE infinities and NaNs
  kFloat8E5M2FNUZ = 20,  // bias 16, no infinity, no negative zero, NaN 0x80, largest 57344
  // Types narrower than a byte. ONNX files pack them (two or four to a byte, the first element
  // in the lowest bits); a kiln Tensor holds one per byte: int4 and int2 as int8 values, uint4
  // and uint2 as uint8 values, float4e2m1 as its 4-bit pattern.
  kUInt4 = 21,
  kInt4 = 22,
  kFloat4E2M1 = 23,  // 2 exponent bits (bias 1), 1 mantissa bit: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}
  kUInt2 = 25,
  kInt2 = 26,
};

// "float32", "int64", ...; "dtype(N)" for a code kiln does not know.
std::string to_string(DType dtype);
// Bytes per element; 0 for types kiln cannot store (string, undefined, unknown codes).
size_t element_size(DType dtype);
bool is_known_dtype(int32_t onnx_code);
bool is_float(DType dtype);    // float16, bfloat16, float32, float64
bool is_integer(DType dtype);  // signed and unsigned integers (not bool)

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <> constexpr DType dtype_of<double>() { return DType::kFloat64; }
template <> constexpr DType dtype_of<int8_t>() { return DType::kInt8; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kUInt8; }
template <> constexpr DType dtype_of<int16_t>() { return DType::kInt16; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::kUInt16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kInt32; }
template <> constexpr DType dtype_of<uint32_t>() { return DType::kUInt32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kInt64; }
template <> constexpr DType dtype_of<uint64_t>() { return DType::kUInt64; }
template <> constexpr DType dtype_of<bool>() { return DType::kBool; }

// The largest tensor kiln holds. A file or a shape computation that asks for more is corrupt
// or hostile. Every shape kiln accepts (from a model or engine file, from shape inference, from
// a caller) is checked against it, so products and strides of a shape's dimensions fit in int64.
constexpr int64_t kMaxTensorBytes = int64_t{64} << 30;  // 64 GiB

// Number of elements of a shape. Throws kInvalidArgument on a negative dimension, or when the
// product of the non-zero dimensions is above kMaxTensorBytes: a shape with a 0 has no
// elements, but its other dimensions still multiply in strides and loop bounds.
int64_t shape_numel(const std::vector<int64_t>& shape);
// Bytes of a tensor of `shape` and `dtype`: shape_numel times element_size, at most
// kMaxTensorBytes (else kInvalidArgument).
size_t shape_bytes(const std::vector<int64_t>& shape, DType dtype);
// "1x3x224x224" ("scalar" for rank 0).
std::string shape_to_string(const std::vector<int64_t>& shape);

class Tensor {
 public:
  Tensor() = default;
  // A zero-filled tensor.
  Tensor(DType dtype, std::vector<int64_t> shape);
  // A tensor whose contents are unspecified, for outputs a kernel writes in full.
  static Tensor uninitialized(DType dtype, std::vector<int64_t> shape);
  // For allocators that recycle memory: a tensor over `storage` (64-byte aligned, at least
  // nbytes() long), and the storage behind a tensor.
  static Tensor over_storage(DType dtype, std::vector<int64_t> shape, std::shared_ptr<unsigned char[]> storage);
  const std::shared_ptr<unsigned char[]>& storage() const { return storage_; }

  template <class T>
  static Tensor from_vector(std::vector<int64_t> shape, const std::vector<T>& values) {
    Tensor t(dtype_of<T>(), std::move(shape));
    if (static_cast<int64_t>(values.size()) != t.numel())
      throw Error(ErrorKind::kInvalidArgument, "from_vector: value count does not match the shape");
    T* out = t.data<T>();
    for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
    return t;
  }
  template <class T>
  static Tensor scalar(T value) { return from_vector<T>({}, {value}); }

  bool defined() const { return dtype_ != DType::kUndefined; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i)); }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * element_size(dtype_); }

  void* raw() { return storage_ ? storage_.get() : nullptr; }
  const void* raw() const { return storage_ ? storage_.get() : nullptr; }

  // Typed access; throws kInvalidArgument if T does not match dtype().
  template <class T> T* data() { check_type(dtype_of<T>()); return static_cast<T*>(raw()); }
  template <class T> const T* data() const {
    check_type(dtype_of<T>());
    return static_cast<const T*>(raw());
  }

  // The same storage seen with another shape of equal element count.
  Tensor reshaped(std::vector<int64_t> shape) const;
  // The same storage seen as another dtype of the same element size (bool as uint8, ...).
  Tensor bitcast(DType dtype) const;
  Tensor clone() const;
  // Element i converted to double / int64 (any numeric dtype); for small tensors and tests.
  double value_as_double(int64_t i) const;
  int64_t value_as_int(int64_t i) const;
  // All elements as int64 (any integer dtype); for shape tensors.
  std::vector<int64_t> to_int_vector() const;
  // A float32 copy of any numeric tensor.
  Tensor to_float32() const;

 private:
  void check_type(DType expected) const;
  void allocate_storage(DType dtype, std::vector<int64_t> shape, bool zero);

  DType dtype_ = DType::kUndefined;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::shared_ptr<unsigned char[]> storage_;
};

// IEEE half and bfloat16 conversion, used by Cast and by importers.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);
// FLOAT8E4M3FN conversion: rounding to nearest, ties to even. Out of range (infinities too):
// +-448 with `saturate` (ONNX's default for Cast and QuantizeLinear, and what the GPU's
// conversion with saturation gives), NaN without. NaN stays NaN.
float float8e4m3fn_to_float(uint8_t b);
uint8_t float_to_float8e4m3fn(float f, bool saturate = true);

}  // namespace kiln
