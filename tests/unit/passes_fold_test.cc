// Tests of fold_constants, remove_identity_and_dropout and simplify_shape_chains: each runs
// the pass alone, checks its structural effect and that the CPU engine computes the same
// outputs before and after.
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

TEST(FoldConstants, FoldsAChainOfConstantNodes) {
  GraphBuilder b;
  b.input("x", {2, 3});
  b.node("Add", {b.random("c1", {3}), b.random("c2", {3})}, "sum");
  b.node("Mul", {"sum", b.scalar("two", 2.f)}, "scaled");
  b.node("Add", {"x", "scaled"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fold_constants(after, cpu_evaluator()), 2);
  ASSERT_EQ(after.nodes.size(), 1u);
  const Tensor* folded = after.constant("scaled");
  ASSERT_NE(folded, nullptr);
  const Tensor& c1 = *before.constant("c1");
  const Tensor& c2 = *before.constant("c2");
  for (int i = 0; i < 3; ++i)
    EXPECT_FLOAT_EQ(folded->data<float>()[i], 2.f * (c1.data<float>()[i] + c2.data<float>()[i]));
  expect_same_outputs(before, after);
}

TEST(FoldConstants, TurnsKnownShapeArithmeticIntoConstants) {
  // x: [N, 3, 4]; Reshape(x, Concat([-1], Unsqueeze(Gather(Shape(x), 1)))) -> [4N, 3].
  GraphBuilder b;
  b.input("x", {Dim::named("N"), 3, 4});
  b.node("Shape", {"x"}, "shape");
  b.node("Gather", {"shape", b.constant("one", Tensor::scalar<int64_t>(1))}, "channels");
  b.node("Unsqueeze", {"channels", b.ints("axes", {0})}, "channels_1d");
  b.node("Concat", {b.ints("minus_one", {-1}), "channels_1d"}, "target", {{"axis", int64_t{0}}});
  b.node("Reshape", {"x", "target"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  // Gather's result (3) is known although Shape's ([N, 3, 4]) is not; the rest then folds.
  EXPECT_EQ(passes::fold_constants(after, cpu_evaluator()), 3);
  const Tensor* target = after.constant("target");
  ASSERT_NE(target, nullptr);
  EXPECT_EQ(target->to_int_vector(), (std::vector<int64_t>{-1, 3}));
  passes::eliminate_dead_code(after);
  ASSERT_EQ(after.nodes.size(), 1u);
  EXPECT_EQ(after.nodes[0].op, "Reshape");
  expect_same_outputs(before, after, 3);
}

TEST(FoldConstants, RespectsTheSizeLimitGraphOutputsAndTheEvaluator) {
  GraphBuilder b;
  b.input("x", {8});
  b.node("Mul", {b.random("a", {8}), b.random("b", {8})}, "ab");
  b.node("Add", {"x", "ab"}, "y");
  b.node("Neg", {b.random("c", {8})}, "constant_output");
  b.output("y");
  b.output("constant_output");
  ir::Graph g = b.build();

  // 32 bytes of output is over a 16-byte limit.
  EXPECT_EQ(passes::fold_constants(g, cpu_evaluator(), 16), 0);
  // An evaluator that cannot compute anything leaves the graph alone.
  int calls = 0;
  passes::NodeEvaluator refuse = [&](const ir::Node&, const std::vector<const Tensor*>&) {
    ++calls;
    return std::optional<std::vector<Tensor>>();
  };
  EXPECT_EQ(passes::fold_constants(g, refuse), 0);
  EXPECT_EQ(calls, 1);  // Mul only: Neg writes a graph output, which stays computed
  EXPECT_EQ(g.nodes.size(), 3u);

  ir::Graph before = g;
  EXPECT_EQ(passes::fold_constants(g, cpu_evaluator()), 1);
  EXPECT_EQ(count_ops(g, "Mul"), 0);
  EXPECT_EQ(count_ops(g, "Neg"), 1);
  expect_same_outputs(before, g);
}

TEST(RemoveIdentityAndDropout, RewiresConsumersAndKeepsOutputNames) {
  GraphBuilder b;
  b.input("x", {2, 5});
  b.node("Relu", {"x"}, "r");
  b.node("Identity", {"r"}, "r_copy");
  b.node("Dropout", {"r_copy", b.scalar("ratio", 0.5f), b.constant("train", Tensor::scalar<bool>(false))}, "dropped");
  b.node("Add", {"dropped", "x"}, "sum");
  b.node("Identity", {"sum"}, "y");  // a graph output: its name must survive
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::remove_identity_and_dropout(after), 3);
  EXPECT_EQ(count_ops(after, "Identity"), 0);
  EXPECT_EQ(count_ops(after, "Dropout"), 0);
  ASSERT_EQ(after.nodes.size(), 2u);
  EXPECT_EQ(after.nodes[1].op, "Add");
  EXPECT_EQ(after.nodes[1].outputs[0], "y");
  EXPECT_EQ(after.nodes[1].inputs[0], "r");
  expect_same_outputs(before, after);
}

TEST(RemoveIdentityAndDropout, KeepsCopiesThatCannotGo) {
  GraphBuilder b;
  b.input("x", {4});
  b.node("Identity", {"x"}, "y");  // graph input -> graph output: a real copy
  b.node("Dropout", {"x", b.scalar("ratio", 0.5f)}, "z");
  b.last().outputs.push_back("mask");  // the mask is read: the Dropout must stay
  b.output("y");
  b.output("z");
  b.output("mask");
  ir::Graph g = b.build();
  EXPECT_EQ(passes::remove_identity_and_dropout(g), 0);
  EXPECT_EQ(g.nodes.size(), 2u);
}

TEST(SimplifyShapeChains, DynamicBatchFlattenGetsAConstantShape) {
  // x.view(x.size(0), -1) as PyTorch exports it.
  GraphBuilder b;
  b.input("x", {Dim::named("N"), 4, 6});
  b.node("Shape", {"x"}, "shape");
  b.node("Gather", {"shape", b.constant("zero", Tensor::scalar<int64_t>(0))}, "batch");
  b.node("Unsqueeze", {"batch", b.ints("axes", {0})}, "batch_1d");
  b.node("Concat", {"batch_1d", b.ints("minus_one", {-1})}, "target", {{"axis", int64_t{0}}});
  b.node("Reshape", {"x", "target"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::simplify_shape_chains(after), 1);
  passes::eliminate_dead_code(after);
  ir::infer_shapes(after);
  ASSERT_EQ(after.nodes.size(), 1u);
  const Tensor* shape = after.constant(after.nodes[0].inputs[1]);
  ASSERT_NE(shape, nullptr) << "the Reshape's shape input is not a constant";
  EXPECT_EQ(shape->to_int_vector(), (std::vector<int64_t>{0, -1}));
  EXPECT_EQ(after.value("y").type.str(), "float32[Nx24]");
  expect_same_outputs(before, after, 3);
  expect_same_outputs(before, after, 1);
}

TEST(SimplifyShapeChains, ChannelShuffleAndExpand) {
  // ShuffleNet's channel shuffle: view(N, 2, 4, H, W) -> transpose -> view(N, -1, H, W), with
  // N taken from Shape(x); then an Expand to [N, 8, 2, 2] from a computed shape.
  GraphBuilder b;
  b.input("x", {Dim::named("N"), 8, 2, 2});
  b.node("Shape", {"x"}, "shape");
  b.node("Gather", {"shape", b.constant("zero", Tensor::scalar<int64_t>(0))}, "batch");
  b.node("Unsqueeze", {"batch", b.ints("axes", {0})}, "batch_1d");
  b.node("Concat", {"batch_1d", b.ints("split_dims", {2, 4, 2, 2})}, "split_shape", {{"axis", int64_t{0}}});
  b.node("Reshape", {"x", "split_shape"}, "split");
  b.node("Transpose", {"split"}, "shuffled", {{"perm", std::vector<int64_t>{0, 2, 1, 3, 4}}});
  b.node("Concat", {"batch_1d", b.ints("merge_dims", {-1, 2, 2})}, "merge_shape", {{"axis", int64_t{0}}});
  b.node("Reshape", {"shuffled", "merge_shape"}, "merged");
  b.node("ReduceMean", {"merged", b.ints("rm_axes", {1})}, "mean", {{"keepdims", int64_t{1}}});
  b.node("Concat", {"batch_1d", b.ints("expand_dims", {8, 2, 2})}, "expand_shape", {{"axis", int64_t{0}}});
  b.node("Expand", {"mean", "expand_shape"}, "expanded");
  b.node("Add", {"merged", "expanded"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::simplify_shape_chains(after), 3);
  passes::eliminate_dead_code(after);
  ir::infer_shapes(after);
  EXPECT_EQ(count_ops(after, "Shape"), 0);
  EXPECT_EQ(count_ops(after, "Concat"), 0);
  std::vector<std::vector<int64_t>> shapes;
  for (const ir::Node& n : after.nodes)
    if (n.op == "Reshape" || n.op == "Expand") {
      ASSERT_NE(after.constant(n.inputs[1]), nullptr) << n.name;
      shapes.push_back(after.constant(n.inputs[1])->to_int_vector());
    }
  EXPECT_EQ(shapes, (std::vector<std::vector<int64_t>>{{0, 2, 4, 2, 2}, {0, -1, 2, 2}, {1, 8, 2, 2}}));
  EXPECT_EQ(after.value("y").type.str(), "float32[Nx8x2x2]");
  expect_same_outputs(before, after, 3);
}

TEST(SimplifyShapeChains, LeavesShapesItCannotExpress) {
  // Reshape(x[N, M, 4], [M, N, 4]) from Shape: neither symbolic dim sits at its own position
  // and two unknowns cannot both be -1.
  GraphBuilder b;
  b.input("x", {Dim::named("N"), Dim::named("M"), 4});
  b.node("Shape", {"x"}, "shape");
  b.node("Gather", {"shape", b.ints("perm", {1, 0, 2})}, "target");
  b.node("Reshape", {"x", "target"}, "y");
  b.output("y");
  ir::Graph g = b.build();
  EXPECT_EQ(passes::simplify_shape_chains(g), 0);
}

}  // namespace
}  // namespace kiln::testing
