// Tests of transpose_before_merge: Transpose(Reshape(X)) with a merging Reshape becomes
// Reshape(Transpose(X)) with the permutation carried over to X's axes, and computes the same;
// Reshapes that split axes, or Transposes of a reshape read elsewhere, stay.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

std::vector<std::string> ops_of(const ir::Graph& g) {
  std::vector<std::string> ops;
  for (const ir::Node& n : g.nodes) ops.push_back(n.op);
  return ops;
}

TEST(TransposeBeforeMerge, PatchEmbeddingFlattenTransposeReadsTheConvolutionAxes) {
  // flatten(2).transpose(1, 2) of a [N, C, H, W] feature map, with a symbolic batch.
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 6, 3, 5});
  b.node("Reshape", {"x", b.ints("flat", {0, 6, 15})}, "flat_x");
  b.node("Transpose", {"flat_x"}, "y", {{"perm", std::vector<int64_t>{0, 2, 1}}});
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::transpose_before_merge(after), 1);
  ir::infer_shapes(after);
  EXPECT_EQ(ops_of(after), (std::vector<std::string>{"Transpose", "Reshape"}));
  EXPECT_EQ(after.nodes[0].attrs.get_ints("perm"), (std::vector<int64_t>{0, 2, 3, 1}));
  EXPECT_EQ(after.nodes[0].inputs[0], "x");
  EXPECT_EQ(after.nodes[1].outputs[0], "y");
  EXPECT_EQ(ir::dims_to_string(*after.value("y").type.shape), ir::dims_to_string(*before.value("y").type.shape));
  expect_same_outputs(before, after);
}

TEST(TransposeBeforeMerge, SeveralMergedRunsAndTrailingUnitAxes) {
  GraphBuilder b;
  b.input("x", {2, 3, 4, 5, 1});
  b.node("Reshape", {"x", b.ints("merged", {6, 20})}, "m");
  b.node("Transpose", {"m"}, "y");  // the default permutation reverses the axes
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::transpose_before_merge(after), 1);
  ir::infer_shapes(after);
  EXPECT_EQ(after.nodes[0].attrs.get_ints("perm"), (std::vector<int64_t>{2, 3, 4, 0, 1}));
  expect_same_outputs(before, after);
}

TEST(TransposeBeforeMerge, SplitsAndSharedReshapesStay) {
  GraphBuilder b;
  b.input("x", {2, 12});
  b.node("Reshape", {"x", b.ints("split", {2, 3, 4})}, "s");
  b.node("Transpose", {"s"}, "y", {{"perm", std::vector<int64_t>{0, 2, 1}}});
  b.input("z", {2, 3, 4});
  b.node("Reshape", {"z", b.ints("merge", {2, 12})}, "zm");
  b.node("Transpose", {"zm"}, "w", {{"perm", std::vector<int64_t>{1, 0}}});
  b.output("y");
  b.output("w");
  b.output("zm");  // the merged tensor is read elsewhere: the Reshape must stay, so nothing moves
  ir::Graph g = b.build();
  EXPECT_EQ(passes::transpose_before_merge(g), 0);
}

}  // namespace
}  // namespace kiln::testing
