// Tests of fold_batchnorm: BN folds into Conv / grouped Conv / ConvTranspose / Gemm (both
// transB) / 2-D MatMul weights, or becomes Mul + Add; outputs agree with the unfolded graph.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

using ir::Dim;

// Adds BatchNormalization(x) -> out with random parameters of `channels` entries.
std::string add_batchnorm(GraphBuilder& b, const std::string& x, int64_t channels, const std::string& out) {
  std::vector<std::string> params = {b.random(out + "_gamma", {channels}, 0.5f, 1.5f),
                                     b.random(out + "_beta", {channels}),
                                     b.random(out + "_mean", {channels}),
                                     b.random(out + "_var", {channels}, 0.1f, 2.f)};
  std::vector<std::string> inputs = {x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  return b.node("BatchNormalization", inputs, out, {{"epsilon", 1e-3f}});
}

TEST(FoldBatchNorm, FoldsIntoConvWeightsAndBias) {
  GraphBuilder b;
  b.input("x", {Dim::named("N"), 4, 6, 6});
  b.node("Conv", {"x", b.random("w", {8, 4, 3, 3}), b.random("bias", {8})}, "conv",
         {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  add_batchnorm(b, "conv", 8, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fold_batchnorm(after), 1);
  EXPECT_EQ(count_ops(after, "BatchNormalization"), 0);
  ASSERT_EQ(after.nodes.size(), 1u);
  EXPECT_EQ(after.nodes[0].op, "Conv");
  EXPECT_EQ(after.nodes[0].outputs[0], "y");
  EXPECT_NE(after.nodes[0].inputs[1], "w");  // new weights; the originals are untouched
  expect_same_outputs(before, after);
}

TEST(FoldBatchNorm, FoldsIntoGroupedConvWithoutBiasAndConvTranspose) {
  GraphBuilder b;
  b.input("x", {2, 6, 5, 5});
  b.node("Conv", {"x", b.random("w", {6, 3, 3, 3})}, "conv", {{"group", int64_t{2}}});
  add_batchnorm(b, "conv", 6, "bn1");
  // ConvTranspose weights are [C_in, C_out / group, k, k]: 6 -> 4 channels in 2 groups.
  b.node("ConvTranspose", {"bn1", b.random("wt", {6, 2, 2, 2})}, "deconv",
         {{"group", int64_t{2}}, {"strides", std::vector<int64_t>{2, 2}}});
  add_batchnorm(b, "deconv", 4, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fold_batchnorm(after), 2);
  EXPECT_EQ(count_ops(after, "BatchNormalization"), 0);
  EXPECT_EQ(after.nodes.size(), 2u);
  expect_same_outputs(before, after);
}

TEST(FoldBatchNorm, FoldsIntoGemmAndMatMul) {
  GraphBuilder b;
  b.input("x", {3, 5});
  // transB = 1 with a [1, N] C and beta != 1, then transB = 0 without C.
  b.node("Gemm", {"x", b.random("w1", {4, 5}), b.random("c1", {1, 4})}, "g1",
         {{"transB", int64_t{1}}, {"beta", 0.5f}, {"alpha", 1.5f}});
  add_batchnorm(b, "g1", 4, "bn1");
  b.node("Gemm", {"bn1", b.random("w2", {4, 6})}, "g2");
  add_batchnorm(b, "g2", 6, "bn2");
  b.node("MatMul", {"bn2", b.random("w3", {6, 2})}, "mm");
  add_batchnorm(b, "mm", 2, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fold_batchnorm(after), 3);
  EXPECT_EQ(count_ops(after, "BatchNormalization"), 0);
  EXPECT_EQ(count_ops(after, "Gemm"), 2);
  // MatMul has no bias input: the shift becomes an Add that epilogue fusion absorbs.
  EXPECT_EQ(count_ops(after, "MatMul"), 1);
  EXPECT_EQ(count_ops(after, "Add"), 1);
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FoldBatchNorm, StandaloneOrSharedBecomesMulAdd) {
  GraphBuilder b;
  b.input("x", {2, 3, 4, 4});
  add_batchnorm(b, "x", 3, "bn0");  // after a graph input: nothing to fold into
  b.node("Conv", {"bn0", b.random("w", {5, 3, 1, 1})}, "conv");
  add_batchnorm(b, "conv", 5, "bn1");
  b.node("Relu", {"conv"}, "r");  // a second reader: the Conv's weights must not change
  b.node("Add", {"bn1", "r"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fold_batchnorm(after), 2);
  EXPECT_EQ(count_ops(after, "BatchNormalization"), 0);
  EXPECT_EQ(count_ops(after, "Mul"), 2);
  EXPECT_EQ(find_op(after, "Conv")->inputs[1], "w");
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

}  // namespace
}  // namespace kiln::testing
