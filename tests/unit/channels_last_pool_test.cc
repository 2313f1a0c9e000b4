// kiln::ChannelsLastMaxPool on the CPU: bit for bit MaxPool (channels-first, tested in
// pool_test.cc) on the same tensors transposed, for ResNet's 3x3 stride-2 pool, 2x2 windows,
// dilation, ceil_mode, asymmetric pads, a window wholly in the padding, channel counts off the
// 16-channel vectors and NaN in a window's first and later taps; under the AVX-512 kernel and the
// plain loops. kiln::ChannelsLastGlobalAveragePool: the mean of each channel, the same bits on
// one thread and on three and under the plain loops, for planes of one band of pixels and of
// several, channel counts past a block.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "compute_test_util.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"

namespace kiln {
namespace {

using testing::permute4;
using testing::random_tensor;
using testing::run_single_node;

struct Pool {
  const char* name;
  std::vector<int64_t> x;  // channels-first [N, C, H, W]
  std::vector<int64_t> kernel, strides, dilations, pads;
  int64_t ceil_mode;
};

std::vector<Pool> pools() {
  return {
      {"3x3 stride 2 pad 1 (ResNet's)", {2, 64, 15, 14}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 0},
      {"2x2 stride 2, 20 channels", {1, 20, 9, 8}, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 0},
      {"3x3 dilation 2, 5 channels", {1, 5, 11, 10}, {3, 3}, {1, 1}, {2, 2}, {2, 2, 2, 2}, 0},
      {"ceil_mode, asymmetric pads", {1, 33, 10, 9}, {3, 2}, {2, 3}, {1, 1}, {0, 1, 2, 0}, 1},
      {"a window wholly in the padding", {1, 17, 4, 5}, {2, 2}, {1, 1}, {1, 1}, {3, 0, 0, 0}, 0},
  };
}

ir::Node pool_node(const std::string& op, const Pool& p) {
  ir::Node node;
  node.op = op;
  node.domain = op == "MaxPool" ? "" : "kiln";
  node.attrs.set("kernel_shape", p.kernel);
  node.attrs.set("strides", p.strides);
  node.attrs.set("dilations", p.dilations);
  node.attrs.set("pads", p.pads);
  node.attrs.set("ceil_mode", p.ceil_mode);
  return node;
}

void expect_same_bits(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < got.numel(); ++i) {
    const float a = got.data<float>()[i], b = want.data<float>()[i];
    ASSERT_TRUE((std::isnan(a) && std::isnan(b)) || a == b) << "element " << i << ": " << a << " vs " << b;
  }
}

TEST(ChannelsLastMaxPool, GivesMaxPoolsBits) {
  uint32_t seed = 9700;
  for (const Pool& p : pools()) {
    SCOPED_TRACE(p.name);
    Tensor x = random_tensor(p.x, seed++);
    // NaN in the first tap of one window and a later tap of another.
    float* v = x.data<float>();
    v[0] = std::numeric_limits<float>::quiet_NaN();
    v[x.numel() / 2 + 1] = std::numeric_limits<float>::quiet_NaN();
    const Tensor want = run_single_node(pool_node("MaxPool", p), {{"X", x}});
    const Tensor nhwc = permute4(x, {0, 2, 3, 1});
    expect_same_bits(permute4(run_single_node(pool_node("ChannelsLastMaxPool", p), {{"X", nhwc}}), {0, 3, 1, 2}), want);
    cpu::sgemm_force_isa(cpu::SgemmIsa::kPlain);
    const Tensor plain = run_single_node(pool_node("ChannelsLastMaxPool", p), {{"X", nhwc}});
    cpu::sgemm_reset_isa();
    expect_same_bits(permute4(plain, {0, 3, 1, 2}), want);
  }
}

TEST(ChannelsLastMaxPool, RefusesAnInputThatIsNotNHWC) {
  try {
    run_single_node(pool_node("ChannelsLastMaxPool", pools()[0]), {{"X", random_tensor({2, 3, 4}, 1)}});
    FAIL() << "a rank-3 input was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("N x H x W x C"), std::string::npos) << e.what();
  }
}

TEST(ChannelsLastGlobalAveragePool, AveragesEachChannelTheSameOnAnyNumberOfThreads) {
  // Channels-first shapes [N, C, H, W]: 7x7 (one band), 5x3, 56x56 (3136 pixels: 7 bands, the
  // last short), 600 channels (past a block of 256), 1 channel, 112x112 at batch 2.
  const std::vector<std::vector<int64_t>> shapes = {{2, 96, 7, 7}, {3, 17, 5, 3}, {1, 24, 56, 56},
                                                   {1, 600, 9, 9}, {2, 1, 6, 6}, {2, 32, 112, 112}};
  const int threads = cpu::thread_count();
  uint32_t seed = 9800;
  for (const auto& shape : shapes) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    Tensor x = random_tensor(shape, seed++);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = x.data<float>()[i] * 100.f + 3.f;  // rounding shows
    ir::Node node;
    node.op = "ChannelsLastGlobalAveragePool";
    node.domain = "kiln";
    const Tensor nhwc = permute4(x, {0, 2, 3, 1});
    const Tensor got = run_single_node(node, {{"X", nhwc}});
    ASSERT_EQ(got.shape(), (std::vector<int64_t>{shape[0], 1, 1, shape[1]}));
    // Against the mean in double: float32 sums of up to 12544 values of about 100.
    const int64_t pixels = shape[2] * shape[3];
    for (int64_t n = 0; n < shape[0]; ++n)
      for (int64_t c = 0; c < shape[1]; ++c) {
        double sum = 0;
        for (int64_t p = 0; p < pixels; ++p) sum += x.data<float>()[(n * shape[1] + c) * pixels + p];
        ASSERT_NEAR(got.data<float>()[n * shape[1] + c], sum / static_cast<double>(pixels), 1e-5 * 100) << n << ", " << c;
      }
    // The same bits on one thread and on three, and under the plain loops.
    cpu::set_thread_count(1);
    const Tensor one_thread = run_single_node(node, {{"X", nhwc}});
    cpu::set_thread_count(3);
    const Tensor three_threads = run_single_node(node, {{"X", nhwc}});
    cpu::set_thread_count(threads);
    cpu::sgemm_force_isa(cpu::SgemmIsa::kPlain);
    const Tensor plain = run_single_node(node, {{"X", nhwc}});
    cpu::sgemm_reset_isa();
    expect_same_bits(one_thread, got);
    expect_same_bits(three_threads, got);
    expect_same_bits(plain, got);
  }
}

TEST(ChannelsLastGlobalAveragePool, RefusesAnInputThatIsNotNHWC) {
  ir::Node node;
  node.op = "ChannelsLastGlobalAveragePool";
  node.domain = "kiln";
  try {
    run_single_node(node, {{"X", random_tensor({2, 3, 4}, 1)}});
    FAIL() << "a rank-3 input was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("N x H x W x C"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
