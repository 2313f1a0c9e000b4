// Tests of fuse_group_norm: GroupNormalization, InstanceNormalization and torch.onnx's GroupNorm
// written out around an InstanceNormalization become one kiln::FusedGroupNorm with the
// activation after them, computing what the graph computed; near misses stay as they are.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "ir/activation.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

using ir::Dim;

std::string filled(GraphBuilder& b, const std::string& name, int64_t n, float value) {
  return b.constant(name, Tensor::from_vector<float>({n}, std::vector<float>(static_cast<size_t>(n), value)));
}

// torch.onnx's nn.GroupNorm(groups, C) on x [N, C, 5, 6] below opset 21, then `tail` reading "gn".
ir::Graph exported_group_norm(int64_t groups, bool restore_by_shape_of_x, void (*tail)(GraphBuilder&)) {
  const int64_t c = 8;
  GraphBuilder b;
  b.input("x", {Dim::named("N"), c, 5, 6});
  b.node("Reshape", {"x", b.ints("grouped_shape", {0, groups, -1})}, "grouped");
  b.node("InstanceNormalization", {"grouped", filled(b, "ones", groups, 1.f), filled(b, "zeros", groups, 0.f)},
         "normalized", {{"epsilon", 1e-3f}});
  if (restore_by_shape_of_x) {
    b.node("Shape", {"x"}, "x_shape");
    b.node("Reshape", {"normalized", "x_shape"}, "restored");
  } else {
    b.node("Reshape", {"normalized", b.ints("back", {0, c, 5, 6})}, "restored");
  }
  b.node("Mul", {"restored", b.random("gamma", {c, 1, 1}, 0.5f, 2.f)}, "scaled");
  b.node("Add", {b.random("beta", {c, 1, 1}), "scaled"}, "gn");
  tail(b);
  return b.build();
}

TEST(FuseGroupNorm, TorchExportedGroupNormAndSiLUBecomeOneNode) {
  for (bool by_shape : {true, false}) {
    ir::Graph before = exported_group_norm(4, by_shape, [](GraphBuilder& b) {
      b.node("Sigmoid", {"gn"}, "sig");
      b.node("Mul", {"gn", "sig"}, "y");
      b.output("y");
    });
    ir::Graph after = before;
    EXPECT_EQ(passes::fuse_group_norm(after), 1);
    passes::eliminate_dead_code(after);
    ASSERT_EQ(after.nodes.size(), 1u) << "restored by Shape(x): " << by_shape;
    const ir::Node& f = after.nodes[0];
    EXPECT_EQ(f.op, "FusedGroupNorm");
    EXPECT_EQ(f.domain, "kiln");
    EXPECT_EQ(f.attrs.get_int("num_groups", 0), 4);
    EXPECT_FLOAT_EQ(f.attrs.get_float("epsilon", 0.f), 1e-3f);
    EXPECT_EQ(std::string(ir::Activation::from_node(f).name()), "SiLU");
    EXPECT_EQ(f.attrs.get_strings("members").size(), 7u);
    EXPECT_EQ(f.outputs[0], "y");
    ir::infer_shapes(after);
    expect_same_outputs(before, after, 3);
  }
}

TEST(FuseGroupNorm, GroupNormalizationAndInstanceNormalizationTakeTheirActivations) {
  GraphBuilder b;
  b.input("x", {2, 6, 4, 3});
  b.node("GroupNormalization", {"x", b.random("s1", {6}), b.random("b1", {6})}, "g", {{"num_groups", int64_t{3}}});
  b.node("Relu", {"g"}, "r");
  b.node("InstanceNormalization", {"r", b.random("s2", {6}), b.random("b2", {6})}, "i");
  b.node("LeakyRelu", {"i"}, "y", {{"alpha", 0.2f}});
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_group_norm(after), 2);
  ASSERT_EQ(count_ops(after, "FusedGroupNorm"), 2);
  ASSERT_EQ(after.nodes.size(), 2u);
  EXPECT_EQ(after.nodes[0].attrs.get_int("num_groups", 0), 3);
  EXPECT_EQ(std::string(ir::Activation::from_node(after.nodes[0]).name()), "Relu");
  EXPECT_EQ(after.nodes[1].attrs.get_int("num_groups", 0), 6);
  const ir::Activation leaky = ir::Activation::from_node(after.nodes[1]);
  EXPECT_EQ(std::string(leaky.name()), "LeakyRelu");
  EXPECT_FLOAT_EQ(leaky.alpha, 0.2f);
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseGroupNorm, AnActivationReadTwiceStaysOutside) {
  // The GroupNorm's output is also a graph output: the Relu cannot be absorbed.
  GraphBuilder b;
  b.input("x", {1, 4, 3, 3});
  b.node("GroupNormalization", {"x", b.random("s", {4}), b.random("b", {4})}, "g", {{"num_groups", int64_t{2}}});
  b.node("Relu", {"g"}, "y");
  b.output("g");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_group_norm(after), 1);
  EXPECT_EQ(count_ops(after, "Relu"), 1);
  EXPECT_TRUE(ir::Activation::from_node(*find_op(after, "FusedGroupNorm")).none());
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseGroupNorm, NearMissesOfTheExportedPatternKeepTheirNodes) {
  // InstanceNormalization scales each group by other than 1: the reshaped InstanceNormalization
  // alone becomes a FusedGroupNorm; the Reshapes, Mul and Add stay.
  {
    GraphBuilder b;
    b.input("x", {2, 8, 5, 6});
    b.node("Reshape", {"x", b.ints("grouped_shape", {0, 4, -1})}, "grouped");
    b.node("InstanceNormalization", {"grouped", b.random("s", {4}), filled(b, "zeros", 4, 0.f)}, "normalized");
    b.node("Reshape", {"normalized", b.ints("back", {2, 8, 5, 6})}, "restored");
    b.node("Mul", {"restored", b.random("gamma", {8, 1, 1})}, "y");
    b.output("y");
    ir::Graph before = b.build();
    ir::Graph after = before;
    EXPECT_EQ(passes::fuse_group_norm(after), 1);
    EXPECT_EQ(count_ops(after, "Reshape"), 2);
    EXPECT_EQ(count_ops(after, "Mul"), 1);
    EXPECT_EQ(find_op(after, "FusedGroupNorm")->attrs.get_int("num_groups", 0), 4);
    ir::infer_shapes(after);
    expect_same_outputs(before, after);
  }
  // The second Reshape does not give back X's shape.
  {
    GraphBuilder b;
    b.input("x", {2, 8, 5, 6});
    b.node("Reshape", {"x", b.ints("grouped_shape", {0, 4, -1})}, "grouped");
    b.node("InstanceNormalization", {"grouped", filled(b, "ones", 4, 1.f), filled(b, "zeros", 4, 0.f)}, "normalized");
    b.node("Reshape", {"normalized", b.ints("back", {2, 8, 30})}, "y");
    b.output("y");
    ir::Graph before = b.build();
    ir::Graph after = before;
    EXPECT_EQ(passes::fuse_group_norm(after), 1);
    EXPECT_EQ(count_ops(after, "Reshape"), 2);
    ir::infer_shapes(after);
    expect_same_outputs(before, after);
  }
  // A gamma that varies along the spatial dims is not a per-channel scale.
  {
    ir::Graph before = exported_group_norm(2, false, [](GraphBuilder& b) {
      b.node("Mul", {"gn", b.random("spatial", {1, 1, 6})}, "y");
      b.output("y");
    });
    ir::Graph after = before;
    EXPECT_EQ(passes::fuse_group_norm(after), 1);
    passes::eliminate_dead_code(after);
    EXPECT_EQ(count_ops(after, "Mul"), 1);
    ir::infer_shapes(after);
    expect_same_outputs(before, after, 3);
  }
}

TEST(FuseGroupNorm, LeavesUnknownChannelCountsAlone) {
  GraphBuilder b;
  b.input("x", {Dim::named("N"), Dim::named("C"), 4, 4});
  b.input("s", {Dim::named("C")});
  b.input("bias", {Dim::named("C")});
  b.node("InstanceNormalization", {"x", "s", "bias"}, "y");
  b.output("y");
  ir::Graph g = b.build();
  EXPECT_EQ(passes::fuse_group_norm(g), 0);
}

}  // namespace
}  // namespace kiln::testing
