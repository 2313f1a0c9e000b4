// kiln::ChannelsLastSeparableConv on the CPU: bit for bit the three (or two)
// kiln::ChannelsLastConv it replaces, run one after another (those are tested against the
// channels-first kernels in channels_last_conv_test.cc), with and without an expansion, strided,
// dilated, asymmetrically padded and 5x5 depthwise kernels, widths off the tiles, K in blocks,
// activations the kernels apply in registers (Relu, Clip) and after (SiLU, HardSwish), residual;
// under the AVX-512 kernels and the plain loops; and what the kernel and schema refuse.
#include <gtest/gtest.h>

#include <string>

#include "compute_test_util.h"
#include "cpu/sgemm.h"
#include "ir/activation.h"

namespace kiln {
namespace {

using testing::run_single_node;
using testing::random_tensor;

struct Block {
  const char* name;
  int64_t n, h, w, c;
  int64_t expanded;  // E; 0: no expansion (E = C)
  int64_t k, stride, dilation;
  std::vector<int64_t> pads;  // top, left, bottom, right
  int64_t m;
  const char* expand_act;
  const char* depthwise_act;
  const char* project_act;
  bool residual;
};

std::vector<Block> blocks() {
  return {
      {"inverted residual, 12 x 13", 1, 12, 13, 16, 96, 3, 1, 1, {1, 1, 1, 1}, 16, "Clip", "Clip", "", true},
      {"stride 2, two images", 2, 11, 9, 8, 40, 3, 2, 1, {1, 1, 1, 1}, 24, "Relu", "Relu", "", false},
      {"no expansion, 20 channels out", 1, 10, 17, 32, 0, 3, 1, 1, {1, 1, 1, 1}, 20, "", "Relu", "Relu", false},
      {"5x5 dilation 2, activations after", 1, 14, 12, 12, 24, 5, 1, 2, {4, 4, 4, 4}, 16, "SiLU", "SiLU", "HardSwish", true},
      {"asymmetric pads, stride 2", 1, 9, 10, 8, 48, 3, 2, 1, {0, 1, 2, 0}, 8, "Relu", "Clip", "", false},
      {"expansion K in blocks (600 channels in)", 1, 5, 6, 600, 64, 3, 1, 1, {1, 1, 1, 1}, 40, "Relu", "Relu", "", true},
      {"projection K in blocks (544 expanded)", 1, 6, 5, 8, 544, 3, 1, 1, {1, 1, 1, 1}, 24, "Relu", "Relu", "", false},
      // Enough rows for several bands of output rows (each expands its first rows anew), two
      // images (a thread's ring must not keep one image's rows for the other's).
      {"bands of rows, two images", 2, 34, 11, 8, 32, 3, 1, 1, {1, 1, 1, 1}, 8, "Relu", "Relu", "", true},
      {"5x5 kernel taller than the 2-row image", 1, 2, 6, 8, 16, 5, 1, 1, {2, 2, 2, 2}, 8, "Relu", "Relu", "", false},
      {"7 x 7, 48 channels out (a narrow last panel)", 1, 7, 7, 16, 32, 3, 1, 1, {1, 1, 1, 1}, 48, "Relu", "", "", true},
  };
}

ir::Activation activation(const char* name) { return ir::Activation::named(name, name == std::string("Clip") ? 0.f : 0.1f, 6.f); }

struct Tensors {
  Tensor x, we, be, wd, bd, wp, bp, z;
};

Tensors make_tensors(const Block& b, const std::vector<int64_t>& out_shape, uint32_t seed) {
  const int64_t e = b.expanded ? b.expanded : b.c;
  Tensors t;
  t.x = random_tensor({b.n, b.h, b.w, b.c}, seed++);
  if (b.expanded) {
    t.we = random_tensor({e, b.c, 1, 1}, seed++);
    t.be = random_tensor({e}, seed++);
  }
  t.wd = random_tensor({e, 1, b.k, b.k}, seed++);
  t.bd = random_tensor({e}, seed++);
  t.wp = random_tensor({b.m, e, 1, 1}, seed++);
  t.bp = random_tensor({b.m}, seed++);
  if (b.residual) t.z = random_tensor(out_shape, seed++);
  return t;
}

ir::Node conv(const char* act, int64_t k, int64_t stride, int64_t dilation, std::vector<int64_t> pads, int64_t group) {
  ir::Node node;
  node.op = "ChannelsLastConv";
  node.domain = "kiln";
  node.attrs.set("kernel_shape", std::vector<int64_t>{k, k});
  node.attrs.set("strides", std::vector<int64_t>{stride, stride});
  node.attrs.set("dilations", std::vector<int64_t>{dilation, dilation});
  node.attrs.set("pads", pads);
  node.attrs.set("group", group);
  activation(act).store(node);
  return node;
}

// The block as the ChannelsLastConv chain it replaces.
Tensor run_chain(const Block& b, const Tensors& t) {
  const int64_t e = b.expanded ? b.expanded : b.c;
  Tensor h = t.x;
  if (b.expanded)
    h = run_single_node(conv(b.expand_act, 1, 1, 1, {0, 0, 0, 0}, 1), {{"X", h}, {"W", t.we, true}, {"B", t.be, true}});
  h = run_single_node(conv(b.depthwise_act, b.k, b.stride, b.dilation, b.pads, e), {{"X", h}, {"W", t.wd, true}, {"B", t.bd, true}});
  std::vector<testing::NodeInput> in{{"X", h}, {"W", t.wp, true}, {"B", t.bp, true}};
  if (b.residual) in.push_back({"Z", t.z});
  return run_single_node(conv(b.project_act, 1, 1, 1, {0, 0, 0, 0}, 1), in);
}

ir::Node separable_node(const Block& b) {
  ir::Node node = conv(b.project_act, b.k, b.stride, b.dilation, b.pads, b.expanded ? b.expanded : b.c);
  node.op = "ChannelsLastSeparableConv";
  activation(b.expand_act).store(node, "expand_");
  activation(b.depthwise_act).store(node, "depthwise_");
  return node;
}

Tensor run_fused(const Block& b, const Tensors& t) {
  std::vector<testing::NodeInput> in{{"X", t.x}};
  if (b.expanded) {
    in.push_back({"We", t.we, true});
    in.push_back({"Be", t.be, true});
  } else {
    in.push_back({"", Tensor()});
    in.push_back({"", Tensor()});
  }
  in.push_back({"Wd", t.wd, true});
  in.push_back({"Bd", t.bd, true});
  in.push_back({"Wp", t.wp, true});
  in.push_back({"Bp", t.bp, true});
  if (b.residual) in.push_back({"Z", t.z});
  return run_single_node(separable_node(b), in);
}

void expect_same_bits(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << "element " << i;
}

TEST(ChannelsLastSeparableConv, GivesTheChainsBits) {
  uint32_t seed = 9100;
  for (const Block& b : blocks()) {
    SCOPED_TRACE(b.name);
    // The output's shape, from the chain without a residual.
    Block probe = b;
    probe.residual = false;
    const std::vector<int64_t> out_shape = run_chain(probe, make_tensors(probe, {}, seed)).shape();
    const Tensors t = make_tensors(b, out_shape, seed++);
    const Tensor want = run_chain(b, t);
    expect_same_bits(run_fused(b, t), want);
    cpu::sgemm_force_isa(cpu::SgemmIsa::kPlain);
    const Tensor want_plain = run_chain(b, t);
    const Tensor got_plain = run_fused(b, t);
    cpu::sgemm_reset_isa();
    expect_same_bits(got_plain, want_plain);
  }
}

TEST(ChannelsLastSeparableConv, RefusesWeightsThatAreNotConstantsAndWrongShapes) {
  const Block b = blocks()[0];
  Tensors t = make_tensors(b, {}, 9500);
  std::vector<testing::NodeInput> in{{"X", t.x}, {"We", t.we, true}, {"Be", t.be, true}, {"Wd", t.wd},
                                     {"Bd", t.bd, true}, {"Wp", t.wp, true}, {"Bp", t.bp, true}};
  try {
    run_single_node(separable_node(b), in);
    FAIL() << "depthwise weights fed at run time were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a constant"), std::string::npos) << e.what();
  }
  in[3] = {"Wd", random_tensor({b.expanded + 1, 1, 3, 3}, 9501), true};  // one channel too many
  try {
    run_single_node(separable_node(b), in);
    FAIL() << "depthwise weights of the wrong width were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Wd"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
