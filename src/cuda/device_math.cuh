// Device helpers shared by the CUDA kernel files: loads and stores of any storage dtype
// through float (or the type's own arithmetic), and a strided index walk.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "cuda/layer.h"

namespace kiln::cuda {

// Float arithmetic on 16-bit storage goes through float32.
template <class T> __device__ __forceinline__ float load_float(const T* p, int64_t i) { return static_cast<float>(p[i]); }
template <> __device__ __forceinline__ float load_float<__half>(const __half* p, int64_t i) { return __half2float(p[i]); }
template <> __device__ __forceinline__ float load_float<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

template <class T> __device__ __forceinline__ void store_float(T* p, int64_t i, float v) { p[i] = static_cast<T>(v); }
template <> __device__ __forceinline__ void store_float<__half>(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
template <> __device__ __forceinline__ void store_float<__nv_bfloat16>(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// The offset of output element `linear` (row-major over shape.dims) in an operand with
// shape.strides.
__device__ __forceinline__ int64_t strided_offset(const StridedShape& shape, int64_t linear) {
  int64_t offset = 0;
#pragma unroll
  for (int d = kMaxKernelRank - 1; d >= 0; --d) {
    if (d >= shape.rank) continue;
    int64_t idx = linear % shape.dims[d];
    linear /= shape.dims[d];
    offset += idx * shape.strides[d];
  }
  return offset;
}

// Moving elements of any dtype as 1- to 16-byte units (data movement and gathers).

// The largest power-of-two unit in [es, 16] bytes dividing every quantity (bytes).
inline size_t widest_unit(size_t es, std::initializer_list<uint64_t> byte_quantities) {
  size_t unit = 16;
  while (unit > es) {
    bool ok = true;
    for (uint64_t q : byte_quantities) ok = ok && q % unit == 0;
    if (ok) break;
    unit /= 2;
  }
  return unit;
}

inline size_t pointer_unit(size_t unit, const void* a, const void* b) {
  const auto bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b);
  while (unit > 1 && bits % unit) unit /= 2;
  return unit;
}

// Calls f(U{}) with U an unsigned type of `unit` bytes (uint4 for 16).
template <class F> void with_unit(size_t unit, F&& f) {
  switch (unit) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    case 16: f(uint4{}); return;
  }
  throw Error(ErrorKind::kInternal, "no copy unit of " + std::to_string(unit) + " bytes");
}

}  // namespace kiln::cuda

// Calls `body` with `T` bound to the C++ type of a storage dtype (float32, float16,
// bfloat16, float64, all integers, bool). Throws kUnsupported for others.
#define KILN_DISPATCH_ALL_TYPES(dtype, T, ...)                                               \
  [&] {                                                                                      \
    switch (dtype) {                                                                         \
      case ::kiln::DType::kFloat32: { using T = float; return __VA_ARGS__(); }               \
      case ::kiln::DType::kFloat16: { using T = __half; return __VA_ARGS__(); }              \
      case ::kiln::DType::kBFloat16: { using T = __nv_bfloat16; return __VA_ARGS__(); }      \
      case ::kiln::DType::kFloat64: { using T = double; return __VA_ARGS__(); }              \
      case ::kiln::DType::kInt8: { using T = int8_t; return __VA_ARGS__(); }                 \
      case ::kiln::DType::kUInt8: { using T = uint8_t; return __VA_ARGS__(); }               \
      case ::kiln::DType::kInt16: { using T = int16_t; return __VA_ARGS__(); }               \
      case ::kiln::DType::kUInt16: { using T = uint16_t; return __VA_ARGS__(); }             \
      case ::kiln::DType::kInt32: { using T = int32_t; return __VA_ARGS__(); }               \
      case ::kiln::DType::kUInt32: { using T = uint32_t; return __VA_ARGS__(); }             \
      case ::kiln::DType::kInt64: { using T = int64_t; return __VA_ARGS__(); }               \
      case ::kiln::DType::kUInt64: { using T = uint64_t; return __VA_ARGS__(); }             \
      case ::kiln::DType::kBool: { using T = bool; return __VA_ARGS__(); }                   \
      default:                                                                               \
        throw ::kiln::Error(::kiln::ErrorKind::kUnsupported,                                 \
                            "dtype " + ::kiln::to_string(dtype) + " has no CUDA kernel");     \
    }                                                                                        \
  }()
