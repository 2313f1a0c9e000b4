// CUDA layers of kiln::FusedGroupNorm (a channel-group normalization and the activation after
// it: passes/fuse_group_norm.cc) and GroupNormalization (opset 21): X stored as float32 or
// float16, statistics in float32, scale and bias as float32 on the device.
//
// One row is one group of one sample: C / num_groups channels by the spatial dims, contiguous
// in NCHW. Two tactics, timed against each other:
// - "rows": GROUP threads per row (a warp up to 1024 columns, the block beyond), the mean, the
//   mean of squared deviations, then the output, as the LayerNormalization kernels do. Rows are
//   read three times, from L1 when they are short; a long row keeps one block busy alone, so
//   few long rows (a diffusion model's 32 groups at batch 1) leave most of the GPU idle.
// - "split": each row in chunks of a few thousand columns, a block per chunk, in two kernels.
//   The first writes each chunk's mean and sum of squared deviations; the second combines a
//   row's chunks (Chan et al.'s pairwise update, so no sum of squares loses the variance to
//   cancellation) and writes act((x - mean) * inv * scale + bias) over its chunk, 16 bytes a
//   thread where the channels allow. X is read twice and Y written once, by every SM.
// Where the producer stores X channels-last (fp16 convolutions) and the batch is 8 or more, the
// layer reads and writes that layout itself instead ("nhwc", below), so no transposes surround it.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ir/activation.h"

// Build options (CMakeLists.txt): the smallest batch whose channels-last group norms skip the
// transposes, and the most chunks of a sample they take.
#ifndef KILN_GROUP_NORM_NHWC_MIN_BATCH
#define KILN_GROUP_NORM_NHWC_MIN_BATCH 8
#endif
#ifndef KILN_GROUP_NORM_NHWC_MAX_CHUNKS
#define KILN_GROUP_NORM_NHWC_MAX_CHUNKS 256
#endif

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

struct GroupNormShape {
  int64_t rows = 0;      // N * groups
  int64_t cols = 0;      // C / groups * spatial (below 2^31)
  int64_t spatial = 1;   // elements per channel
  int64_t groups = 1;
  int64_t channels_per_group = 1;
  FastDiv by_spatial;    // a column's channel within its group
  float eps = 1e-5f;
  ir::Activation act;
  int64_t chunk = 1, splits = 1;  // "split": a row's columns in `splits` chunks of `chunk`
};

// VEC neighbouring elements as float (VEC 1, or 8 of float16 / 4 of float32 in one 16-byte access).
template <int VEC, class T> __device__ __forceinline__ void load_vec(const T* p, float (&v)[VEC]) {
  if constexpr (VEC == 1) v[0] = load_float(p, 0);
  else load_floats<VEC>(p, v);
}
template <int VEC> __device__ __forceinline__ void store_vec(float* p, const float (&v)[VEC]) {
  if constexpr (VEC == 1) *p = v[0];
  else *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
template <int VEC> __device__ __forceinline__ void store_vec(__half* p, const float (&v)[VEC]) {
  if constexpr (VEC == 1) *p = __float2half_rn(v[0]);
  else store_floats<VEC>(p, v);
}

// The sum and the sum of squared deviations from `mean` (two passes when `mean` is given) of
// columns [begin, end) of a row, VEC a thread at a time, STEP threads.
template <int VEC, int STEP, class T>
__device__ __forceinline__ float row_sum(const T* __restrict__ xr, int64_t begin, int64_t end) {
  float sum = 0.f;
  for (int64_t c = begin; c < end; c += STEP * VEC) {
    float v[VEC];
    load_vec<VEC>(xr + c, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += v[j];
  }
  return sum;
}
template <int VEC, int STEP, class T>
__device__ __forceinline__ float row_squares(const T* __restrict__ xr, int64_t begin, int64_t end, float mean) {
  float sq = 0.f;
  for (int64_t c = begin; c < end; c += STEP * VEC) {
    float v[VEC];
    load_vec<VEC>(xr + c, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = v[j] - mean;
      sq += d * d;
    }
  }
  return sq;
}

// act((x - mean) * inv * scale + bias) over columns [begin, end) of row `row`, VEC a thread at a
// time, STEP threads (VEC > 1 only where the spatial size is a multiple of VEC: the VEC elements
// share a channel).
template <int VEC, int STEP, class T>
__device__ __forceinline__ void normalize_columns(const T* __restrict__ xr, T* __restrict__ yr,
                                                  const float* __restrict__ scale, const float* __restrict__ bias,
                                                  const GroupNormShape& p, int64_t row, int64_t begin, int64_t end,
                                                  float mean, float inv) {
  const int64_t first_channel = (row % p.groups) * p.channels_per_group;
  for (int64_t c = begin; c < end; c += STEP * VEC) {
    const int64_t ch = first_channel + fast_div(p.by_spatial, static_cast<uint32_t>(c));
    const float s = scale[ch] * inv, t = bias[ch];
    float v[VEC];
    load_vec<VEC>(xr + c, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = p.act.apply((v[j] - mean) * s + t);
    store_vec<VEC>(yr + c, v);
  }
}

// --- "rows" -----------------------------------------------------------------------------------

template <class T, int GROUP, int VEC>
__global__ void __launch_bounds__(kThreads) group_norm_rows_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                   const float* __restrict__ scale,
                                                                   const float* __restrict__ bias, GroupNormShape p) {
  __shared__ float smem[kThreads / 32];
  constexpr int kRowsPerBlock = kThreads / GROUP;
  const int lane = static_cast<int>(threadIdx.x) % GROUP, group = static_cast<int>(threadIdx.x) / GROUP;
  const float cols_f = static_cast<float>(p.cols);
  for (int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + group; row < p.rows;
       row += int64_t{gridDim.x} * kRowsPerBlock) {
    const T* xr = x + row * p.cols;
    const int64_t first = int64_t{lane} * VEC;
    const float mean = group_sum<GROUP>(row_sum<VEC, GROUP>(xr, first, p.cols), smem) / cols_f;
    const float var = group_sum<GROUP>(row_squares<VEC, GROUP>(xr, first, p.cols, mean), smem) / cols_f;
    normalize_columns<VEC, GROUP>(xr, y + row * p.cols, scale, bias, p, row, first, p.cols, mean,
                                  1.f / sqrtf(var + p.eps));
  }
}

// --- "split" ----------------------------------------------------------------------------------

__device__ __forceinline__ int64_t chunk_begin(const GroupNormShape& p, int64_t split) { return split * p.chunk; }
__device__ __forceinline__ int64_t chunk_end(const GroupNormShape& p, int64_t split) {
  return min(p.cols, (split + 1) * p.chunk);
}

// Each chunk's mean and sum of squared deviations from it (`partials`, row-major [rows, splits]).
template <class T, int VEC>
__global__ void __launch_bounds__(kThreads) group_norm_partials_kernel(const T* __restrict__ x,
                                                                       float2* __restrict__ partials, GroupNormShape p) {
  __shared__ float smem[kThreads / 32];
  for (int64_t b = blockIdx.x; b < p.rows * p.splits; b += gridDim.x) {
    const int64_t row = b / p.splits, split = b % p.splits;
    const int64_t begin = chunk_begin(p, split), end = chunk_end(p, split);
    const int64_t first = begin + int64_t{threadIdx.x} * VEC;
    const T* xr = x + row * p.cols;
    const float mean = group_sum<kThreads>(row_sum<VEC, kThreads>(xr, first, end), smem) / static_cast<float>(end - begin);
    const float m2 = group_sum<kThreads>(row_squares<VEC, kThreads>(xr, first, end, mean), smem);
    if (threadIdx.x == 0) partials[b] = make_float2(mean, m2);
  }
}

// (count, mean, sum of squared deviations) of two parts -> of both (Chan, Golub and LeVeque).
__device__ __forceinline__ void combine(float& n, float& mean, float& m2, float nb, float meanb, float m2b) {
  const float total = n + nb;
  if (total == 0.f) return;
  const float delta = meanb - mean;
  mean += delta * (nb / total);
  m2 += m2b + delta * delta * (n * nb / total);
  n = total;
}

// Every lane's (count, mean, sum of squared deviations) -> of the whole warp, in every lane.
__device__ __forceinline__ void warp_combine(float& n, float& mean, float& m2) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const float nb = __shfl_xor_sync(0xffffffffu, n, d);
    const float meanb = __shfl_xor_sync(0xffffffffu, mean, d);
    const float m2b = __shfl_xor_sync(0xffffffffu, m2, d);
    combine(n, mean, m2, nb, meanb, m2b);
  }
}

// A row's mean and 1 / sqrt(var + eps) from its chunks' partials, by the block's first warp
// into stats[0..1] (the caller synchronizes).
__device__ __forceinline__ void row_statistics(const float2* __restrict__ partials, const GroupNormShape& p,
                                               int64_t row, float* stats) {
  if (threadIdx.x >= 32) return;
  float n = 0.f, mean = 0.f, m2 = 0.f;
  for (int64_t s = threadIdx.x; s < p.splits; s += 32) {
    const float2 part = partials[row * p.splits + s];
    combine(n, mean, m2, static_cast<float>(chunk_end(p, s) - chunk_begin(p, s)), part.x, part.y);
  }
  warp_combine(n, mean, m2);
  if (threadIdx.x == 0) {
    stats[0] = mean;
    stats[1] = 1.f / sqrtf(m2 / static_cast<float>(p.cols) + p.eps);
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads) group_norm_apply_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                    const float2* __restrict__ partials,
                                                                    const float* __restrict__ scale,
                                                                    const float* __restrict__ bias, GroupNormShape p) {
  __shared__ float stats[2];
  for (int64_t b = blockIdx.x; b < p.rows * p.splits; b += gridDim.x) {
    const int64_t row = b / p.splits, split = b % p.splits;
    row_statistics(partials, p, row, stats);
    __syncthreads();
    normalize_columns<VEC, kThreads>(x + row * p.cols, y + row * p.cols, scale, bias, p, row,
                                     chunk_begin(p, split) + int64_t{threadIdx.x} * VEC, chunk_end(p, split), stats[0],
                                     stats[1]);
    __syncthreads();  // stats is rewritten for the next chunk
  }
}

// --- "nhwc": X stored channels-last --------------------------------------------------------------
//
// Where the producer stores X channels-last (fp16 convolutions do), a group is C / G neighbouring
// channels of every pixel. Blocks take chunks of one sample's pixels, threads neighbouring
// channel vectors of `rows` pixels at a time (coalesced), so no transpose runs before or after
// the layer. The first kernel writes each chunk's mean and sum of squared deviations per group
// (per-channel sums over the block's pixel rows in shared memory, then per group); the second
// combines a sample's chunks per group and writes the output. A sample in more than
// kMaxSerialChunks chunks has its chunks combined once, by a warp per group in a kernel between
// the two, instead of by a thread per group in every block of the second.

struct NhwcShape {
  int64_t batch = 0, pixels = 0;
  int channels = 0, groups = 1, channels_per_group = 1;
  int vectors = 0;     // channel vectors of VEC per pixel
  int rows = 1;        // pixels a block reads at once (blockDim.y); blockDim.x = min(vectors, 256)
  int64_t chunk = 1, splits = 1;  // a sample's pixels in `splits` chunks of `chunk`
  float eps = 1e-5f;
  ir::Activation act;

  int threads_x() const { return std::min(vectors, kThreads); }
  // Dynamic shared memory of the statistics kernel: per-row channel sums, channel totals, group means.
  size_t partial_smem() const {
    return (static_cast<size_t>(rows) * channels + channels + groups) * sizeof(float);
  }
};

__device__ __forceinline__ int64_t nhwc_chunk_end(const NhwcShape& p, int64_t split) {
  return min(p.pixels, (split + 1) * p.chunk);
}

// Sums over the block's pixel rows of what each thread left in rows[y][channel] -> totals[channel].
__device__ __forceinline__ void channel_totals(const NhwcShape& p, const float* rows, float* totals) {
  const int threads = blockDim.x * blockDim.y, t = threadIdx.y * blockDim.x + threadIdx.x;
  for (int c = t; c < p.channels; c += threads) {
    float sum = 0.f;
    for (int y = 0; y < p.rows; ++y) sum += rows[y * p.channels + c];
    totals[c] = sum;
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads) nhwc_partials_kernel(const T* __restrict__ x, float2* __restrict__ partials,
                                                                 NhwcShape p) {
  extern __shared__ float smem[];
  float* rows = smem;                            // [rows][channels]
  float* totals = rows + p.rows * p.channels;    // [channels]
  float* group_mean = totals + p.channels;       // [groups]
  const int threads = blockDim.x * blockDim.y, t = threadIdx.y * blockDim.x + threadIdx.x;
  for (int64_t b = blockIdx.x; b < p.batch * p.splits; b += gridDim.x) {
    const int64_t n = b / p.splits, split = b % p.splits;
    const int64_t begin = split * p.chunk, end = nhwc_chunk_end(p, split);
    const T* xs = x + n * p.pixels * p.channels;
    for (int v = threadIdx.x; v < p.vectors; v += blockDim.x) {
      float acc[VEC] = {};
      for (int64_t q = begin + threadIdx.y; q < end; q += p.rows) {
        float vals[VEC];
        load_vec<VEC>(xs + q * p.channels + v * VEC, vals);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += vals[j];
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) rows[threadIdx.y * p.channels + v * VEC + j] = acc[j];
    }
    __syncthreads();
    channel_totals(p, rows, totals);
    __syncthreads();
    const float count = static_cast<float>((end - begin) * p.channels_per_group);
    for (int g = t; g < p.groups; g += threads) {
      float sum = 0.f;
      for (int k = 0; k < p.channels_per_group; ++k) sum += totals[g * p.channels_per_group + k];
      group_mean[g] = sum / count;
    }
    __syncthreads();
    for (int v = threadIdx.x; v < p.vectors; v += blockDim.x) {
      float mean[VEC], acc[VEC] = {};
#pragma unroll
      for (int j = 0; j < VEC; ++j) mean[j] = group_mean[(v * VEC + j) / p.channels_per_group];
      for (int64_t q = begin + threadIdx.y; q < end; q += p.rows) {
        float vals[VEC];
        load_vec<VEC>(xs + q * p.channels + v * VEC, vals);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = vals[j] - mean[j];
          acc[j] += d * d;
        }
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) rows[threadIdx.y * p.channels + v * VEC + j] = acc[j];
    }
    __syncthreads();
    channel_totals(p, rows, totals);
    __syncthreads();
    for (int g = t; g < p.groups; g += threads) {
      float m2 = 0.f;
      for (int k = 0; k < p.channels_per_group; ++k) m2 += totals[g * p.channels_per_group + k];
      partials[b * p.groups + g] = make_float2(group_mean[g], m2);
    }
    __syncthreads();  // the shared arrays are rewritten for the next chunk
  }
}

// Each (sample, group)'s mean and 1 / sqrt(var + eps) from its chunks' partials: a warp per
// group, lanes over the chunks, Chan's update across lanes by shuffles.
__global__ void __launch_bounds__(kThreads) nhwc_statistics_kernel(const float2* __restrict__ partials,
                                                                   float2* __restrict__ stats, NhwcShape p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = int64_t{gridDim.x} * (kThreads / 32);
  const float group_size = static_cast<float>(p.pixels * p.channels_per_group);
  for (int64_t w = int64_t{blockIdx.x} * (kThreads / 32) + threadIdx.x / 32; w < p.batch * p.groups; w += warps) {
    const int64_t n = w / p.groups, g = w % p.groups;
    float count = 0.f, mean = 0.f, m2 = 0.f;
    for (int64_t k = lane; k < p.splits; k += 32) {
      const float2 part = partials[(n * p.splits + k) * p.groups + g];
      combine(count, mean, m2, static_cast<float>((nhwc_chunk_end(p, k) - k * p.chunk) * p.channels_per_group), part.x,
              part.y);
    }
    warp_combine(count, mean, m2);
    if (lane == 0) stats[w] = make_float2(mean, 1.f / sqrtf(m2 / group_size + p.eps));
  }
}

// `stats` null: each block's threads combine its sample's chunks from `partials`, a thread per
// group; else `stats` holds every (sample, group)'s mean and inverse deviation.
template <class T, int VEC>
__global__ void __launch_bounds__(kThreads) nhwc_apply_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                              const float2* __restrict__ partials,
                                                              const float2* __restrict__ stats,
                                                              const float* __restrict__ scale,
                                                              const float* __restrict__ bias, NhwcShape p) {
  extern __shared__ float smem[];
  float* group_mean = smem;              // [groups]
  float* group_inv = smem + p.groups;    // [groups]
  const int threads = blockDim.x * blockDim.y, t = threadIdx.y * blockDim.x + threadIdx.x;
  const float group_size = static_cast<float>(p.pixels * p.channels_per_group);
  for (int64_t b = blockIdx.x; b < p.batch * p.splits; b += gridDim.x) {
    const int64_t n = b / p.splits, split = b % p.splits;
    for (int g = t; g < p.groups; g += threads) {
      if (stats) {
        const float2 st = stats[n * p.groups + g];
        group_mean[g] = st.x;
        group_inv[g] = st.y;
        continue;
      }
      float count = 0.f, mean = 0.f, m2 = 0.f;
      for (int64_t k = 0; k < p.splits; ++k) {
        const float2 part = partials[(n * p.splits + k) * p.groups + g];
        combine(count, mean, m2, static_cast<float>((nhwc_chunk_end(p, k) - k * p.chunk) * p.channels_per_group),
                part.x, part.y);
      }
      group_mean[g] = mean;
      group_inv[g] = 1.f / sqrtf(m2 / group_size + p.eps);
    }
    __syncthreads();
    const int64_t begin = split * p.chunk, end = nhwc_chunk_end(p, split);
    const int64_t base = n * p.pixels * p.channels;
    for (int v = threadIdx.x; v < p.vectors; v += blockDim.x) {
      float mean[VEC], s[VEC], shift[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int c = v * VEC + j, g = c / p.channels_per_group;
        mean[j] = group_mean[g];
        s[j] = scale[c] * group_inv[g];
        shift[j] = bias[c];
      }
      for (int64_t q = begin + threadIdx.y; q < end; q += p.rows) {
        float vals[VEC];
        load_vec<VEC>(x + base + q * p.channels + v * VEC, vals);
#pragma unroll
        for (int j = 0; j < VEC; ++j) vals[j] = p.act.apply((vals[j] - mean[j]) * s[j] + shift[j]);
        store_vec<VEC>(y + base + q * p.channels + v * VEC, vals);
      }
    }
    __syncthreads();  // the group statistics are rewritten for the next chunk
  }
}

// --- the layers -------------------------------------------------------------------------------

template <class T>
constexpr int kVec = sizeof(T) == 2 ? 8 : 4;

template <class T, int GROUP>
void launch_rows(bool vector, unsigned blocks, const LayerIO& io, const GroupNormShape& p, cudaStream_t stream) {
  const T* x = static_cast<const T*>(io.inputs[0]);
  T* y = static_cast<T*>(io.outputs[0]);
  const float* scale = static_cast<const float*>(io.inputs[1]);
  const float* bias = static_cast<const float*>(io.inputs[2]);
  // A view at an odd offset takes the one-element kernel.
  if (vector && aligned16(x) && aligned16(y))
    group_norm_rows_kernel<T, GROUP, kVec<T>><<<blocks, kThreads, 0, stream>>>(x, y, scale, bias, p);
  else
    group_norm_rows_kernel<T, GROUP, 1><<<blocks, kThreads, 0, stream>>>(x, y, scale, bias, p);
  KILN_CUDA_CHECK_LAUNCH();
}

template <class T>
std::unique_ptr<Layer> rows_layer(const GroupNormShape& p) {
  const bool vector = p.spatial % kVec<T> == 0;
  const bool warp = p.cols <= (vector ? 32 * 4 * kVec<T> : 1024);
  const unsigned blocks = capped_blocks(warp ? (p.rows + kThreads / 32 - 1) / (kThreads / 32) : p.rows);
  return make_layer(warp ? "kernel:group-norm-warp" : "kernel:group-norm-block",
                    [p, warp, vector, blocks](const LayerIO& io, cudaStream_t stream) {
    if (warp) launch_rows<T, 32>(vector, blocks, io, p, stream);
    else launch_rows<T, kThreads>(vector, blocks, io, p, stream);
  });
}

// Chunks of at least 2,048 columns (a multiple of what a block reads in one step), as many as
// give the GPU about eight blocks per SM.
GroupNormShape with_chunks(GroupNormShape p, int sms) {
  constexpr int64_t kMinChunk = 2048;
  const int64_t wanted = std::max<int64_t>(1, int64_t{sms} * 8 / std::max<int64_t>(1, p.rows));
  const int64_t most = std::max<int64_t>(1, (p.cols + kMinChunk - 1) / kMinChunk);
  const int64_t splits = std::min(wanted, most);
  p.chunk = ((p.cols + splits - 1) / splits + kMinChunk - 1) / kMinChunk * kMinChunk;
  p.splits = (p.cols + p.chunk - 1) / p.chunk;
  return p;
}

template <class T>
std::unique_ptr<Layer> split_layer(const GroupNormShape& p) {
  const bool vector = p.spatial % kVec<T> == 0;  // (chunk is a multiple of kVec)
  const unsigned blocks = capped_blocks(p.rows * p.splits);
  const size_t workspace = static_cast<size_t>(p.rows * p.splits) * sizeof(float2);
  return make_layer("kernel:group-norm-split" + std::to_string(p.splits), [p, vector, blocks](const LayerIO& io,
                                                                                           cudaStream_t stream) {
    const T* x = static_cast<const T*>(io.inputs[0]);
    T* y = static_cast<T*>(io.outputs[0]);
    const float* scale = static_cast<const float*>(io.inputs[1]);
    const float* bias = static_cast<const float*>(io.inputs[2]);
    float2* partials = static_cast<float2*>(io.workspace);
    if (vector && aligned16(x) && aligned16(y)) {
      group_norm_partials_kernel<T, kVec<T>><<<blocks, kThreads, 0, stream>>>(x, partials, p);
      KILN_CUDA_CHECK_LAUNCH();
      group_norm_apply_kernel<T, kVec<T>><<<blocks, kThreads, 0, stream>>>(x, y, partials, scale, bias, p);
    } else {
      group_norm_partials_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(x, partials, p);
      KILN_CUDA_CHECK_LAUNCH();
      group_norm_apply_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(x, y, partials, scale, bias, p);
    }
    KILN_CUDA_CHECK_LAUNCH();
  }, workspace);
}

// Channels-last layers take C up to this (their shared memory holds a row of channels per
// pixel row); wider tensors are transposed to NCHW for the other kernels.
constexpr int kMaxNhwcChannels = 2048;
// Batches below this keep the NCHW kernels, with transposes around them: at batch 1 the
// channels-last kernels, a sample cut into 50 to 130 chunks, made ResNet-50-GN and the UNet blocks
// of bench/group_norm_models.py 1.05x to 1.8x slower however the chunks were combined (H200,
// docs/design/gpu-engine.md).
constexpr int64_t kMinNhwcBatch = KILN_GROUP_NORM_NHWC_MIN_BATCH;
// A sample takes at most this many chunks.
constexpr int64_t kMaxNhwcChunks = KILN_GROUP_NORM_NHWC_MAX_CHUNKS;
static_assert(kMinNhwcBatch >= 1 && kMaxNhwcChunks >= 1,
              "KILN_GROUP_NORM_NHWC_MIN_BATCH and KILN_GROUP_NORM_NHWC_MAX_CHUNKS must be 1 or more");
// Up to this many chunks a sample, every block of the second kernel combines them itself, a
// thread per group, one chunk after another; beyond it a warp per group combines them once, in a
// kernel of its own (one launch more, which costs batches 32 and 128 more than it saves them).
constexpr int64_t kMaxSerialChunks = 16;

// The shape of the channels-last kernels for vectors of `vec` channels, and a chunking that gives
// every SM about four blocks (each thread row at least two pixels a chunk).
NhwcShape nhwc_shape(const GroupNormShape& g, int64_t batch, int channels, int vec, int sms) {
  NhwcShape p;
  p.batch = batch;
  p.pixels = g.spatial;
  p.channels = channels;
  p.groups = static_cast<int>(g.groups);
  p.channels_per_group = static_cast<int>(g.channels_per_group);
  p.vectors = channels / vec;
  p.rows = std::max(1, kThreads / p.threads_x());
  p.eps = g.eps;
  p.act = g.act;
  const int64_t wanted = std::max<int64_t>(1, int64_t{sms} * 4 / std::max<int64_t>(1, batch));
  const int64_t most = std::max<int64_t>(1, p.pixels / (int64_t{p.rows} * 2));
  const int64_t splits = std::min({wanted, most, kMaxNhwcChunks});
  p.chunk = std::max<int64_t>(1, (p.pixels + splits - 1) / splits);
  p.splits = (p.pixels + p.chunk - 1) / p.chunk;
  return p;
}

// The workspace: every chunk's partials, then (beyond kMaxSerialChunks) every group's statistics.
size_t nhwc_partials_bytes(const NhwcShape& p) { return static_cast<size_t>(p.batch * p.splits * p.groups) * sizeof(float2); }
size_t nhwc_workspace_bytes(const NhwcShape& p) {
  return nhwc_partials_bytes(p) + (p.splits > kMaxSerialChunks ? static_cast<size_t>(p.batch * p.groups) * sizeof(float2) : 0);
}

template <class T, int VEC>
void launch_nhwc(const NhwcShape& p, const LayerIO& io, cudaStream_t stream) {
  const T* x = static_cast<const T*>(io.inputs[0]);
  T* y = static_cast<T*>(io.outputs[0]);
  float2* partials = static_cast<float2*>(io.workspace);
  float2* stats = nullptr;
  const dim3 block(p.threads_x(), p.rows);
  const unsigned blocks = capped_blocks(p.batch * p.splits);
  nhwc_partials_kernel<T, VEC><<<blocks, block, p.partial_smem(), stream>>>(x, partials, p);
  KILN_CUDA_CHECK_LAUNCH();
  if (p.splits > kMaxSerialChunks) {
    stats = reinterpret_cast<float2*>(static_cast<char*>(io.workspace) + nhwc_partials_bytes(p));
    constexpr int64_t kWarps = kThreads / 32;
    nhwc_statistics_kernel<<<capped_blocks((p.batch * p.groups + kWarps - 1) / kWarps), kThreads, 0, stream>>>(partials,
                                                                                                             stats, p);
    KILN_CUDA_CHECK_LAUNCH();
  }
  nhwc_apply_kernel<T, VEC><<<blocks, block, 2 * p.groups * sizeof(float), stream>>>(
      x, y, partials, stats, static_cast<const float*>(io.inputs[1]), static_cast<const float*>(io.inputs[2]), p);
  KILN_CUDA_CHECK_LAUNCH();
}

template <class T>
std::unique_ptr<Layer> nhwc_layer(const GroupNormShape& g, int64_t batch, int channels, int sms) {
  const bool vector = channels % kVec<T> == 0;
  const NhwcShape wide = nhwc_shape(g, batch, channels, vector ? kVec<T> : 1, sms);
  const NhwcShape narrow = nhwc_shape(g, batch, channels, 1, sms);
  const size_t workspace = std::max(nhwc_workspace_bytes(wide), nhwc_workspace_bytes(narrow));
  return make_layer("kernel:group-norm-nhwc" + std::to_string(wide.splits), [vector, wide, narrow](const LayerIO& io,
                                                                                              cudaStream_t stream) {
    // A view at an odd offset takes one channel a thread.
    if (vector && aligned16(io.inputs[0]) && aligned16(io.outputs[0])) launch_nhwc<T, kVec<T>>(wide, io, stream);
    else launch_nhwc<T, 1>(narrow, io, stream);
  }, workspace);
}

std::string group_norm_check(const LayerRequest& r) {
  if (r.input_dtypes[0] != DType::kFloat32)
    return "input type " + to_string(r.input_dtypes[0]) + " is not supported (supported: float32)";
  for (size_t i = 1; i < 3; ++i)
    if (!r.has_input(i) || r.input_dtypes[i] != DType::kFloat32) return "scale and bias must be float32";
  const std::vector<int64_t>& shape = r.input_shape(0);
  if (shape.size() < 2) return "the input must have rank 2 or more";
  const int64_t groups = r.node.attrs.get_int("num_groups", 1);
  if (groups < 1 || shape[1] % groups != 0)
    return std::to_string(shape[1]) + " channels do not split into " + std::to_string(groups) + " groups";
  if (shape[0] * shape[1] > 0 && shape_numel(shape) / (shape[0] * shape[1]) * (shape[1] / groups) >= (int64_t{1} << 31))
    return "a group of 2^31 elements or more";
  if (shape_numel(r.input_shape(1)) != shape[1] || shape_numel(r.input_shape(2)) != shape[1])
    return "scale and bias must have C = " + std::to_string(shape[1]) + " elements";
  try {
    (void)ir::Activation::from_node(r.node);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// X and Y channels-last where the producer stores X so (a 4-D tensor of at most
// kMaxNhwcChannels channels and a batch of kMinNhwcBatch or more), else row-major; scale and
// bias float32.
LayerFormats group_norm_formats(const LayerRequest& r) {
  const std::vector<int64_t>& shape = r.input_shape(0);
  const bool nhwc = !r.is_constant(0) && r.inputs[0]->format.layout == Layout::kNHWC && shape.size() == 4 &&
                    shape[1] <= kMaxNhwcChannels && shape[0] >= kMinNhwcBatch;
  const Layout layout = nhwc ? Layout::kNHWC : Layout::kLinear;
  LayerFormats f;
  f.inputs = {Format{r.float_storage(), layout}, Format{DType::kFloat32, Layout::kLinear},
              Format{DType::kFloat32, Layout::kLinear}};
  f.outputs = {Format{r.float_storage(), layout}};
  return f;
}

template <class T>
std::unique_ptr<Layer> fastest(const GroupNormShape& p, const std::string& storage, BuildServices& services) {
  const GroupNormShape split = with_chunks(p, services.device().multiProcessorCount);
  const std::string key = "group_norm|" + storage + "|r" + std::to_string(p.rows) + "|c" + std::to_string(p.cols) + "|s" +
                          std::to_string(p.spatial) + "|" + p.act.name();
  if (std::optional<std::string> cached = services.cached_tactic(key)) {
    if (*cached == "rows") return rows_layer<T>(p);
    if (*cached == "split") return split_layer<T>(split);
  }
  std::unique_ptr<Layer> candidates[2] = {rows_layer<T>(p), split_layer<T>(split)};
  const char* names[2] = {"rows", "split"};
  LayerIO io = services.scratch_io();
  float best_ms = 0.f;
  int best = 0;
  for (int k = 0; k < 2; ++k) {
    io.workspace = candidates[k]->workspace_bytes() ? services.scratch(candidates[k]->workspace_bytes()) : nullptr;
    const float ms = services.time_ms([&](cudaStream_t stream) { candidates[k]->enqueue(io, stream); });
    if (services.tactics().log_candidates) services.log("group_norm/" + std::string(names[k]) + " " + std::to_string(ms) + " ms");
    if (k == 0 || ms < best_ms) best_ms = ms, best = k;
  }
  services.record_tactic(key, names[best]);
  return std::move(candidates[best]);
}

std::unique_ptr<Layer> group_norm_create(const LayerRequest& r, const LayerFormats& f, BuildServices& services) {
  const std::string why = group_norm_check(r);
  if (!why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  const std::vector<int64_t>& shape = r.input_shape(0);
  GroupNormShape p;
  p.groups = r.node.attrs.get_int("num_groups", 1);
  p.channels_per_group = shape[1] / p.groups;
  p.spatial = shape[0] * shape[1] > 0 ? shape_numel(shape) / (shape[0] * shape[1]) : 0;
  p.rows = shape[0] * p.groups;
  p.cols = p.channels_per_group * p.spatial;
  p.by_spatial = make_fast_div(static_cast<uint32_t>(std::max<int64_t>(p.spatial, 1)));
  p.eps = r.node.attrs.get_float("epsilon", 1e-5f);
  p.act = ir::Activation::from_node(r.node);
  if (p.rows == 0 || p.cols == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  if (f.inputs[0].layout == Layout::kNHWC) {
    const int sms = services.device().multiProcessorCount, channels = static_cast<int>(shape[1]);
    switch (f.inputs[0].dtype) {
      case DType::kFloat32: return nhwc_layer<float>(p, shape[0], channels, sms);
      case DType::kFloat16: return nhwc_layer<__half>(p, shape[0], channels, sms);
      default: break;
    }
    throw r.node.error(ErrorKind::kUnsupported, "storage type " + to_string(f.inputs[0].dtype) + " is not supported");
  }
  switch (f.inputs[0].dtype) {
    case DType::kFloat32: return fastest<float>(p, "f32", services);
    case DType::kFloat16: return fastest<__half>(p, "f16", services);
    default: break;
  }
  throw r.node.error(ErrorKind::kUnsupported, "storage type " + to_string(f.inputs[0].dtype) + " is not supported");
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(group_norm) {
  for (const char* op : {"FusedGroupNorm", "GroupNormalization"}) {
    LayerEntry e;
    e.op = op;
    e.domain = std::string(op) == "FusedGroupNorm" ? "kiln" : "";
    e.check = group_norm_check;
    e.formats = group_norm_formats;
    e.create = group_norm_create;
    e.dtypes = "float32, float16 storage (float32 statistics)";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
