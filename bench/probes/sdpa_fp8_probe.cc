// How fast is cuDNN's fused attention in FP8 (E4M3 in and out) against its float16 form, on
// the shapes and layouts kiln's engines run? Q, K and V are views of one packed projection
// output [batch, sequence, 3, heads, head size] (what pack_attention_projections gives), the
// output [batch, sequence, heads, head size] (what the attention-output product reads).
//   fp16        float16 Q, K, V and output (kiln's fp16 tactic, attention_sdpa.cc)
//   fp16 bias   the same with an additive float16 bias [batch, 1, queries, keys] (BERT's padding
//               mask as kiln passes it); cuDNN's FP8 attention takes no bias
//   fp8         E4M3 Q, K, V and output, per-tensor descales, the probabilities quantized with
//               scale 448 (their largest value is 1), the output with the scale its float16 form
//               asks for (max |O| / 448)
// Each case is timed over back-to-back runs after a warm-up; the FP8 output, dequantized, is
// compared with the float16 output (cosine, relative L2) on the same inputs.
// Build, from the repository's root (cuDNN frontend headers from PyPI's nvidia-cudnn-frontend):
//   g++ -O2 -std=c++20 -I.venv/lib/python3.11/site-packages/include -I/usr/local/cuda/include \
//     bench/probes/sdpa_fp8_probe.cc -L/usr/local/cuda/lib64 -lcudnn -lnvrtc -lcudart -o sdpa_fp8_probe
// Run: sdpa_fp8_probe [B,H,S,D ...] (default: BERT-base b32, BERT-large b8, ViT-B/16 b1 and b128)
// Prints one line per (shape, path): mean ms, TFLOPS, and the FP8 output's fidelity.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cudnn_frontend.h>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;

#define CHECK_CUDA(x)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

#define CHECK_CUDNN(x)                                                                             \
  do {                                                                                             \
    cudnnStatus_t s_ = (x);                                                                        \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudnnGetErrorString(s_));    \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

namespace {

struct Shape {
  int64_t b, h, s, d;
};

enum Uid : int64_t { kQ = 1, kK, kV, kO, kBias, kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO, kAmaxS, kAmaxO };

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string why;
};

// Q/K/V strides over [b, h, s, d] inside the packed [b, s, 3, h, d] buffer; O's over [b, s, h, d].
std::vector<int64_t> qkv_strides(const Shape& x) { return {x.s * 3 * x.h * x.d, x.d, 3 * x.h * x.d, 1}; }
std::vector<int64_t> out_strides(const Shape& x) { return {x.s * x.h * x.d, x.d, x.h * x.d, 1}; }

Plan make_plan(const Shape& x, bool fp8, bool bias, cudnnHandle_t handle) {
  Plan plan;
  auto g = std::make_shared<fe::graph::Graph>();
  const auto io = fp8 ? fe::DataType_t::FP8_E4M3 : fe::DataType_t::HALF;
  g->set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);
  using fe::graph::Tensor_attributes;
  const std::vector<int64_t> dims = {x.b, x.h, x.s, x.d};
  auto q = g->tensor(Tensor_attributes().set_name("Q").set_uid(kQ).set_dim(dims).set_stride(qkv_strides(x)));
  auto k = g->tensor(Tensor_attributes().set_name("K").set_uid(kK).set_dim(dims).set_stride(qkv_strides(x)));
  auto v = g->tensor(Tensor_attributes().set_name("V").set_uid(kV).set_dim(dims).set_stride(qkv_strides(x)));
  const float scale = 1.f / std::sqrt(static_cast<float>(x.d));
  std::shared_ptr<Tensor_attributes> out;
  if (!fp8) {
    auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(false).set_attn_scale(scale);
    if (bias) {
      auto b = g->tensor(Tensor_attributes().set_name("bias").set_uid(kBias).set_dim({x.b, 1, x.s, x.s})
                             .set_stride({x.s * x.s, x.s * x.s, x.s, 1}));
      options.set_bias(b);
    }
    auto [o, stats] = g->sdpa(q, k, v, options);
    (void)stats;
    out = o;
  } else {
    auto scalar = [&](const char* name, int64_t uid) {
      return g->tensor(Tensor_attributes().set_name(name).set_uid(uid).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1})
                           .set_data_type(fe::DataType_t::FLOAT));
    };
    auto options = fe::graph::SDPA_fp8_attributes().set_name("attention").set_generate_stats(false).set_attn_scale(scale);
    auto [o, stats, amax_s, amax_o] =
        g->sdpa_fp8(q, k, v, scalar("descale_q", kDescaleQ), scalar("descale_k", kDescaleK), scalar("descale_v", kDescaleV),
                    scalar("descale_s", kDescaleS), scalar("scale_s", kScaleS), scalar("scale_o", kScaleO), options);
    (void)stats;
    amax_s->set_output(true).set_uid(kAmaxS).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
    amax_o->set_output(true).set_uid(kAmaxO).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
    out = o;
  }
  out->set_output(true).set_uid(kO).set_dim(dims).set_stride(out_strides(x));
  auto failed = [&](fe::error_t e, const char* step) {
    if (e.is_good()) return false;
    plan.why = std::string(step) + ": " + e.get_message();
    return true;
  };
  if (failed(g->validate(), "validate") || failed(g->build_operation_graph(handle), "operation graph") ||
      failed(g->create_execution_plans({fe::HeurMode_t::A}), "execution plans") || failed(g->check_support(handle), "support") ||
      failed(g->build_plans(handle), "build") || failed(g->get_workspace_size(plan.workspace), "workspace"))
    return plan;
  plan.graph = g;
  return plan;
}

float mean_ms(const Plan& plan, cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pack, void* workspace,
              cudaStream_t stream) {
  for (int i = 0; i < 20; ++i)
    if (!plan.graph->execute(handle, pack, workspace).is_good()) return -1.f;
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t t0, t1;
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));
  const int runs = 200;
  CHECK_CUDA(cudaEventRecord(t0, stream));
  for (int i = 0; i < runs; ++i) (void)plan.graph->execute(handle, pack, workspace);
  CHECK_CUDA(cudaEventRecord(t1, stream));
  CHECK_CUDA(cudaEventSynchronize(t1));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
  CHECK_CUDA(cudaEventDestroy(t0));
  CHECK_CUDA(cudaEventDestroy(t1));
  return ms / runs;
}

void* device_copy(const void* host, size_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  CHECK_CUDA(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
  return p;
}

void probe(const Shape& x, cudnnHandle_t handle, cudaStream_t stream) {
  const size_t packed = static_cast<size_t>(x.b * x.s * 3 * x.h * x.d), outs = static_cast<size_t>(x.b * x.s * x.h * x.d);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> qkv(packed);
  for (auto& value : qkv) value = normal(rng);
  // Q, K, V as E4M3 with one per-tensor scale (max |x| / 448), and the same values in float16,
  // so both paths see the same numbers.
  float amax = 0;
  for (float value : qkv) amax = std::fmax(amax, std::fabs(value));
  const float in_scale = amax / 448.f;
  std::vector<__nv_fp8_e4m3> qkv8(packed);
  std::vector<__half> qkv16(packed);
  for (size_t i = 0; i < packed; ++i) {
    qkv8[i] = __nv_fp8_e4m3(qkv[i] / in_scale);
    qkv16[i] = __float2half(static_cast<float>(qkv8[i]) * in_scale);
  }
  std::vector<__half> bias(static_cast<size_t>(x.b * x.s * x.s));
  for (int64_t n = 0; n < x.b; ++n)  // the last quarter of each row's keys hidden, as BERT's mask
    for (int64_t i = 0; i < x.s; ++i)
      for (int64_t j = 0; j < x.s; ++j) bias[(n * x.s + i) * x.s + j] = __float2half(j >= x.s * 3 / 4 ? -10000.f : 0.f);

  void* d_qkv16 = device_copy(qkv16.data(), packed * 2);
  void* d_qkv8 = device_copy(qkv8.data(), packed);
  void* d_bias = device_copy(bias.data(), bias.size() * 2);
  void *d_o16 = nullptr, *d_o8 = nullptr;
  CHECK_CUDA(cudaMalloc(&d_o16, outs * 2));
  CHECK_CUDA(cudaMalloc(&d_o8, outs));
  const double flops = 4.0 * x.b * x.h * x.s * x.s * x.d;
  auto report = [&](const char* path, float ms, const std::string& extra) {
    if (ms < 0) return;
    std::printf("b=%lld h=%lld s=%lld d=%lld  %-9s %8.4f ms  %6.1f TFLOPS%s\n", (long long)x.b, (long long)x.h,
                (long long)x.s, (long long)x.d, path, ms, flops / ms * 1e-9, extra.c_str());
  };
  auto workspace_for = [](const Plan& p) {
    void* w = nullptr;
    if (p.workspace > 0) CHECK_CUDA(cudaMalloc(&w, static_cast<size_t>(p.workspace)));
    return w;
  };

  const __half* h16 = static_cast<const __half*>(d_qkv16);
  const int64_t kv_offset = x.h * x.d;  // K then V follow Q in each token's packed row
  std::vector<__half> o16(outs);
  for (bool with_bias : {false, true}) {
    Plan p = make_plan(x, false, with_bias, handle);
    if (!p.graph) {
      std::printf("b=%lld h=%lld s=%lld d=%lld  %-9s declined: %s\n", (long long)x.b, (long long)x.h, (long long)x.s,
                  (long long)x.d, with_bias ? "fp16 bias" : "fp16", p.why.c_str());
      continue;
    }
    std::unordered_map<int64_t, void*> pack = {{kQ, (void*)h16}, {kK, (void*)(h16 + kv_offset)},
                                               {kV, (void*)(h16 + 2 * kv_offset)}, {kO, d_o16}};
    if (with_bias) pack[kBias] = d_bias;
    void* w = workspace_for(p);
    report(with_bias ? "fp16 bias" : "fp16", mean_ms(p, handle, pack, w, stream), "");
    if (!with_bias) {  // the unmasked float16 output is the FP8 path's reference
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_CUDA(cudaMemcpy(o16.data(), d_o16, outs * 2, cudaMemcpyDeviceToHost));
    }
    if (w) CHECK_CUDA(cudaFree(w));
  }

  Plan p = make_plan(x, true, false, handle);
  if (!p.graph) {
    std::printf("b=%lld h=%lld s=%lld d=%lld  %-9s declined: %s\n", (long long)x.b, (long long)x.h, (long long)x.s,
                (long long)x.d, "fp8", p.why.c_str());
  } else {
    float o_amax = 0;
    for (const __half& value : o16) o_amax = std::fmax(o_amax, std::fabs(__half2float(value)));
    const float out_scale = (o_amax > 0 ? o_amax : 1.f) / 448.f;
    // descale_q, descale_k, descale_v, descale_s, scale_s, scale_o; then amax_s and amax_o.
    const float scalars[8] = {in_scale, in_scale, in_scale, 1.f / 448.f, 448.f, 1.f / out_scale, 0.f, 0.f};
    float* d_scalars = static_cast<float*>(device_copy(scalars, sizeof(scalars)));
    const uint8_t* h8 = static_cast<const uint8_t*>(d_qkv8);
    std::unordered_map<int64_t, void*> pack = {
        {kQ, (void*)h8}, {kK, (void*)(h8 + kv_offset)}, {kV, (void*)(h8 + 2 * kv_offset)}, {kO, d_o8},
        {kDescaleQ, d_scalars + 0}, {kDescaleK, d_scalars + 1}, {kDescaleV, d_scalars + 2}, {kDescaleS, d_scalars + 3},
        {kScaleS, d_scalars + 4}, {kScaleO, d_scalars + 5}, {kAmaxS, d_scalars + 6}, {kAmaxO, d_scalars + 7}};
    void* w = workspace_for(p);
    const float ms = mean_ms(p, handle, pack, w, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<__nv_fp8_e4m3> o8(outs);
    CHECK_CUDA(cudaMemcpy(o8.data(), d_o8, outs, cudaMemcpyDeviceToHost));
    double dot = 0, n8 = 0, n16 = 0, diff = 0;
    for (size_t i = 0; i < outs; ++i) {
      const double a = static_cast<float>(o8[i]) * out_scale, r = __half2float(o16[i]);
      dot += a * r, n8 += a * a, n16 += r * r, diff += (a - r) * (a - r);
    }
    char extra[160];
    std::snprintf(extra, sizeof(extra), "  against fp16: cosine %.5f, relative L2 %.4f", dot / std::sqrt(n8 * n16 + 1e-30),
                  std::sqrt(diff / (n16 + 1e-30)));
    report("fp8", ms, extra);
    if (w) CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaFree(d_scalars));
  }
  for (void* ptr : {d_qkv16, d_qkv8, d_bias, d_o16, d_o8}) CHECK_CUDA(cudaFree(ptr));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    Shape x{};
    if (std::sscanf(argv[i], "%lld,%lld,%lld,%lld", (long long*)&x.b, (long long*)&x.h, (long long*)&x.s,
                    (long long*)&x.d) != 4 || x.b <= 0 || x.h <= 0 || x.s <= 0 || x.d <= 0 || x.b * x.h * x.s * x.d > (1LL << 31)) {
      std::fprintf(stderr, "sdpa_fp8_probe: '%s' is not B,H,S,D (positive, at most 2^31 elements)\n", argv[i]);
      return 2;
    }
    shapes.push_back(x);
  }
  if (shapes.empty()) shapes = {{32, 12, 128, 64}, {8, 16, 384, 64}, {1, 12, 197, 64}, {128, 12, 197, 64}};
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, cuDNN %zu\n", prop.name, cudnnGetVersion());
  cudnnHandle_t handle;
  CHECK_CUDNN(cudnnCreate(&handle));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  CHECK_CUDNN(cudnnSetStream(handle, stream));
  for (const Shape& x : shapes) probe(x, handle, stream);
  CHECK_CUDNN(cudnnDestroy(handle));
  return 0;
}
