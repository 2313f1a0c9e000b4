// sgemm_bench: kiln's packed sgemm (cpu/sgemm.h) against OpenBLAS on ResNet-50's and BERT-base's
// GEMM shapes.
//
//   sgemm_bench [--reps N] [--threads N] [--only M,N,K[,residual]] [--rows M,N,K] [--bf16-rows M,N,K]
//
// --only times one GEMM shape alone (for a change to the kernel or its threading): kiln with B, C
// and the residual (with ",residual": bias + residual + Relu, as a bottleneck's last 1x1 conv)
// in cache ("warm") and cycled through copies adding up to 256 MB ("cold", as a model's layers
// meet their activations), best of --reps. --rows times rows_sgemm (MatMul and Gemm by constant
// weights: X's rows by packed W) the same way; --bf16-rows times bf16_rows_gemm (cpu/bf16_gemm.h,
// the products of a --bf16 CPU build) on the best bfloat16 kernel this CPU has.
//
// For each (M, N, K) prints GFLOP/s of kiln (A pre-packed, B a plain row-major matrix packed
// per call) and of cblas_sgemm, both on --threads threads (default: the CPUs the process may run
// on; OpenBLAS single-threaded per call, split over columns the way gemm_util's parallel_sgemm
// does).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/bf16_gemm.h"
#include "cpu/conv_shape.h"
#include "cpu/conv_winograd.h"
#include "cpu/gemm_util.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"

using namespace kiln::cpu;

namespace {

template <typename F>
double best_seconds(int reps, F&& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The best of `reps` runs of run(0) (warm: one set of operands, in cache) and of runs cycling
// through the `copies` sets (cold), in seconds.
template <typename F>
std::pair<double, double> warm_and_cold(int reps, int copies, F&& run) {
  const double warm = best_seconds(reps, [&] { run(0); });
  int next = 0;
  const double cold = best_seconds(reps, [&] {
    run(next);
    next = (next + 1) % copies;
  });
  return {warm, cold};
}

// --only M,N,K[,residual]: one shape, warm and cold (see the top of the file).
int time_one_shape(const std::string& spec, int reps, int threads) {
  long m = 0, n = 0, k = 0;
  char extra[16] = {0};
  const int fields = std::sscanf(spec.c_str(), "%ld,%ld,%ld,%15s", &m, &n, &k, extra);
  const bool residual = fields == 4 && std::string(extra) == "residual";
  if (fields < 3 || m <= 0 || n <= 0 || k <= 0 || (fields == 4 && !residual) || m * n > (1L << 26) || k * n > (1L << 26) ||
      m * k > (1L << 26)) {
    std::fprintf(stderr, "sgemm_bench: --only wants M,N,K[,residual] with each product of two at most 2^26, not '%s'\n",
                 spec.c_str());
    return 2;
  }
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> a(static_cast<size_t>(m * k)), bias(static_cast<size_t>(m));
  for (float& v : a) v = dist(rng);
  for (float& v : bias) v = dist(rng);
  PackedA pa(a.data(), m, k, k);
  if (n <= kNarrowN) pa.add_wide_panels();
  // One set of B, C and residual per copy; enough copies that a cycle through them leaves the caches.
  const int64_t set_floats = k * n + 2 * m * n;
  const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t{256} << 20) / (set_floats * 4)));
  std::vector<std::vector<float>> sets(static_cast<size_t>(copies));
  for (auto& set : sets) {
    set.resize(static_cast<size_t>(set_floats));
    for (float& v : set) v = dist(rng);
  }
  const Epilogue relu{kiln::ir::Activation{kiln::ir::ActivationKind::kRelu}};
  auto run = [&](int i) {
    float* set = sets[static_cast<size_t>(i)].data();
    SgemmB sb;
    sb.data = set;
    sb.ld = n;
    SgemmEpilogue ep;
    if (residual) {
      ep.row_bias = bias.data();
      ep.residual = set + k * n + m * n;
      ep.ld_residual = n;
      ep.act = &relu;
    }
    packed_sgemm(pa, n, sb, set + k * n, n, ep, threads);
  };
  const double flop = 2.0 * static_cast<double>(m * n * k);
  const auto [warm, cold] = warm_and_cold(reps, copies, run);
  std::printf("M %5ld N %5ld K %5ld%s, %d threads: warm %6.1f GFLOP/s (%.3f ms)   cold %6.1f GFLOP/s (%.3f ms)\n", m, n, k,
              residual ? " + bias, residual, relu" : "", threads, flop / warm * 1e-9, warm * 1e3, flop / cold * 1e-9,
              cold * 1e3);
  return 0;
}

// --rows M,N,K: rows_sgemm, as MatMul and Gemm by constant weights run it (X [M x K] by W [K x N],
// packed once), warm and with X, W and Y cycled through copies adding up to 256 MB. --bf16-rows
// (bf16 true): bf16_rows_gemm the same way.
int time_rows_shape(const std::string& spec, int reps, int threads, bool bf16) {
  long m = 0, n = 0, k = 0;
  if (std::sscanf(spec.c_str(), "%ld,%ld,%ld", &m, &n, &k) != 3 || m <= 0 || n <= 0 || k <= 0 || m * n > (1L << 26) ||
      k * n > (1L << 26) || m * k > (1L << 26)) {
    std::fprintf(stderr, "sgemm_bench: --rows wants M,N,K with each product of two at most 2^26, not '%s'\n", spec.c_str());
    return 2;
  }
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const int64_t set_floats = m * k + m * n;
  const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t{256} << 20) / ((set_floats + k * n) * 4)));
  std::vector<std::vector<float>> sets(static_cast<size_t>(copies));
  std::vector<PackedColumns> weights(static_cast<size_t>(copies));
  std::vector<Bf16PackedColumns> bf16_weights(static_cast<size_t>(copies));
  std::vector<float> w(static_cast<size_t>(k * n));
  const Bf16GemmIsa isa = bf16_gemm_isa();
  if (bf16 && isa == Bf16GemmIsa::kNone) {
    std::fprintf(stderr, "sgemm_bench: this CPU has no bfloat16 products (AVX512-BF16 or AMX-BF16)\n");
    return 2;
  }
  for (int c = 0; c < copies; ++c) {
    for (float& v : w) v = dist(rng);
    if (bf16) bf16_weights[static_cast<size_t>(c)].pack(isa, w.data(), k, n, n);
    else weights[static_cast<size_t>(c)].pack(w.data(), k, n, n);
    sets[static_cast<size_t>(c)].resize(static_cast<size_t>(set_floats));
    for (float& v : sets[static_cast<size_t>(c)]) v = dist(rng);
  }
  auto run = [&](int i) {
    float* set = sets[static_cast<size_t>(i)].data();
    if (bf16)
      bf16_rows_gemm(bf16_weights[static_cast<size_t>(i)], m, set, k, set + m * k, n, nullptr, nullptr, 0, nullptr, threads);
    else
      rows_sgemm(weights[static_cast<size_t>(i)], m, set, k, set + m * k, n, nullptr, nullptr, 0, nullptr, threads);
  };
  const double flop = 2.0 * static_cast<double>(m * n * k);
  const auto [warm, cold] = warm_and_cold(reps, copies, run);
  std::printf("%s M %5ld N %5ld K %5ld, %d threads: warm %6.1f GFLOP/s (%.3f ms)   cold %6.1f GFLOP/s (%.3f ms)\n",
              bf16 ? bf16_gemm_isa_name(isa) : "rows", m, n, k, threads, flop / warm * 1e-9, warm * 1e3, flop / cold * 1e-9, cold * 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--reps") reps = std::stoi(argv[++i]);
    else if (std::string(argv[i]) == "--threads") set_thread_count(std::stoi(argv[++i]));
  }
  use_single_threaded_blas();
  const int threads = thread_count();
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--only") return time_one_shape(argv[i + 1], reps, threads);
    if (std::string(argv[i]) == "--rows") return time_rows_shape(argv[i + 1], reps, threads, false);
    if (std::string(argv[i]) == "--bf16-rows") return time_rows_shape(argv[i + 1], reps, threads, true);
  }
  struct Shape {
    int64_t m, n, k;
  };
  // ResNet-50 at batch 1: (out channels, output positions, in channels * kernel size); then
  // BERT-base's.
  const Shape shapes[] = {{64, 12544, 147}, {64, 3136, 64},   {64, 3136, 576},  {256, 3136, 64},
                          {128, 784, 1152}, {512, 784, 128},  {256, 196, 2304}, {1024, 196, 256}, {256, 196, 1024},
                          {512, 49, 4608},  {2048, 49, 512},  {512, 49, 2048}, {2048, 49, 1024},
                          // BERT-base's products at batch 1, sequence 128, as MatMul runs them
                          // (Y^T = W^T X^T): (out features, tokens, in features).
                          {768, 128, 768},  {3072, 128, 768}, {768, 128, 3072}};
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::printf("isa %s, %d threads\n", sgemm_isa_name(sgemm_isa()), threads);
  for (const Shape& s : shapes) {
    std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)),
        c(static_cast<size_t>(s.m * s.n));
    for (float& v : a) v = dist(rng);
    for (float& v : b) v = dist(rng);
    PackedA pa(a.data(), s.m, s.k, s.k);
    if (s.n <= kNarrowN) pa.add_wide_panels();  // as Conv does
    SgemmB sb;
    sb.data = b.data();
    sb.ld = s.n;
    const double flop = 2.0 * static_cast<double>(s.m * s.n * s.k);
    auto kiln = [&] { packed_sgemm(pa, s.n, sb, c.data(), s.n, SgemmEpilogue{}, threads); };
    double tk = best_seconds(reps, kiln);
    // Narrow outputs: both of kiln's paths, whatever the cost model picks.
    double t32 = 0, t7 = 0;
    if (s.n <= kNarrowN) {
      sgemm_set_narrow_policy(NarrowPolicy::kNever);
      t32 = best_seconds(reps, kiln);
      sgemm_set_narrow_policy(NarrowPolicy::kAlways);
      t7 = best_seconds(reps, kiln);
      sgemm_set_narrow_policy(NarrowPolicy::kAuto);
    }
    double tb = best_seconds(reps, [&] {
      parallel_sgemm(false, false, s.m, s.n, s.k, 1.f, a.data(), s.k, b.data(), s.n, 0.f, c.data(), s.n);
    });
    std::printf("M %5ld N %5ld K %5ld   kiln %6.1f GFLOP/s   openblas %6.1f GFLOP/s", static_cast<long>(s.m),
                static_cast<long>(s.n), static_cast<long>(s.k), flop / tk * 1e-9, flop / tb * 1e-9);
    if (t32 > 0) std::printf("   (32-column path %6.1f, transposed 7x32 path %6.1f)", flop / t32 * 1e-9, flop / t7 * 1e-9);
    std::printf("\n");
  }
  // The epilogue's cost on ResNet-50's stage-1 expansion (1x1, 64 -> 256 at 56x56, K = 64: the
  // residual and output are 3.2 MB each): none, the bias, the bias and the residual, and Relu.
  {
    const int64_t m = 256, n = 3136, k = 64;
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n)),
        z(static_cast<size_t>(m * n)), bias(static_cast<size_t>(m));
    for (float& v : a) v = dist(rng);
    for (float& v : b) v = dist(rng);
    for (float& v : z) v = dist(rng);
    for (float& v : bias) v = dist(rng);
    PackedA pa(a.data(), m, k, k);
    SgemmB sb;
    sb.data = b.data();
    sb.ld = n;
    const Epilogue relu{kiln::ir::Activation{kiln::ir::ActivationKind::kRelu}};
    const double flop = 2.0 * static_cast<double>(m * n * k);
    std::printf("epilogue M %ld N %ld K %ld:", static_cast<long>(m), static_cast<long>(n), static_cast<long>(k));
    for (int parts = 0; parts < 4; ++parts) {
      SgemmEpilogue ep;
      if (parts >= 1) ep.row_bias = bias.data();
      if (parts >= 2) {
        ep.residual = z.data();
        ep.ld_residual = n;
      }
      if (parts >= 3) ep.act = &relu;
      const double t = best_seconds(reps, [&] { packed_sgemm(pa, n, sb, c.data(), n, ep, threads); });
      static const char* names[] = {"none", "+bias", "+residual", "+relu"};
      std::printf("   %s %6.1f", names[parts], flop / t * 1e-9);
    }
    std::printf(" GFLOP/s\n");
  }
  // ResNet-50's convolutions at batch 1 as Conv runs them: B is the im2col matrix, packed from
  // the image while the GEMM runs. "warm" repeats one set of weights; "cold" cycles through
  // copies adding up to 512 MB, as an engine's layers each read their own weights once per run.
  struct ConvShape {
    int64_t c, m, in, k, stride, pad, batch = 1;
  };
  const ConvShape convs[] = {{3, 64, 224, 7, 2, 3},     {64, 64, 56, 3, 1, 1},    {128, 128, 56, 3, 2, 1},
                             {128, 128, 28, 3, 1, 1},   {256, 256, 28, 3, 2, 1},  {256, 256, 14, 3, 1, 1},
                             {512, 512, 14, 3, 2, 1},   {512, 512, 7, 3, 1, 1},   {256, 512, 56, 1, 2, 0},
                             {512, 1024, 28, 1, 2, 0},  {1024, 2048, 14, 1, 2, 0},
                             // batch 8: images one per thread on the direct path, as Conv runs them
                             {64, 64, 56, 3, 1, 1, 8},  {256, 256, 14, 3, 1, 1, 8}, {512, 512, 7, 3, 1, 1, 8}};
  for (const ConvShape& s : convs) {
    const int64_t out = (s.in + 2 * s.pad - s.k) / s.stride + 1, n = out * out, kk = s.c * s.k * s.k;
    std::vector<float> x(static_cast<size_t>(s.batch * s.c * s.in * s.in)), w(static_cast<size_t>(s.m * kk)),
        y(static_cast<size_t>(s.batch * s.m * n));
    for (float& v : x) v = dist(rng);
    for (float& v : w) v = dist(rng);
    const int copies = static_cast<int>(std::max<int64_t>(1, (int64_t{512} << 20) / (s.m * kk * 4)));
    std::vector<PackedA> packed(static_cast<size_t>(copies));
    for (PackedA& p : packed) {
      p.pack(w.data(), s.m, kk, kk);
      if (n <= kNarrowN) p.add_wide_panels();
    }
    Im2col im;
    im.x = x.data();
    im.in[1] = im.in[2] = s.in;
    im.out[1] = im.out[2] = out;
    im.k[1] = im.k[2] = s.k;
    im.s[1] = im.s[2] = s.stride;
    im.p[1] = im.p[2] = s.pad;
    SgemmB sb;
    sb.conv = &im;
    const double flop = 2.0 * static_cast<double>(s.batch * s.m * n * kk);
    auto direct = [&](const PackedA& pa) {
      if (s.batch == 1) {
        packed_sgemm(pa, n, sb, y.data(), n, SgemmEpilogue{}, threads);
        return;
      }
      parallel_for_each(s.batch, true, [&](int64_t b) {
        Im2col image = im;
        image.x = x.data() + b * s.c * s.in * s.in;
        SgemmB ib;
        ib.conv = &image;
        packed_sgemm(pa, n, ib, y.data() + b * s.m * n, n, SgemmEpilogue{}, 1);
      }, 1);
    };
    const double warm = best_seconds(reps, [&] { direct(packed[0]); });
    int next = 0;
    const double cold = best_seconds(reps, [&] {
      direct(packed[static_cast<size_t>(next)]);
      next = (next + 1) % copies;
    });
    std::printf("conv batch %ld C %4ld M %4ld in %3ld k %ld s %ld: M %5ld N %5ld K %5ld   warm %6.1f GFLOP/s   cold %6.1f GFLOP/s",
                static_cast<long>(s.batch), static_cast<long>(s.c), static_cast<long>(s.m), static_cast<long>(s.in),
                static_cast<long>(s.k), static_cast<long>(s.stride), static_cast<long>(s.m), static_cast<long>(n),
                static_cast<long>(kk), flop / warm * 1e-9, flop / cold * 1e-9);
    // The same convolution by Winograd F(2x2, 3x3), in the direct convolution's FLOPs per second
    // (warm), with the image's tiles in phases over the whole image and in blocks per thread.
    const std::vector<int64_t> w_shape{s.m, s.c, s.k, s.k};
    Geo3 geo;
    geo.batch = s.batch;
    geo.in_c = s.c;
    geo.out_c = s.m;
    geo.in[1] = geo.in[2] = s.in;
    geo.out[1] = geo.out[2] = out;
    geo.k[1] = geo.k[2] = s.k;
    geo.s[1] = geo.s[2] = s.stride;
    geo.p[1] = geo.p[2] = s.pad;
    if (WinogradConv::available(w_shape, 1) && WinogradConv::runs_geometry(geo)) {
      WinogradConv wino(w.data(), s.m, s.c);
      const Epilogue none;
      for (WinogradSchedule schedule : {WinogradSchedule::kImagePhases, WinogradSchedule::kThreadBlocks}) {
        winograd_set_schedule(schedule);
        const double t = best_seconds(reps, [&] { wino.run(geo, x.data(), nullptr, nullptr, none, y.data()); });
        std::printf("   winograd %s %6.1f", schedule == WinogradSchedule::kImagePhases ? "phases" : "blocks", flop / t * 1e-9);
      }
      winograd_set_schedule(WinogradSchedule::kAuto);
    }
    std::printf("\n");
  }
  // MatMul by constant weights on AVX-512 (rows_sgemm): Y [tokens x out] = X [tokens x in] @ W.
  // "warm" repeats one W; "cold" cycles through copies of W adding up to 512 MB, as a model's
  // layers each read their own weights once per run.
  if (sgemm_isa() == SgemmIsa::kAvx512) {
    const Shape bert[] = {{768, 128, 768}, {3072, 128, 768}, {768, 128, 3072}, {768, 1, 768}, {3072, 32, 768}};
    for (const Shape& s : bert) {
      const int64_t out = s.m, tokens = s.n, in = s.k;
      std::vector<float> x(static_cast<size_t>(tokens * in)), w(static_cast<size_t>(in * out)),
          y(static_cast<size_t>(tokens * out));
      for (float& v : x) v = dist(rng);
      for (float& v : w) v = dist(rng);
      const int copies = static_cast<int>(std::max<int64_t>(1, (int64_t{512} << 20) / (in * out * 4)));
      std::vector<PackedColumns> packed(static_cast<size_t>(copies));
      for (PackedColumns& p : packed) p.pack(w.data(), in, out, out);
      const double flop = 2.0 * static_cast<double>(out * tokens * in);
      const double warm = best_seconds(reps, [&] {
        rows_sgemm(packed[0], tokens, x.data(), in, y.data(), out, nullptr, nullptr, 0, nullptr, threads);
      });
      int next = 0;
      const double cold = best_seconds(reps, [&] {
        rows_sgemm(packed[static_cast<size_t>(next)], tokens, x.data(), in, y.data(), out, nullptr, nullptr, 0, nullptr,
                   threads);
        next = (next + 1) % copies;
      });
      std::printf("rows_sgemm tokens %4ld in %5ld out %5ld   warm %6.1f GFLOP/s   cold %6.1f GFLOP/s\n",
                  static_cast<long>(tokens), static_cast<long>(in), static_cast<long>(out), flop / warm * 1e-9,
                  flop / cold * 1e-9);
    }
  }
  return 0;
}
