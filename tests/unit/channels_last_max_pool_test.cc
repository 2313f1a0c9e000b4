// kiln::ChannelsLastMaxPool on the CPU: bit for bit MaxPool (channels-first, tested in
// pool_test.cc) on the same tensors transposed, for ResNet's 3x3 stride-2 pool, 2x2 windows,
// dilation, ceil_mode, asymmetric pads, a window wholly in the padding, channel counts off the
// 16-channel vectors and NaN in a window's first and later taps; under the AVX-512 kernel and the
// plain loops.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "compute_test_util.h"
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

}  // namespace
}  // namespace kiln
