// Tests of fuse_attention_quantize: a kiln::StridedAttention whose output an INT8 build quantizes
// (directly, or through the reshapes a matrix product as a 1x1 convolution reads it by) writes
// int8 itself, computing what the graph computed (the CPU engine's integers exactly); near misses
// (the float output read elsewhere, per-channel scales, float8, a zero point other than 0) stay
// as they are, and a hostile scale is an error naming the node.
#include <gtest/gtest.h>

#include "attention_graphs.h"
#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

using ir::Dim;

constexpr int64_t S = 5, N = 2, H = 2, D = 8, E = H * D;

// torch.onnx's nn.MultiheadAttention on a packed projection [S, N, 3E], folded into one
// kiln::StridedAttention writing Y's rows [S * N, E] as "y"; then, as an INT8 build adds them
// (fold_attention_views has run by then), [a Reshape to one-pixel images ->] QuantizeLinear ->
// "y_quantized" (the output), and `also_read` reading "y" too when given.
ir::Graph attention_quantized(bool reshaped, DType q_type = DType::kInt8, int zero = 0, const char* also_read = nullptr) {
  GraphBuilder b;
  b.input("qkv", {S, N, 3 * E});
  add_packed_attention(b, "qkv", "y", S, N, H, D);
  b.output("y");
  ir::Graph g = b.build();
  EXPECT_EQ(passes::fold_attention_views(g), 1);

  auto add = [&](const std::string& op, std::vector<std::string> inputs, const std::string& output) {
    ir::Node n;
    n.op = op;
    n.name = output + "_node";
    n.inputs = std::move(inputs);
    n.outputs = {output};
    g.nodes.push_back(std::move(n));
  };
  std::string v = "y";
  if (reshaped) {
    Tensor shape(DType::kInt64, {4});
    const int64_t dims[4] = {-1, E, 1, 1};
    std::copy(dims, dims + 4, shape.data<int64_t>());
    add("Reshape", {"y", g.add_constant("as_image", std::move(shape))}, "y_as_image");
    v = "y_as_image";
  }
  Tensor scale(DType::kFloat32, {});
  *scale.data<float>() = 0.004f;
  Tensor zp(q_type, {});
  if (q_type == DType::kInt8) *zp.data<int8_t>() = static_cast<int8_t>(zero);
  else *static_cast<uint8_t*>(zp.raw()) = 0;
  add("QuantizeLinear", {v, g.add_constant("q_scale", std::move(scale)), g.add_constant("q_zero", std::move(zp))}, "y_quantized");
  g.outputs = {"y_quantized"};
  if (also_read) {
    add("Relu", {"y"}, also_read);
    g.outputs.push_back(also_read);
  }
  ir::infer_shapes(g);
  return g;
}

TEST(FuseAttentionQuantize, TheAttentionWritesInt8ThroughAReshape) {
  const ir::Graph before = attention_quantized(true);
  ASSERT_EQ(count_ops(before, "StridedAttention"), 1);
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_attention_quantize(after), 1);
  EXPECT_EQ(count_ops(after, "QuantizeLinear"), 0);
  const ir::Node* a = find_op(after, "StridedAttention");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->inputs.size(), 6u);
  EXPECT_EQ(a->inputs[4], "q_scale");
  EXPECT_EQ(a->inputs[5], "q_zero");
  EXPECT_EQ(after.value(a->outputs[0]).type.dtype, DType::kInt8);
  const ir::Node* r = find_op(after, "Reshape");  // the one-pixel images, now of int8
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->inputs[0], a->outputs[0]);
  EXPECT_EQ(r->outputs[0], "y_quantized");
  ir::infer_shapes(after);
  EXPECT_EQ(after.value("y_quantized").type.dtype, DType::kInt8);
  expect_same_outputs(before, after);
}

TEST(FuseAttentionQuantize, TheAttentionWritesTheQuantizeLinearsOutputDirectly) {
  const ir::Graph before = attention_quantized(false);
  ir::Graph after = before;
  EXPECT_EQ(passes::fuse_attention_quantize(after), 1);
  ASSERT_EQ(after.nodes.size(), 1u);
  EXPECT_EQ(after.nodes[0].op, "StridedAttention");
  EXPECT_EQ(after.nodes[0].outputs[0], "y_quantized");
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseAttentionQuantize, NearMissesStayAsTheyAre) {
  {  // the float output read by something else too (a residual)
    ir::Graph g = attention_quantized(false, DType::kInt8, 0, "also");
    EXPECT_EQ(passes::fuse_attention_quantize(g), 0);
    EXPECT_EQ(count_ops(g, "QuantizeLinear"), 1);
  }
  {  // float8: the attention writes int8 only
    ir::Graph g = attention_quantized(true, DType::kFloat8E4M3FN);
    EXPECT_EQ(passes::fuse_attention_quantize(g), 0);
  }
  {  // a zero point other than 0
    ir::Graph g = attention_quantized(true, DType::kInt8, 3);
    EXPECT_EQ(passes::fuse_attention_quantize(g), 0);
  }
}

TEST(StridedAttention, AnInt8OutputsScaleOfManyValuesIsAnErrorNamingTheNode) {
  // As a hostile engine file may hold it: y_scale of three values, or the zero point alone.
  for (bool zero_point_alone : {false, true}) {
    ir::Graph g = attention_quantized(false);
    ASSERT_EQ(passes::fuse_attention_quantize(g), 1);
    ir::Node& a = g.nodes[0];
    if (zero_point_alone) {
      a.inputs[4].clear();
    } else {
      Tensor three(DType::kFloat32, {3});
      for (int i = 0; i < 3; ++i) three.data<float>()[i] = 0.01f;
      a.inputs[4] = g.add_constant("three_scales", std::move(three));
    }
    try {
      ir::infer_shapes(g);
      FAIL() << "accepted " << (zero_point_alone ? "a zero point without a scale" : "a y_scale of 3 values");
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(zero_point_alone ? "come together" : "y_scale must hold one value"), std::string::npos) << what;
      EXPECT_NE(what.find(a.name), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace kiln::testing
