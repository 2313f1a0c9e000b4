// Reformat layers (layout change NCHW <-> NHWC and/or a float dtype change) that the builder
// puts between layers, the random fill for timing buffers, and the host-side conversion of
// constants to a storage format.
#include <cuda_fp8.h>

#include <cstring>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"

namespace kiln::cuda {

namespace {

template <class T> struct Bits { using type = T; };

template <class Out, class In> __device__ __forceinline__ Out convert_element(In v) {
  if constexpr (std::is_same_v<In, Out>) {
    return v;
  } else {
    Out out;
    store_float(&out, 0, load_float(&v, 0));
    return out;
  }
}

// src [batch][rows][cols] -> dst [batch][cols][rows], converting each element.
template <class In, class Out>
__global__ void transpose_kernel(const In* __restrict__ src, Out* __restrict__ dst, int64_t rows, int64_t cols,
                                 int64_t batch) {
  __shared__ In tile[32][33];
  const int64_t r0 = int64_t{blockIdx.y} * 32, c0 = int64_t{blockIdx.x} * 32;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const In* s = src + b * rows * cols;
    Out* d = dst + b * rows * cols;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
      int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[i][threadIdx.x] = s[r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
      int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && c < cols) d[c * rows + r] = convert_element<Out>(tile[threadIdx.x][i]);
    }
    __syncthreads();
  }
}

// The same transpose when rows is small (NCHW -> NHWC of an image input, C = 3): one thread
// per column reads its `rows` elements (each read coalesced across the warp) and writes them
// next to each other; the 32x32 tiles above would leave most threads idle.
template <class In, class Out>
__global__ void transpose_few_rows_kernel(const In* __restrict__ src, Out* __restrict__ dst, int rows, int64_t cols,
                                          int64_t batch) {
  const int64_t total = batch * cols;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / cols, c = i - b * cols;
    const In* s = src + b * rows * cols + c;
    Out* d = dst + i * rows;
    for (int r = 0; r < rows; ++r) d[r] = convert_element<Out>(s[r * cols]);
  }
}

template <class In, class Out>
__global__ void convert_kernel(const In* __restrict__ src, Out* __restrict__ dst, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = convert_element<Out>(src[i]);
}

template <class T>
__global__ void fill_random_kernel(T* data, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed * 2246822519u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    store_float(data, i, static_cast<float>(h) * (2.f / 4294967296.f) - 1.f);
  }
}

// E4M3 values in [-8, 8] (FP8 layers' timing inputs; zeros can run faster than real data).
__global__ void fill_random_fp8_kernel(__nv_fp8_storage_t* data, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed * 2246822519u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    data[i] = __nv_cvt_float_to_fp8(static_cast<float>(h) * (16.f / 4294967296.f) - 8.f, __NV_SATFINITE, __NV_E4M3);
  }
}

// Same-size types move as unsigned integers; float conversions go through float.
#define KILN_DISPATCH_STORAGE(dtype, T, ...)                                                   \
  [&] {                                                                                        \
    switch (dtype) {                                                                           \
      case DType::kFloat32: { using T = float; return __VA_ARGS__(); }                         \
      case DType::kFloat16: { using T = __half; return __VA_ARGS__(); }                        \
      case DType::kBFloat16: { using T = __nv_bfloat16; return __VA_ARGS__(); }                \
      default: break;                                                                          \
    }                                                                                          \
    switch (element_size(dtype)) {                                                             \
      case 1: { using T = uint8_t; return __VA_ARGS__(); }                                     \
      case 2: { using T = uint16_t; return __VA_ARGS__(); }                                    \
      case 4: { using T = uint32_t; return __VA_ARGS__(); }                                    \
      case 8: { using T = uint64_t; return __VA_ARGS__(); }                                    \
    }                                                                                          \
    throw Error(ErrorKind::kUnsupported, "cannot reformat dtype " + to_string(dtype));        \
  }()

bool float_storage_type(DType d) { return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16; }

class ReformatLayer final : public Layer {
 public:
  ReformatLayer(const TensorSpec& from, const TensorSpec& to) : from_(from), to_(to) {
    if (from.shape != to.shape) throw Error(ErrorKind::kInternal, "reformat between different shapes");
    if (from.format.dtype != to.format.dtype &&
        !(float_storage_type(from.format.dtype) && float_storage_type(to.format.dtype)))
      throw Error(ErrorKind::kInternal, "reformat cannot convert " + to_string(from.format.dtype) + " to " +
                                            to_string(to.format.dtype));
    transpose_ = from.format.layout != to.format.layout && from.rank() == 4;
    if (transpose_) {
      const int64_t n = from.shape[0], c = from.shape[1], hw = from.shape[2] * from.shape[3];
      batch_ = n;
      // NCHW -> NHWC: [n][c][hw] -> [n][hw][c]; NHWC -> NCHW: [n][hw][c] -> [n][c][hw].
      rows_ = from.format.layout == Layout::kLinear ? c : hw;
      cols_ = from.format.layout == Layout::kLinear ? hw : c;
    }
  }

  void enqueue(const LayerIO& io, cudaStream_t stream) const override {
    const int64_t n = from_.elements();
    if (n == 0) return;
    const void* src = io.inputs[0];
    void* dst = io.outputs[0];
    if (!transpose_ && from_.format.dtype == to_.format.dtype) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, from_.bytes(), cudaMemcpyDeviceToDevice, stream));
      return;
    }
    KILN_DISPATCH_STORAGE(from_.format.dtype, In, [&] {
      KILN_DISPATCH_STORAGE(to_.format.dtype, Out, [&] {
        if constexpr (sizeof(In) == sizeof(Out) || (!std::is_integral_v<In> && !std::is_integral_v<Out>)) {
          if (transpose_ && rows_ <= kFewRows) {
            transpose_few_rows_kernel<In, Out><<<grid_for(batch_ * cols_, 256, 4), 256, 0, stream>>>(
                static_cast<const In*>(src), static_cast<Out*>(dst), static_cast<int>(rows_), cols_, batch_);
          } else if (transpose_) {
            dim3 block(32, 8);
            dim3 grid(static_cast<unsigned>((cols_ + 31) / 32), static_cast<unsigned>((rows_ + 31) / 32),
                      static_cast<unsigned>(std::min<int64_t>(batch_, 65535)));
            transpose_kernel<In, Out><<<grid, block, 0, stream>>>(static_cast<const In*>(src), static_cast<Out*>(dst),
                                                                  rows_, cols_, batch_);
          } else {
            convert_kernel<In, Out><<<grid_for(n, 256, 4), 256, 0, stream>>>(static_cast<const In*>(src),
                                                                              static_cast<Out*>(dst), n);
          }
          KILN_CUDA_CHECK_LAUNCH();
        } else {
          throw Error(ErrorKind::kInternal, "reformat between integer types of different sizes");
        }
      });
    });
  }

  std::string tactic() const override {
    if (transpose_ && rows_ <= kFewRows) return "kernel:transpose_few_rows " + from_.format.str() + "->" + to_.format.str();
    return std::string(transpose_ ? "kernel:transpose " : "kernel:convert ") + from_.format.str() + "->" +
           to_.format.str();
  }

 private:
  static constexpr int64_t kFewRows = 8;
  TensorSpec from_, to_;
  bool transpose_ = false;
  int64_t batch_ = 0, rows_ = 0, cols_ = 0;
};

}  // namespace

std::unique_ptr<Layer> make_reformat_layer(const TensorSpec& from, const TensorSpec& to) {
  return std::make_unique<ReformatLayer>(from, to);
}

void fill_random(void* data, DType dtype, int64_t n, uint32_t seed, cudaStream_t stream) {
  if (n == 0) return;
  if (dtype == DType::kFloat32) {
    fill_random_kernel<<<grid_for(n, 256, 4), 256, 0, stream>>>(static_cast<float*>(data), n, seed);
  } else if (dtype == DType::kFloat16) {
    fill_random_kernel<<<grid_for(n, 256, 4), 256, 0, stream>>>(static_cast<__half*>(data), n, seed);
  } else if (dtype == DType::kBFloat16) {
    fill_random_kernel<<<grid_for(n, 256, 4), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data), n, seed);
  } else if (dtype == DType::kFloat8E4M3FN) {
    fill_random_fp8_kernel<<<grid_for(n, 256, 4), 256, 0, stream>>>(static_cast<__nv_fp8_storage_t*>(data), n, seed);
  } else {
    // Integers (indices) and bools: zeros are always valid.
    KILN_CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<size_t>(n) * element_size(dtype), stream));
    return;
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void check_gpu_architecture(const cudaDeviceProp& prop) {
  // A GPU whose architecture kiln's kernels are not compiled for (and that cannot compile their
  // PTX) has no image of them: every launch would fail with "no kernel image is available".
  cudaFuncAttributes attributes{};
  const cudaError_t e = cudaFuncGetAttributes(&attributes, fill_random_kernel<float>);
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  if (e != cudaErrorNoKernelImageForDevice && e != cudaErrorInvalidDeviceFunction) KILN_CUDA_CHECK(e);
  const std::string sm = std::to_string(prop.major) + std::to_string(prop.minor);
  throw Error(ErrorKind::kDevice, std::string("this kiln's CUDA kernels are compiled for " KILN_CUDA_ARCHITECTURES_TEXT
                                              "; the GPU ") + prop.name + " is sm_" + sm)
      .hint("build kiln for it: cmake -DKILN_CUDA_ARCHITECTURES=\"" + sm + "\" (or several: \"80;86;89;90\")");
}

Tensor convert_constant(const Tensor& t, const Format& format) {
  Tensor src = t;
  if (format.dtype != t.dtype()) {
    if (t.dtype() != DType::kFloat32 || (format.dtype != DType::kFloat16 && format.dtype != DType::kBFloat16))
      throw Error(ErrorKind::kInternal, "cannot convert a " + to_string(t.dtype()) + " constant to " +
                                            to_string(format.dtype));
    Tensor out = Tensor::uninitialized(format.dtype, t.shape());
    const float* in = t.data<float>();
    uint16_t* o = static_cast<uint16_t*>(out.raw());
    for (int64_t i = 0; i < t.numel(); ++i)
      o[i] = format.dtype == DType::kFloat16 ? float_to_half(in[i]) : float_to_bfloat16(in[i]);
    src = out;
  }
  if (format.layout == Layout::kNHWC && t.rank() == 4) {
    const int64_t n = t.dim(0), c = t.dim(1), hw = t.dim(2) * t.dim(3);
    const size_t es = element_size(src.dtype());
    Tensor out = Tensor::uninitialized(src.dtype(), t.shape());
    const char* in = static_cast<const char*>(src.raw());
    char* o = static_cast<char*>(out.raw());
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t s = 0; s < hw; ++s)
          std::memcpy(o + ((b * hw + s) * c + ch) * es, in + ((b * c + ch) * hw + s) * es, es);
    src = out;
  }
  return src;
}

}  // namespace kiln::cuda
