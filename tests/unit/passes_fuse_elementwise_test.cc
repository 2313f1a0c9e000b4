// Tests of fuse_elementwise: groups of elementwise ops (and a Concat feeding one) become one
// kiln::FusedElementwise that computes what the unfused graph computes, on the CPU kernel.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "ops/fused_elementwise.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

// DenseNet's pre-activation: Concat -> BatchNorm as Mul and Add -> Relu.
TEST(FuseElementwise, ConcatScaleShiftRelu) {
  GraphBuilder b;
  b.input("a", {2, 4, 3, 3});
  b.input("b", {2, 8, 3, 3});
  b.node("Concat", {"a", "b"}, "joined", {{"axis", int64_t{1}}});
  b.node("Mul", {"joined", b.random("scale", {1, 12, 1, 1})}, "scaled");
  b.node("Add", {"scaled", b.random("shift", {12, 1, 1})}, "shifted");
  b.node("Relu", {"shifted"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_elementwise(after), 1);
  ASSERT_EQ(after.nodes.size(), 1u);
  const ir::Node& f = after.nodes[0];
  EXPECT_EQ(f.op, "FusedElementwise");
  EXPECT_EQ(f.domain, "kiln");
  EXPECT_EQ(f.outputs, std::vector<std::string>{"y"});
  const ir::ElementwiseProgram p = ir::ElementwiseProgram::of(f);
  EXPECT_EQ(p.concat_parts, 2);
  EXPECT_EQ(p.concat_axis, 1);
  EXPECT_EQ(p.steps.size(), 3u);
  EXPECT_EQ(p.members.size(), 4u);
  EXPECT_EQ(f.inputs[0], "a");
  EXPECT_EQ(f.inputs[1], "b");
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

// A tree over two runtime inputs with broadcast constants, binary ops in both operand orders and
// unary ops with parameters.
TEST(FuseElementwise, TreeWithBroadcastsAndParameters) {
  GraphBuilder b;
  b.input("x", {2, 3, 4, 5});
  b.input("z", {2, 3, 4, 5});
  b.input("row", {2, 1, 4, 1});
  b.node("Mul", {b.random("w", {5}), "x"}, "xw");
  b.node("Div", {"z", b.scalar("two", 2.f)}, "zh");
  b.node("Sub", {"xw", "zh"}, "d");
  b.node("LeakyRelu", {"d"}, "l", {{"alpha", 0.2f}});
  b.node("Max", {"l", "row"}, "m");
  b.node("HardSigmoid", {"m"}, "h", {{"alpha", 0.3f}, {"beta", 0.4f}});
  b.node("Min", {"row", "h"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_elementwise(after), 1);
  ASSERT_EQ(after.nodes.size(), 1u);
  EXPECT_EQ(ir::ElementwiseProgram::of(after.nodes[0]).steps.size(), 7u);
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

// A value read outside the group ends it there; a lone op stays as it is.
TEST(FuseElementwise, ValuesReadOutsideStayComputed) {
  GraphBuilder b;
  b.input("x", {2, 6});
  b.node("Mul", {"x", b.random("s", {6})}, "scaled");
  b.node("Add", {"scaled", b.random("t", {6})}, "shifted");
  b.node("Relu", {"shifted"}, "y");
  b.node("Sigmoid", {"shifted"}, "gate");
  b.output("y");
  b.output("gate");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_elementwise(after), 1);
  EXPECT_EQ(count_ops(after, "FusedElementwise"), 1);
  EXPECT_EQ(count_ops(after, "Relu"), 1);
  EXPECT_EQ(count_ops(after, "Sigmoid"), 1);
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

// A Concat with another reader, an op that broadcasts the group's values to a larger shape, and
// integer values are not fused.
TEST(FuseElementwise, LeavesWhatItCannotTake) {
  GraphBuilder b;
  b.input("a", {2, 3});
  b.input("c", {2, 3});
  b.input("wide", {4, 2, 3});
  b.node("Concat", {"a", "c"}, "joined", {{"axis", int64_t{0}}});
  b.node("Relu", {"joined"}, "r");
  b.node("Neg", {"joined"}, "n");
  b.node("Add", {"r", "n"}, "sum");      // [4, 3]: Relu, Neg and Add fuse
  b.node("Sigmoid", {"joined"}, "gate");  // the Concat has a reader outside the group
  b.node("Exp", {"a"}, "e");
  b.node("Add", {"e", "wide"}, "big");   // Exp's [2, 3] is broadcast: not the group's shape
  b.output("sum");
  b.output("big");
  b.output("gate");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_elementwise(after), 1);
  EXPECT_EQ(count_ops(after, "Concat"), 1);
  EXPECT_EQ(count_ops(after, "Exp"), 1);
  const ir::Node* f = find_op(after, "FusedElementwise");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(ir::ElementwiseProgram::of(*f).concat_parts, 0);
  EXPECT_EQ(ir::ElementwiseProgram::of(*f).steps.size(), 3u);
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseElementwise, NeedsKnownShapes) {
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 6});
  b.node("Relu", {"x"}, "r");
  b.node("Neg", {"r"}, "y");
  b.output("y");
  ir::Graph g = b.build();
  EXPECT_EQ(passes::fuse_elementwise(g), 0);
}

// Five results alive at once are more than a group holds: the group is cut smaller, and the
// graph computes the same.
TEST(FuseElementwise, ManyLiveResults) {
  GraphBuilder b;
  b.input("x", {3, 8});
  const char* unary[] = {"Relu", "Sigmoid", "Tanh", "Abs", "Neg"};
  for (int k = 0; k < 5; ++k) b.node(unary[k], {"x"}, "u" + std::to_string(k));
  b.node("Add", {"u0", "u1"}, "s1");
  b.node("Add", {"s1", "u2"}, "s2");
  b.node("Add", {"s2", "u3"}, "s3");
  b.node("Add", {"s3", "u4"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_GE(passes::fuse_elementwise(after), 1);
  for (const ir::Node& n : after.nodes)
    if (n.op == "FusedElementwise") EXPECT_LE(ir::ElementwiseProgram::of(n).live_results(), 4);
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseElementwise, MalformedProgramIsRefused) {
  GraphBuilder b;
  b.input("x", {2, 3});
  b.node("FusedElementwise", {"x"}, "y",
         {{"steps", std::vector<std::string>{"Relu"}}, {"operands", std::vector<int64_t>{1, -1}},
          {"alphas", std::vector<float>{0.f}}, {"betas", std::vector<float>{0.f}}});
  b.last().domain = "kiln";
  b.output("y");
  try {
    b.build();
    FAIL() << "a step reading a register not yet computed was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("register"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::testing
