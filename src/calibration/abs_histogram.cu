// Calibration histograms on the GPU (see abs_histogram.h).
#include "calibration/abs_histogram.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include <string>

#include "cuda/runtime/device_scope.h"

namespace kiln::calibration {

namespace {

// This module's CUDA calls, checked (it runs beside the backend, on the public Context only).
void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw Error(ErrorKind::kDevice, std::string("GPU error in calibration: ") + cudaGetErrorString(status) + " in " + call);
}
#define KILN_CALIBRATION_CHECK(call) check((call), #call)

constexpr int kThreads = 256;
constexpr int kBins = AbsHistogram::kBins;

// The largest |x| (NaN ignored: fmaxf keeps the other operand; an infinity comes through, and
// the host refuses it). Non-negative floats order as their bit patterns, so atomicMax on them
// as unsigned integers is the float maximum.
__global__ void __launch_bounds__(kThreads) max_abs_kernel(const float* __restrict__ x, int64_t n, float* __restrict__ out) {
  float m = 0.f;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads) m = fmaxf(m, fabsf(x[i]));
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) atomicMax(reinterpret_cast<unsigned int*>(out), __float_as_uint(m));
}

// Counts |x| into kBins bins of width 1 / per_bin, as AbsHistogram::add does (double
// arithmetic, the last bin taking the rest, NaN skipped). Shared-memory counts per block; bin 0
// (a ReLU output's zeros, often half the values) is counted in a register per thread, since
// atomics on one shared address serialize.
__global__ void __launch_bounds__(kThreads) count_abs_kernel(const float* __restrict__ x, int64_t n, double per_bin,
                                                             unsigned long long* __restrict__ counts) {
  __shared__ unsigned int bins[kBins];
  for (int b = threadIdx.x; b < kBins; b += kThreads) bins[b] = 0;
  __syncthreads();
  unsigned int zeros = 0;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads) {
    const double a = fabs(static_cast<double>(x[i]));
    if (!(a == a)) continue;
    const int b = min(kBins - 1, static_cast<int>(a * per_bin));
    if (b == 0) ++zeros;
    else atomicAdd(&bins[b], 1u);
  }
  for (int off = 16; off > 0; off /= 2) zeros += __shfl_xor_sync(0xffffffffu, zeros, off);
  if ((threadIdx.x & 31) == 0 && zeros) atomicAdd(&bins[0], zeros);
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += kThreads)
    if (bins[b]) atomicAdd(&counts[b], static_cast<unsigned long long>(bins[b]));
}

unsigned grid(int64_t n, int limit) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads * 8 - 1) / (kThreads * 8), 1, limit));
}

int multiprocessors() {
  int device = 0, sms = 0;
  KILN_CALIBRATION_CHECK(cudaGetDevice(&device));
  KILN_CALIBRATION_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace

GpuHistogramCollector::GpuHistogramCollector(Context& context, std::vector<std::string> outputs, int gpu)
    : context_(context), outputs_(std::move(outputs)), gpu_(gpu) {
  cuda::DeviceScope scope(gpu_);
  cudaStream_t s = nullptr;
  KILN_CALIBRATION_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  const size_t n = std::max<size_t>(outputs_.size(), 1);
  KILN_CALIBRATION_CHECK(cudaMalloc(&max_abs_, n * sizeof(float)));
  KILN_CALIBRATION_CHECK(cudaMalloc(&counts_, n * kBins * sizeof(uint64_t)));
  host_max_.resize(n);
  host_counts_.resize(n * kBins);
}

GpuHistogramCollector::~GpuHistogramCollector() {
  cuda::DeviceScope scope(gpu_, /*checked=*/false);
  cudaFree(counts_);
  cudaFree(max_abs_);
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void GpuHistogramCollector::add_batch(const std::map<std::string, Tensor>& batch, std::map<std::string, AbsHistogram>& histograms) {
  cuda::DeviceScope scope(gpu_);
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  static const int sms = multiprocessors();
  for (const auto& [name, t] : batch) {
    context_.set_input_shape(name, t.shape());
    KILN_CALIBRATION_CHECK(cudaMemcpyAsync(context_.input_buffer(name), t.raw(), t.nbytes(), cudaMemcpyHostToDevice, s));
  }
  context_.enqueue(s);
  const size_t count = outputs_.size();
  std::vector<int64_t> sizes(count);
  KILN_CALIBRATION_CHECK(cudaMemsetAsync(max_abs_, 0, count * sizeof(float), s));
  for (size_t t = 0; t < count; ++t) {
    sizes[t] = shape_numel(context_.output_shape(outputs_[t]));
    if (sizes[t] == 0) continue;
    max_abs_kernel<<<grid(sizes[t], 4 * sms), kThreads, 0, s>>>(static_cast<const float*>(context_.output_buffer(outputs_[t])), sizes[t],
                                                                max_abs_ + t);
    KILN_CALIBRATION_CHECK(cudaGetLastError());
  }
  KILN_CALIBRATION_CHECK(cudaMemcpyAsync(host_max_.data(), max_abs_, count * sizeof(float), cudaMemcpyDeviceToHost, s));
  KILN_CALIBRATION_CHECK(cudaStreamSynchronize(s));

  // The host grows each range (AbsHistogram::cover), then the device counts into it.
  std::vector<bool> binned(count, false);
  KILN_CALIBRATION_CHECK(cudaMemsetAsync(counts_, 0, count * kBins * sizeof(uint64_t), s));
  for (size_t t = 0; t < count; ++t) {
    AbsHistogram& h = histograms[outputs_[t]];
    try {
      binned[t] = h.cover(host_max_[t], sizes[t]);
    } catch (Error& e) {
      e.hint("the float32 model computes an infinity at '" + outputs_[t] + "' on this calibration batch");
      throw;
    }
    if (!binned[t]) continue;
    count_abs_kernel<<<grid(sizes[t], 8 * sms), kThreads, 0, s>>>(static_cast<const float*>(context_.output_buffer(outputs_[t])),
                                                                  sizes[t], h.per_bin(), reinterpret_cast<unsigned long long*>(counts_) + t * kBins);
    KILN_CALIBRATION_CHECK(cudaGetLastError());
  }
  KILN_CALIBRATION_CHECK(cudaMemcpyAsync(host_counts_.data(), counts_, count * kBins * sizeof(uint64_t), cudaMemcpyDeviceToHost, s));
  KILN_CALIBRATION_CHECK(cudaStreamSynchronize(s));
  for (size_t t = 0; t < count; ++t)
    if (binned[t]) histograms[outputs_[t]].add_counts(host_counts_.data() + t * kBins);
}

}  // namespace kiln::calibration
