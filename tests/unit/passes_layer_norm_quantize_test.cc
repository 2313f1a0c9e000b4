// Tests of fuse_layer_norm_quantize: a LayerNormalization whose output an INT8 or FP8 build
// quantizes (directly, or through the reshapes a matrix product as a 1x1 convolution reads it
// by) becomes one kiln::QuantizingLayerNorm writing the quantized copy, computing what the graph
// computed (the CPU engine's int8 and E4M3 values exactly); the float output stays where
// anything else reads it; near misses stay as they are.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

using ir::Dim;

std::string zero_point(GraphBuilder& b, const std::string& name, DType dtype) {
  Tensor z(dtype, {});
  *static_cast<uint8_t*>(z.raw()) = 0;  // 0 in int8 and in E4M3
  return b.constant(name, std::move(z));
}

// x [N, 6, 32] -> LayerNormalization -> "ln"; Reshape(ln, [-1, 32, 1, 1]) when `reshaped`
// -> QuantizeLinear(scale 0.02) -> "q" (an output).
void layer_norm_quantized(GraphBuilder& b, DType dtype, bool reshaped) {
  b.input("x", {Dim::named("N"), 6, 32});
  b.node("LayerNormalization", {"x", b.random("gamma", {32}, 0.5f, 2.f), b.random("beta", {32})}, "ln",
         {{"axis", int64_t{-1}}, {"epsilon", 1e-5f}});
  std::string v = "ln";
  if (reshaped) v = b.node("Reshape", {"ln", b.ints("as_image", {-1, 32, 1, 1})}, "ln_as_image");
  b.node("QuantizeLinear", {v, b.scalar("q_scale", 0.02f), zero_point(b, "q_zero", dtype)}, "q");
  b.output("q");
}

TEST(FuseLayerNormQuantize, TheQuantizedCopyThroughAReshapeWithTheFloatOutputStillRead) {
  for (DType dtype : {DType::kInt8, DType::kFloat8E4M3FN}) {
    GraphBuilder b;
    layer_norm_quantized(b, dtype, true);
    b.node("Add", {"ln", "x"}, "residual");  // a later product's residual reads the float output
    b.output("residual");
    ir::Graph before = b.build();
    ir::Graph after = before;
    EXPECT_EQ(passes::fuse_layer_norm_quantize(after), 1);
    EXPECT_EQ(count_ops(after, "QuantizeLinear"), 0);
    EXPECT_EQ(count_ops(after, "LayerNormalization"), 0);
    const ir::Node* f = find_op(after, "QuantizingLayerNorm");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->domain, "kiln");
    EXPECT_EQ(f->outputs[0], "ln");  // still read by the Add
    EXPECT_EQ(after.value(f->outputs[1]).type.dtype, dtype);
    EXPECT_EQ(count_ops(after, "Reshape"), 1);  // the int8 reshape; the float one had no other reader
    ir::infer_shapes(after);
    expect_same_outputs(before, after, 3);
  }
}

TEST(FuseLayerNormQuantize, WithoutOtherReadersTheFloatOutputIsDropped) {
  GraphBuilder b;
  layer_norm_quantized(b, DType::kInt8, false);
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_layer_norm_quantize(after), 1);
  ASSERT_EQ(after.nodes.size(), 1u);
  EXPECT_EQ(after.nodes[0].op, "QuantizingLayerNorm");
  EXPECT_TRUE(after.nodes[0].outputs[0].empty());
  EXPECT_EQ(after.nodes[0].outputs[1], "q");
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseLayerNormQuantize, ALayerNormWithoutBias) {
  GraphBuilder b;
  b.input("x", {3, 5, 16});
  b.node("LayerNormalization", {"x", b.random("gamma", {16}, 0.5f, 2.f)}, "ln");
  b.node("QuantizeLinear", {"ln", b.scalar("q_scale", 0.03f), zero_point(b, "q_zero", DType::kInt8)}, "q");
  b.output("q");
  ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_layer_norm_quantize(after), 1);
  ASSERT_EQ(after.nodes.size(), 1u);
  EXPECT_TRUE(after.nodes[0].inputs[2].empty());
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseLayerNormQuantize, PerChannelScalesAndReadStatisticsStayAsTheyAre) {
  {  // a scale per element of the last axis: not a per-tensor copy
    GraphBuilder b;
    b.input("x", {2, 4, 16});
    b.node("LayerNormalization", {"x", b.random("gamma", {16})}, "ln");
    b.node("QuantizeLinear", {"ln", b.random("scales", {16}, 0.01f, 0.05f), b.constant("zp", Tensor(DType::kInt8, {16}))}, "q",
           {{"axis", int64_t{2}}});
    b.output("q");
    ir::Graph g = b.build();
    EXPECT_EQ(passes::fuse_layer_norm_quantize(g), 0);
    EXPECT_EQ(count_ops(g, "QuantizeLinear"), 1);
  }
  {  // Mean read: the fused node has no place for it
    GraphBuilder b;
    b.input("x", {2, 4, 16});
    b.node("LayerNormalization", {"x", b.random("gamma", {16})}, "ln");
    b.last().outputs.push_back("mean");
    b.node("QuantizeLinear", {"ln", b.scalar("q_scale", 0.02f), zero_point(b, "q_zero", DType::kInt8)}, "q");
    b.output("q");
    b.output("mean");
    ir::Graph g = b.build();
    EXPECT_EQ(passes::fuse_layer_norm_quantize(g), 0);
    EXPECT_EQ(count_ops(g, "LayerNormalization"), 1);
  }
}

TEST(QuantizingLayerNorm, AScaleOfManyOrUnknownValuesIsAnErrorNamingTheNode) {
  // As a hostile engine file may hold it: y_scale a runtime input, not one value.
  for (bool known_length : {true, false}) {
    GraphBuilder b;
    b.input("x", {2, 8});
    b.input("y_scale", {known_length ? Dim(3) : Dim::named("K")});
    b.node("QuantizingLayerNorm", {"x", b.random("gamma", {8}), "", "y_scale", zero_point(b, "q_zero", DType::kInt8)}, "y");
    b.last().domain = "kiln";
    b.last().outputs.push_back("q");
    b.output("q");
    try {
      b.build();
      FAIL() << "accepted a y_scale of " << (known_length ? "3 values" : "unknown length");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("y_scale must hold one value"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("y_node"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln::testing
