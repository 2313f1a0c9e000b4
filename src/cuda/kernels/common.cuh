// What the CUDA kernel files share: the compute type of each storage dtype and the conversions
// to and from it, loads and stores through float, warp reductions, merging a tensor's dims into
// a short strided walk, launch sizes, element moves of any dtype, and dtype dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/runtime/check.h"
#include "cuda/runtime/layer.h"

namespace kiln::cuda {

// Arithmetic on 16-bit float storage is float32; every other type computes in itself.
template <class T> struct ComputeOf { using type = T; };
template <> struct ComputeOf<__half> { using type = float; };
template <> struct ComputeOf<__nv_bfloat16> { using type = float; };
template <class T> using compute_t = typename ComputeOf<T>::type;

template <class T> __device__ __forceinline__ compute_t<T> to_compute(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return v;
}

template <class U, class V> __device__ __forceinline__ U from_compute(V v) {
  if constexpr (std::is_same_v<U, __half>) return __float2half_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<U, __nv_bfloat16>) return __float2bfloat16_rn(static_cast<float>(v));
  else return static_cast<U>(v);
}

// Float arithmetic on 16-bit storage goes through float32.
template <class T> __device__ __forceinline__ float load_float(const T* p, int64_t i) { return static_cast<float>(p[i]); }
template <> __device__ __forceinline__ float load_float<__half>(const __half* p, int64_t i) { return __half2float(p[i]); }
template <> __device__ __forceinline__ float load_float<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

template <class T> __device__ __forceinline__ void store_float(T* p, int64_t i, float v) { p[i] = static_cast<T>(v); }
template <> __device__ __forceinline__ void store_float<__half>(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
template <> __device__ __forceinline__ void store_float<__nv_bfloat16>(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// N (2, 4 or 8) neighbouring elements as float: one access of 2N bytes of float16 (p aligned to
// it), read-only 8- or 16-byte loads of float32 (p aligned to 4N bytes).
template <int N> __device__ __forceinline__ void load_floats(const __half* p, float (&v)[N]) {
  static_assert(N == 2 || N == 4 || N == 8, "2, 4 or 8 elements");
  using Raw = std::conditional_t<N == 8, uint4, std::conditional_t<N == 4, uint2, uint32_t>>;
  const Raw raw = *reinterpret_cast<const Raw*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int k = 0; k < N / 2; ++k) {
    const float2 f = __half22float2(h[k]);
    v[2 * k] = f.x;
    v[2 * k + 1] = f.y;
  }
}
template <int N> __device__ __forceinline__ void load_floats(const float* p, float (&v)[N]) {
  static_assert(N == 2 || N == 4 || N == 8, "2, 4 or 8 elements");
  if constexpr (N == 2) {
    const float2 a = __ldg(reinterpret_cast<const float2*>(p));
    v[0] = a.x, v[1] = a.y;
  } else {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(p) + k);
      v[4 * k] = a.x, v[4 * k + 1] = a.y, v[4 * k + 2] = a.z, v[4 * k + 3] = a.w;
    }
  }
}
template <int N> __device__ __forceinline__ void store_floats(__half* p, const float (&v)[N]) {
  static_assert(N == 2 || N == 4 || N == 8, "2, 4 or 8 elements");
  using Raw = std::conditional_t<N == 8, uint4, std::conditional_t<N == 4, uint2, uint32_t>>;
  Raw raw;
  __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
  for (int k = 0; k < N / 2; ++k) h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<Raw*>(p) = raw;
}

// Asynchronous copies global -> shared memory (sm_80 and later), which overlap a block's next
// loads with its arithmetic.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, or 16 zero bytes when `valid` is false (src is not read then).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// What a launch sizes its grid by: how many blocks of `threads` threads and `smem` bytes of
// dynamic shared memory fit on one multiprocessor of the current device, and its
// multiprocessors. The first call per kernel, size and device raises the kernel's shared-memory
// limit to the most a block may have on the device (the limit belongs to the function, so one
// raised to each caller's `smem` would refuse the launches of a larger size made before it) and,
// with `all_shared`, asks for all of L1 as shared memory (as cuDNN's
// convolution kernels take it: a kernel that asks for another split makes the multiprocessors
// drain and reconfigure between it and its neighbours, which isolated timing does not see;
// ResNet-50's INT8 engine ran 20% slower at batch 1). Later calls look it up, so a launch asks
// the device nothing; the first comes from the layer's build, outside graph capture. `what`
// names the kernel in the error when it does not fit at all.
struct KernelOccupancy {
  int blocks_per_sm = 0;
  int sms = 0;
};
template <class Kernel>
KernelOccupancy prepare_kernel(Kernel kernel, int threads, int smem, bool all_shared, const char* what) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int>, KernelOccupancy> known;
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  KernelOccupancy& info = known[{device, reinterpret_cast<const void*>(kernel), smem}];
  if (info.sms == 0) {
    int most = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (smem > most) throw Error(ErrorKind::kDevice, std::string(what) + ": needs more shared memory than a block has on this GPU");
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    if (all_shared)
      KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&info.blocks_per_sm, kernel, threads, smem));
    if (info.blocks_per_sm < 1) throw Error(ErrorKind::kDevice, std::string(what) + ": the kernel does not fit on this GPU");
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, device));
  }
  return info;
}

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

// n / d for n, d < 2^31 with a multiply and a shift (Granlund-Montgomery, as in PyTorch).
struct FastDiv {
  uint32_t mul = 1, shift = 0;
};

inline FastDiv make_fast_div(uint32_t d) {
  FastDiv f;
  uint32_t shift = 0;
  while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
  f.shift = shift;
  f.mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  return f;
}

__device__ __forceinline__ uint32_t fast_div(const FastDiv& f, uint32_t n) {
  return (__umulhi(n, f.mul) + n) >> f.shift;
}

// `op` over the 32 lanes of a warp (a butterfly: every lane gets the result).
template <class Op> __device__ __forceinline__ float warp_all(float v, Op op) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  return warp_all(v, [](float a, float b) { return a + b; });
}

// The sum of v over GROUP threads: a warp (32), or the whole block (GROUP = blockDim.x, a
// multiple of 32; smem holds GROUP / 32 floats, and every thread of the block must call it).
template <int GROUP>
__device__ __forceinline__ float group_sum(float v, float* smem) {
  v = warp_sum(v);
  if constexpr (GROUP == 32) {
    return v;
  } else {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    float r = smem[0];
    for (int w = 1; w < GROUP / 32; ++w) r += smem[w];
    __syncthreads();
    return r;
  }
}

// (size, stride) dims in iteration order -> a StridedShape, size-1 dims dropped and runs that
// are contiguous in memory (stride-0 runs too) merged. False when more than kMaxKernelRank dims
// remain.
inline bool merge_dims(const std::vector<std::pair<int64_t, int64_t>>& dims, StridedShape& out) {
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& [size, stride] : dims) {
    if (size == 1) continue;
    if (!merged.empty() && merged.back().second == stride * size) {
      merged.back() = {merged.back().first * size, stride};
      continue;
    }
    merged.emplace_back(size, stride);
  }
  if (merged.size() > static_cast<size_t>(kMaxKernelRank)) return false;
  out = StridedShape{};
  out.rank = static_cast<int>(merged.size());
  for (size_t i = 0; i < merged.size(); ++i) {
    out.dims[i] = merged[i].first;
    out.strides[i] = merged[i].second;
  }
  return true;
}

// A grid of `blocks` blocks, at least 1 and at most 2^20 (kernels that loop over their work
// past that).
inline unsigned capped_blocks(int64_t blocks) { return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 20)); }

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

// Whether p may be read and written 16 bytes at a time (a view at an odd offset may not).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
