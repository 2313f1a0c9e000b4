// kiln's packed sgemm (cpu/sgemm.h) against a naive double-precision loop: many (M, N, K)
// including edge sizes around the tile sizes, with and without the epilogue (bias, residual,
// every activation kind), row-major and im2col B, one and several threads, on every kernel
// path this CPU has (the vector ones forced down through the test hook).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm_util.h"
#include "cpu/sgemm.h"

namespace kiln::cpu {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Restores the default kernel choice when a test ends, pass or fail. The transposed narrow
// path is forced wherever a PackedA has wide panels, so those tests always reach it.
struct IsaScope {
  explicit IsaScope(SgemmIsa isa) {
    sgemm_force_isa(isa);
    sgemm_set_narrow_policy(NarrowPolicy::kAlways);
  }
  ~IsaScope() {
    sgemm_reset_isa();
    sgemm_set_narrow_policy(NarrowPolicy::kAuto);
  }
};

std::vector<SgemmIsa> available_isas() {
  std::vector<SgemmIsa> isas{SgemmIsa::kPlain};
  if (sgemm_best_isa() >= SgemmIsa::kAvx2) isas.push_back(SgemmIsa::kAvx2);
  if (sgemm_best_isa() >= SgemmIsa::kAvx512) isas.push_back(SgemmIsa::kAvx512);
  return isas;
}

struct Case {
  int64_t m, n, k;
};

// act(A @ B + bias + residual) in double, then the activation in float as Epilogue defines it.
std::vector<float> reference(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n,
                             int64_t k, const float* bias, const float* residual, const ir::Activation& act) {
  std::vector<float> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = bias ? bias[i] : 0.0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * b[static_cast<size_t>(p * n + j)];
      if (residual) s += residual[i * n + j];
      c[static_cast<size_t>(i * n + j)] = act.apply(static_cast<float>(s));
    }
  return c;
}

// Max |got - want| relative to the size of the sum (K terms of magnitude <= 1).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, int64_t k, int64_t ldc, int64_t m,
                  int64_t n) {
  const double tol = 1e-5 * (static_cast<double>(k) + 4);
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float g = got[static_cast<size_t>(i * ldc + j)], w = want[static_cast<size_t>(i * n + j)];
      if (!(std::fabs(g - w) <= tol) && bad++ < 5)
        ADD_FAILURE() << "C[" << i << ", " << j << "] = " << g << ", want " << w;
    }
  EXPECT_EQ(bad, 0);
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  // Around every kernel's MR (4, 6, 8) and NR (16, 32), primes, and K blocks (320).
  for (int64_t m : {1, 3, 5, 7, 8, 9, 13, 17, 33})
    for (int64_t n : {1, 15, 17, 31, 33, 49, 67})
      for (int64_t k : {1, 2, 7, 64})
        cs.push_back({m, n, k});
  cs.push_back({37, 300, 321});   // two K blocks, several column tasks
  cs.push_back({64, 1100, 147});  // wide: column chunks over threads
  cs.push_back({70, 49, 700});    // narrow: shared B, rows split, three K blocks
  cs.push_back({130, 196, 97});
  // narrow on two threads: A smaller than B, each task packing its own columns (the last
  // panel 5 columns wide), and A the larger, B packed together and A's rows split
  cs.push_back({96, 196, 576});
  cs.push_back({40, 250, 400});
  cs.push_back({160, 49, 960});
  cs.push_back({256, 196, 100});
  // narrow on the 32-column path with A smaller than B: column chunks on two threads
  cs.push_back({40, 196, 200});
  cs.push_back({100, 150, 90});
  return cs;
}

TEST(Sgemm, MatchesNaiveLoopOnEveryKernel) {
  uint32_t seed = 1;
  for (SgemmIsa isa : available_isas()) {
    IsaScope scope(isa);
    for (const Case& c : cases())
      for (int threads : {1, 2})
        for (bool wide : {false, true}) {
        if (wide && (isa != SgemmIsa::kAvx512 || c.n > kNarrowN)) continue;
        SCOPED_TRACE(std::string(sgemm_isa_name(isa)) + " M " + std::to_string(c.m) + " N " + std::to_string(c.n) +
                     " K " + std::to_string(c.k) + " threads " + std::to_string(threads) +
                     (wide ? " (transposed narrow path)" : ""));
        std::vector<float> a = random_vector(static_cast<size_t>(c.m * c.k), seed++);
        std::vector<float> b = random_vector(static_cast<size_t>(c.k * c.n), seed++);
        // C with a wider leading dimension, so writes past N would show.
        const int64_t ldc = c.n + 3;
        std::vector<float> got(static_cast<size_t>(c.m * ldc), 1234.f);
        PackedA pa(a.data(), c.m, c.k, c.k);
        ASSERT_EQ(pa.isa(), isa);
        if (wide) pa.add_wide_panels();
        ASSERT_EQ(pa.has_wide_panels(), wide);
        SgemmB sb;
        sb.data = b.data();
        sb.ld = c.n;
        packed_sgemm(pa, c.n, sb, got.data(), ldc, SgemmEpilogue{}, threads);
        expect_close(got, reference(a, b, c.m, c.n, c.k, nullptr, nullptr, {}), c.k, ldc, c.m, c.n);
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = c.n; j < ldc; ++j) ASSERT_EQ(got[static_cast<size_t>(i * ldc + j)], 1234.f);
      }
  }
}

TEST(Sgemm, EpilogueAddsBiasResidualAndActivation) {
  uint32_t seed = 500;
  const std::vector<Case> shapes{{9, 33, 5}, {17, 49, 321}, {40, 700, 30}, {8, 32, 16}, {70, 196, 300}, {33, 49, 600}, {96, 196, 576}, {160, 49, 960}};
  for (SgemmIsa isa : available_isas()) {
    IsaScope scope(isa);
    for (const Case& c : shapes)
      for (const char* kind : {"", "Relu", "Clip", "LeakyRelu", "Sigmoid", "SiLU", "HardSwish"})
        for (bool with_bias : {false, true})
          for (bool with_residual : {false, true})
            for (bool wide : {false, true}) {
            SCOPED_TRACE(std::string(sgemm_isa_name(isa)) + " M " + std::to_string(c.m) + " N " +
                         std::to_string(c.n) + " K " + std::to_string(c.k) + " '" + kind + "' bias " +
                         std::to_string(with_bias) + " residual " + std::to_string(with_residual) +
                         (wide ? " wide" : ""));
            std::vector<float> a = random_vector(static_cast<size_t>(c.m * c.k), seed++);
            std::vector<float> b = random_vector(static_cast<size_t>(c.k * c.n), seed++);
            std::vector<float> bias = random_vector(static_cast<size_t>(c.m), seed++);
            std::vector<float> z = random_vector(static_cast<size_t>(c.m * c.n), seed++);
            ir::Activation act = ir::Activation::named(kind, std::string(kind) == "Clip" ? -0.3f : 0.1f, 0.4f);
            Epilogue epilogue(act);
            SgemmEpilogue ep;
            ep.row_bias = with_bias ? bias.data() : nullptr;
            ep.residual = with_residual ? z.data() : nullptr;
            ep.ld_residual = c.n;
            ep.act = &epilogue;
            PackedA pa(a.data(), c.m, c.k, c.k);
            if (wide) pa.add_wide_panels();
            SgemmB sb;
            sb.data = b.data();
            sb.ld = c.n;
            std::vector<float> got(static_cast<size_t>(c.m * c.n), -1.f);
            packed_sgemm(pa, c.n, sb, got.data(), c.n, ep, 2);
            expect_close(got, reference(a, b, c.m, c.n, c.k, ep.row_bias, ep.residual, act), c.k, c.n, c.m, c.n);
          }
  }
}

TEST(Sgemm, ReluMapsNanToZeroAndClipKeepsIt) {
  // Epilogue::apply's definitions, which the vector kernels must follow.
  for (SgemmIsa isa : available_isas()) {
    IsaScope scope(isa);
    std::vector<float> a{1.f, 1.f}, b{NAN, 2.f};  // A 2x1, B 1x2
    PackedA pa(a.data(), 2, 1, 1);
    SgemmB sb;
    sb.data = b.data();
    sb.ld = 2;
    for (const char* kind : {"Relu", "Clip"}) {
      Epilogue e(ir::Activation::named(kind, -1.f, 1.f));
      SgemmEpilogue ep;
      ep.act = &e;
      std::vector<float> c(4, 7.f);
      packed_sgemm(pa, 2, sb, c.data(), 2, ep, 1);
      SCOPED_TRACE(std::string(sgemm_isa_name(isa)) + " " + kind);
      if (std::string(kind) == "Relu") EXPECT_EQ(c[0], 0.f);
      else EXPECT_TRUE(std::isnan(c[0]));
      EXPECT_EQ(c[1], std::string(kind) == "Relu" ? 2.f : 1.f);
    }
  }
}

// The im2col matrix of a 2-D conv written out plainly, to feed the same product as a
// row-major B.
std::vector<float> explicit_im2col(const Im2col& g, int64_t channels) {
  const int64_t kh = g.k[1], kw = g.k[2], oh = g.out[1], ow = g.out[2], H = g.in[1], W = g.in[2];
  std::vector<float> col(static_cast<size_t>(channels * kh * kw * oh * ow));
  size_t idx = 0;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t y = 0; y < kh; ++y)
      for (int64_t x = 0; x < kw; ++x)
        for (int64_t i = 0; i < oh; ++i)
          for (int64_t j = 0; j < ow; ++j) {
            const int64_t ih = i * g.s[1] - g.p[1] + y * g.d[1], iw = j * g.s[2] - g.p[2] + x * g.d[2];
            col[idx++] = ih >= 0 && ih < H && iw >= 0 && iw < W ? g.x[(c * H + ih) * W + iw] : 0.f;
          }
  return col;
}

TEST(Sgemm, Im2colPackingMatchesExplicitColumns) {
  struct ConvCase {
    int64_t c, h, w, kh, kw, s, d, p, m;
  };
  // Strides 1, 2 and 3 (the three packing loops), padding, dilation, rows that end inside a
  // panel, outputs narrow enough for the shared-B path, and stride-2 output rows longer than
  // one 16-lane copy, with taps cut off by the padding on either side.
  const ConvCase convs[] = {{3, 17, 19, 7, 7, 2, 1, 3, 10}, {5, 9, 9, 3, 3, 1, 1, 1, 9},  {4, 11, 13, 3, 3, 3, 1, 2, 7},
                            {2, 12, 12, 3, 3, 1, 2, 2, 8},  {16, 7, 7, 3, 3, 1, 1, 1, 40}, {8, 30, 30, 1, 1, 2, 1, 0, 12},
                            {64, 4, 5, 3, 3, 1, 1, 1, 33}, {3, 40, 45, 7, 7, 2, 1, 3, 10}, {4, 21, 37, 3, 3, 2, 2, 2, 9},
                            {6, 34, 34, 3, 3, 2, 1, 1, 16}};
  uint32_t seed = 900;
  for (SgemmIsa isa : available_isas()) {
    IsaScope scope(isa);
    for (const ConvCase& cc : convs)
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(sgemm_isa_name(isa)) + " C " + std::to_string(cc.c) + " " + std::to_string(cc.h) +
                     "x" + std::to_string(cc.w) + " kernel " + std::to_string(cc.kh) + "x" + std::to_string(cc.kw) +
                     " stride " + std::to_string(cc.s) + " threads " + std::to_string(threads));
        std::vector<float> x = random_vector(static_cast<size_t>(cc.c * cc.h * cc.w), seed++);
        Im2col g;
        g.x = x.data();
        g.in[1] = cc.h;
        g.in[2] = cc.w;
        g.k[1] = cc.kh;
        g.k[2] = cc.kw;
        g.s[1] = g.s[2] = cc.s;
        g.d[1] = g.d[2] = cc.d;
        g.p[1] = g.p[2] = cc.p;
        g.out[1] = (cc.h + 2 * cc.p - (cc.kh - 1) * cc.d - 1) / cc.s + 1;
        g.out[2] = (cc.w + 2 * cc.p - (cc.kw - 1) * cc.d - 1) / cc.s + 1;
        const int64_t k = cc.c * cc.kh * cc.kw, n = g.out[1] * g.out[2];
        std::vector<float> col = explicit_im2col(g, cc.c);
        std::vector<float> a = random_vector(static_cast<size_t>(cc.m * k), seed++);
        PackedA pa(a.data(), cc.m, k, k);
        if (threads == 2) pa.add_wide_panels();  // the transposed path where it applies
        SgemmB sb;
        sb.conv = &g;
        std::vector<float> got(static_cast<size_t>(cc.m * n));
        packed_sgemm(pa, n, sb, got.data(), n, SgemmEpilogue{}, threads);
        expect_close(got, reference(a, col, cc.m, n, k, nullptr, nullptr, {}), k, n, cc.m, n);
      }
  }
}

TEST(Sgemm, EmptyDepthLeavesTheEpilogue) {
  std::vector<float> bias{1.f, -2.f};
  PackedA pa(nullptr, 2, 0, 0);
  Epilogue relu(ir::Activation{ir::ActivationKind::kRelu});
  SgemmEpilogue ep;
  ep.row_bias = bias.data();
  ep.act = &relu;
  std::vector<float> c(6, 9.f);
  SgemmB sb;
  packed_sgemm(pa, 3, sb, c.data(), 3, ep, 1);
  EXPECT_EQ(c, (std::vector<float>{1.f, 1.f, 1.f, 0.f, 0.f, 0.f}));
}

}  // namespace
}  // namespace kiln::cpu
