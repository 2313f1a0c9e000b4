// Checks and times kiln's fused attention kernel (src/cuda/kernels/flash_attention.cu) on the
// layouts kiln's engines run: Q, K and V as views of one packed projection output [batch,
// sequence, 3, heads, 64], the output [batch, sequence, heads, 64]. Every case is compared with a
// float32 reference computed on the GPU (one thread per query row, the same masking rules); the
// int8 output with the reference quantized (at most one step apart). Then the shapes of BERT-base
// (b32, s128, with and without its padding mask), BERT-large (b8, s384) and ViT-B/16 (b1, b128,
// s197) are timed, float16 and int8 output (compare with bench/probes/sdpa_fp8_probe's cuDNN
// figures in the same call).
// Build, from the repository's root:
//   nvcc -O3 -std=c++20 -arch=sm_90 -I src bench/probes/flash_attention_probe.cu \
//     src/cuda/kernels/flash_attention.cu -o flash_attention_probe
// Run: flash_attention_probe [checks] (exit status 1 when a case does not match its reference;
// `checks`: the small cases only, untimed, as for compute-sanitizer).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels/flash_attention.h"

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

namespace {

using kiln::cuda::FlashAttentionProblem;

enum class MaskKind { kNone, kPaddingFloat, kPaddingLowest, kBooleanFull };

struct Case {
  std::string name;
  int64_t b, hq, hkv, sq, sk;
  bool causal = false;
  MaskKind mask = MaskKind::kNone;
  bool time = false;
};

// The reference: one thread per (batch, head, query), float32, the kernel's masking rules.
__global__ void reference_kernel(FlashAttentionProblem p, float* out) {
  const int64_t row = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t rows = p.batch * p.q_heads * p.queries;
  if (row >= rows) return;
  const int64_t i = row % p.queries, h = (row / p.queries) % p.q_heads, b = row / p.queries / p.q_heads;
  const int64_t kvh = h / (p.q_heads / p.kv_heads);
  const __half* q = static_cast<const __half*>(p.q) + b * p.q_strides[0] + h * p.q_strides[1] + i * p.q_strides[2];
  auto logit = [&](int64_t j) -> float {
    if (j >= p.keys || (p.causal && j > i)) return -INFINITY;
    const __half* k = static_cast<const __half*>(p.k) + b * p.k_strides[0] + kvh * p.k_strides[1] + j * p.k_strides[2];
    float s = 0.f;
    for (int d = 0; d < 64; ++d) s += __half2float(q[d]) * __half2float(k[d]);
    s *= p.scale;
    if (p.mask) {
      if (j >= p.mask_keys) return -INFINITY;
      const int64_t at = b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3];
      if (p.mask_boolean) {
        if (!static_cast<const bool*>(p.mask)[at]) return -INFINITY;
      } else {
        s += static_cast<const float*>(p.mask)[at];
      }
    }
    return s;
  };
  float m = -INFINITY;
  for (int64_t j = 0; j < p.keys; ++j) m = fmaxf(m, logit(j));
  float acc[64] = {};
  float sum = 0.f;
  if (m != -INFINITY) {
    for (int64_t j = 0; j < p.keys; ++j) {
      const float l = logit(j);
      if (l == -INFINITY) continue;
      const float e = expf(l - m);
      sum += e;
      const __half* v = static_cast<const __half*>(p.v) + b * p.v_strides[0] + kvh * p.v_strides[1] + j * p.v_strides[2];
      for (int d = 0; d < 64; ++d) acc[d] += e * __half2float(v[d]);
    }
  }
  for (int d = 0; d < 64; ++d) out[row * 64 + d] = sum > 0.f ? acc[d] / sum : 0.f;
}

// Y [b, s, h, 64] (the kernel's output layout here) read as rows [b, h, s] of 64.
float output_at(const std::vector<float>& y, const Case& c, int64_t b, int64_t h, int64_t i, int d) {
  return y[((b * c.sq + i) * c.hq + h) * 64 + d];
}

struct Buffers {
  __half* qkv = nullptr;  // [b, s, 3, h, 64] (Q, K, V share one sequence length: the longer one)
  void* y = nullptr;
  void* mask = nullptr;
  float* ref = nullptr;
};

FlashAttentionProblem problem_for(const Case& c, const Buffers& buf, bool int8, int warps = 4) {
  FlashAttentionProblem p;
  p.block_warps = warps;
  const int64_t s = std::max(c.sq, c.sk), h = std::max(c.hq, c.hkv);
  p.batch = c.b, p.q_heads = c.hq, p.kv_heads = c.hkv, p.queries = c.sq, p.keys = c.sk, p.head_size = 64;
  const int64_t row = 3 * h * 64;
  p.q = buf.qkv;
  p.k = buf.qkv + h * 64;
  p.v = buf.qkv + 2 * h * 64;
  for (int64_t* st : {p.q_strides, p.k_strides, p.v_strides}) st[0] = s * row, st[1] = 64, st[2] = row;
  p.y = buf.y;
  p.y_strides[0] = c.sq * c.hq * 64, p.y_strides[1] = 64, p.y_strides[2] = c.hq * 64;
  p.scale = 0.125f;
  p.causal = c.causal;
  p.y_int8 = int8;
  p.y_scale = 1.5f / 127.f;
  if (c.mask != MaskKind::kNone) {
    p.mask = buf.mask;
    p.mask_keys = c.sk;
    if (c.mask == MaskKind::kBooleanFull) {
      p.mask_boolean = true;
      p.mask_strides[0] = c.hq * c.sq * c.sk, p.mask_strides[1] = c.sq * c.sk, p.mask_strides[2] = c.sk, p.mask_strides[3] = 1;
    } else {
      // [b, 1, 1, keys], as BERT's extended attention mask.
      p.mask_strides[0] = c.sk, p.mask_strides[1] = 0, p.mask_strides[2] = 0, p.mask_strides[3] = 1;
    }
  }
  return p;
}

bool run_case(const Case& c, std::mt19937& rng) {
  const int64_t s = std::max(c.sq, c.sk), h = std::max(c.hq, c.hkv);
  const size_t qkv_elems = static_cast<size_t>(c.b * s * 3 * h * 64);
  std::vector<__half> qkv(qkv_elems);
  std::uniform_real_distribution<float> uni(-2.f, 2.f);
  for (auto& x : qkv) x = __float2half(uni(rng));
  Buffers buf;
  CHECK_CUDA(cudaMalloc(&buf.qkv, qkv_elems * sizeof(__half)));
  CHECK_CUDA(cudaMemcpy(buf.qkv, qkv.data(), qkv_elems * sizeof(__half), cudaMemcpyHostToDevice));
  const size_t y_elems = static_cast<size_t>(c.b * c.sq * c.hq * 64);
  CHECK_CUDA(cudaMalloc(&buf.y, y_elems * sizeof(__half)));
  CHECK_CUDA(cudaMalloc(&buf.ref, y_elems * sizeof(float)));
  if (c.mask == MaskKind::kBooleanFull) {
    std::vector<char> m(static_cast<size_t>(c.b * c.hq * c.sq * c.sk));
    std::bernoulli_distribution keep(0.7);
    for (auto& x : m) x = keep(rng);
    // Some rows hide every key: they give zeros.
    for (int64_t i = 0; i < c.sq; i += 5)
      for (int64_t j = 0; j < c.sk; ++j) m[static_cast<size_t>(i * c.sk + j)] = 0;
    CHECK_CUDA(cudaMalloc(&buf.mask, m.size()));
    CHECK_CUDA(cudaMemcpy(buf.mask, m.data(), m.size(), cudaMemcpyHostToDevice));
  } else if (c.mask != MaskKind::kNone) {
    const float hidden = c.mask == MaskKind::kPaddingLowest ? -3.4028234663852886e38f : -10000.f;
    std::vector<float> m(static_cast<size_t>(c.b * c.sk));
    for (int64_t b = 0; b < c.b; ++b) {
      const int64_t length = b == 0 ? c.sk : std::max<int64_t>(1, c.sk - (b * 37) % c.sk);
      for (int64_t j = 0; j < c.sk; ++j) m[static_cast<size_t>(b * c.sk + j)] = j < length ? 0.f : hidden;
    }
    CHECK_CUDA(cudaMalloc(&buf.mask, m.size() * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(buf.mask, m.data(), m.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  bool ok = true;
  const FlashAttentionProblem ref_problem = problem_for(c, buf, false);
  const int64_t rows = c.b * c.hq * c.sq;
  reference_kernel<<<static_cast<unsigned>((rows + 127) / 128), 128>>>(ref_problem, buf.ref);
  CHECK_CUDA(cudaGetLastError());
  std::vector<float> ref_rows(y_elems);
  CHECK_CUDA(cudaMemcpy(ref_rows.data(), buf.ref, y_elems * sizeof(float), cudaMemcpyDeviceToHost));
  for (int warps : {4, 8})
  for (bool int8 : {false, true}) {
    const FlashAttentionProblem p = problem_for(c, buf, int8, warps);
    const std::string label = std::string(int8 ? "int8" : "fp16") + (warps == 4 ? " w4" : " w8");
    if (const std::string why = kiln::cuda::flash_attention_unsupported(p); !why.empty()) {
      std::printf("%-28s %s: unsupported: %s\n", c.name.c_str(), label.c_str(), why.c_str());
      ok = false;
      continue;
    }
    CHECK_CUDA(cudaMemset(buf.y, 0x7f, y_elems * sizeof(__half)));  // poison
    CHECK_CUDA(kiln::cuda::launch_flash_attention(p, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> y(y_elems);
    if (int8) {
      std::vector<int8_t> raw(y_elems);
      CHECK_CUDA(cudaMemcpy(raw.data(), buf.y, y_elems, cudaMemcpyDeviceToHost));
      for (size_t e = 0; e < y_elems; ++e) y[e] = raw[e];
    } else {
      std::vector<__half> raw(y_elems);
      CHECK_CUDA(cudaMemcpy(raw.data(), buf.y, y_elems * sizeof(__half), cudaMemcpyDeviceToHost));
      for (size_t e = 0; e < y_elems; ++e) y[e] = __half2float(raw[e]);
    }
    double max_err = 0, err2 = 0, ref2 = 0, max_ref = 0;
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t hh = 0; hh < c.hq; ++hh)
        for (int64_t i = 0; i < c.sq; ++i)
          for (int d = 0; d < 64; ++d) {
            float r = ref_rows[static_cast<size_t>(((b * c.hq + hh) * c.sq + i) * 64 + d)];
            if (int8) r = std::clamp(std::nearbyint(r / p.y_scale), -128.f, 127.f);
            const float got = output_at(y, c, b, hh, i, d);
            const double e = std::fabs(double(got) - r);
            max_err = std::max(max_err, std::isnan(got) ? 1e30 : e);
            err2 += e * e, ref2 += double(r) * r, max_ref = std::max(max_ref, std::fabs(double(r)));
          }
    // float16 P and output: a few units of float16's 2^-11 of the largest output; int8: one step.
    const bool pass = int8 ? max_err <= 1.0 : max_err <= 4e-3 * std::max(1.0, max_ref);
    ok = ok && pass;
    std::printf("%-28s %s: max |error| %.3g (largest |reference| %.3g), relative L2 %.3g: %s\n", c.name.c_str(),
                label.c_str(), max_err, max_ref, ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0, pass ? "ok" : "MISMATCH");
    if (c.time && pass) {
      cudaEvent_t start, stop;
      CHECK_CUDA(cudaEventCreate(&start));
      CHECK_CUDA(cudaEventCreate(&stop));
      for (int w = 0; w < 20; ++w) CHECK_CUDA(kiln::cuda::launch_flash_attention(p, nullptr));
      const int runs = 200;
      CHECK_CUDA(cudaEventRecord(start));
      for (int r = 0; r < runs; ++r) CHECK_CUDA(kiln::cuda::launch_flash_attention(p, nullptr));
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      ms /= runs;
      const double flops = 4.0 * c.b * c.hq * c.sq * c.sk * 64;
      std::printf("%-28s %s: %.4f ms, %.1f TFLOPS\n", c.name.c_str(), label.c_str(), ms, flops / ms / 1e9);
      CHECK_CUDA(cudaEventDestroy(start));
      CHECK_CUDA(cudaEventDestroy(stop));
    }
  }
  CHECK_CUDA(cudaFree(buf.qkv));
  CHECK_CUDA(cudaFree(buf.y));
  CHECK_CUDA(cudaFree(buf.ref));
  if (buf.mask) CHECK_CUDA(cudaFree(buf.mask));
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  // "checks": only the small cases, untimed (for compute-sanitizer).
  const bool checks_only = argc > 1 && std::string(argv[1]) == "checks";
  std::mt19937 rng(7);
  const std::vector<Case> cases = {
      {"one query one key", 1, 1, 1, 1, 1},
      {"odd lengths 7x65", 2, 3, 3, 7, 65},
      {"cross 130 queries 77 keys", 2, 2, 2, 130, 77},
      {"causal 100", 2, 4, 4, 100, 100, true},
      {"causal 129 queries 200 keys", 1, 2, 2, 129, 200, true},
      {"grouped 8 over 2 heads", 2, 8, 2, 96, 96},
      {"padding -10000", 4, 3, 3, 70, 70, false, MaskKind::kPaddingFloat},
      {"padding float32 lowest", 4, 3, 3, 70, 70, false, MaskKind::kPaddingLowest},
      {"boolean mask, hidden rows", 2, 2, 2, 50, 90, false, MaskKind::kBooleanFull},
      {"BERT-base b32 s128", 32, 12, 12, 128, 128, false, MaskKind::kNone, true},
      {"BERT-base b32 s128 padding", 32, 12, 12, 128, 128, false, MaskKind::kPaddingFloat, true},
      {"BERT-large b8 s384", 8, 16, 16, 384, 384, false, MaskKind::kNone, true},
      {"ViT-B/16 b1 s197", 1, 12, 12, 197, 197, false, MaskKind::kNone, true},
      {"ViT-B/16 b128 s197", 128, 12, 12, 197, 197, false, MaskKind::kNone, true},
  };
  bool ok = true;
  for (const Case& c : cases)
    if (!(checks_only && c.time)) ok = run_case(c, rng) && ok;
  std::printf("%s\n", ok ? "all cases match" : "SOME CASES DO NOT MATCH");
  return ok ? 0 : 1;
}
