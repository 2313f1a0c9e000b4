// Tests of fold_channel_scale: a Mul by a per-column constant after a product by constant
// weights (through an optional bias Add and Transpose) folds into the weights and bias; the
// outputs agree with the unfolded graph, and scales along other axes, shared products,
// scalars and scales that broadcast the product up are left alone.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

using ir::Dim;

TEST(FoldChannelScale, FoldsAConvNeXtLayerScaleThroughTheTranspose) {
  // [N, H, W, C] product, bias, transposed back to [N, C, H, W], scaled by gamma [C, 1, 1].
  GraphBuilder b;
  b.input("x", {Dim::named("N"), 3, 5, 4});
  b.node("MatMul", {"x", b.random("w", {4, 6})}, "m");
  b.node("Add", {"m", b.random("bias", {6})}, "a");
  b.node("Transpose", {"a"}, "t", {{"perm", std::vector<int64_t>{0, 3, 1, 2}}});
  b.node("Mul", {"t", b.random("gamma", {6, 1, 1}, 0.5f, 2.f)}, "s");
  b.node("Add", {"s", b.random("residual", {6, 3, 5})}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fold_channel_scale(after), 1);
  EXPECT_EQ(count_ops(after, "Mul"), 0);
  EXPECT_NE(find_op(after, "MatMul")->inputs[1], "w");  // new weights; the originals are untouched
  EXPECT_EQ(find_op(after, "Transpose")->outputs[0], "s");
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FoldChannelScale, FoldsWithoutTransposeOrBiasAndWithTheScaleFirst) {
  GraphBuilder b;
  b.input("x", {2, 7, 5});
  b.node("MatMul", {"x", b.random("w1", {5, 3})}, "m1");
  b.node("Mul", {b.random("s1", {3}), "m1"}, "h");  // the scale as the first input
  b.node("MatMul", {"h", b.random("w2", {3, 4})}, "m2");
  b.node("Add", {b.random("b2", {1, 1, 4}), "m2"}, "a2");
  b.node("Mul", {"a2", b.random("s2", {1, 4})}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fold_channel_scale(after), 2);
  EXPECT_EQ(count_ops(after, "Mul"), 0);
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FoldChannelScale, LeavesOtherScalesAlone) {
  GraphBuilder b;
  b.input("x", {2, 3, 4});
  // A scale along the rows, not the columns.
  b.node("MatMul", {"x", b.random("w1", {4, 4})}, "m1");
  b.node("Mul", {"m1", b.random("rows", {3, 1})}, "r");
  // A product read twice: its weights must not change.
  b.node("MatMul", {"r", b.random("w2", {4, 4})}, "m2");
  b.node("Mul", {"m2", b.random("s2", {4})}, "s");
  b.node("Relu", {"m2"}, "relu");
  // A scalar (the attention scale's form), and a scale of a higher rank than the product's.
  b.node("MatMul", {"s", b.random("w3", {4, 4})}, "m3");
  b.node("Mul", {"m3", b.scalar("half", 0.5f)}, "h");
  b.node("MatMul", {"h", b.random("w4", {4, 4})}, "m4");
  b.node("Mul", {"m4", b.random("high", {1, 1, 1, 4})}, "w");
  b.node("Add", {"w", "relu"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fold_channel_scale(after), 0);
  EXPECT_EQ(count_ops(after, "Mul"), 4);
}

}  // namespace
}  // namespace kiln::testing
