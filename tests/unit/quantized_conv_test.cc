// kiln::QConv, the INT8 convolution: the CPU kernel (the integer reference the GPU is tested
// against) against the op's definition computed naively, on its portable loop and on every int8
// GEMM this CPU runs (cpu/int8_gemm.h), and the INT8 pass (compiler/quantize_graph.h) on a
// small residual network.
#include <cpuid.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <set>

#include "compute_test_util.h"
#include "cpu/amx.h"
#include "cpu/engine.h"
#include "cpu/int8_gemm.h"
#include "graph_builder.h"
#include "ir/activation.h"
#include "ir/op_schema.h"
#include "compiler/quantize_graph.h"

namespace kiln {
namespace {

Tensor random_int8(std::vector<int64_t> shape, uint32_t seed, int lo = -128, int hi = 127) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  Tensor t(DType::kInt8, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int8_t>()[i] = static_cast<int8_t>(dist(rng));
  return t;
}

// The largest |x| of a float tensor (a symmetric INT8 scale is this / 127).
float amax(const Tensor& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data<float>()[i]));
  return m;
}

// |got - want| / |want| over all elements (L2 norms).
double relative_l2(const Tensor& got, const Tensor& want) {
  double err = 0, norm = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = got.data<float>()[i] - want.data<float>()[i];
    err += d * d;
    norm += double{want.data<float>()[i]} * want.data<float>()[i];
  }
  return std::sqrt(err / norm);
}

struct Case {
  int64_t n, c, h, w, m, k, stride, pad;
  bool z = false, z_int8 = false, y_int8 = true, relu = true;
  int64_t group = 1;
  int64_t dilation = 1;
  std::string activation;  // in place of relu when set
  float y_scale = 0.047f;

  int64_t out_h() const { return (h + 2 * pad - dilation * (k - 1) - 1) / stride + 1; }
  int64_t out_w() const { return (w + 2 * pad - dilation * (k - 1) - 1) / stride + 1; }
  ir::Activation act() const { return ir::Activation::named(activation.empty() ? (relu ? "Relu" : "") : activation, 0.f, 6.f); }
};

// The int8 GEMMs this CPU runs, the portable loop (kNone) first; restores the default after.
struct Int8IsaScope {
  explicit Int8IsaScope(cpu::Int8GemmIsa isa) { cpu::int8_gemm_force_isa(isa); }
  ~Int8IsaScope() { cpu::int8_gemm_reset_isa(); }
};

std::vector<cpu::Int8GemmIsa> int8_isas() {
  std::vector<cpu::Int8GemmIsa> isas{cpu::Int8GemmIsa::kNone};
  for (cpu::Int8GemmIsa isa : {cpu::Int8GemmIsa::kAvx2, cpu::Int8GemmIsa::kAvxVnni, cpu::Int8GemmIsa::kAvx512Vnni, cpu::Int8GemmIsa::kAmx})
    if (cpu::int8_gemm_best_isa() >= isa) isas.push_back(isa);
  return isas;
}

// The op's definition, one output element at a time: the window's int8 products summed
// exactly, then the float32 epilogue in the order src/ops/quantized_conv.cc gives.
Tensor reference_qconv(const Case& cs, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor* z, float x_scale,
                       const std::vector<float>& w_scales, float z_scale, float y_scale) {
  const int64_t oh = cs.out_h(), ow = cs.out_w();
  const ir::Activation act = cs.act();
  Tensor y(cs.y_int8 ? DType::kInt8 : DType::kFloat32, {cs.n, cs.m, oh, ow});
  for (int64_t n = 0; n < cs.n; ++n)
    for (int64_t m = 0; m < cs.m; ++m)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          int64_t acc = 0;
          const int64_t cg = cs.c / cs.group, first = m / (cs.m / cs.group) * cg;  // this output's group
          for (int64_t c = first; c < first + cg; ++c)
            for (int64_t a = 0; a < cs.k; ++a)
              for (int64_t e = 0; e < cs.k; ++e) {
                const int64_t yi = i * cs.stride - cs.pad + a * cs.dilation, xj = j * cs.stride - cs.pad + e * cs.dilation;
                if (yi < 0 || yi >= cs.h || xj < 0 || xj >= cs.w) continue;
                acc += int64_t{x.data<int8_t>()[((n * cs.c + c) * cs.h + yi) * cs.w + xj]} *
                       w.data<int8_t>()[((m * cg + c - first) * cs.k + a) * cs.k + e];
              }
          const int64_t at = ((n * cs.m + m) * oh + i) * ow + j;
          const float mult = x_scale * w_scales[static_cast<size_t>(m)];
          float v = std::fma(static_cast<float>(acc), mult, b.data<float>()[m]);
          if (z) v += cs.z_int8 ? static_cast<float>(z->data<int8_t>()[at]) * z_scale : z->data<float>()[at];
          v = act.apply(v);
          if (cs.y_int8) y.data<int8_t>()[at] = static_cast<int8_t>(std::clamp(std::nearbyint(v * (1.f / y_scale)), -128.f, 127.f));
          else y.data<float>()[at] = v;
        }
  return y;
}

void check_case(const Case& cs, uint32_t seed) {
  const int64_t oh = cs.out_h(), ow = cs.out_w();
  Tensor x = random_int8({cs.n, cs.c, cs.h, cs.w}, seed);
  Tensor w = random_int8({cs.m, cs.c / cs.group, cs.k, cs.k}, seed + 1, -127, 127);
  Tensor b = testing::random_tensor({cs.m}, seed + 2);
  std::vector<float> w_scales(static_cast<size_t>(cs.m));
  std::mt19937 rng(seed + 3);
  std::uniform_real_distribution<float> ws(1e-3f, 1e-2f);
  for (float& s : w_scales) s = ws(rng);
  const float x_scale = 0.021f, z_scale = 0.033f, y_scale = cs.y_scale;
  Tensor z = cs.z_int8 ? random_int8({cs.n, cs.m, oh, ow}, seed + 4) : testing::random_tensor({cs.n, cs.m, oh, ow}, seed + 4);

  ir::Node node;
  node.op = "QConv";
  node.domain = "kiln";
  node.attrs.set("kernel_shape", std::vector<int64_t>{cs.k, cs.k});
  node.attrs.set("group", cs.group);
  node.attrs.set("strides", std::vector<int64_t>{cs.stride, cs.stride});
  node.attrs.set("pads", std::vector<int64_t>{cs.pad, cs.pad, cs.pad, cs.pad});
  node.attrs.set("dilations", std::vector<int64_t>{cs.dilation, cs.dilation});
  const ir::Activation act = cs.act();
  act.store(node);
  node.attrs.set("x_scale", x_scale);
  node.attrs.set("w_scales", w_scales);
  if (cs.z_int8) node.attrs.set("z_scale", z_scale);
  if (cs.y_int8) node.attrs.set("y_scale", y_scale);
  std::vector<testing::NodeInput> inputs = {{"X", x}, {"W", w, true}, {"B", b, true}};
  if (cs.z) inputs.push_back({"Z", z});
  Tensor want = reference_qconv(cs, x, w, b, cs.z ? &z : nullptr, x_scale, w_scales, z_scale, y_scale);
  Tensor got;
  for (cpu::Int8GemmIsa isa : int8_isas()) {
    Int8IsaScope scope(isa);
    got = testing::run_single_node(node, inputs);
    ASSERT_EQ(got.shape(), want.shape());
    ASSERT_EQ(got.dtype(), want.dtype());
    int64_t differ = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      if (cs.y_int8) differ += got.data<int8_t>()[i] != want.data<int8_t>()[i];
      else differ += std::memcmp(got.data<float>() + i, want.data<float>() + i, sizeof(float)) != 0;
    }
    EXPECT_EQ(differ, 0) << "of " << got.numel() << " outputs with the int8 GEMM " << cpu::int8_gemm_isa_name(isa);
  }
  // The outputs use the int8 range (a test whose outputs all saturate or vanish proves little).
  if (cs.y_int8) {
    int distinct = 0;
    std::vector<bool> seen(256, false);
    for (int64_t i = 0; i < got.numel(); ++i) {
      const int v = got.data<int8_t>()[i] + 128;
      distinct += !seen[static_cast<size_t>(v)];
      seen[static_cast<size_t>(v)] = true;
    }
    EXPECT_GT(distinct, 20);
  }
}

TEST(QConv, MatchesTheIntegerDefinition3x3Stride2) { check_case({2, 16, 9, 11, 32, 3, 2, 1}, 1); }
TEST(QConv, MatchesTheIntegerDefinition1x1) { check_case({3, 32, 5, 6, 16, 1, 1, 0}, 2); }
TEST(QConv, ImageStemOfThreeChannels) { check_case({2, 3, 20, 21, 16, 7, 2, 3}, 12); }
TEST(QConv, Int8ResidualAndInt8Output) {
  Case c{2, 16, 8, 8, 16, 3, 1, 1};
  c.z = c.z_int8 = true;
  check_case(c, 3);
}
TEST(QConv, DepthwiseAndGrouped) {
  Case depthwise{2, 24, 9, 8, 24, 3, 1, 1};
  depthwise.group = 24;
  check_case(depthwise, 5);
  Case grouped{1, 12, 7, 7, 18, 3, 2, 1};  // 3 groups of 4 input and 6 output channels
  grouped.group = 3;
  grouped.z = grouped.z_int8 = true;
  check_case(grouped, 6);
}
// Shapes that leave the int8 GEMM's tiles partly empty: output channels not a multiple of 8,
// output pixels not a multiple of 32, K not a multiple of 4; dilation, groups of 8 channels
// or more, 1x1 convolutions read in place, and every kind of epilogue.
TEST(QConv, Int8GemmTilesAndEpilogues) {
  check_case({1, 20, 13, 17, 20, 3, 1, 1}, 21);
  check_case({2, 5, 11, 9, 24, 3, 1, 1}, 22);  // K = 45
  Case dilated{1, 16, 15, 14, 40, 3, 1, 2};
  dilated.dilation = 2;
  check_case(dilated, 23);
  Case grouped{2, 32, 9, 10, 48, 3, 2, 1};  // 2 groups of 16 input, 24 output channels
  grouped.group = 2;
  grouped.z = true;
  check_case(grouped, 24);
  Case pointwise{2, 64, 3, 5, 40, 1, 1, 0};
  pointwise.z = pointwise.z_int8 = true;
  check_case(pointwise, 25);
  check_case({1, 8, 3, 4, 16, 5, 1, 2}, 30);  // taps shifted past the whole image
  // Images of many B panels, the last one partial (399 pixels: 13 panels, the last of 15).
  Case many_panels{1, 16, 21, 19, 20, 3, 1, 1};
  many_panels.z = many_panels.z_int8 = true;
  check_case(many_panels, 31);
  Case many_panels_grouped{2, 32, 18, 17, 48, 3, 1, 1};
  many_panels_grouped.group = 2;
  many_panels_grouped.y_int8 = false;
  check_case(many_panels_grouped, 32);
  // A product as the INT8 pass writes it: rows of 1x1 images, the rows the GEMM's columns.
  Case rows{37, 40, 1, 1, 24, 1, 1, 0};
  rows.z = rows.z_int8 = true;
  check_case(rows, 31);
  check_case({20, 37, 1, 1, 16, 1, 1, 0}, 33);  // K = 37: a partial step of four
  Case rows_float{70, 64, 1, 1, 48, 1, 1, 0};
  rows_float.z = true;
  rows_float.y_int8 = false;
  rows_float.activation = "Gelu";
  check_case(rows_float, 32);
  Case wide{1, 8, 40, 40, 16, 1, 2, 0};  // strided 1x1
  check_case(wide, 26);
  Case clipped{1, 16, 12, 12, 16, 3, 1, 1};
  clipped.activation = "Clip";  // Clip(0, 6)
  clipped.y_scale = 0.02f;      // and saturating at 127
  check_case(clipped, 27);
  Case sigmoid{1, 16, 7, 9, 24, 3, 1, 1};
  sigmoid.activation = "Sigmoid";
  sigmoid.y_scale = 0.004f;
  check_case(sigmoid, 28);
  Case float_out{1, 16, 6, 7, 17, 3, 1, 1};
  float_out.z = true;
  float_out.y_int8 = false;
  float_out.activation = "SiLU";
  check_case(float_out, 29);
}

// An int8 GEMM is in use wherever the CPU has AVX2 and FMA (the tests above then check it):
// AVX-VNNI's where the CPU has that but not AVX-512 VNNI, AVX-512 VNNI's where the CPU has it,
// AMX's where it has AMX too.
TEST(QConv, Int8GemmIsUsedWhereTheCpuHasAvx2) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool avx_vnni = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && ((eax >> 4) & 1);
  EXPECT_EQ(cpu::int8_gemm_isa() != cpu::Int8GemmIsa::kNone, avx2);
  EXPECT_EQ(cpu::int8_gemm_isa() >= cpu::Int8GemmIsa::kAvx512Vnni, vnni);
  EXPECT_EQ(cpu::int8_gemm_isa() == cpu::Int8GemmIsa::kAvxVnni, avx2 && avx_vnni && !vnni);
  std::cout << "int8 GEMM on this CPU: " << cpu::int8_gemm_isa_name(cpu::int8_gemm_isa())
            << (avx_vnni ? "; AVX-VNNI present" : "; no AVX-VNNI") << "\n";
}

// Every int8 GEMM's tiles against sums in int64, on random bytes and on the extremes where
// pairs of products would leave int16 (vpmaddubsw's saturation, which the AVX2 kernels avoid):
// A all -128 or 127 against B all 127 or -128 (packed as 255 and 0), and A without -128 (the
// AVX2 kernel's symmetric form) at -127 and 127 against B at -128 and 127; K past one step and odd.
TEST(Int8Gemm, TilesAreTheExactSumsOnEveryKernel) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(-128, 127), symmetric(-127, 127);
  for (cpu::Int8GemmIsa isa : int8_isas()) {
    if (isa == cpu::Int8GemmIsa::kNone) continue;
    for (const std::string fill : {"random", "extreme", "mixed_extremes", "symmetric_random", "symmetric_extremes"})
      for (int64_t k : {4, 67, 300}) {
        SCOPED_TRACE(std::string(cpu::int8_gemm_isa_name(isa)) + " " + fill + " K " + std::to_string(k));
        const int64_t m = cpu::int8_gemm_tile_rows(isa), n = cpu::kInt8GemmCols;
        std::vector<int8_t> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
        const bool symmetric_a = fill.rfind("symmetric", 0) == 0;
        for (size_t i = 0; i < a.size(); ++i) {
          const int value = fill == "random"             ? byte(rng)
                            : fill == "symmetric_random" ? symmetric(rng)
                            : fill == "extreme"          ? -128
                            : fill == "mixed_extremes"   ? (i % 3 ? -128 : 127)
                                                         : (i % 3 ? -127 : 127);
          a[i] = static_cast<int8_t>(value);
        }
        a[0] = symmetric_a ? a[0] : -128;  // the other fills hold -128 for certain
        for (size_t i = 0; i < b.size(); ++i)
          b[i] = static_cast<int8_t>(fill == "random" || fill == "symmetric_random" ? byte(rng)
                                     : fill == "extreme"                             ? 127
                                                                                     : (i % 5 ? 127 : -128));
        const cpu::Int8PackedA packed = cpu::int8_pack_a(isa, a.data(), m, k, k);
        EXPECT_EQ(packed.above_int8_min, symmetric_a);
        cpu::AlignedVector<uint8_t> panel(static_cast<size_t>(cpu::int8_b_panel_bytes(packed)));
        cpu::int8_pack_b_panel(b.data(), n, k, packed.k_padded, 0, n, panel.data());
        std::vector<int32_t> tile(static_cast<size_t>(cpu::kInt8GemmMaxRows * cpu::kInt8GemmCols));
        {
          cpu::AmxTileScope tiles(isa == cpu::Int8GemmIsa::kAmx);
          cpu::int8_tile(packed, 0, panel.data(), tile.data());
        }
        int64_t differ = 0;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < n; ++j) {
            int64_t sum = 0;
            for (int64_t i = 0; i < k; ++i) sum += int64_t{a[static_cast<size_t>(r * k + i)]} * b[static_cast<size_t>(i * n + j)];
            differ += tile[static_cast<size_t>(r * cpu::kInt8GemmCols + j)] - packed.shift[static_cast<size_t>(r)] != sum;
          }
        EXPECT_EQ(differ, 0);
      }
  }
}

TEST(QConv, FloatResidualFloatOutputNoActivation) {
  Case c{1, 16, 6, 7, 32, 3, 1, 1};
  c.z = true;
  c.y_int8 = false;
  c.relu = false;
  check_case(c, 4);
}

// FP8: random E4M3 X, W and residual, the float32 sums taken in the kernel's order (c, then
// the taps): E4M3 products are exact in float32, so the reference gives the same sums and the
// same E4M3 outputs, bit for bit.
Tensor random_float8(std::vector<int64_t> shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, 255);
  Tensor t(DType::kFloat8E4M3FN, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) {
    int b = dist(rng);
    if ((b & 0x7f) > 0x5f) b &= 0xcf;  // no NaN, and |values| at most 15 so sums stay moderate
    static_cast<uint8_t*>(t.raw())[i] = static_cast<uint8_t>(b);
  }
  return t;
}

TEST(QConv, Float8MatchesItsDefinition) {
  const int64_t n = 2, c = 16, h = 7, w = 9, m = 32, k = 3;
  Tensor x = random_float8({n, c, h, w}, 41), wt = random_float8({m, c, k, k}, 42), z = random_float8({n, m, h, w}, 43);
  Tensor b = testing::random_tensor({m}, 44);
  std::vector<float> w_scales(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) w_scales[static_cast<size_t>(i)] = 0.01f + 0.001f * static_cast<float>(i);
  const float x_scale = 0.05f, z_scale = 0.3f, y_scale = 0.2f;
  ir::Node node;
  node.op = "QConv";
  node.domain = "kiln";
  node.attrs.set("kernel_shape", std::vector<int64_t>{k, k});
  node.attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  node.attrs.set("activation", std::string("Relu"));
  node.attrs.set("x_scale", x_scale);
  node.attrs.set("w_scales", w_scales);
  node.attrs.set("z_scale", z_scale);
  node.attrs.set("y_scale", y_scale);
  Tensor got = testing::run_single_node(node, {{"X", x}, {"W", wt, true}, {"B", b, true}, {"Z", z}});
  ASSERT_EQ(got.dtype(), DType::kFloat8E4M3FN);
  auto f8 = [](const Tensor& t, int64_t i) { return float8e4m3fn_to_float(static_cast<const uint8_t*>(t.raw())[i]); };
  int64_t differ = 0, saturated = 0, zeros = 0;
  for (int64_t img = 0; img < n; ++img)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < w; ++j) {
          float acc = 0.f;
          for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t a = 0; a < k; ++a)
              for (int64_t e = 0; e < k; ++e) {
                const int64_t yi = i - 1 + a, xj = j - 1 + e;
                if (yi < 0 || yi >= h || xj < 0 || xj >= w) continue;
                acc += f8(x, ((img * c + ch) * h + yi) * w + xj) * f8(wt, ((o * c + ch) * k + a) * k + e);
              }
          const int64_t at = ((img * m + o) * h + i) * w + j;
          float v = std::fma(acc, x_scale * w_scales[static_cast<size_t>(o)], b.data<float>()[o]) + f8(z, at) * z_scale;
          v = v > 0.f ? v : 0.f;
          const uint8_t want = float_to_float8e4m3fn(v * (1.f / y_scale));
          const uint8_t have = static_cast<const uint8_t*>(got.raw())[at];
          differ += want != have;
          saturated += (have & 0x7f) == 0x7e;
          zeros += have == 0;
        }
  EXPECT_EQ(differ, 0) << "of " << got.numel();
  EXPECT_LT(saturated, got.numel() / 10);  // the outputs use the range, not only its ends
  EXPECT_LT(zeros, got.numel() * 7 / 10);
}

// QuantizeLinear per tensor to int8 and uint8 (an INT8 engine's input quantize layer) runs 32
// values at a time: the same bytes as the definition on every kind of value, ties, the ends of
// the range, beyond them, infinities and NaN, with the count off a multiple of 32.
TEST(QuantizeLinear, PerTensorBytesMatchTheDefinition) {
  std::vector<float> values;
  const float scale = 0.05f;
  for (int i = -400; i <= 400; ++i) values.push_back(static_cast<float>(i) * 0.025f);  // every tie
  for (float v : {6.35f, 6.375f, 6.4f, -6.4f, -6.425f, 12.7f, 12.725f, 1e9f, -1e9f, 3e38f}) values.push_back(v);
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(-std::numeric_limits<float>::infinity());
  values.push_back(std::numeric_limits<float>::quiet_NaN());
  values.push_back(0.f);
  values.push_back(-0.f);
  const int64_t n = static_cast<int64_t>(values.size());
  ASSERT_NE(n % 32, 0);
  for (const DType dtype : {DType::kInt8, DType::kUInt8})
    for (const int zero_point : {0, 7, -3, 128}) {
      if ((dtype == DType::kInt8) == (zero_point == 128) || (dtype == DType::kUInt8 && zero_point < 0)) continue;
      testing::GraphBuilder gb;
      gb.input("X", {n});
      gb.constant("scale", Tensor::from_vector<float>({}, {scale}));
      Tensor zp(dtype, {});
      if (dtype == DType::kInt8) zp.data<int8_t>()[0] = static_cast<int8_t>(zero_point);
      else zp.data<uint8_t>()[0] = static_cast<uint8_t>(zero_point);
      gb.constant("zero", zp);
      gb.node("QuantizeLinear", {"X", "scale", "zero"}, "Y");
      gb.output("Y");
      const Tensor x = Tensor::from_vector<float>({n}, values);
      const Tensor y = cpu::CpuEngine(gb.build()).run({{"X", x}}).at("Y");
      ASSERT_EQ(y.dtype(), dtype);
      const double lo = dtype == DType::kInt8 ? -128 : 0, hi = dtype == DType::kInt8 ? 127 : 255;
      for (int64_t i = 0; i < n; ++i) {
        double q = static_cast<double>(std::nearbyint(values[static_cast<size_t>(i)] / scale)) + zero_point;
        if (std::isnan(q)) q = 0;
        const int want = static_cast<int>(std::min(std::max(q, lo), hi));
        const int got = dtype == DType::kInt8 ? y.data<int8_t>()[i] : y.data<uint8_t>()[i];
        ASSERT_EQ(got, want) << to_string(dtype) << " zero point " << zero_point << ", x = " << values[static_cast<size_t>(i)];
      }
    }
}

TEST(QConv, SchemaRejectsFloatInputsAndBadScales) {
  testing::GraphBuilder gb;
  gb.input("X", {1, 16, 4, 4});  // float32: a quantized conv takes int8
  gb.constant("W", random_int8({16, 16, 1, 1}, 5));
  gb.node("QConv", {"X", "W"}, "Y", {{"x_scale", 0.1f}, {"w_scales", std::vector<float>(16, 0.1f)}});
  gb.last().domain = "kiln";
  gb.output("Y");
  EXPECT_THROW(gb.build(), Error);

  testing::GraphBuilder g2;
  g2.input("X", {1, 16, 4, 4}, DType::kInt8);
  g2.constant("W", random_int8({16, 16, 1, 1}, 5));
  g2.node("QConv", {"X", "W"}, "Y", {{"x_scale", 0.1f}, {"w_scales", std::vector<float>(8, 0.1f)}});  // 8 != 16
  g2.last().domain = "kiln";
  g2.output("Y");
  try {
    g2.build();
    FAIL() << "8 scales for 16 channels were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w_scales"), std::string::npos) << e.what();
  }
}

// conv3x3+Relu -> conv1x1 + residual + Relu -> pool, with scales from the float network's own
// ranges on its input x.
struct ResidualChain {
  ir::Graph graph;
  Tensor x;
  std::map<std::string, float> scales;
};

ResidualChain residual_chain() {
  testing::GraphBuilder gb;
  gb.input("X", {2, 16, 8, 8});
  gb.random("W1", {16, 16, 3, 3}, -0.2f, 0.2f);
  gb.random("B1", {16}, -0.1f, 0.1f);
  gb.random("W2", {16, 16, 1, 1}, -0.3f, 0.3f);
  gb.random("B2", {16}, -0.1f, 0.1f);
  gb.node("FusedConv", {"X", "W1", "B1"}, "y1",
          {{"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"activation", std::string("Relu")}});
  gb.last().domain = "kiln";
  gb.node("FusedConv", {"y1", "W2", "B2", "y1"}, "y2", {{"activation", std::string("Relu")}});
  gb.last().domain = "kiln";
  gb.node("GlobalAveragePool", {"y2"}, "out");
  gb.output("out");
  ResidualChain c{gb.build(), testing::random_tensor({2, 16, 8, 8}, 7), {}};
  ir::Graph probe = c.graph;
  probe.outputs = {"out", "y1", "y2"};
  auto ranges = cpu::CpuEngine(probe).run({{"X", c.x}});
  c.scales = {{"X", amax(c.x) / 127.f}, {"y1", amax(ranges.at("y1")) / 127.f}, {"y2", amax(ranges.at("y2")) / 127.f}};
  return c;
}

// The INT8 pass on the residual chain: the first conv's output stays int8 (both readers are
// quantized convs), the second writes float for the pool; the network's output moves by about
// the quantization step only.
TEST(QuantizeGraph, ResidualChainKeepsInt8BetweenConvs) {
  const ResidualChain c = residual_chain();
  ir::Graph q = c.graph;
  compiler::QuantizeGraphReport r = compiler::quantize_graph(q, c.scales);
  EXPECT_EQ(r.quantized, 2);
  EXPECT_EQ(r.int8_values, 1);     // y1
  EXPECT_EQ(r.quantize_nodes, 1);  // X
  EXPECT_EQ(q.value("y1").type.dtype, DType::kInt8);
  EXPECT_EQ(q.value("y2").type.dtype, DType::kFloat32);
  int qconv = 0;
  for (const ir::Node& n : q.nodes) qconv += n.op == "QConv";
  EXPECT_EQ(qconv, 2);
  ir::infer_shapes(q);  // the rewritten graph is well-typed

  const Tensor want = cpu::CpuEngine(c.graph).run({{"X", c.x}}).at("out");
  const Tensor got = cpu::CpuEngine(q).run({{"X", c.x}}).at("out");
  const double err = relative_l2(got, want);
  EXPECT_LT(err, 0.03) << "INT8 moved the output too far";
  EXPECT_GT(err, 0.0) << "the quantized graph computed exactly the float result: was it quantized?";
}

TEST(QuantizeGraph, ReportsWhyAConvStaysFloat) {
  testing::GraphBuilder gb;
  gb.input("X", {1, 6, 8, 8});
  gb.random("W", {16, 6, 3, 3});
  gb.node("Conv", {"X", "W"}, "Y");
  gb.output("Y");
  ir::Graph g = gb.build();
  compiler::QuantizeGraphReport r = compiler::quantize_graph(g, {{"X", 0.01f}});
  EXPECT_EQ(r.quantized, 0);
  ASSERT_EQ(r.kept_float.size(), 1u);
  EXPECT_NE(r.kept_float[0].find("multiples of 16"), std::string::npos) << r.kept_float[0];
}

// An image stem (3 input channels, 7x7 stride 2) is quantized with its input, and the MaxPool
// after it runs on int8 with the stem's output scale: stem -> pool -> block passes int8
// tensors only, the image's QuantizeLinear being the one quantize layer. The same graph for a
// target without few-channel convolutions keeps the stem float, and says why.
TEST(QuantizeGraph, ImageStemAndMaxPoolRunInt8) {
  testing::GraphBuilder gb;
  gb.input("X", {2, 3, 20, 20});
  gb.random("W1", {16, 3, 7, 7}, -0.2f, 0.2f);
  gb.random("B1", {16}, -0.1f, 0.1f);
  gb.random("W2", {16, 16, 3, 3}, -0.2f, 0.2f);
  gb.random("B2", {16}, -0.1f, 0.1f);
  gb.node("FusedConv", {"X", "W1", "B1"}, "stem",
          {{"pads", std::vector<int64_t>{3, 3, 3, 3}}, {"strides", std::vector<int64_t>{2, 2}}, {"activation", std::string("Relu")}});
  gb.last().domain = "kiln";
  gb.node("MaxPool", {"stem"}, "pool",
          {{"kernel_shape", std::vector<int64_t>{3, 3}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"strides", std::vector<int64_t>{2, 2}}});
  gb.node("FusedConv", {"pool", "W2", "B2", "pool"}, "block", {{"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"activation", std::string("Relu")}});
  gb.last().domain = "kiln";
  gb.node("GlobalAveragePool", {"block"}, "out");
  gb.output("out");
  ir::Graph g = gb.build();

  Tensor x = testing::random_tensor({2, 3, 20, 20}, 11);
  ir::Graph probe = g;
  probe.outputs = {"out", "stem", "pool", "block"};
  auto ranges = cpu::CpuEngine(probe).run({{"X", x}});
  std::map<std::string, float> scales;
  scales["X"] = amax(x) / 127.f;
  for (const char* v : {"stem", "block"}) scales[v] = amax(ranges.at(v)) / 127.f;
  scales["pool"] = 0.5f * scales["stem"];  // a calibrated pool scale the pass must not use

  ir::Graph q = g;
  compiler::QuantizeGraphReport r = compiler::quantize_graph(q, scales);
  EXPECT_EQ(r.quantized, 2);
  EXPECT_EQ(r.int8_pools, 1);
  EXPECT_EQ(r.int8_values, 2);     // stem, pool
  EXPECT_EQ(r.quantize_nodes, 1);  // X
  EXPECT_EQ(q.value("stem").type.dtype, DType::kInt8);
  EXPECT_EQ(q.value("pool").type.dtype, DType::kInt8);
  for (const ir::Node& n : q.nodes)
    if (n.op == "QConv" && n.outputs[0] == "block") {
      EXPECT_EQ(n.attrs.get_float("x_scale", 0.f), scales["stem"]);  // the pool keeps the stem's scale
      EXPECT_EQ(n.attrs.get_float("z_scale", 0.f), scales["stem"]);
    }
  ir::infer_shapes(q);

  const Tensor want = cpu::CpuEngine(g).run({{"X", x}}).at("out");
  const Tensor got = cpu::CpuEngine(q).run({{"X", x}}).at("out");
  const double err = relative_l2(got, want);
  EXPECT_LT(err, 0.03) << "INT8 moved the output too far";
  EXPECT_GT(err, 0.0);

  ir::Graph f = g;
  compiler::QuantizeTarget no_stems;
  no_stems.few_input_channels = false;
  r = compiler::quantize_graph(f, scales, {}, nullptr, no_stems);
  EXPECT_EQ(r.quantized, 1);
  EXPECT_EQ(r.int8_pools, 0);
  ASSERT_EQ(r.kept_float.size(), 1u);
  EXPECT_NE(r.kept_float[0].find("3 input"), std::string::npos) << r.kept_float[0];
  EXPECT_EQ(f.value("pool").type.dtype, DType::kFloat32);
}

// A stem with a residual input, or a filter of more than 64 taps, has no INT8 kernel on the GPU.
TEST(QuantizeGraph, StemsOutsideTheKernelStayFloat) {
  testing::GraphBuilder gb;
  gb.input("X", {1, 3, 20, 20});
  gb.input("R", {1, 16, 20, 20});
  gb.random("W1", {16, 3, 9, 9});
  gb.random("W2", {16, 3, 3, 3});
  gb.node("Conv", {"X", "W1"}, "big", {{"pads", std::vector<int64_t>{4, 4, 4, 4}}});
  gb.node("FusedConv", {"X", "W2", "", "R"}, "res", {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  gb.last().domain = "kiln";
  gb.output("big");
  gb.output("res");
  ir::Graph g = gb.build();
  compiler::QuantizeGraphReport r = compiler::quantize_graph(g, {{"X", 0.01f}, {"R", 0.01f}});
  EXPECT_EQ(r.quantized, 0);
  ASSERT_EQ(r.kept_float.size(), 2u);
  EXPECT_NE(r.kept_float[0].find("64 taps"), std::string::npos) << r.kept_float[0];
  EXPECT_NE(r.kept_float[1].find("residual"), std::string::npos) << r.kept_float[1];
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Explicit quantization: symmetric int8 Q/DQ pairs and DQ'd int8 weights are read out of the
// graph; an asymmetric (uint8, zero point 128) pair is left to run as it is.
TEST(AbsorbQdq, ReadsSymmetricPairsAndWeightsKeepsOthers) {
  testing::GraphBuilder gb;
  gb.input("X", {1, 16, 4, 4});
  gb.scalar("s", 0.05f);
  gb.constant("zp", Tensor::scalar<int8_t>(0));
  gb.constant("Wq", random_int8({16, 16, 1, 1}, 9, -127, 127));
  std::vector<float> ws(16);
  for (size_t i = 0; i < ws.size(); ++i) ws[i] = 0.01f * static_cast<float>(i + 1);
  gb.constant("ws", Tensor::from_vector<float>({16}, ws));
  gb.constant("wzp", Tensor(DType::kInt8, {16}));
  gb.scalar("s2", 0.1f);
  gb.constant("zp2", Tensor::scalar<uint8_t>(128));
  gb.node("QuantizeLinear", {"X", "s", "zp"}, "Xq");
  gb.node("DequantizeLinear", {"Xq", "s", "zp"}, "Xd");
  gb.node("DequantizeLinear", {"Wq", "ws", "wzp"}, "W", {{"axis", int64_t{0}}});
  gb.node("Conv", {"Xd", "W"}, "Y");
  gb.node("QuantizeLinear", {"Y", "s2", "zp2"}, "Yq");
  gb.node("DequantizeLinear", {"Yq", "s2", "zp2"}, "Yd");
  gb.output("Yd");
  ir::Graph g = gb.build();

  compiler::QdqScales q = compiler::absorb_qdq(g);
  ASSERT_EQ(q.activations.size(), 1u);
  EXPECT_FLOAT_EQ(q.activations.at("X"), 0.05f);
  ASSERT_EQ(q.weights.count("W"), 1u);
  EXPECT_EQ(q.weights.at("W").scales, ws);
  EXPECT_EQ(q.pairs_left, 2);  // the uint8 pair
  const Tensor wq = random_int8({16, 16, 1, 1}, 9, -127, 127);
  ASSERT_NE(g.constant("W"), nullptr);
  const Tensor& w = *g.constant("W");
  for (int64_t e = 0; e < w.numel(); ++e)
    ASSERT_EQ(w.data<float>()[e], static_cast<float>(wq.data<int8_t>()[e]) * ws[static_cast<size_t>(e / 16)]);
  int convs = 0;
  for (const ir::Node& n : g.nodes) {
    if (n.op == "Conv") {
      ++convs;
      EXPECT_EQ(n.inputs[0], "X");  // reads the float input directly
    }
  }
  EXPECT_EQ(convs, 1);

  // The INT8 pass then keeps the model's integers.
  compiler::QuantizeGraphReport r = compiler::quantize_graph(g, q.activations, {}, &q.weights);
  EXPECT_EQ(r.quantized, 1);
  EXPECT_EQ(r.model_weights, 1);
  for (const ir::Node& n : g.nodes) {
    if (n.op != "QConv") continue;
    const Tensor* got = g.constant(n.inputs[1]);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(std::memcmp(got->raw(), wq.raw(), wq.nbytes()), 0) << "the model's integers were not kept";
    EXPECT_EQ(n.attrs.get_floats("w_scales"), ws);
  }
}


// Matrix products through the INT8 convolution (compiler/gemm_as_conv.h): a Gemm with a
// bias and Relu, then a MatMul over a 3-D activation, both become QConv between reshapes, keep
// their layer names, and the network's output moves by about the quantization step only.
TEST(QuantizeGraph, GemmAndMatMulRunAsInt8Convolutions) {
  testing::GraphBuilder gb;
  gb.input("X", {2, 3, 32});
  gb.random("W1", {48, 32}, -0.3f, 0.3f);  // Gemm with transB = 1: [N, K]
  gb.random("B1", {48}, -0.1f, 0.1f);
  gb.random("W2", {48, 16}, -0.3f, 0.3f);  // MatMul: [K, N]
  gb.node("Reshape", {"X", gb.ints("flat", {6, 32})}, "x2");
  gb.node("FusedGemm", {"x2", "W1", "B1"}, "h", {{"transB", int64_t{1}}, {"activation", std::string("Relu")}});
  gb.last().domain = "kiln";
  gb.last().name = "fc1";
  gb.node("Reshape", {"h", gb.ints("back", {2, 3, 48})}, "h3");
  gb.node("MatMul", {"h3", "W2"}, "out");
  gb.last().name = "fc2";
  gb.output("out");
  ir::Graph g = gb.build();

  Tensor x = testing::random_tensor({2, 3, 32}, 11);
  ir::Graph probe = g;
  probe.outputs = {"out", "x2", "h", "h3"};
  auto ranges = cpu::CpuEngine(probe).run({{"X", x}});
  std::map<std::string, float> scales;
  for (const char* v : {"x2", "h", "h3", "out"}) scales[v] = amax(ranges.at(v)) / 127.f;

  ir::Graph q = g;
  compiler::QuantizeGraphReport r = compiler::quantize_graph(q, scales);
  EXPECT_EQ(r.quantized, 2);
  EXPECT_EQ(r.matrix_products, 2);
  std::set<std::string> qconvs;
  for (const ir::Node& n : q.nodes)
    if (n.op == "QConv") qconvs.insert(n.name);
  EXPECT_EQ(qconvs, (std::set<std::string>{"fc1", "fc2"}));
  ir::infer_shapes(q);
  EXPECT_EQ(q.value("out").type.shape, ir::dims_of({2, 3, 16}));

  const Tensor want = cpu::CpuEngine(g).run({{"X", x}}).at("out");
  const Tensor got = cpu::CpuEngine(q).run({{"X", x}}).at("out");
  ASSERT_EQ(got.shape(), want.shape());
  const double err = relative_l2(got, want);
  EXPECT_LT(err, 0.03) << "INT8 moved the output too far";
  EXPECT_GT(err, 0.0) << "the output is exactly the float one: was it quantized?";

  // Pinned to float by name, a product stays as it was.
  ir::Graph pinned = g;
  compiler::QuantizeGraphReport rp = compiler::quantize_graph(pinned, scales, {"fc2"});
  EXPECT_EQ(rp.matrix_products, 1);
  bool matmul_left = false;
  for (const ir::Node& n : pinned.nodes) matmul_left = matmul_left || (n.op == "MatMul" && n.name == "fc2");
  EXPECT_TRUE(matmul_left);
}

// A transformer block's product with its skip connection in the epilogue
// (kiln::FusedMatMul(A, W, bias, Z)) keeps Z as the convolution's residual; with output
// features that need padding it stays float (the residual has no padded channels). Products
// of the same activation share its quantized form.
TEST(QuantizeGraph, AProductsResidualStaysInItsEpilogue) {
  testing::GraphBuilder gb;
  gb.input("X", {2, 3, 32});
  gb.input("R", {2, 3, 48});
  gb.input("R10", {2, 3, 10});
  gb.random("W", {32, 48}, -0.3f, 0.3f);
  gb.random("B", {48}, -0.1f, 0.1f);
  gb.random("W10", {32, 10}, -0.3f, 0.3f);
  gb.node("FusedMatMul", {"X", "W", "B", "R"}, "out");
  gb.last().domain = "kiln";
  gb.last().name = "projection";
  gb.node("FusedMatMul", {"X", "W10", "", "R10"}, "narrow_out");
  gb.last().domain = "kiln";
  gb.last().name = "narrow";
  gb.random("W16", {32, 16}, -0.3f, 0.3f);
  gb.node("MatMul", {"X", "W16"}, "sibling_out");
  gb.last().name = "sibling";
  gb.output("out");
  gb.output("narrow_out");
  gb.output("sibling_out");
  ir::Graph g = gb.build();
  const Tensor x = testing::random_tensor({2, 3, 32}, 21);
  const Tensor r = testing::random_tensor({2, 3, 48}, 22);
  const Tensor r10 = testing::random_tensor({2, 3, 10}, 23);
  const std::map<std::string, Tensor> feeds{{"X", x}, {"R", r}, {"R10", r10}};
  const Tensor want = cpu::CpuEngine(g).run(feeds).at("out");
  std::map<std::string, float> scales{{"X", amax(x) / 127.f}, {"out", amax(want) / 127.f}};

  ir::Graph q = g;
  compiler::QuantizeGraphReport rep = compiler::quantize_graph(q, scales);
  EXPECT_EQ(rep.matrix_products, 2);
  EXPECT_EQ(rep.quantize_nodes, 1) << "two products of X quantize it once";
  ASSERT_EQ(rep.kept_float.size(), 1u);
  EXPECT_NE(rep.kept_float[0].find("narrow: a residual"), std::string::npos) << rep.kept_float[0];
  const ir::Node* conv = nullptr;
  for (const ir::Node& n : q.nodes)
    if (n.op == "QConv" && n.name == "projection") conv = &n;
  ASSERT_NE(conv, nullptr);
  EXPECT_TRUE(conv->has_input(3)) << "the residual was dropped";
  const auto got = cpu::CpuEngine(q).run(feeds);
  const double err = relative_l2(got.at("out"), want);
  EXPECT_LT(err, 0.03) << "INT8 moved the output too far";
  EXPECT_GT(err, 0.0);
  EXPECT_EQ(relative_l2(got.at("narrow_out"), cpu::CpuEngine(g).run(feeds).at("narrow_out")), 0.0);
}

// A transformer's feed-forward products: the first product's output (after its GELU) is read
// only by the second, so it goes to it as the convolution's output image, written quantized by
// the first (y_scale) with no Reshapes or quantize layer between them; X, read as the first's
// input and the second's residual, is quantized once. Pinning the second to float brings the
// float value and its Reshape back. In INT8 and in FP8.
TEST(QuantizeGraph, AProductFeedingProductsWritesTheirQuantizedInput) {
  testing::GraphBuilder gb;
  gb.input("X", {2, 3, 32});
  gb.random("W1", {32, 48}, -0.3f, 0.3f);
  gb.random("B1", {48}, -0.1f, 0.1f);
  gb.random("W2", {48, 32}, -0.3f, 0.3f);
  gb.random("B2", {32}, -0.1f, 0.1f);
  gb.node("FusedMatMul", {"X", "W1", "B1"}, "h", {{"activation", std::string("Gelu")}});
  gb.last().domain = "kiln";
  gb.last().name = "ffn1";
  gb.node("FusedMatMul", {"h", "W2", "B2", "X"}, "out");
  gb.last().domain = "kiln";
  gb.last().name = "ffn2";
  gb.output("out");
  ir::Graph g = gb.build();
  const Tensor x = testing::random_tensor({2, 3, 32}, 31);
  ir::Graph probe = g;
  probe.outputs = {"out", "h"};
  const auto ranges = cpu::CpuEngine(probe).run({{"X", x}});
  const std::map<std::string, float> scales{{"X", amax(x) / 127.f}, {"h", amax(ranges.at("h")) / 127.f}};
  for (const compiler::QuantizeFormat format : {compiler::QuantizeFormat::kInt8, compiler::QuantizeFormat::kFloat8E4M3}) {
    compiler::QuantizeTarget target;
    target.format = format;
    ir::Graph q = g;
    compiler::QuantizeGraphReport r = compiler::quantize_graph(q, scales, {}, nullptr, target);
    EXPECT_EQ(r.quantized, 2);
    EXPECT_EQ(r.int8_values, 1);
    EXPECT_EQ(r.quantize_nodes, 1) << "only X is quantized by a layer of its own";
    const ir::Node *ffn1 = nullptr, *ffn2 = nullptr;
    int reshapes = 0;
    for (const ir::Node& n : q.nodes) {
      if (n.name == "ffn1") ffn1 = &n;
      if (n.name == "ffn2") ffn2 = &n;
      reshapes += n.op == "Reshape";
    }
    ASSERT_TRUE(ffn1 && ffn2);
    EXPECT_GT(ffn1->attrs.get_float("y_scale", 0.f), 0.f);
    EXPECT_EQ(ffn2->inputs[0], ffn1->outputs[0]);
    EXPECT_EQ(reshapes, 2) << "X's view and the output's Reshape back, nothing between the products";
    const double err = relative_l2(cpu::CpuEngine(q).run({{"X", x}}).at("out"), ranges.at("out"));
    EXPECT_LT(err, 0.05) << "quantized products moved the output too far";
    EXPECT_GT(err, 0.0);
  }
  ir::Graph pinned = g;
  compiler::QuantizeGraphReport rp = compiler::quantize_graph(pinned, scales, {"ffn2"});
  EXPECT_EQ(rp.quantized, 1);
  EXPECT_EQ(rp.int8_values, 0);
  EXPECT_LT(relative_l2(cpu::CpuEngine(pinned).run({{"X", x}}).at("out"), ranges.at("out")), 0.05);
  bool h_written = false;
  for (const ir::Node& n : pinned.nodes)
    for (const std::string& o : n.outputs) h_written = h_written || o == "h";
  EXPECT_TRUE(h_written) << "the float product reads h, so it is written";
}

// A classifier whose class count is no multiple of 16 (10 here) runs as a 16-channel INT8
// convolution whose extra channels (zero weights) a Slice drops; 20 input features stay float.
TEST(QuantizeGraph, OutputFeaturesArePaddedToSixteenAndSlicedBack) {
  testing::GraphBuilder gb;
  gb.input("X", {5, 32});
  gb.random("W", {10, 32}, -0.3f, 0.3f);
  gb.random("B", {10}, -0.1f, 0.1f);
  gb.random("W2", {20, 8}, -0.3f, 0.3f);
  gb.node("Gemm", {"X", "W", "B"}, "logits", {{"transB", int64_t{1}}});
  gb.last().name = "classifier";
  gb.node("Reshape", {"X", gb.ints("to20", {-1, 20})}, "x20");
  gb.node("MatMul", {"x20", "W2"}, "side");
  gb.last().name = "narrow";
  gb.output("logits");
  gb.output("side");
  ir::Graph g = gb.build();
  Tensor x = testing::random_tensor({5, 32}, 5);
  const auto want = cpu::CpuEngine(g).run({{"X", x}});
  std::map<std::string, float> scales{{"X", amax(x) / 127.f}, {"x20", amax(x) / 127.f}};

  ir::Graph q = g;
  compiler::QuantizeGraphReport r = compiler::quantize_graph(q, scales);
  EXPECT_EQ(r.matrix_products, 1);
  ASSERT_EQ(r.kept_float.size(), 1u);
  EXPECT_NE(r.kept_float[0].find("narrow: 20 input features"), std::string::npos) << r.kept_float[0];
  const ir::Node* conv = nullptr;
  bool sliced = false;
  for (const ir::Node& n : q.nodes) {
    if (n.op == "QConv") conv = &n;
    sliced = sliced || n.op == "Slice";
  }
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->name, "classifier");
  EXPECT_EQ(q.constant(conv->inputs[1])->dim(0), 16);  // int8 weights, 16 output channels
  EXPECT_TRUE(sliced);
  ir::infer_shapes(q);
  EXPECT_EQ(q.value("logits").type.shape, ir::dims_of({5, 10}));
  const Tensor got = cpu::CpuEngine(q).run({{"X", x}}).at("logits");
  ASSERT_EQ(got.shape(), want.at("logits").shape());
  const double err = relative_l2(got, want.at("logits"));
  EXPECT_LT(err, 0.03);
  EXPECT_GT(err, 0.0);
}

// Grouped and depthwise convolutions: quantized for a target that runs them (the CPU engine),
// left in float, with the reason, for one that does not (the GPU).
TEST(QuantizeGraph, DepthwiseConvolutionsForTargetsThatRunThem) {
  testing::GraphBuilder gb;
  gb.input("X", {2, 24, 8, 8});
  gb.random("Wd", {24, 1, 3, 3}, -0.5f, 0.5f);
  gb.random("Bd", {24}, -0.1f, 0.1f);
  gb.random("Wp", {32, 24, 1, 1}, -0.3f, 0.3f);
  gb.node("FusedConv", {"X", "Wd", "Bd"}, "d",
          {{"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"group", int64_t{24}}, {"activation", std::string("Relu")}});
  gb.last().domain = "kiln";
  gb.last().name = "depthwise";
  gb.node("Conv", {"d", "Wp"}, "out");
  gb.last().name = "pointwise";
  gb.output("out");
  ir::Graph g = gb.build();
  Tensor x = testing::random_tensor({2, 24, 8, 8}, 13);
  ir::Graph probe = g;
  probe.outputs = {"out", "d"};
  auto ranges = cpu::CpuEngine(probe).run({{"X", x}});
  const std::map<std::string, float> scales = {{"X", amax(x) / 127.f}, {"d", amax(ranges.at("d")) / 127.f}};

  // 24 channels: with group 1 that is not a multiple of 16, so the pointwise conv stays float
  // on every target; the depthwise one is quantized where the target has grouped INT8.
  ir::Graph gpu = g;
  compiler::QuantizeGraphReport rg = compiler::quantize_graph(gpu, scales);
  EXPECT_EQ(rg.quantized, 0);
  ASSERT_EQ(rg.kept_float.size(), 2u);
  EXPECT_NE(rg.kept_float[0].find("grouped convolution"), std::string::npos) << rg.kept_float[0];

  // The GPU's depthwise kernel needs channels in multiples of 16: 24 stay float, and say so.
  compiler::QuantizeTarget gpu_target;
  gpu_target.depthwise_convolutions = true;
  ir::Graph on_gpu = g;
  compiler::QuantizeGraphReport rd = compiler::quantize_graph(on_gpu, scales, {}, nullptr, gpu_target);
  EXPECT_EQ(rd.quantized, 0);
  ASSERT_EQ(rd.kept_float.size(), 2u);
  EXPECT_NE(rd.kept_float[0].find("24 depthwise channels"), std::string::npos) << rd.kept_float[0];

  compiler::QuantizeTarget cpu_target;
  cpu_target.grouped_convolutions = true;
  ir::Graph q = g;
  compiler::QuantizeGraphReport r = compiler::quantize_graph(q, scales, {}, nullptr, cpu_target);
  EXPECT_EQ(r.quantized, 1);
  EXPECT_EQ(r.kept_float.size(), 1u);
  bool depthwise_int8 = false;
  for (const ir::Node& n : q.nodes) depthwise_int8 = depthwise_int8 || (n.op == "QConv" && n.name == "depthwise");
  EXPECT_TRUE(depthwise_int8);
  const double err = relative_l2(cpu::CpuEngine(q).run({{"X", x}}).at("out"), cpu::CpuEngine(g).run({{"X", x}}).at("out"));
  EXPECT_LT(err, 0.03) << "INT8 moved the output too far";
  EXPECT_GT(err, 0.0) << "the output is exactly the float one: was it quantized?";
}

// --fp8: the same residual chain with E4M3 tensors: both convolutions quantized, the value
// between them stays float8e4m3fn, the image stem and pools stay float, and the output moves
// by about E4M3's rounding (3 mantissa bits) from float32's.
TEST(QuantizeGraph, Float8FormatKeepsE4M3BetweenConvs) {
  const ResidualChain c = residual_chain();
  std::map<std::string, float> scales = c.scales;
  const ir::Graph& g = c.graph;
  const Tensor& x = c.x;
  ir::Graph q = g;
  compiler::QuantizeTarget fp8;
  fp8.format = compiler::QuantizeFormat::kFloat8E4M3;
  compiler::QuantizeGraphReport r = compiler::quantize_graph(q, scales, {}, nullptr, fp8);
  EXPECT_EQ(r.quantized, 2);
  EXPECT_EQ(q.value("y1").type.dtype, DType::kFloat8E4M3FN);
  for (const ir::Node& n : q.nodes)
    if (n.op == "QConv") {
      EXPECT_EQ(q.value(n.inputs[1]).type.dtype, DType::kFloat8E4M3FN);
      if (n.outputs[0] == "y2") EXPECT_FLOAT_EQ(n.attrs.get_float("x_scale", 0.f), scales["y1"] * 127.f / 448.f);
    }
  ir::infer_shapes(q);
  const Tensor want = cpu::CpuEngine(g).run({{"X", x}}).at("out");
  const double err = relative_l2(cpu::CpuEngine(q).run({{"X", x}}).at("out"), want);
  EXPECT_LT(err, 0.06) << "FP8 moved the output too far";
  EXPECT_GT(err, 0.0);
}

// HardSwish and HardSigmoid (MobileNet-V3's activations) are in every INT8 epilogue (the CPU
// engine's and kiln's GPU kernels apply any activation), so INT8 quantizes those convolutions
// and the result stays near the float one; FP8, whose convolutions run on cuDNN's pointwise
// ops only, keeps them float and says why.
TEST(QuantizeGraph, HardActivationsInInt8NotInFloat8) {
  testing::GraphBuilder gb;
  gb.input("X", {2, 16, 8, 8});
  gb.random("W1", {32, 16, 3, 3}, -0.2f, 0.2f);
  gb.random("B1", {32}, -0.1f, 0.1f);
  gb.random("W2", {16, 32, 1, 1}, -0.3f, 0.3f);
  gb.random("B2", {16}, 0.2f, 0.4f);
  gb.node("FusedConv", {"X", "W1", "B1"}, "y1", {{"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"activation", std::string("HardSwish")}});
  gb.last().domain = "kiln";
  gb.node("FusedConv", {"y1", "W2", "B2"}, "y2",
          {{"activation", std::string("HardSigmoid")}, {"activation_alpha", 0.2f}, {"activation_beta", 0.5f}});
  gb.last().domain = "kiln";
  gb.output("y2");
  const ir::Graph g = gb.build();
  const Tensor x = testing::random_tensor({2, 16, 8, 8}, 23);
  ir::Graph probe = g;
  probe.outputs = {"y1", "y2"};
  auto ranges = cpu::CpuEngine(probe).run({{"X", x}});
  const std::map<std::string, float> scales = {
      {"X", amax(x) / 127.f}, {"y1", amax(ranges.at("y1")) / 127.f}, {"y2", amax(ranges.at("y2")) / 127.f}};

  ir::Graph q = g;
  compiler::QuantizeGraphReport r = compiler::quantize_graph(q, scales);
  EXPECT_EQ(r.quantized, 2) << (r.kept_float.empty() ? "" : r.kept_float[0]);
  EXPECT_EQ(q.value("y1").type.dtype, DType::kInt8);  // HardSwish's output straight into the next conv
  ir::infer_shapes(q);
  const Tensor want = cpu::CpuEngine(g).run({{"X", x}}).at("y2");
  const double err = relative_l2(cpu::CpuEngine(q).run({{"X", x}}).at("y2"), want);
  EXPECT_LT(err, 0.03) << "INT8 moved the output too far";
  EXPECT_GT(err, 0.0) << "the output is exactly the float one: was it quantized?";

  ir::Graph f = g;
  compiler::QuantizeTarget fp8;
  fp8.format = compiler::QuantizeFormat::kFloat8E4M3;
  compiler::QuantizeGraphReport rf = compiler::quantize_graph(f, scales, {}, nullptr, fp8);
  EXPECT_EQ(rf.quantized, 0);
  ASSERT_EQ(rf.kept_float.size(), 2u);
  EXPECT_NE(rf.kept_float[0].find("activation has no FP8 epilogue"), std::string::npos) << rf.kept_float[0];
}

// A product reading a view of a calibrated value (Reshape and Transpose that passes add after
// calibration, as fold_attention_views does around attention's output) takes that value's
// scale and is quantized; without the calibrated source it stays float, saying which input
// has no scale.
TEST(QuantizeGraph, LayoutOpsPassTheirInputsScale) {
  testing::GraphBuilder gb;
  gb.input("X", {2, 4, 3, 16});
  gb.random("W", {32, 64}, -0.3f, 0.3f);  // Gemm with transB = 1: [N, K]
  gb.random("B", {32}, -0.1f, 0.1f);
  gb.node("Transpose", {"X"}, "moved", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  gb.node("Reshape", {"moved", gb.ints("rows_shape", {6, 64})}, "rows");
  gb.node("FusedGemm", {"rows", "W", "B"}, "out", {{"transB", int64_t{1}}});
  gb.last().domain = "kiln";
  gb.last().name = "projection";
  gb.output("out");
  const ir::Graph g = gb.build();
  const Tensor x = testing::random_tensor({2, 4, 3, 16}, 29);

  ir::Graph q = g;
  compiler::QuantizeGraphReport r = compiler::quantize_graph(q, {{"X", amax(x) / 127.f}});
  EXPECT_EQ(r.quantized, 1) << (r.kept_float.empty() ? "" : r.kept_float[0]);
  ir::infer_shapes(q);
  const Tensor want = cpu::CpuEngine(g).run({{"X", x}}).at("out");
  const double err = relative_l2(cpu::CpuEngine(q).run({{"X", x}}).at("out"), want);
  EXPECT_LT(err, 0.03) << "INT8 moved the output too far";
  EXPECT_GT(err, 0.0) << "the output is exactly the float one: was it quantized?";

  ir::Graph unscaled = g;
  compiler::QuantizeGraphReport ru = compiler::quantize_graph(unscaled, {{"other", 0.1f}});
  EXPECT_EQ(ru.quantized, 0);
  ASSERT_EQ(ru.kept_float.size(), 1u);
  EXPECT_NE(ru.kept_float[0].find("no calibrated scale"), std::string::npos) << ru.kept_float[0];
}

// The GPU's grouped kernel takes 4, 8, 16, 32 or 64 channels per group in and out, with
// channels in multiples of 16 and no residual: 32 channels in groups of 8 are quantized, groups
// of 6 (48 channels) and a grouped conv with a residual stay float, each saying why.
TEST(QuantizeGraph, GroupedConvolutionsForTheGpuKernel) {
  testing::GraphBuilder gb;
  gb.input("X", {1, 32, 8, 8});
  gb.input("R", {1, 48, 8, 8});
  gb.random("W8", {32, 8, 3, 3}, -0.2f, 0.2f);
  gb.random("W6", {48, 6, 3, 3}, -0.2f, 0.2f);
  gb.random("Wr", {48, 6, 3, 3}, -0.2f, 0.2f);
  gb.node("Conv", {"X", "W8"}, "g8", {{"group", int64_t{4}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  gb.last().name = "groups_of_8";
  gb.node("Conv", {"R", "W6"}, "g6", {{"group", int64_t{8}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  gb.last().name = "groups_of_6";
  gb.node("FusedConv", {"R", "Wr", "", "R"}, "gr", {{"group", int64_t{8}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  gb.last().domain = "kiln";
  gb.last().name = "with_residual";
  gb.output("g8");
  gb.output("g6");
  gb.output("gr");
  ir::Graph g = gb.build();
  compiler::QuantizeTarget gpu;
  gpu.depthwise_convolutions = gpu.gpu_grouped_convolutions = true;
  compiler::QuantizeGraphReport r = compiler::quantize_graph(g, {{"X", 0.01f}, {"R", 0.01f}}, {}, nullptr, gpu);
  EXPECT_EQ(r.quantized, 1);
  ASSERT_EQ(r.kept_float.size(), 2u);
  EXPECT_NE(r.kept_float[0].find("6 input / 6 output channels per group"), std::string::npos) << r.kept_float[0];
  EXPECT_NE(r.kept_float[1].find("residual"), std::string::npos) << r.kept_float[1];
  for (const ir::Node& n : g.nodes)
    if (n.name == "groups_of_8") EXPECT_EQ(n.op, "QConv");
}

}  // namespace
}  // namespace kiln
