// Tests of channels_last_convs: chains of convolutions become kiln::ChannelsLastConv with
// Transposes only at their ends and compute the same; single convolutions, convolutions the
// backend has no kernel for, and chains too light for what their Transposes move stay;
// outputs read elsewhere keep a Transpose and their names; a model's own Transpose to
// channels-last reads the rewritten output directly; a squeeze-and-excitation block (pool,
// convolutions on one pixel, Mul) stays in its chain, and which elementwise ops may; a first
// convolution on a few channels reads them channels-first where the backend says so, and stays
// out of the separable blocks.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

// Every chain's arithmetic is enough (the tests of the mechanics); the threshold has a test of its own.
constexpr double kAnyArithmetic = 0;

// An inverted residual block, as MobileNet-V2's: 1x1 expansion, 3x3 depthwise, 1x1 projection
// plus the block's input (a FusedConv residual), on a symbolic batch.
ir::Graph inverted_residual(GraphBuilder& b) {
  b.input("x", {ir::Dim::named("N"), 8, 9, 7});
  b.node("Conv", {"x", b.random("w0", {8, 8, 1, 1}), b.random("b0", {8})}, "c0", conv_attrs(1));
  b.node("Conv", {"c0", b.random("w1", {64, 8, 1, 1}), b.random("b1", {64})}, "c1", conv_attrs(1));
  b.node("Conv", {"c1", b.random("w2", {64, 1, 3, 3})}, "c2", conv_attrs(3, 64, 2));
  b.node("Conv", {"c2", b.random("w3", {8, 64, 1, 1})}, "c3", conv_attrs(1));
  b.node("Conv", {"c3", b.random("w4", {8, 8, 3, 3}), b.random("b4", {8})}, "c4", conv_attrs(3));
  b.node("FusedConv", {"c4", b.random("w5", {8, 8, 1, 1}), "", "c3"}, "y", conv_attrs(1));
  b.last().domain = "kiln";
  b.last().attrs.set("activation", std::string("Relu"));
  b.output("y");
  return b.build();
}

TEST(ChannelsLastConvs, AChainRunsChannelsLastBetweenTwoTransposes) {
  GraphBuilder b;
  ir::Graph before = inverted_residual(b);
  ir::Graph after = before;
  EXPECT_EQ(passes::channels_last_convs(after, any_conv, kAnyArithmetic), 6);
  ir::infer_shapes(after);
  EXPECT_EQ(count_ops(after, "ChannelsLastConv"), 6);
  EXPECT_EQ(count_ops(after, "Transpose"), 2);
  EXPECT_EQ(after.nodes.front().op, "Transpose");
  EXPECT_EQ(after.nodes.front().inputs[0], "x");
  EXPECT_EQ(after.nodes.back().op, "Transpose");
  EXPECT_EQ(after.nodes.back().outputs[0], "y");
  // The residual reads the channels-last copy of c3, not a Transpose of its own.
  const ir::Node& last_conv = after.nodes[after.nodes.size() - 2];
  EXPECT_EQ(last_conv.op, "ChannelsLastConv");
  EXPECT_EQ(last_conv.inputs[3], after.nodes[after.nodes.size() - 4].outputs[0]);
  EXPECT_EQ(last_conv.attrs.get_string("activation", ""), "Relu");
  expect_same_outputs(before, after);
  // Once more: nothing left to rewrite (an engine file's graph is laid out again when loaded).
  EXPECT_EQ(passes::channels_last_convs(after, any_conv, kAnyArithmetic), 0);
}

// The CPU's rule, as a query: one group of at most 4 input channels.
bool few_input_channels(const ir::Graph& g, const ir::Node& n) {
  const Tensor* w = g.constant(n.inputs[1]);
  return n.attrs.get_int("group", 1) == 1 && w && w->dim(1) <= 4;
}

TEST(ChannelsLastConvs, AFirstConvolutionOnAFewChannelsReadsThemChannelsFirst) {
  // An image of 3 channels -> 3x3 stride 2 -> 1x1 back to 3 channels -> 3x3: only the first
  // reads a value from outside the chain, so only it reads channels-first.
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 3, 11, 13});
  b.node("Conv", {"x", b.random("w0", {16, 3, 3, 3}), b.random("b0", {16})}, "c0", conv_attrs(3, 1, 2));
  b.node("Conv", {"c0", b.random("w1", {3, 16, 1, 1})}, "c1", conv_attrs(1));
  b.node("Conv", {"c1", b.random("w2", {8, 3, 3, 3})}, "y", conv_attrs(3));
  b.output("y");
  const ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::channels_last_convs(after, any_conv, kAnyArithmetic, few_input_channels), 3);
  ir::infer_shapes(after);
  EXPECT_EQ(count_ops(after, "Transpose"), 1);  // Y's, back to channels-first
  const ir::Node& first = after.nodes.front();
  EXPECT_EQ(first.op, "ChannelsLastConv");
  EXPECT_EQ(first.inputs[0], "x");
  EXPECT_EQ(first.attrs.get_int("input_channels_first", 0), 1);
  EXPECT_EQ(after.nodes[2].op, "ChannelsLastConv");
  EXPECT_EQ(after.nodes[2].attrs.get_int("input_channels_first", 0), 0);  // reads c1 channels-last
  expect_same_outputs(before, after);
  // Without the query the input has a Transpose of its own.
  ir::Graph transposed = before;
  EXPECT_EQ(passes::channels_last_convs(transposed, any_conv, kAnyArithmetic), 3);
  EXPECT_EQ(count_ops(transposed, "Transpose"), 2);
  EXPECT_EQ(find_op(transposed, "ChannelsLastConv")->attrs.get_int("input_channels_first", 0), 0);
}

TEST(ChannelsLastConvs, AChannelsFirstExpansionStaysOutOfSeparableBlocks) {
  // 1x1 expansion of a 3-channel input, depthwise, projection: the expansion reads channels-first,
  // so the block the separable pass fuses is the depthwise and the projection only.
  GraphBuilder b;
  b.input("x", {1, 3, 12, 12});
  b.node("Conv", {"x", b.random("w0", {24, 3, 1, 1})}, "c0", conv_attrs(1));
  b.node("Conv", {"c0", b.random("w1", {24, 1, 3, 3})}, "c1", conv_attrs(3, 24));
  b.node("Conv", {"c1", b.random("w2", {8, 24, 1, 1})}, "y", conv_attrs(1));
  b.output("y");
  const ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::channels_last_convs(after, any_conv, kAnyArithmetic, few_input_channels), 3);
  ir::infer_shapes(after);
  EXPECT_EQ(passes::separable_convs(after, 0), 1);
  ir::infer_shapes(after);
  EXPECT_EQ(count_ops(after, "ChannelsLastConv"), 1);
  EXPECT_EQ(find_op(after, "ChannelsLastConv")->attrs.get_int("input_channels_first", 0), 1);
  EXPECT_EQ(count_ops(after, "ChannelsLastSeparableConv"), 1);
  expect_same_outputs(before, after);
}

TEST(ChannelsLastConvs, ConvolutionsWithoutAKernelAndSingleOnesStay) {
  // Without a kernel for the 3x3 convolutions the chain splits in two: c0 -> c1, and c3 -> y
  // (y's residual); c2 and c4 stay channels-first between them.
  GraphBuilder b;
  const ir::Graph chain = inverted_residual(b);
  ir::Graph kept = chain;
  auto only_pointwise = [](const ir::Graph&, const ir::Node& n) { return n.attrs.get_ints("kernel_shape") == std::vector<int64_t>{1, 1}; };
  EXPECT_EQ(passes::channels_last_convs(kept, only_pointwise, kAnyArithmetic), 4);
  EXPECT_EQ(count_ops(kept, "ChannelsLastConv"), 4);
  EXPECT_EQ(count_ops(kept, "Conv"), 2);
  ir::infer_shapes(kept);
  expect_same_outputs(chain, kept);
  kept = chain;
  EXPECT_EQ(passes::channels_last_convs(kept, [](const ir::Graph&, const ir::Node&) { return false; }, kAnyArithmetic), 0);
  EXPECT_EQ(kept.nodes.size(), chain.nodes.size());

  GraphBuilder one;
  one.input("x", {1, 4, 6, 6});
  one.node("Conv", {"x", one.random("w", {4, 4, 3, 3})}, "y", conv_attrs(3));
  one.output("y");
  ir::Graph single = one.build();
  EXPECT_EQ(passes::channels_last_convs(single, any_conv, kAnyArithmetic), 0);
}

TEST(ChannelsLastConvs, AMaxPoolJoinsTheConvolutionsAroundIt) {
  // ResNet's stem: a 7x7 stride-2 convolution, a 3x3 stride-2 MaxPool, then the first block's
  // convolutions. A MaxPool with a kernel joins them; without one (or with its Indices), the
  // chain splits at it, and the stem, a chain of one, stays channels-first.
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 3, 20, 18});
  b.node("Conv", {"x", b.random("w0", {8, 3, 7, 7})}, "c0",
         {{"kernel_shape", std::vector<int64_t>{7, 7}}, {"pads", std::vector<int64_t>(4, 3)},
          {"strides", std::vector<int64_t>{2, 2}}});
  b.node("MaxPool", {"c0"}, "p0",
         {{"kernel_shape", std::vector<int64_t>{3, 3}}, {"pads", std::vector<int64_t>(4, 1)},
          {"strides", std::vector<int64_t>{2, 2}}});
  b.node("Conv", {"p0", b.random("w1", {8, 8, 3, 3})}, "c1", conv_attrs(3));
  b.node("Conv", {"c1", b.random("w2", {16, 8, 1, 1})}, "y", conv_attrs(1));
  b.output("y");
  const ir::Graph before = b.build();
  ir::Graph joined = before;
  auto with_pools = [](const ir::Graph& g, const ir::Node& n) { return any_conv(g, n) || n.op == "MaxPool"; };
  EXPECT_EQ(passes::channels_last_convs(joined, with_pools, kAnyArithmetic), 4);
  ir::infer_shapes(joined);
  EXPECT_EQ(count_ops(joined, "ChannelsLastMaxPool"), 1);
  EXPECT_EQ(count_ops(joined, "ChannelsLastConv"), 3);
  EXPECT_EQ(count_ops(joined, "Transpose"), 2);  // x in, y out
  expect_same_outputs(before, joined);
  ir::Graph split = before;
  EXPECT_EQ(passes::channels_last_convs(split, any_conv, kAnyArithmetic), 2);
  EXPECT_EQ(count_ops(split, "MaxPool"), 1);
  EXPECT_EQ(count_ops(split, "FusedConv") + count_ops(split, "Conv"), 1);  // the stem
}

TEST(ChannelsLastConvs, ChainsTooLightForTheirTransposesStay) {
  // Two 1x1 convolutions of 4 x 4 channels on 6 x 6 pixels: 2 x 36 x 16 x 2 = 2304 FLOPs per
  // image; their Transposes move x (144 elements), c0 (read by Sigmoid, 144) and c1 (144).
  GraphBuilder split;
  split.input("x", {1, 4, 6, 6});
  split.node("Conv", {"x", split.random("w0", {4, 4, 1, 1})}, "c0", conv_attrs(1));
  split.node("Sigmoid", {"c0"}, "s0");
  split.node("Conv", {"c0", split.random("w1", {4, 4, 1, 1})}, "c1", conv_attrs(1));
  split.node("Add", {"c1", "s0"}, "y");
  split.output("y");
  const ir::Graph busy = split.build();
  ir::Graph at_threshold = busy, past_threshold = busy;
  EXPECT_EQ(passes::channels_last_convs(at_threshold, any_conv, 2304.0 / 432), 2);
  EXPECT_EQ(passes::channels_last_convs(past_threshold, any_conv, 2304.0 / 432 * 1.01), 0);
  EXPECT_EQ(count_ops(past_threshold, "ChannelsLastConv"), 0);
  ir::infer_shapes(at_threshold);
  expect_same_outputs(busy, at_threshold);
}

TEST(ChannelsLastConvs, OutputsReadElsewhereKeepTheirNamesAndValues) {
  GraphBuilder b;
  b.input("x", {2, 6, 10, 10});
  std::string prev = "x";
  for (int i = 0; i < 20; ++i) {  // alternately 3x3 and 1x1, 32 channels
    const std::string c = "c" + std::to_string(i);
    b.node("Conv", {prev, b.random("w" + std::to_string(i), {32, i == 0 ? 6 : 32, i % 2 ? 1 : 3, i % 2 ? 1 : 3})}, c,
           conv_attrs(i % 2 ? 1 : 3));
    prev = c;
  }
  b.node("ReduceMean", {"c1", b.ints("axes", {2, 3})}, "side");  // c1 read outside the chain
  b.node("Transpose", {"c19"}, "c19_nhwc", {{"perm", std::vector<int64_t>{0, 2, 3, 1}}});  // the model's own
  b.node("Relu", {"c19_nhwc"}, "y");
  b.output("y");
  b.output("side");
  b.output("c2");  // a graph output inside the chain
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::channels_last_convs(after, any_conv, kAnyArithmetic), 20);
  ir::infer_shapes(after);
  // Into the chain: x. Out of it: c1 (ReduceMean) and c2 (a graph output). The model's Transpose
  // of c19 is gone: Relu reads the channels-last c19.
  EXPECT_EQ(count_ops(after, "Transpose"), 3);
  for (const ir::Node& n : after.nodes) EXPECT_NE(n.outputs[0], "c19") << n.name;
  EXPECT_EQ(find_op(after, "Relu")->inputs[0], after.value("c19_channels_last").name);
  expect_same_outputs(before, after);
}

// The CPU engine's query, less its instruction set: convolutions, pools, layout-free elementwise ops.
bool with_pools_and_elementwise(const ir::Graph& g, const ir::Node& n) {
  return any_conv(g, n) || n.op == "MaxPool" || n.op == "GlobalAveragePool" || passes::layout_free_elementwise(g, n);
}

TEST(ChannelsLastConvs, ASqueezeAndExcitationBlockStaysInItsChain) {
  // MobileNet-V3's block: expansion, depthwise, squeeze-and-excitation (GlobalAveragePool, two
  // 1x1 convolutions on its one pixel, the block's activations times their result), projection
  // with the block's input added, then the network's own pool.
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 8, 9, 7});
  b.node("Conv", {"x", b.random("w0", {24, 8, 1, 1})}, "expand", conv_attrs(1));
  b.node("Conv", {"expand", b.random("w1", {24, 1, 3, 3})}, "depthwise", conv_attrs(3, 24));
  b.node("GlobalAveragePool", {"depthwise"}, "squeeze");
  b.node("FusedConv", {"squeeze", b.random("w2", {6, 24, 1, 1}), b.random("b2", {6})}, "fc1", conv_attrs(1));
  b.last().domain = "kiln";
  b.last().attrs.set("activation", std::string("Relu"));
  b.node("FusedConv", {"fc1", b.random("w3", {24, 6, 1, 1}), b.random("b3", {24})}, "fc2", conv_attrs(1));
  b.last().domain = "kiln";
  b.last().attrs.set("activation", std::string("HardSigmoid"));
  b.node("Mul", {"depthwise", "fc2"}, "excited");
  b.node("FusedConv", {"excited", b.random("w4", {8, 24, 1, 1}), "", "x"}, "project", conv_attrs(1));
  b.last().domain = "kiln";
  b.node("HardSwish", {"project"}, "activated");
  b.node("GlobalAveragePool", {"activated"}, "y");
  b.output("y");
  const ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::channels_last_convs(after, with_pools_and_elementwise, kAnyArithmetic), 9);
  ir::infer_shapes(after);
  EXPECT_EQ(count_ops(after, "ChannelsLastConv"), 5);
  EXPECT_EQ(count_ops(after, "ChannelsLastGlobalAveragePool"), 2);
  EXPECT_EQ(count_ops(after, "GlobalAveragePool"), 0);
  // x into the chain (the expansion and the residual read one copy), y out of it.
  EXPECT_EQ(count_ops(after, "Transpose"), 2);
  const ir::Node* mul = find_op(after, "Mul");
  ASSERT_NE(mul, nullptr);
  EXPECT_EQ(mul->domain, "");
  EXPECT_EQ(mul->inputs[0], after.value("depthwise_channels_last").name);
  EXPECT_EQ(mul->inputs[1], after.value("fc2_channels_last").name);
  EXPECT_EQ(find_op(after, "HardSwish")->inputs[0], after.value("project_channels_last").name);
  expect_same_outputs(before, after);
  EXPECT_EQ(passes::channels_last_convs(after, with_pools_and_elementwise, kAnyArithmetic), 0);

  // Without the pools and elementwise ops the block splits into chains of their own: expansion
  // and depthwise, fc1 and fc2; the projection, a chain of one, stays channels-first.
  ir::Graph convs_only = before;
  EXPECT_EQ(passes::channels_last_convs(convs_only, any_conv, kAnyArithmetic), 4);
  EXPECT_EQ(count_ops(convs_only, "GlobalAveragePool"), 2);
  EXPECT_EQ(count_ops(convs_only, "FusedConv"), 1);
}

TEST(ChannelsLastConvs, ElementwiseOpsJoinWhereTheirOperandsBroadcastAlikeInBothLayouts) {
  GraphBuilder b;
  b.input("x", {1, 4, 5, 6});
  b.input("per_channel", {4, 1, 1});
  b.node("Mul", {"x", b.random("scale4", {1, 4, 1, 1})}, "rank4");
  b.node("Add", {"x", b.scalar("one", 1.f)}, "plus_scalar");
  b.node("Add", {"x", b.random("single", {1, 1})}, "plus_single");
  b.node("Mul", {"x", "per_channel"}, "rank3");  // [4, 1, 1] broadcasts along W channels-last
  b.node("Relu", {"x"}, "unary");
  b.node("Transpose", {"x"}, "moved", {{"perm", std::vector<int64_t>{0, 2, 3, 1}}});
  b.node("Less", {"x", "x"}, "compare");
  for (const char* out : {"rank4", "plus_scalar", "plus_single", "rank3", "unary", "moved", "compare"}) b.output(out);
  const ir::Graph g = b.build();
  auto takes = [&](const std::string& out) { return passes::layout_free_elementwise(g, g.nodes[static_cast<size_t>(g.producer(out))]); };
  EXPECT_TRUE(takes("rank4"));
  EXPECT_TRUE(takes("plus_scalar"));
  EXPECT_TRUE(takes("plus_single"));
  EXPECT_FALSE(takes("rank3"));
  EXPECT_TRUE(takes("unary"));
  EXPECT_FALSE(takes("moved"));
  EXPECT_FALSE(takes("compare"));
}

}  // namespace
}  // namespace kiln::testing
