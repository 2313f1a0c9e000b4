// The bfloat16 products of a CPU engine built with Precision::kBf16 (cpu/bf16_gemm.h): the GEMM
// on each kernel this CPU has (AMX-BF16, AVX512-BF16) against float64 sums of the same rounded
// operands, over row, column and K counts off its blocks, with bias, residual and activations
// (those it applies in registers and those after); rounding to nearest even; MatMul, Gemm
// and channels-last convolutions (strided, padded, dilated, pointwise) in an engine of bfloat16
// products against the float32 kernels run on operands rounded beforehand, which must agree to
// float32's summation rounding (the products of two bfloat16 values are exact in float32); and
// Attention, whose probabilities are rounded inside, within bfloat16's rounding of float32's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compute_test_util.h"
#include "cpu/bf16_gemm.h"
#include "cpu/gemm_util.h"
#include "ir/activation.h"

namespace kiln {
namespace {

using testing::all_close;
using testing::bf16_value;
using testing::NodeInput;
using testing::random_tensor;
using testing::single_node_graph;

std::vector<cpu::Bf16GemmIsa> isas() {
  std::vector<cpu::Bf16GemmIsa> out;
  for (cpu::Bf16GemmIsa isa : {cpu::Bf16GemmIsa::kAvx512Bf16, cpu::Bf16GemmIsa::kAmx})
    if (static_cast<int>(isa) <= static_cast<int>(cpu::bf16_gemm_best_isa())) out.push_back(isa);
  return out;
}

TEST(Bf16Gemm, RoundsToNearestEven) {
  if (cpu::bf16_gemm_best_isa() == cpu::Bf16GemmIsa::kNone) GTEST_SKIP() << "no bfloat16 products on this CPU";
  // Halfway cases both ways, values just off halfway, the largest finite floats, infinities, NaN.
  std::vector<float> values = {1.f, -2.5f, 3.14159f, 1e-3f, -6.5e4f, 3.0e38f, -3.4e38f, INFINITY, -INFINITY};
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f817fffu, 0xbf808000u})
    values.push_back([&] { float f; std::memcpy(&f, &bits, 4); return f; }());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 100.f);
  for (int i = 0; i < 100; ++i) values.push_back(normal(rng));
  values.push_back(NAN);
  std::vector<uint16_t> got(values.size());
  cpu::bf16_round_floats(values.data(), static_cast<int64_t>(values.size()), got.data());
  for (size_t i = 0; i + 1 < values.size(); ++i)
    EXPECT_EQ(got[i], float_to_bfloat16(values[i])) << "value " << values[i];
  const uint32_t nan_bits = static_cast<uint32_t>(got.back()) << 16;
  float nan_back;
  std::memcpy(&nan_back, &nan_bits, 4);
  EXPECT_TRUE(std::isnan(nan_back));
}

TEST(Bf16Gemm, SumsTheRoundedOperandsOnEveryKernel) {
  if (cpu::bf16_gemm_best_isa() == cpu::Bf16GemmIsa::kNone) GTEST_SKIP() << "no bfloat16 products on this CPU";
  struct Shape {
    int64_t rows, n, k;
  };
  // Rows around the 32-row blocks and the 8 rows below which AMX gives way to AVX512-BF16;
  // columns around the 32-column panels; K around AMX's steps of 32 and odd (pairs of K); and
  // rounded rows past 2 MB, which each task rounds for itself (1100 x 1024 x 2 bytes).
  const std::vector<Shape> shapes = {{1, 1, 1},     {3, 33, 17},     {8, 32, 32},   {9, 31, 33},  {33, 70, 64},
                                     {64, 96, 200}, {100, 17, 1000}, {300, 40, 72}, {1100, 9, 1000}};
  const std::vector<ir::Activation> acts = {ir::Activation{}, ir::Activation{ir::ActivationKind::kRelu},
                                            ir::Activation::named("Clip", -0.3f, 0.4f),
                                            ir::Activation{ir::ActivationKind::kGelu}};
  uint32_t seed = 100;
  for (cpu::Bf16GemmIsa isa : isas())
    for (const Shape& s : shapes)
      for (size_t a = 0; a < acts.size(); ++a) {
        SCOPED_TRACE(std::string(cpu::bf16_gemm_isa_name(isa)) + " rows " + std::to_string(s.rows) + " n " +
                     std::to_string(s.n) + " k " + std::to_string(s.k) + " activation " + std::to_string(a));
        const bool extras = a % 2 == 1;  // bias and residual with every other activation
        const Tensor x = random_tensor({s.rows, s.k}, seed++), w = random_tensor({s.k, s.n}, seed++);
        const Tensor bias = random_tensor({s.n}, seed++), res = random_tensor({s.rows, s.n}, seed++);
        cpu::Bf16PackedColumns packed;
        packed.pack(isa, w.data<float>(), s.k, s.n, s.n);
        Tensor y(DType::kFloat32, {s.rows, s.n});
        const cpu::Epilogue ep(acts[a]);
        cpu::bf16_rows_gemm(packed, s.rows, x.data<float>(), s.k, y.data<float>(), s.n,
                            extras ? bias.data<float>() : nullptr, extras ? res.data<float>() : nullptr, s.n, &ep, 2);
        for (int64_t r = 0; r < s.rows; ++r)
          for (int64_t j = 0; j < s.n; ++j) {
            double sum = 0, magnitude = 0;
            for (int64_t i = 0; i < s.k; ++i) {
              const double p = double{bf16_value(x.data<float>()[r * s.k + i])} * bf16_value(w.data<float>()[i * s.n + j]);
              sum += p;
              magnitude += std::fabs(p);
            }
            if (extras) {
              sum += double{bias.data<float>()[j]} + res.data<float>()[r * s.n + j];
              magnitude += std::fabs(bias.data<float>()[j]) + std::fabs(res.data<float>()[r * s.n + j]);
            }
            const double want = acts[a].apply(static_cast<float>(sum));
            // float32 sums in another order: a few units of 2^-24 of the terms' magnitude each.
            ASSERT_NEAR(y.data<float>()[r * s.n + j], want, 4e-7 * (magnitude + 1) * (1 + std::log2(s.k + 1)))
                << "row " << r << " column " << j;
          }
      }
}

// The engine's output for one node, bfloat16 products or not, and the kernel's tactic.
Tensor run_node(const ir::Node& node, const std::vector<NodeInput>& inputs, bool bf16, std::string* tactic = nullptr) {
  cpu::CpuEngine engine(single_node_graph(node, inputs), 0, false, bf16);
  if (tactic) *tactic = engine.tactic(0);
  std::map<std::string, Tensor> feed;
  for (const NodeInput& in : inputs)
    if (!in.name.empty() && !in.constant) feed[in.name] = in.data;
  return engine.run(feed).at("Y");
}

// The node with bfloat16 products against the float32 kernel on rounded X and W (the inputs
// named in `rounded_inputs`), and its tactic naming the bfloat16 kernel.
void expect_rounded_float32(const ir::Node& node, std::vector<NodeInput> inputs, const std::vector<size_t>& rounded_inputs) {
  std::string tactic;
  const Tensor got = run_node(node, inputs, true, &tactic);
  EXPECT_EQ(tactic, std::string("bf16 ") + cpu::bf16_gemm_isa_name(cpu::bf16_gemm_isa()));
  const Tensor unrounded = run_node(node, inputs, false);
  for (size_t i : rounded_inputs) inputs[i].data = testing::bf16_rounded(inputs[i].data);
  const Tensor want = run_node(node, inputs, false);
  EXPECT_TRUE(all_close(got, want, 1e-4f));
  // And the operands were rounded: the float32 product of the unrounded ones differs.
  EXPECT_FALSE(all_close(got, unrounded, 1e-6f));
}

TEST(Bf16Products, MatMulAndGemmByConstantWeights) {
  if (cpu::bf16_gemm_best_isa() == cpu::Bf16GemmIsa::kNone) GTEST_SKIP() << "no bfloat16 products on this CPU";
  for (cpu::Bf16GemmIsa isa : isas()) {
    SCOPED_TRACE(cpu::bf16_gemm_isa_name(isa));
    cpu::bf16_gemm_force_isa(isa);
    ir::Node matmul;
    matmul.op = "MatMul";
    // Batch and rows fold into one product of 2 x 45 rows.
    expect_rounded_float32(matmul, {{"A", random_tensor({2, 45, 70}, 1)}, {"B", random_tensor({70, 50}, 2), true}}, {0, 1});
    ir::Node fused;
    fused.op = "FusedMatMul";
    fused.domain = "kiln";
    ir::Activation{ir::ActivationKind::kGelu}.store(fused);
    expect_rounded_float32(fused,
                           {{"A", random_tensor({37, 64}, 3)}, {"B", random_tensor({64, 40}, 4), true},
                            {"bias", random_tensor({40}, 5), true}, {"Z", random_tensor({37, 40}, 6)}},
                           {0, 1});
    ir::Node gemm;
    gemm.op = "Gemm";
    gemm.attrs.set("transB", int64_t{1});
    expect_rounded_float32(gemm,
                           {{"A", random_tensor({5, 33}, 7)}, {"B", random_tensor({20, 33}, 8), true},
                            {"C", random_tensor({20}, 9), true}},
                           {0, 1});
    cpu::bf16_gemm_reset_isa();
  }
}

TEST(Bf16Products, ChannelsLastConvolutions) {
  if (cpu::bf16_gemm_best_isa() == cpu::Bf16GemmIsa::kNone) GTEST_SKIP() << "no bfloat16 products on this CPU";
  struct Case {
    const char* name;
    std::vector<int64_t> x, w;  // X channels-last [N, H, W, C], W [M, C, kH, kW]
    std::vector<int64_t> strides, dilations, pads;
  };
  const std::vector<Case> cases = {
      {"pointwise, 2 images", {2, 7, 6, 40}, {70, 40, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {"3x3 pad 1", {1, 9, 11, 16}, {40, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
      {"7x7 stride 2 pad 3, 3 channels", {1, 20, 18, 3}, {8, 3, 7, 7}, {2, 2}, {1, 1}, {3, 3, 3, 3}},
      {"dilation 2, asymmetric pads", {1, 12, 10, 6}, {9, 6, 3, 3}, {1, 1}, {2, 2}, {2, 1, 0, 2}},
      {"rectangular kernel, strides 1x3", {1, 8, 13, 5}, {5, 5, 2, 4}, {1, 3}, {1, 1}, {0, 1, 1, 0}},
      {"pads wider than the input", {1, 2, 3, 4}, {6, 4, 3, 3}, {1, 1}, {1, 1}, {3, 2, 3, 2}},
      {"3x3 stride 2, 70 channels in", {1, 9, 8, 70}, {20, 70, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}},
  };
  uint32_t seed = 300;
  for (cpu::Bf16GemmIsa isa : isas())
    for (const Case& c : cases)
      for (const char* act : {"Relu", "SiLU"}) {
        SCOPED_TRACE(std::string(cpu::bf16_gemm_isa_name(isa)) + " " + c.name + " " + act);
        cpu::bf16_gemm_force_isa(isa);
        ir::Node node;
        node.op = "ChannelsLastConv";
        node.domain = "kiln";
        node.attrs.set("strides", c.strides);
        node.attrs.set("dilations", c.dilations);
        node.attrs.set("pads", c.pads);
        node.attrs.set("group", int64_t{1});
        ir::Activation::named(act, 0.f, 0.f).store(node);
        const Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++), b = random_tensor({c.w[0]}, seed++);
        const Tensor probe = run_node(node, {{"X", x}, {"W", w, true}, {"B", b, true}}, false);
        const Tensor z = random_tensor(probe.shape(), seed++);
        expect_rounded_float32(node, {{"X", x}, {"W", w, true}, {"B", b, true}, {"Z", z}}, {0, 1});
        cpu::bf16_gemm_reset_isa();
      }
}

// Attention's two products per head in bfloat16: within bfloat16's rounding of the float32
// kernel, for 4-D and 3-D (heads in the last axis) inputs, an additive mask with masked keys,
// causal rows, key counts off the 32-column panels and head sizes off AMX's 32 steps of K.
TEST(Bf16Products, AttentionWithinBfloat16RoundingOfFloat32) {
  if (cpu::bf16_gemm_best_isa() == cpu::Bf16GemmIsa::kNone) GTEST_SKIP() << "no bfloat16 products on this CPU";
  uint32_t seed = 900;
  for (bool three_d : {false, true})
    for (bool causal : {false, true}) {
      const int64_t B = 2, H = 3, S = 37, T = causal ? 37 : 45, D = 24, Dv = 40;
      SCOPED_TRACE(std::string(three_d ? "3-D" : "4-D") + (causal ? " causal" : " masked"));
      Tensor q = random_tensor(three_d ? std::vector<int64_t>{B, S, H * D} : std::vector<int64_t>{B, H, S, D}, seed++);
      Tensor k = random_tensor(three_d ? std::vector<int64_t>{B, T, H * D} : std::vector<int64_t>{B, H, T, D}, seed++);
      Tensor v = random_tensor(three_d ? std::vector<int64_t>{B, T, H * Dv} : std::vector<int64_t>{B, H, T, Dv}, seed++);
      Tensor mask = random_tensor({S, T}, seed++);
      for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] *= 3.f;  // a softmax far from uniform
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 1; j < T; j += 3) mask.data<float>()[i * T + j] = -INFINITY;
      auto run = [&](bool bf16, std::string* tactic) {
        ir::Node node;
        if (causal) node.attrs.set("is_causal", int64_t{1});
        if (three_d) {
          node.attrs.set("q_num_heads", H);
          node.attrs.set("kv_num_heads", H);
        }
        cpu::CpuEngine engine(testing::attention_graph({{"Q", &q}, {"K", &k}, {"V", &v}, {"M", &mask}}, node), 0, false,
                              bf16);
        if (tactic) *tactic = engine.tactic(0);
        return engine.run({{"Q", q}, {"K", k}, {"V", v}, {"M", mask}}).at("Y");
      };
      std::string tactic;
      const Tensor got = run(true, &tactic), want = run(false, nullptr);
      EXPECT_EQ(tactic, std::string("bf16 ") + cpu::bf16_gemm_isa_name(cpu::bf16_gemm_isa()));
      ASSERT_EQ(got.shape(), want.shape());
      double worst = 0, differ = 0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        const double d = std::fabs(double{got.data<float>()[i]} - want.data<float>()[i]);
        worst = std::max(worst, d);
        differ += d > 0;
      }
      // Outputs are averages of values in [-1, 1]: bfloat16's operands move them by about 2^-8.
      EXPECT_LT(worst, 0.015);
      EXPECT_GT(differ, got.numel() / 2);
    }
}

// A channels-last 3x3 convolution of stride 1, padded by 1, in `group` groups.
ir::Node channels_last_3x3(int64_t group) {
  ir::Node conv;
  conv.op = "ChannelsLastConv";
  conv.domain = "kiln";
  conv.attrs.set("strides", std::vector<int64_t>{1, 1});
  conv.attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  conv.attrs.set("group", group);
  return conv;
}

// The node in an engine of bfloat16 products computes the float32 engine's bits, and says so.
void expect_float32_bits(const ir::Node& node, const std::vector<NodeInput>& inputs) {
  std::string tactic;
  const Tensor got = run_node(node, inputs, true, &tactic), want = run_node(node, inputs, false);
  EXPECT_EQ(tactic, "");
  ASSERT_EQ(got.numel(), want.numel());
  EXPECT_EQ(std::memcmp(got.raw(), want.raw(), static_cast<size_t>(got.nbytes())), 0);
}

// An engine of bfloat16 products on a CPU without them (forced here) computes in float32.
TEST(Bf16Products, Float32WhereTheCpuHasNoBfloat16Products) {
  cpu::bf16_gemm_force_isa(cpu::Bf16GemmIsa::kNone);
  ir::Node matmul;
  matmul.op = "MatMul";
  expect_float32_bits(matmul, {{"A", random_tensor({9, 40}, 1)}, {"B", random_tensor({40, 33}, 2), true}});
  expect_float32_bits(channels_last_3x3(1),
                      {{"X", random_tensor({1, 6, 7, 16}, 3)}, {"W", random_tensor({24, 16, 3, 3}, 4), true}});
  cpu::bf16_gemm_reset_isa();
}

TEST(Bf16Products, DepthwiseConvolutionsStayFloat32) {
  if (cpu::bf16_gemm_best_isa() == cpu::Bf16GemmIsa::kNone) GTEST_SKIP() << "no bfloat16 products on this CPU";
  expect_float32_bits(channels_last_3x3(24),
                      {{"X", random_tensor({1, 6, 7, 24}, 1)}, {"W", random_tensor({24, 1, 3, 3}, 2), true}});
}

}  // namespace
}  // namespace kiln
