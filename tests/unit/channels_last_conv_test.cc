// kiln::ChannelsLastConv on the CPU: against kiln::FusedConv (channels-first, itself tested
// against the definition in conv_test.cc) on the same tensors transposed, for one group and
// depthwise, pointwise and strided, padded, dilated and rectangular kernels, channel and pixel
// counts off the 8 x 32 tiles and the 16-channel vectors, K in blocks, Winograd's two schedules,
// a channels-first X (input_channels_first: images of 1 to 4 channels, strides 1 to 4, tiles
// that pass the image's edges and the output row's end), with bias, residual and activations;
// the AVX-512 kernels against the plain loops bit for bit; and the nodes it refuses.
#include <gtest/gtest.h>

#include <string>

#include "compute_test_util.h"
#include "cpu/sgemm.h"
#include "ir/activation.h"

namespace kiln {
namespace {

using testing::all_close;
using testing::NodeInput;
using testing::permute4;
using testing::random_tensor;
using testing::run_single_node;

Tensor to_channels_last(const Tensor& x) { return permute4(x, {0, 2, 3, 1}); }
Tensor to_channels_first(const Tensor& x) { return permute4(x, {0, 3, 1, 2}); }

struct Case {
  const char* name;
  std::vector<int64_t> x, w;  // channels-first X [N, C, H, W], W [M, C/group, kH, kW]
  std::vector<int64_t> strides, dilations, pads;
  int64_t group;
  bool winograd = false;  // 3x3 of stride 1 with enough tiles: the AVX-512 kernel runs Winograd here
  bool channels_first_input = false;  // X given channels-first (attribute input_channels_first)
};

std::vector<Case> cases() {
  return {
      {"pointwise, 3 x 5 pixels", {1, 17, 3, 5}, {33, 17, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1},
      {"pointwise, 2 images, 70 channels out", {2, 40, 7, 7}, {70, 40, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1},
      {"pointwise stride 2", {1, 24, 9, 10}, {32, 24, 1, 1}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 1},
      {"pointwise with end pads", {1, 8, 5, 5}, {5, 8, 1, 1}, {1, 1}, {1, 1}, {0, 0, 1, 1}, 1},
      {"3x3 pad 1", {1, 16, 9, 11}, {40, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1},
      {"3-channel stem, 3x3 stride 2", {2, 3, 15, 16}, {32, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 1},
      {"7x7 stride 2 pad 3", {1, 3, 20, 18}, {8, 3, 7, 7}, {2, 2}, {1, 1}, {3, 3, 3, 3}, 1},
      {"dilation 2, asymmetric pads", {1, 6, 12, 10}, {9, 6, 3, 3}, {1, 1}, {2, 2}, {2, 1, 0, 2}, 1},
      {"rectangular kernel, strides 1x3", {1, 5, 8, 13}, {5, 5, 2, 4}, {1, 3}, {1, 1}, {0, 1, 1, 0}, 1},
      {"pads wider than the input", {1, 4, 2, 3}, {6, 4, 3, 3}, {1, 1}, {1, 1}, {3, 2, 3, 2}, 1},
      {"depthwise 3x3, 5 channels", {1, 5, 11, 11}, {5, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 5},
      {"depthwise 3x3 stride 2, 40 channels", {2, 40, 12, 13}, {40, 1, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 40},
      {"depthwise 3x3, 70 channels, 16 columns", {1, 70, 6, 16}, {70, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 70},
      {"depthwise 5x5 stride 2", {1, 17, 13, 17}, {17, 1, 5, 5}, {2, 2}, {1, 1}, {2, 2, 2, 2}, 17},
      {"depthwise 5x5, 24 columns of 40 channels", {1, 40, 9, 24}, {40, 1, 5, 5}, {1, 1}, {1, 1}, {2, 2, 2, 2}, 40},
      {"depthwise 3x3 stride 2, 20 output columns", {1, 24, 9, 40}, {24, 1, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 24},
      {"depthwise 5x5 stride 2, 22 output columns", {1, 20, 9, 44}, {20, 1, 5, 5}, {2, 2}, {1, 1}, {2, 2, 2, 2}, 20},
      {"depthwise 7x7, dilation 2", {1, 32, 16, 15}, {32, 1, 7, 7}, {1, 1}, {2, 2}, {6, 6, 6, 6}, 32},
      {"depthwise narrower than the kernel", {1, 16, 4, 2}, {16, 1, 3, 3}, {1, 1}, {1, 1}, {0, 1, 0, 1}, 16},
      // 25 taps x 200 channels of weights (20 KB) run in runs of 128 channels; 7-pixel rows leave
      // three pixels inside the image, so every pixel runs one at a time.
      {"depthwise 5x5, 200 channels on 7 x 7", {1, 200, 7, 7}, {200, 1, 5, 5}, {1, 1}, {1, 1}, {2, 2, 2, 2}, 200},
      {"depthwise 3x3, 600 channels on 6 x 14", {1, 600, 6, 14}, {600, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 600},
      // K past 512 rows runs in blocks of 256: across kernel rows (3 x 70 = 210 each), inside one
      // pointwise row, and across dilated taps.
      {"3x3 stride 2, 70 channels in", {1, 70, 9, 8}, {20, 70, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 1},
      {"pointwise, 600 channels in", {1, 600, 3, 4}, {40, 600, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1},
      {"dilated 3x3, 100 channels in", {1, 100, 7, 7}, {24, 100, 3, 3}, {1, 1}, {2, 2}, {2, 2, 2, 2}, 1},
      // 49 pixels run in tiles of 7 (tiles of 8 would compute 56 rows): a full panel, a narrow
      // last panel of 8 channels (two tiles a call), and a 3x3 kernel over the padded edge.
      {"7 x 7 pixels, 40 channels out", {1, 24, 7, 7}, {40, 24, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1},
      {"3x3 stride 2 to 7 x 7 pixels", {1, 12, 13, 14}, {36, 12, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 1},
      // Winograd F(2x2, 3x3): blocks of tiles, odd sizes over two images, and (U larger than
      // the tiles' transforms) the three loops over all tiles.
      {"Winograd, 16 x 18 pixels", {1, 16, 16, 18}, {24, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, true},
      {"Winograd, 2 images of 9 x 13, 33 channels out", {2, 20, 9, 13}, {33, 20, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, true},
      {"Winograd over all tiles, 128 channels", {1, 128, 12, 12}, {128, 128, 3, 3}, {1, 1}, {1, 1}, {0, 1, 1, 0}, 1, true},
      // X channels-first: tiles of 8 pixels by 32 channels (16 by 16 where M fits one vector)
      // along an output row, the strides 1, 2 and 4 fixed at compile time and others not.
      {"channels-first stem, 3x3 stride 2", {2, 3, 15, 16}, {32, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 1, false, true},
      {"channels-first 7x7 stride 2, 64 channels out", {1, 3, 20, 37}, {64, 3, 7, 7}, {2, 2}, {1, 1}, {3, 3, 3, 3}, 1, false, true},
      {"channels-first 1 channel, 16 out", {1, 1, 9, 37}, {16, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, false, true},
      {"channels-first 4x4 stride 4 patches, 40 out", {1, 4, 16, 20}, {40, 4, 4, 4}, {4, 4}, {1, 1}, {0, 0, 0, 0}, 1, false, true},
      {"channels-first stride 3, dilation 2, asymmetric pads", {1, 3, 17, 61}, {20, 3, 3, 2}, {3, 3}, {2, 2}, {2, 1, 0, 3}, 1, false, true},
      {"channels-first pads wider than the input", {1, 2, 2, 3}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {3, 2, 3, 2}, 1, false, true},
      {"channels-first pointwise, 33 out", {1, 2, 5, 19}, {33, 2, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, false, true},
      {"channels-first 5x3 stride 2, 24 out", {1, 3, 12, 41}, {24, 3, 5, 3}, {2, 1}, {1, 1}, {2, 1, 2, 1}, 1, false, true},
  };
}

ir::Node conv_node(const std::string& op, const Case& c) {
  ir::Node node;
  node.name = "node0";
  node.op = op;
  node.domain = "kiln";
  node.attrs.set("strides", c.strides);
  node.attrs.set("dilations", c.dilations);
  node.attrs.set("pads", c.pads);
  node.attrs.set("group", c.group);
  if (c.channels_first_input) node.attrs.set("input_channels_first", int64_t{1});
  return node;
}

// The channels-last kernel's output for channels-first inputs, back in channels-first.
Tensor run_channels_last(const Case& c, const ir::Activation& act, const Tensor& x, const Tensor& w, const Tensor& b,
                         const Tensor& z) {
  ir::Node node = conv_node("ChannelsLastConv", c);
  act.store(node);
  return to_channels_first(run_single_node(
      node, {{"X", c.channels_first_input ? x : to_channels_last(x)}, {"W", w, true}, {"B", b, true}, {"Z", to_channels_last(z)}}));
}

TEST(ChannelsLastConv, MatchesTheChannelsFirstKernel) {
  uint32_t seed = 7000;
  for (const Case& c : cases())
    for (const char* act : {"Relu", "Clip", "SiLU", ""}) {
      SCOPED_TRACE(std::string(c.name) + ", activation '" + act + "'");
      Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++), b = random_tensor({c.w[0]}, seed++);
      ir::Node fused = conv_node("FusedConv", c);
      const ir::Activation a = ir::Activation::named(act, std::string(act) == "Clip" ? -0.25f : 0.1f, 0.5f);
      a.store(fused);
      // The output's shape, from the channels-first kernel without a residual.
      Tensor shape_probe = run_single_node(fused, {{"X", x}, {"W", w, true}, {"B", b, true}});
      Tensor z = random_tensor(shape_probe.shape(), seed++);
      Tensor want = run_single_node(fused, {{"X", x}, {"W", w, true}, {"B", b, true}, {"Z", z}});
      EXPECT_TRUE(all_close(run_channels_last(c, a, x, w, b, z), want));
    }
}

// The AVX2 kernels (what an engine file built on an AVX-512 CPU runs on a CPU without it) sum in
// the AVX-512 kernels' order: the same bits.
TEST(ChannelsLastConv, Avx512KernelsGiveTheAvx2KernelsBits) {
  if (cpu::sgemm_best_isa() != cpu::SgemmIsa::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  uint32_t seed = 7500;
  for (const Case& c : cases()) {
    if (c.winograd) continue;  // the AVX2 kernels run the direct convolution
    SCOPED_TRACE(c.name);
    Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++), b = random_tensor({c.w[0]}, seed++);
    ir::Node probe = conv_node("FusedConv", c);
    Tensor z = random_tensor(run_single_node(probe, {{"X", x}, {"W", w, true}}).shape(), seed++);
    const ir::Activation relu{ir::ActivationKind::kRelu};
    Tensor vector = run_channels_last(c, relu, x, w, b, z);
    cpu::sgemm_force_isa(cpu::SgemmIsa::kAvx2);
    Tensor avx2 = run_channels_last(c, relu, x, w, b, z);
    cpu::sgemm_reset_isa();
    ASSERT_EQ(vector.numel(), avx2.numel());
    for (int64_t i = 0; i < vector.numel(); ++i)
      ASSERT_EQ(vector.data<float>()[i], avx2.data<float>()[i]) << "element " << i;
  }
}

TEST(ChannelsLastConv, RefusesWhatItHasNoKernelFor) {
  const Case grouped{"groups 2", {1, 4, 5, 5}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 2};
  Tensor x = to_channels_last(random_tensor(grouped.x, 1)), w = random_tensor(grouped.w, 2);
  try {
    run_single_node(conv_node("ChannelsLastConv", grouped), {{"X", x}, {"W", w, true}});
    FAIL() << "a grouped convolution ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 2"), std::string::npos) << e.what();
  }
  const Case plain{"3x3", {1, 4, 5, 5}, {6, 4, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1};
  try {
    run_single_node(conv_node("ChannelsLastConv", plain), {{"X", to_channels_last(random_tensor(plain.x, 3))}, {"W", random_tensor(plain.w, 4)}});
    FAIL() << "weights given at run time ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a constant"), std::string::npos) << e.what();
  }
  // A channels-first X takes one group.
  Case grouped_first = grouped;
  grouped_first.channels_first_input = true;
  try {
    run_single_node(conv_node("ChannelsLastConv", grouped_first), {{"X", random_tensor(grouped.x, 7)}, {"W", w, true}});
    FAIL() << "a grouped convolution of a channels-first X ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 2"), std::string::npos) << e.what();
  }
  // Nor strides past 64 (each tile copies (pixels - 1) * stride floats of a segment at the edges).
  Case far_apart = grouped_first;
  far_apart.w = {6, 4, 3, 3};
  far_apart.group = 1;
  far_apart.strides = {1, 65};
  try {
    run_single_node(conv_node("ChannelsLastConv", far_apart), {{"X", random_tensor(grouped.x, 8)}, {"W", random_tensor(far_apart.w, 9), true}});
    FAIL() << "a channels-first X with stride 65 ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("strides of 65"), std::string::npos) << e.what();
  }
  // X's channels (the last axis) must be W's.
  try {
    run_single_node(conv_node("ChannelsLastConv", plain), {{"X", random_tensor({1, 4, 5, 5}, 5)}, {"W", random_tensor(plain.w, 6), true}});
    FAIL() << "5 channels ran against weights of 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("channels"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
