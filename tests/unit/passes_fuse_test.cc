// Tests of fuse_epilogue: Conv / Gemm / MatMul chains become one kiln fused op with the right
// activation, and compute what the unfused graph computes.
#include <gtest/gtest.h>

#include <cmath>

#include "graph_builder.h"
#include "ir/activation.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

using ir::Dim;

TEST(FuseEpilogue, ConvBiasResidualRelu) {
  GraphBuilder b;
  b.input("x", {Dim::named("N"), 3, 5, 5});
  b.input("skip", {Dim::named("N"), 4, 5, 5});
  b.node("Conv", {"x", b.random("w", {4, 3, 3, 3}), b.random("bias", {4})}, "conv",
         {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  b.node("Add", {b.random("channel_bias", {1, 4, 1, 1}), "conv"}, "biased");
  b.node("Add", {"skip", "biased"}, "sum");
  b.node("Relu", {"sum"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fuse_epilogue(after), 1);
  ASSERT_EQ(after.nodes.size(), 1u);
  const ir::Node& f = after.nodes[0];
  EXPECT_EQ(f.op, "FusedConv");
  EXPECT_EQ(f.domain, "kiln");
  EXPECT_EQ(std::string(ir::Activation::from_node(f).name()), "Relu");
  ASSERT_EQ(f.inputs.size(), 4u);
  EXPECT_EQ(f.inputs[3], "skip");
  EXPECT_EQ(f.outputs[0], "y");
  EXPECT_EQ(f.attrs.get_ints("pads"), (std::vector<int64_t>{1, 1, 1, 1}));
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

// Conv followed by one activation node (or pattern); `add` appends it reading "conv".
struct ActivationCase {
  const char* name;
  const char* kind;  // expected ir::Activation kind
  void (*add)(GraphBuilder&);
};

const ActivationCase kActivationCases[] = {
    {"Relu", "Relu", [](GraphBuilder& b) { b.node("Relu", {"conv"}, "y"); }},
    {"Relu6", "Clip", [](GraphBuilder& b) { b.node("Clip", {"conv", b.scalar("lo", 0.f), b.scalar("hi", 6.f)}, "y"); }},
    {"ClipMaxOnly", "Clip", [](GraphBuilder& b) { b.node("Clip", {"conv", "", b.scalar("hi", 0.5f)}, "y"); }},
    {"Sigmoid", "Sigmoid", [](GraphBuilder& b) { b.node("Sigmoid", {"conv"}, "y"); }},
    {"Tanh", "Tanh", [](GraphBuilder& b) { b.node("Tanh", {"conv"}, "y"); }},
    {"HardSwish", "HardSwish", [](GraphBuilder& b) { b.node("HardSwish", {"conv"}, "y"); }},
    {"HardSigmoid", "HardSigmoid",
     [](GraphBuilder& b) { b.node("HardSigmoid", {"conv"}, "y", {{"alpha", 0.3f}, {"beta", 0.4f}}); }},
    {"LeakyRelu", "LeakyRelu", [](GraphBuilder& b) { b.node("LeakyRelu", {"conv"}, "y", {{"alpha", 0.2f}}); }},
    {"Gelu", "Gelu", [](GraphBuilder& b) { b.node("Gelu", {"conv"}, "y"); }},
    {"GeluTanh", "GeluTanh",
     [](GraphBuilder& b) { b.node("Gelu", {"conv"}, "y", {{"approximate", std::string("tanh")}}); }},
    {"SiLU", "SiLU",
     [](GraphBuilder& b) {
       b.node("Sigmoid", {"conv"}, "sig");
       b.node("Mul", {"sig", "conv"}, "y");
     }},
    // x * (1 + erf(x / sqrt2)) * 0.5, as torch.onnx exports nn.GELU.
    {"GeluErfTorch", "Gelu",
     [](GraphBuilder& b) {
       b.node("Div", {"conv", b.scalar("sqrt2", 1.4142135f)}, "scaled");
       b.node("Erf", {"scaled"}, "erf");
       b.node("Add", {"erf", b.scalar("one", 1.f)}, "one_plus");
       b.node("Mul", {"conv", "one_plus"}, "prod");
       b.node("Mul", {"prod", b.scalar("half", 0.5f)}, "y");
     }},
    // (0.5 * x) * (1 + erf(x * (1/sqrt2))).
    {"GeluErfHalfFirst", "Gelu",
     [](GraphBuilder& b) {
       b.node("Mul", {"conv", b.scalar("rsqrt2", 0.70710678f)}, "scaled");
       b.node("Erf", {"scaled"}, "erf");
       b.node("Add", {b.scalar("one", 1.f), "erf"}, "one_plus");
       b.node("Mul", {b.scalar("half", 0.5f), "conv"}, "half_x");
       b.node("Mul", {"half_x", "one_plus"}, "y");
     }},
    // x * (0.5 * (1 + erf(x / sqrt2))).
    {"GeluErfHalfInside", "Gelu",
     [](GraphBuilder& b) {
       b.node("Div", {"conv", b.scalar("sqrt2", 1.4142135f)}, "scaled");
       b.node("Erf", {"scaled"}, "erf");
       b.node("Add", {"erf", b.scalar("one", 1.f)}, "one_plus");
       b.node("Mul", {"one_plus", b.scalar("half", 0.5f)}, "cdf");
       b.node("Mul", {"conv", "cdf"}, "y");
     }},
};

class FuseConvActivation : public ::testing::TestWithParam<ActivationCase> {};

TEST_P(FuseConvActivation, BecomesOneFusedConv) {
  const ActivationCase& c = GetParam();
  GraphBuilder b;
  b.input("x", {2, 3, 4, 4});
  b.node("Conv", {"x", b.random("w", {4, 3, 1, 1}), b.random("bias", {4})}, "conv");
  c.add(b);
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fuse_epilogue(after), 1);
  ASSERT_EQ(after.nodes.size(), 1u);
  EXPECT_EQ(after.nodes[0].op, "FusedConv");
  EXPECT_EQ(std::string(ir::Activation::from_node(after.nodes[0]).name()), c.kind);
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

INSTANTIATE_TEST_SUITE_P(Activations, FuseConvActivation, ::testing::ValuesIn(kActivationCases),
                         [](const ::testing::TestParamInfo<ActivationCase>& i) { return std::string(i.param.name); });

TEST(FuseEpilogue, GemmActivationAndMatMulBiasGelu) {
  GraphBuilder b;
  b.input("x", {3, 6});
  b.node("Gemm", {"x", b.random("w1", {5, 6}), b.random("c1", {5})}, "g", {{"transB", int64_t{1}}});
  b.node("LeakyRelu", {"g"}, "h", {{"alpha", 0.1f}});
  b.node("MatMul", {"h", b.random("w2", {5, 4})}, "mm");
  b.node("Add", {"mm", b.random("bias", {4})}, "biased");
  b.node("Gelu", {"biased"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fuse_epilogue(after), 2);
  ASSERT_EQ(after.nodes.size(), 2u);
  EXPECT_EQ(after.nodes[0].op, "FusedGemm");
  EXPECT_EQ(std::string(ir::Activation::from_node(after.nodes[0]).name()), "LeakyRelu");
  EXPECT_FLOAT_EQ(ir::Activation::from_node(after.nodes[0]).alpha, 0.1f);
  EXPECT_EQ(after.nodes[1].op, "FusedMatMul");
  ASSERT_EQ(after.nodes[1].inputs.size(), 3u);
  EXPECT_EQ(after.nodes[1].inputs[2], "bias");
  EXPECT_EQ(std::string(ir::Activation::from_node(after.nodes[1]).name()), "Gelu");
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseEpilogue, GemmWithoutCTakesTheFollowingBiasAdd) {
  GraphBuilder b;
  b.input("x", {Dim::named("N"), 6});
  b.node("Gemm", {"x", b.random("w", {6, 5})}, "g", {{"alpha", 0.5f}, {"beta", 3.f}});
  b.node("Add", {"g", b.random("bias", {1, 5})}, "biased");
  b.node("Relu", {"biased"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fuse_epilogue(after), 1);
  ASSERT_EQ(after.nodes.size(), 1u);
  EXPECT_EQ(after.nodes[0].op, "FusedGemm");
  ASSERT_EQ(after.nodes[0].inputs.size(), 3u);
  EXPECT_FLOAT_EQ(after.nodes[0].attrs.get_float("beta", 0.f), 1.f);
  EXPECT_EQ(std::string(ir::Activation::from_node(after.nodes[0]).name()), "Relu");
  ir::infer_shapes(after);
  expect_same_outputs(before, after, 3);
}

TEST(FuseEpilogue, BatchedMatMulBiasWithoutActivation) {
  GraphBuilder b;
  b.input("x", {Dim::named("B"), 7, 6});
  b.node("MatMul", {"x", b.random("w", {6, 8})}, "mm");
  b.node("Add", {b.random("bias", {1, 1, 8}), "mm"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;

  EXPECT_EQ(passes::fuse_epilogue(after), 1);
  ASSERT_EQ(after.nodes.size(), 1u);
  EXPECT_EQ(after.nodes[0].op, "FusedMatMul");
  EXPECT_EQ(after.value(after.nodes[0].inputs[2]).type.str(), "float32[8]");
  ir::infer_shapes(after);
  expect_same_outputs(before, after, 3);
}

TEST(FuseEpilogue, LeavesChainsWhoseIntermediatesAreRead) {
  GraphBuilder b;
  b.input("x", {1, 2, 3, 3});
  // conv1 is also a graph output; conv2's Sigmoid is read elsewhere (no SiLU); a MatMul with
  // a non-constant addend that broadcasts is neither a bias nor a residual.
  b.node("Conv", {"x", b.random("w1", {2, 2, 1, 1})}, "conv1");
  b.node("Relu", {"conv1"}, "r1");
  b.node("Conv", {"r1", b.random("w2", {2, 2, 1, 1})}, "conv2");
  b.node("Sigmoid", {"conv2"}, "sig");
  b.node("Mul", {"conv2", "sig"}, "silu");
  b.node("Add", {"silu", "sig"}, "y");
  b.input("a", {3, 4});
  b.input("c", {1, 5});
  b.node("MatMul", {"a", b.random("w3", {4, 5})}, "mm");
  b.node("Add", {"mm", "c"}, "z");
  b.output("conv1");
  b.output("y");
  b.output("z");
  ir::Graph g = b.build();
  EXPECT_EQ(passes::fuse_epilogue(g), 0);
  EXPECT_EQ(count_ops(g, "Conv"), 2);
  EXPECT_EQ(count_ops(g, "MatMul"), 1);
}

TEST(FuseEpilogue, ResidualAddsJoinTheProductsEpilogue) {
  // A transformer block's two skip connections: MatMul + bias + x (FusedMatMul's Z), and a
  // Gemm over rows whose output is reshaped back to [N, S, E] before the residual Add (the Add
  // moves before the Reshape, x reshaped to rows instead: FusedGemm's Z).
  GraphBuilder b;
  b.input("x", {2, 5, 8});
  b.node("MatMul", {"x", b.random("w1", {8, 8})}, "mm");
  b.node("Add", {"mm", b.random("b1", {8})}, "biased");
  b.node("Add", {"biased", "x"}, "h");
  b.node("Reshape", {"h", b.ints("rows", {10, 8})}, "h_rows");
  b.node("Gemm", {"h_rows", b.random("w2", {8, 8}), b.random("b2", {8})}, "g", {{"transB", int64_t{1}}});
  b.node("Reshape", {"g", b.ints("nse", {2, 5, 8})}, "g3");
  b.node("Add", {"h", "g3"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_epilogue(after), 2);
  ir::infer_shapes(after);
  EXPECT_EQ(count_ops(after, "Add"), 0);
  for (const ir::Node& n : after.nodes) {
    if (n.op == "FusedMatMul") EXPECT_EQ(n.inputs, (std::vector<std::string>{"x", "w1", "b1", "x"}));
    if (n.op == "FusedGemm") {
      ASSERT_EQ(n.inputs.size(), 4u);
      EXPECT_EQ(after.producer(n.inputs[3]) >= 0 ? after.nodes[static_cast<size_t>(after.producer(n.inputs[3]))].op : "",
                "Reshape");
    }
  }
  EXPECT_EQ(count_ops(after, "FusedMatMul"), 1);
  EXPECT_EQ(count_ops(after, "FusedGemm"), 1);
  expect_same_outputs(before, after);
}

}  // namespace
}  // namespace kiln::testing
