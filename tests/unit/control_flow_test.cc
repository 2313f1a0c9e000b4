// Tests of simplify_subgraph (cpu/control_flow.h): what If, Loop and Scan do to their subgraphs
// before building them. Shape arithmetic on values of known shape and copies go; what is left
// computes the same, under the same input and output names.
#include <gtest/gtest.h>

#include "cpu/control_flow.h"
#include "graph_builder.h"

namespace kiln::testing {
namespace {

using ir::Dim;

// A Loop body's kind of arithmetic: x (its shape changing each trip) scaled by a constant and by
// the column count of w (a value the loop reads unchanged), then copied to the output.
ir::Graph body_like() {
  GraphBuilder b;
  b.input("x", {Dim::named("rows"), 4});
  b.input("w", {3, 4});
  b.node("Mul", {"x", b.constant("two", Tensor::from_vector<float>({1}, {2.f}))}, "doubled");
  b.node("Shape", {"w"}, "w_shape");
  b.node("Cast", {"w_shape"}, "w_dims", {{"to", int64_t{1}}});
  b.node("ReduceMax", {"w_dims"}, "columns", {{"keepdims", int64_t{0}}});
  b.node("Mul", {"doubled", "columns"}, "scaled");
  b.node("Identity", {"scaled"}, "y");
  b.output("y");
  return b.build();
}

TEST(SimplifySubgraph, FoldsConstantsAndShapeArithmeticAndKeepsTheNames) {
  const ir::Graph before = body_like();
  ir::Graph after = before;
  EXPECT_GT(cpu::simplify_subgraph(after), 0);
  EXPECT_EQ(after.inputs, before.inputs);
  EXPECT_EQ(after.outputs, before.outputs);
  ASSERT_EQ(after.nodes.size(), 2u) << "left: the two products by x";
  EXPECT_EQ(count_ops(after, "Mul"), 2);
  EXPECT_EQ(after.nodes.back().outputs[0], "y") << "the last product writes the output itself";
  expect_same_outputs(before, after, 5);
}

TEST(SimplifySubgraph, AnOutputThatIsAnInputStaysAnInput) {
  GraphBuilder b;
  b.input("x", {2, 3});
  b.node("Identity", {"x"}, "y");
  b.output("y");
  const ir::Graph before = b.build();
  ir::Graph after = before;
  cpu::simplify_subgraph(after);
  ASSERT_EQ(after.outputs, std::vector<std::string>{"y"});
  expect_same_outputs(before, after);
}

}  // namespace
}  // namespace kiln::testing
