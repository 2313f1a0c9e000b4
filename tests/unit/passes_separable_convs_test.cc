// Tests of separable_convs: depthwise-separable blocks of channels-last convolutions (with and
// without an expansion, a residual on the projection) become one kiln::ChannelsLastSeparableConv
// and compute what the chain computed; blocks whose depthwise input is under the threshold stay;
// a value between the convolutions that something else reads keeps its convolution.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "ir/activation.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

// Two blocks on a symbolic batch: MobileNet-V2's inverted residual (1x1 expansion to 48 channels,
// 3x3 depthwise, 1x1 projection plus the block's input) and a depthwise-separable layer of
// stride 2 without expansion. The depthwise convolutions read 48 x 10 x 9 and 8 x 10 x 9 floats
// an image (17,280 and 2,880 bytes).
ir::Graph two_blocks(GraphBuilder& b, bool expanded_read_elsewhere = false) {
  b.input("x", {ir::Dim::named("N"), 8, 10, 9});
  b.node("Conv", {"x", b.random("w0", {8, 8, 3, 3}), b.random("b0", {8})}, "c0", conv_attrs(3));
  b.node("FusedConv", {"c0", b.random("w1", {48, 8, 1, 1}), b.random("b1", {48})}, "c1", conv_attrs(1));
  b.last().domain = "kiln";
  ir::Activation::named("Clip", 0.f, 6.f).store(b.last());
  b.node("FusedConv", {"c1", b.random("w2", {48, 1, 3, 3}), b.random("b2", {48})}, "c2", conv_attrs(3, 48));
  b.last().domain = "kiln";
  ir::Activation::named("Relu").store(b.last());
  b.node("FusedConv", {"c2", b.random("w3", {8, 48, 1, 1}), b.random("b3", {8}), "c0"}, "c3", conv_attrs(1));
  b.last().domain = "kiln";
  b.node("Conv", {"c3", b.random("w4", {8, 1, 3, 3})}, "c4", conv_attrs(3, 8, 2));
  b.node("Conv", {"c4", b.random("w5", {16, 8, 1, 1}), b.random("b5", {16})}, "y", conv_attrs(1));
  b.output("y");
  if (expanded_read_elsewhere) b.output("c1");
  return b.build();
}

// The CPU engine's layout (the compiler's order): channels-last, then the blocks.
ir::Graph laid_out(ir::Graph g, int64_t min_bytes, int expected_blocks) {
  EXPECT_EQ(passes::channels_last_convs(g, any_conv, 0), 6);
  ir::infer_shapes(g);
  EXPECT_EQ(passes::separable_convs(g, min_bytes), expected_blocks);
  ir::infer_shapes(g);
  return g;
}

TEST(SeparableConvs, BlocksBecomeOneNodeAndComputeTheSame) {
  GraphBuilder b;
  const ir::Graph before = two_blocks(b);
  ir::Graph after = laid_out(before, 0, 2);
  EXPECT_EQ(count_ops(after, "ChannelsLastSeparableConv"), 2);
  EXPECT_EQ(count_ops(after, "ChannelsLastConv"), 1);  // the 3x3 stem
  const ir::Node* block = find_op(after, "ChannelsLastSeparableConv");
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(block->inputs.size(), 8u);  // X, We, Be, Wd, Bd, Wp, Bp and the residual
  EXPECT_EQ(block->attrs.get_string("expand_activation", ""), "Clip");
  EXPECT_EQ(block->attrs.get_string("depthwise_activation", ""), "Relu");
  EXPECT_EQ(block->attrs.get_int("group", 0), 48);
  expect_same_outputs(before, after);
  // Once more: nothing left to fuse (an engine file's graph is laid out again when loaded).
  EXPECT_EQ(passes::separable_convs(after, 0), 0);
}

TEST(SeparableConvs, BlocksUnderTheThresholdStay) {
  GraphBuilder b;
  const ir::Graph before = two_blocks(b);
  // Only the inverted residual's depthwise input (17,280 bytes) reaches 10,000 bytes.
  const ir::Graph after = laid_out(before, 10000, 1);
  EXPECT_EQ(count_ops(after, "ChannelsLastConv"), 3);
  expect_same_outputs(before, after);
  laid_out(before, 17281, 0);
}

TEST(SeparableConvs, AValueReadElsewhereKeepsItsConvolution) {
  GraphBuilder b;
  const ir::Graph before = two_blocks(b, /*expanded_read_elsewhere=*/true);
  const ir::Graph after = laid_out(before, 0, 2);
  // The expansion's output is a graph output: the first block fuses its depthwise and
  // projection only, the expansion stays a ChannelsLastConv of its own.
  EXPECT_EQ(count_ops(after, "ChannelsLastConv"), 2);
  for (const ir::Node& n : after.nodes)
    if (n.op == "ChannelsLastSeparableConv" && n.attrs.get_int("group", 0) == 48) EXPECT_EQ(n.inputs[1], "");
  expect_same_outputs(before, after);
}

}  // namespace
}  // namespace kiln::testing
