// Probe (not part of kiln): an INT8 depthwise convolution for NHWC int8 tensors with QConv's
// epilogue computed as the CPU reference does (src/cpu/quantized_conv.cc), checked bit for bit
// against a host loop and timed on MobileNet-v2's depthwise shapes at batch 128. The question
// for the GPU INT8 depthwise layer (issue 4): how close to the memory floor does the plainest
// kernel get? Each thread computes 16 channels (one 16-byte load per tap) of one output pixel,
// int32 sums of int8 products (no dot-product instruction applies: depthwise sums no channels).
//
//   nvcc -O3 -arch=sm_90 -std=c++17 bench/probes/int8_depthwise_probe.cu -o build-gpu/probes/int8_depthwise_probe
//   build-gpu/probes/int8_depthwise_probe            # prints one line per shape
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK(call)                                                                           \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

struct Shape {
  int n, c, h, w, k, stride, pad;  // k x k filter
  __host__ __device__ int oh() const { return (h + 2 * pad - k) / stride + 1; }
  __host__ __device__ int ow() const { return (w + 2 * pad - k) / stride + 1; }
};

// x: [n, h, w, c] int8; wt: [k*k][c] int8 (tap-major); y: [n, oh, ow, c] int8.
__global__ void depthwise_int8(const int8_t* __restrict__ x, const int8_t* __restrict__ wt, const float* __restrict__ mult,
                               const float* __restrict__ bias, int8_t* __restrict__ y, Shape s, float inv_y_scale, bool relu) {
  const int groups = s.c / 16;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pixels = static_cast<int64_t>(s.n) * s.oh() * s.ow();
  if (t >= pixels * groups) return;
  const int cg = static_cast<int>(t % groups);
  const int64_t p = t / groups;
  const int ow = static_cast<int>(p % s.ow()), oh = static_cast<int>(p / s.ow() % s.oh()), n = static_cast<int>(p / (s.ow() * s.oh()));
  const int c0 = cg * 16;
  int acc[16] = {};
  for (int r = 0; r < s.k; ++r) {
    const int ih = oh * s.stride - s.pad + r;
    if (ih < 0 || ih >= s.h) continue;
    for (int q = 0; q < s.k; ++q) {
      const int iw = ow * s.stride - s.pad + q;
      if (iw < 0 || iw >= s.w) continue;
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + ((static_cast<int64_t>(n) * s.h + ih) * s.w + iw) * s.c + c0));
      const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wt + static_cast<int64_t>(r * s.k + q) * s.c + c0));
      const int8_t* xb = reinterpret_cast<const int8_t*>(&xv);
      const int8_t* wb = reinterpret_cast<const int8_t*>(&wv);
#pragma unroll
      for (int i = 0; i < 16; ++i) acc[i] += int{xb[i]} * int{wb[i]};
    }
  }
  uint4 out;
  int8_t* ob = reinterpret_cast<int8_t*>(&out);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float v = __fmaf_rn(__int2float_rn(acc[i]), mult[c0 + i], bias[c0 + i]);
    if (relu) v = fmaxf(v, 0.f);
    int q;
    asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(q) : "f"(__fmul_rn(v, inv_y_scale)));
    ob[i] = static_cast<int8_t>(q);
  }
  *reinterpret_cast<uint4*>(y + p * s.c + c0) = out;
}

void reference(const std::vector<int8_t>& x, const std::vector<int8_t>& wt, const std::vector<float>& mult,
               const std::vector<float>& bias, std::vector<int8_t>& y, const Shape& s, float inv, bool relu) {
  for (int n = 0; n < s.n; ++n)
    for (int oh = 0; oh < s.oh(); ++oh)
      for (int ow = 0; ow < s.ow(); ++ow)
        for (int c = 0; c < s.c; ++c) {
          int acc = 0;
          for (int r = 0; r < s.k; ++r)
            for (int q = 0; q < s.k; ++q) {
              const int ih = oh * s.stride - s.pad + r, iw = ow * s.stride - s.pad + q;
              if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
              acc += int{x[((static_cast<size_t>(n) * s.h + ih) * s.w + iw) * s.c + c]} * wt[static_cast<size_t>(r * s.k + q) * s.c + c];
            }
          float v = std::fma(static_cast<float>(acc), mult[c], bias[c]);
          if (relu) v = v > 0.f ? v : 0.f;
          y[((static_cast<size_t>(n) * s.oh() + oh) * s.ow() + ow) * s.c + c] =
              static_cast<int8_t>(std::fmin(std::fmax(std::nearbyint(v * inv), -128.f), 127.f));
        }
}

int main() {
  // MobileNet-v2's depthwise convolutions at 224 px (batch set below).
  const Shape shapes[] = {{0, 32, 112, 112, 3, 1, 1}, {0, 96, 112, 112, 3, 2, 1}, {0, 144, 56, 56, 3, 1, 1},
                          {0, 144, 56, 56, 3, 2, 1},  {0, 192, 28, 28, 3, 1, 1},  {0, 192, 28, 28, 3, 2, 1},
                          {0, 384, 14, 14, 3, 1, 1},  {0, 576, 14, 14, 3, 1, 1},  {0, 576, 14, 14, 3, 2, 1},
                          {0, 960, 7, 7, 3, 1, 1}};
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> byte(-128, 127), weight(-127, 127);
  std::uniform_real_distribution<float> scale(2e-4f, 1e-3f), offset(-0.2f, 0.2f);
  bool all_exact = true;
  for (Shape s : shapes) {
    for (int batch : {2, 128}) {
      s.n = batch;
      const size_t xs = static_cast<size_t>(s.n) * s.h * s.w * s.c, ys = static_cast<size_t>(s.n) * s.oh() * s.ow() * s.c;
      std::vector<int8_t> x(xs), wt(static_cast<size_t>(s.k * s.k * s.c)), y(ys), want(ys);
      std::vector<float> mult(static_cast<size_t>(s.c)), bias(static_cast<size_t>(s.c));
      for (auto& v : x) v = static_cast<int8_t>(byte(rng));
      for (auto& v : wt) v = static_cast<int8_t>(weight(rng));
      for (auto& v : mult) v = scale(rng);
      for (auto& v : bias) v = offset(rng);
      const float inv = 1.f / 0.05f;
      int8_t *dx, *dw, *dy;
      float *dm, *db;
      CHECK(cudaMalloc(&dx, xs));
      CHECK(cudaMalloc(&dw, wt.size()));
      CHECK(cudaMalloc(&dy, ys));
      CHECK(cudaMalloc(&dm, mult.size() * 4));
      CHECK(cudaMalloc(&db, bias.size() * 4));
      CHECK(cudaMemcpy(dx, x.data(), xs, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(dw, wt.data(), wt.size(), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(dm, mult.data(), mult.size() * 4, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(db, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
      const int64_t threads = static_cast<int64_t>(s.n) * s.oh() * s.ow() * (s.c / 16);
      const unsigned blocks = static_cast<unsigned>((threads + 255) / 256);
      auto launch = [&] { depthwise_int8<<<blocks, 256>>>(dx, dw, dm, db, dy, s, inv, true); };
      launch();
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      if (batch == 2) {
        CHECK(cudaMemcpy(y.data(), dy, ys, cudaMemcpyDeviceToHost));
        reference(x, wt, mult, bias, want, s, inv, true);
        size_t differ = 0;
        for (size_t i = 0; i < ys; ++i) differ += y[i] != want[i];
        all_exact = all_exact && differ == 0;
        std::printf("c=%d %dx%d s%d: %zu of %zu outputs differ from the host reference\n", s.c, s.h, s.w, s.stride, differ, ys);
      } else {
        cudaEvent_t a, b;
        CHECK(cudaEventCreate(&a));
        CHECK(cudaEventCreate(&b));
        for (int i = 0; i < 10; ++i) launch();
        CHECK(cudaEventRecord(a));
        const int runs = 50;
        for (int i = 0; i < runs; ++i) launch();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        ms /= runs;
        std::printf("batch 128 c=%d %dx%d s%d: %.4f ms, %.0f GB/s (input + output bytes)\n", s.c, s.h, s.w, s.stride, ms,
                    (xs + ys) / (ms * 1e6));
        CHECK(cudaEventDestroy(a));
        CHECK(cudaEventDestroy(b));
      }
      CHECK(cudaFree(dx));
      CHECK(cudaFree(dw));
      CHECK(cudaFree(dy));
      CHECK(cudaFree(dm));
      CHECK(cudaFree(db));
    }
  }
  std::printf(all_exact ? "all exact\n" : "MISMATCH\n");
  return all_exact ? 0 : 1;
}
