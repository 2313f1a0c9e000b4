// Tests of probe_symbolic_values: shape arithmetic that symbolic inference cannot follow
// becomes known after probing, and the Reshape it feeds gets a constant shape.
#include <gtest/gtest.h>

#include "cpu/evaluate.h"
#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

using ir::Dim;

passes::NodeEvaluator cpu_evaluator() {
  return [](const ir::Node& n, const std::vector<const Tensor*>& in) { return cpu::evaluate_node(n, in); };
}

TEST(ProbeSymbolicValues, AttentionHeadReshapeOfNTimes12) {
  // q.view(L, N * heads, d) as exported by nn.MultiheadAttention: the middle element is N*3.
  GraphBuilder b;
  b.input("x", {5, Dim::named("N"), 12});
  b.node("Shape", {"x"}, "shape");
  b.node("Gather", {"shape", b.constant("one", Tensor::scalar<int64_t>(1))}, "batch");
  b.node("Mul", {"batch", b.constant("heads", Tensor::scalar<int64_t>(3))}, "batch_heads");
  b.node("Unsqueeze", {"batch_heads", b.ints("axes", {0})}, "bh_1d");
  b.node("Concat", {b.ints("len", {5}), "bh_1d", b.ints("depth", {4})}, "target", {{"axis", int64_t{0}}});
  b.node("Reshape", {"x", "target"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ASSERT_FALSE(before.value("target").symbolic_value && ir::all_known(*before.value("target").symbolic_value));

  ir::Graph after = before;
  EXPECT_GE(passes::probe_symbolic_values(after, cpu_evaluator()), 1);
  const auto& learned = after.value("target").symbolic_value;
  ASSERT_TRUE(learned.has_value());
  EXPECT_EQ(ir::dims_to_string(*learned), "5x?x4") << "N*3 is neither a constant nor a symbol";

  EXPECT_EQ(passes::simplify_shape_chains(after), 1);
  passes::eliminate_dead_code(after);
  ir::infer_shapes(after);
  ASSERT_EQ(after.nodes.size(), 1u);
  const Tensor* shape = after.constant(after.nodes[0].inputs[1]);
  ASSERT_NE(shape, nullptr);
  EXPECT_EQ(shape->to_int_vector(), (std::vector<int64_t>{5, -1, 4}));
  expect_same_outputs(before, after, 2);
  expect_same_outputs(before, after, 7);
}

TEST(ProbeSymbolicValues, TorchExpandMinusOnePattern) {
  // x.expand(N, -1) of a [1, 6] tensor: Where(Equal(s, -1), ones, s) with s = [N, -1].
  GraphBuilder b;
  b.input("x", {Dim::named("N"), 6});
  b.node("Shape", {"x"}, "shape");
  b.node("Gather", {"shape", b.constant("zero", Tensor::scalar<int64_t>(0))}, "batch");
  b.node("Unsqueeze", {"batch", b.ints("axes", {0})}, "batch_1d");
  b.node("Concat", {"batch_1d", b.ints("minus_one", {-1})}, "s", {{"axis", int64_t{0}}});
  b.node("ConstantOfShape", {b.ints("two", {2})}, "ones", {{"value", Tensor::from_vector<int64_t>({1}, {1})}});
  b.node("Mul", {"ones", b.constant("m1", Tensor::scalar<int64_t>(-1))}, "neg");
  b.node("Equal", {"s", "neg"}, "is_minus_one");
  b.node("Where", {"is_minus_one", "ones", "s"}, "target");
  b.node("Expand", {b.random("token", {1, 6}), "target"}, "expanded");
  b.node("Add", {"x", "expanded"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  EXPECT_NE(before.value("expanded").type.str(), "float32[Nx6]");

  ir::Graph after = before;
  EXPECT_GE(passes::probe_symbolic_values(after, cpu_evaluator()), 1);
  ir::infer_shapes(after);
  EXPECT_EQ(ir::dims_to_string(*after.value("target").symbolic_value), "Nx1");
  EXPECT_EQ(after.value("expanded").type.str(), "float32[Nx6]");
  expect_same_outputs(before, after, 3);
}

TEST(ProbeSymbolicValues, ProbesAgainWithSmallerSizesWhenTheModelHasALimit) {
  // A transformer's positions: the first 300 rows of a table, sliced to the sequence S and added
  // to the input, so no S past 300 runs. The probe at sizes past 1000 fails; the one below 256
  // still learns the expand(-1, ...) target.
  GraphBuilder b;
  b.input("x", {Dim::named("S"), 6});
  b.node("Shape", {"x"}, "shape");
  b.node("Gather", {"shape", b.constant("zero", Tensor::scalar<int64_t>(0))}, "length");
  b.node("Unsqueeze", {"length", b.ints("axes", {0})}, "length_1d");
  b.node("Slice", {b.random("positions", {300, 6}), b.ints("starts", {0}), "length_1d", b.ints("slice_axes", {0})},
         "position_rows");
  b.node("Concat", {"length_1d", b.ints("minus_one", {-1})}, "s", {{"axis", int64_t{0}}});
  b.node("ConstantOfShape", {b.ints("two", {2})}, "ones", {{"value", Tensor::from_vector<int64_t>({1}, {1})}});
  b.node("Mul", {"ones", b.constant("m1", Tensor::scalar<int64_t>(-1))}, "neg");
  b.node("Equal", {"s", "neg"}, "is_minus_one");
  b.node("Where", {"is_minus_one", "ones", "s"}, "target");
  b.node("Expand", {b.random("token", {1, 6}), "target"}, "expanded");
  b.node("Add", {"x", "position_rows"}, "placed");
  b.node("Add", {"placed", "expanded"}, "y");
  b.output("y");
  ir::Graph before = b.build();

  ir::Graph after = before;
  EXPECT_GE(passes::probe_symbolic_values(after, cpu_evaluator()), 1);
  ir::infer_shapes(after);
  ASSERT_TRUE(after.value("target").symbolic_value.has_value());
  EXPECT_EQ(ir::dims_to_string(*after.value("target").symbolic_value), "Sx1");
  EXPECT_EQ(after.value("expanded").type.str(), "float32[Sx6]");
  expect_same_outputs(before, after, 5);
}

TEST(ProbeSymbolicValues, LearnsNothingWithoutSymbols) {
  GraphBuilder b;
  b.input("x", {2, 6});
  b.node("Shape", {"x"}, "shape");
  b.node("Reshape", {"x", "shape"}, "y");
  b.output("y");
  ir::Graph g = b.build();
  EXPECT_EQ(passes::probe_symbolic_values(g, cpu_evaluator()), 0);
}

}  // namespace
}  // namespace kiln::testing
