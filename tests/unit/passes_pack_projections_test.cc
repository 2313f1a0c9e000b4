// Tests of pack_attention_projections: Q, K and V projected from one tensor by three constant
// matrices (BERT's form) become one product by the matrices side by side whose heads the
// attention reads in place, computing what the three did; K and V alone pack for
// cross-attention; nothing packs where the heads could not then be read in place.
#include <gtest/gtest.h>

#include "compiler/pipeline.h"
#include "onnx/exporter.h"
#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

constexpr int64_t B = 2, S = 5, T = 3, H = 2, D = 4, E = H * D;

// x [B, S, E] (and, for cross-attention, memory [B, T, E]) -> MatMul + bias per projection ->
// Reshape [B, ., H, D] -> Transpose to heads -> Attention -> heads merged back to [B, S, E].
ir::Graph bert_attention(bool cross, bool bias, ir::Dim batch = ir::Dim(B)) {
  GraphBuilder b;
  b.input("x", {batch, S, E});
  if (cross) b.input("memory", {batch, T, E});
  const char* names[3] = {"q", "k", "v"};
  for (const std::string n : names) {
    const std::string from = cross && n != "q" ? "memory" : "x";
    const int64_t rows = cross && n != "q" ? T : S;
    b.node("MatMul", {from, b.random(n + "_w", {E, E})}, n + "_product");
    std::string projected = n + "_product";
    if (bias) projected = b.node("Add", {projected, b.random(n + "_b", {E})}, n + "_projected");
    b.node("Reshape", {projected, b.ints(n + "_split", {0, rows, H, D})}, n + "_heads");
    b.node("Transpose", {n + "_heads"}, n, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  }
  b.node("Attention", {"q", "k", "v"}, "y4");
  b.node("Transpose", {"y4"}, "y_bshd", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  b.node("Reshape", {"y_bshd", b.ints("merge", {0, S, E})}, "y");
  b.output("y");
  return b.build();
}

ir::Graph packed_and_folded(const ir::Graph& before, int packs) {
  ir::Graph after = before;
  EXPECT_EQ(passes::pack_attention_projections(after), packs);
  ir::infer_shapes(after);
  passes::fold_attention_views(after);
  ir::infer_shapes(after);
  return after;
}

TEST(PackAttentionProjections, QKAndVBecomeOneProductReadInPlace) {
  for (bool bias : {true, false}) {
    const ir::Graph before = bert_attention(false, bias);
    const ir::Graph after = packed_and_folded(before, 1);
    EXPECT_EQ(count_ops(after, "MatMul"), 1) << "bias " << bias;
    EXPECT_EQ(count_ops(after, "Add"), bias ? 1 : 0);
    EXPECT_EQ(count_ops(after, "Split"), 0) << "the heads are read from the packed product";
    ASSERT_EQ(count_ops(after, "StridedAttention"), 1);
    for (const ir::Node& n : after.nodes)
      if (n.op == "StridedAttention") {
        EXPECT_EQ(n.inputs[0], n.inputs[1]);
        EXPECT_EQ(n.inputs[1], n.inputs[2]);
        // Q [b, h, s, d] = packed[b, s, h * D + d]; K and V one and two E further along the row.
        EXPECT_EQ(n.attrs.get_ints("q_view"), (std::vector<int64_t>{0, S * 3 * E, D, 3 * E}));
        EXPECT_EQ(n.attrs.get_ints("k_view"), (std::vector<int64_t>{E, S * 3 * E, D, 3 * E}));
        EXPECT_EQ(n.attrs.get_ints("v_view"), (std::vector<int64_t>{2 * E, S * 3 * E, D, 3 * E}));
      }
    const Tensor* w = nullptr;
    for (const ir::Node& n : after.nodes)
      if (n.op == "MatMul") w = after.constant(n.inputs[1]);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->shape(), (std::vector<int64_t>{E, 3 * E}));
    expect_same_outputs(before, after, 3);
  }
}

// A quantized GPU build of one static shape quantizes the graph at that shape: Q, K and V are
// one product (one quantized convolution of 3E channels) whose heads the attention reads in
// place, as in the fp16 engine. With a profile of batches 1 to 4 the symbolic graph is quantized
// as it is: three products.
TEST(PackAttentionProjections, AStaticQuantizedBuildPacksBeforeQuantizing) {
  GraphBuilder b;
  constexpr int64_t heads = 2, depth = 8, width = heads * depth;
  b.input("x", {ir::Dim::named("batch"), S, width});
  for (const std::string n : {"q", "k", "v"}) {
    b.node("MatMul", {"x", b.random(n + "_w", {width, width})}, n + "_product");
    b.node("Add", {n + "_product", b.random(n + "_b", {width})}, n + "_projected");
    b.node("Reshape", {n + "_projected", b.ints(n + "_split", {0, S, heads, depth})}, n + "_heads");
    b.node("Transpose", {n + "_heads"}, n, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  }
  b.node("Attention", {"q", "k", "v"}, "y4");
  b.node("Transpose", {"y4"}, "y_bshd", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  b.node("Reshape", {"y_bshd", b.ints("merge", {0, S, width})}, "y");
  b.output("y");
  const std::string bytes = onnx_export::export_model(b.build());
  for (bool fixed : {true, false}) {
    BuildOptions options;
    options.device = Device::kCuda;
    options.precision = Precision::kInt8;
    options.int8_scales = {{"x", 0.02f}};
    if (fixed) options.input_shapes["x"] = {B, S, width};
    else options.profiles = {{{"x", ShapeRange{{1, S, width}, {B, S, width}, {4, S, width}}}}};
    compiler::QdqScales qdq;
    ir::Graph g = compiler::float_graph(bytes, "attention.onnx", ".", options, qdq);
    std::vector<std::string> kept_float;
    compiler::quantize_for_precision(g, "attention.onnx", options, qdq, kept_float);
    std::vector<int64_t> channels;
    for (const ir::Node& n : g.nodes)
      if (n.op == "QConv") channels.push_back(g.constant(n.inputs[1])->dim(0));
    const std::vector<int64_t> want = fixed ? std::vector<int64_t>{3 * width} : std::vector<int64_t>{width, width, width};
    EXPECT_EQ(channels, want) << fixed;
    EXPECT_EQ(count_ops(g, "StridedAttention"), fixed ? 1 : 0) << fixed;
  }
}

TEST(PackAttentionProjections, CrossAttentionPacksKeysAndValues) {
  const ir::Graph before = bert_attention(true, true);
  const ir::Graph after = packed_and_folded(before, 1);
  EXPECT_EQ(count_ops(after, "MatMul"), 2) << "Q from x, K and V together from memory";
  EXPECT_EQ(count_ops(after, "Split"), 0);
  expect_same_outputs(before, after, 3);
}

TEST(PackAttentionProjections, FusedProjectionsOfAnEngineGraphPackAtItsShapes) {
  // A GPU engine optimizes the graph with its dynamic batch (the projections become
  // kiln::FusedMatMul, nothing packs), then again at each input shape: there they pack.
  ir::Graph g = bert_attention(false, true, ir::Dim::named("N"));
  compiler::optimize(g);
  EXPECT_EQ(count_ops(g, "FusedMatMul"), 3);
  passes::bind_input_shapes(g, {{"x", {B, S, E}}});
  compiler::optimize(g);
  EXPECT_EQ(count_ops(g, "FusedMatMul"), 1);
  EXPECT_EQ(count_ops(g, "StridedAttention"), 1);
  ir::Graph reference = bert_attention(false, true);
  expect_same_outputs(reference, g);
}

TEST(PackAttentionProjections, NothingPacksWhereTheHeadsCouldNotBeReadInPlace) {
  // A dynamic batch: no strides, so the Split would copy.
  ir::Graph symbolic = bert_attention(false, true, ir::Dim::named("N"));
  EXPECT_EQ(passes::pack_attention_projections(symbolic), 0);
  EXPECT_EQ(count_ops(symbolic, "MatMul"), 3);
  // Projections from different tensors, or weights that are inputs, do not pack.
  GraphBuilder b;
  b.input("x", {B, S, E});
  b.input("w", {E, E});
  b.node("MatMul", {"x", "w"}, "q2");
  b.node("MatMul", {"x", "w"}, "k2");
  b.node("MatMul", {"x", "w"}, "v2");
  b.node("Attention", {"q2", "k2", "v2"}, "y", {{"q_num_heads", H}, {"kv_num_heads", H}});
  b.output("y");
  ir::Graph inputs = b.build();
  EXPECT_EQ(passes::pack_attention_projections(inputs), 0);
}

}  // namespace
}  // namespace kiln::testing
