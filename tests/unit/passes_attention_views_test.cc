// Tests of fold_attention_views: an Attention whose Q, K and V come through layers that only
// move elements, or whose Y goes through Transposes and Reshapes, becomes one
// kiln::StridedAttention reading and writing those tensors in place, with the strides the
// layers described, and computes what they computed; chains that are not views stay.
#include <gtest/gtest.h>

#include <algorithm>

#include "compiler/quantize_graph.h"
#include "attention_graphs.h"
#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

constexpr int64_t S = 5, N = 2, H = 3, D = 4, E = H * D;

GraphBuilder packed_projection_attention() {
  GraphBuilder b;
  b.input("qkv", {S, N, 3 * E});
  add_packed_attention(b, "qkv", "y", S, N, H, D);
  b.output("y");
  return b;
}

// The graph after fold_attention_views, which must fold exactly one attention.
ir::Graph folded(const ir::Graph& before) {
  ir::Graph after = before;
  EXPECT_EQ(passes::fold_attention_views(after), 1);
  ir::infer_shapes(after);
  return after;
}

const ir::Node* only_node(const ir::Graph& g, const std::string& op) {
  const ir::Node* found = nullptr;
  for (const ir::Node& n : g.nodes)
    if (n.op == op) {
      EXPECT_EQ(found, nullptr) << "more than one " << op;
      found = &n;
    }
  return found;
}

TEST(FoldAttentionViews, PackedProjectionIsReadInPlace) {
  ir::Graph before = packed_projection_attention().build();
  ir::Graph after = folded(before);
  ASSERT_EQ(after.nodes.size(), 1u) << "every Reshape, Transpose and Gather folds";
  const ir::Node* a = only_node(after, "StridedAttention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->domain, "kiln");
  EXPECT_EQ(a->inputs, (std::vector<std::string>{"qkv", "qkv", "qkv"}));
  EXPECT_EQ(a->outputs[0], "y");
  // Q [b, h, s, d] = qkv[s, b, 0 * E + h * D + d]; K and V one and two E further.
  EXPECT_EQ(a->attrs.get_ints("q_view"), (std::vector<int64_t>{0, 3 * E, D, N * 3 * E}));
  EXPECT_EQ(a->attrs.get_ints("k_view"), (std::vector<int64_t>{E, 3 * E, D, N * 3 * E}));
  EXPECT_EQ(a->attrs.get_ints("v_view"), (std::vector<int64_t>{2 * E, 3 * E, D, N * 3 * E}));
  // Y [b, h, s, d] = y[s * N + b, h * D + d].
  EXPECT_EQ(a->attrs.get_ints("y_view"), (std::vector<int64_t>{0, E, D, N * E}));
  EXPECT_EQ(a->attrs.get_ints("y_shape"), (std::vector<int64_t>{S * N, E}));
  expect_same_outputs(before, after);
}

TEST(FoldAttentionViews, TransposesAcrossTheProjectionsJoinTheViews) {
  // The whole of nn.MultiheadAttention: the input [N, S, E] transposed to [S, N, E] before the
  // packed projection (MatMul, bias Add), Y's rows [S * N, E] through the output projection
  // (Gemm), reshaped to [S, N, E] and transposed back. Both Transposes move across the
  // projections into the views: no layer but the two projections and the attention stays.
  GraphBuilder b;
  b.input("x", {N, S, E});
  b.node("Transpose", {"x"}, "x_sne", {{"perm", std::vector<int64_t>{1, 0, 2}}});
  b.node("MatMul", {"x_sne", b.random("w_in", {E, 3 * E})}, "qkv_nobias");
  b.node("Add", {"qkv_nobias", b.random("b_in", {3 * E})}, "qkv");
  add_packed_attention(b, "qkv", "y", S, N, H, D);
  b.node("Gemm", {"y", b.random("w_out", {E, E}), b.random("b_out", {E})}, "rows_out", {{"transB", int64_t{1}}});
  b.node("Reshape", {"rows_out", b.ints("sne", {S, N, E})}, "sne_out");
  b.node("Transpose", {"sne_out"}, "out", {{"perm", std::vector<int64_t>{1, 0, 2}}});
  b.output("out");
  ir::Graph before = b.build();
  ir::Graph after = folded(before);
  std::vector<std::string> ops;
  for (const ir::Node& n : after.nodes)
    if (n.op != "Reshape") ops.push_back(n.op);
  EXPECT_EQ(ops, (std::vector<std::string>{"MatMul", "Add", "StridedAttention", "Gemm"}));
  const ir::Node* a = only_node(after, "StridedAttention");
  ASSERT_NE(a, nullptr);
  // Q [b, h, s, d] = projected[b, s, h * D + d] ([N, S, 3E] now); Y written as rows [N * S, E].
  EXPECT_EQ(a->attrs.get_ints("q_view"), (std::vector<int64_t>{0, S * 3 * E, D, 3 * E}));
  EXPECT_EQ(a->attrs.get_ints("y_view"), (std::vector<int64_t>{0, S * E, D, E}));
  expect_same_outputs(before, after);
}

// The output projection of a folded attention reads a value that calibration never saw (the
// attention's output, written as the projection's rows); the attention names the values it
// replaced, so an INT8 build finds the calibrated rows' scale and quantizes both projections.
// Without the names the output projection stays float for want of a scale.
TEST(FoldAttentionViews, OutputProjectionFindsTheCalibratedScale) {
  constexpr int64_t s = 5, n = 2, h = 2, d = 8, e = h * d;  // 16 features: INT8's granularity
  GraphBuilder b;
  b.input("x", {n, s, e});
  b.node("Transpose", {"x"}, "x_sne", {{"perm", std::vector<int64_t>{1, 0, 2}}});
  b.node("MatMul", {"x_sne", b.random("w_in", {e, 3 * e})}, "qkv_nobias");
  b.node("Add", {"qkv_nobias", b.random("b_in", {3 * e})}, "qkv");
  add_packed_attention(b, "qkv", "y", s, n, h, d);
  b.node("Gemm", {"y", b.random("w_out", {e, e}), b.random("b_out", {e})}, "rows_out", {{"transB", int64_t{1}}});
  b.node("Reshape", {"rows_out", b.ints("sne", {s, n, e})}, "sne_out");
  b.node("Transpose", {"sne_out"}, "out", {{"perm", std::vector<int64_t>{1, 0, 2}}});
  b.output("out");
  const ir::Graph after = folded(b.build());
  const ir::Node* a = only_node(after, "StridedAttention");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(a->outputs[0], "y");  // written as the projection's rows, a value of its own
  const std::vector<std::string> same = a->attrs.get_strings("same_values_as");
  EXPECT_NE(std::find(same.begin(), same.end(), "y"), same.end());

  // Calibration's names: the model's values before kiln's passes.
  const std::map<std::string, float> scales = {{"x", 0.02f}, {"x_sne", 0.02f}, {"y", 0.01f}};
  ir::Graph quantized = after;
  compiler::QuantizeGraphReport r = compiler::quantize_graph(quantized, scales);
  EXPECT_EQ(r.quantized, 2) << (r.kept_float.empty() ? "" : r.kept_float[0]);

  ir::Graph unnamed = after;
  for (ir::Node& node : unnamed.nodes)
    if (node.op == "StridedAttention") node.attrs.erase("same_values_as");
  compiler::QuantizeGraphReport ru = compiler::quantize_graph(unnamed, scales);
  EXPECT_EQ(ru.quantized, 1);
  ASSERT_EQ(ru.kept_float.size(), 1u);
  EXPECT_NE(ru.kept_float[0].find("no calibrated scale"), std::string::npos) << ru.kept_float[0];
}

TEST(FoldAttentionViews, TransposeBeforeAFusedProjectionJoinsTheViews) {
  // An engine's graph is optimized again once its shapes are bound, when fuse_epilogue has
  // already made the packed projection one kiln::FusedMatMul (bias, GELU): the Transpose before
  // it moves across it all the same, and no Transpose is left.
  GraphBuilder b;
  b.input("x", {N, S, E});
  b.node("Transpose", {"x"}, "x_sne", {{"perm", std::vector<int64_t>{1, 0, 2}}});
  b.node("FusedMatMul", {"x_sne", b.random("w_in", {E, 3 * E}), b.random("b_in", {3 * E})}, "qkv",
         {{"activation", std::string("Gelu")}});
  b.last().domain = "kiln";
  add_packed_attention(b, "qkv", "y", S, N, H, D);
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = folded(before);
  std::vector<std::string> ops;
  for (const ir::Node& n : after.nodes)
    if (n.op != "Reshape") ops.push_back(n.op);
  EXPECT_EQ(ops, (std::vector<std::string>{"FusedMatMul", "StridedAttention"}));
  const ir::Node* a = only_node(after, "StridedAttention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->attrs.get_ints("q_view"), (std::vector<int64_t>{0, S * 3 * E, D, 3 * E}));
  expect_same_outputs(before, after);
}

TEST(FoldAttentionViews, FusedProjectionWithAResidualKeepsItsTranspose) {
  // A residual Z is laid out like the projection's output: the Transpose cannot move across.
  GraphBuilder b;
  b.input("x", {N, S, E});
  b.input("z", {S, N, 3 * E});
  b.node("Transpose", {"x"}, "x_sne", {{"perm", std::vector<int64_t>{1, 0, 2}}});
  b.node("FusedMatMul", {"x_sne", b.random("w_in", {E, 3 * E}), b.random("b_in", {3 * E}), "z"}, "qkv");
  b.last().domain = "kiln";
  add_packed_attention(b, "qkv", "y", S, N, H, D);
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = folded(before);
  int transposes = 0;
  for (const ir::Node& n : after.nodes) transposes += n.op == "Transpose";
  EXPECT_EQ(transposes, 1);
  expect_same_outputs(before, after);
}

TEST(FoldAttentionViews, SplitAndSliceOfThePackedLastAxis) {
  // GPT-2's packing: [N, S, 3E] split along the last axis (K by a Slice), heads by Reshape and
  // Transpose; the 3-D form is left to fuse_attention, so this uses the 4-D form.
  GraphBuilder b;
  b.input("qkv", {N, S, 3 * E});
  b.node("Split", {"qkv", b.ints("sizes", {E, E, E})}, "q3", {{"axis", int64_t{2}}});
  b.last().outputs = {"q3", "unused", "v3"};
  b.node("Slice", {"qkv", b.ints("starts", {E}), b.ints("ends", {2 * E}), b.ints("axes", {2})}, "k3");
  const char* names[3] = {"q", "k", "v"};
  for (const std::string n : names) {
    b.node("Reshape", {n + "3", b.ints(n + "_split", {N, S, H, D})}, n + "_bshd");
    b.node("Transpose", {n + "_bshd"}, n, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  }
  b.input("mask", {N, 1, 1, S});
  b.node("Attention", {"q", "k", "v", "mask"}, "y", {{"is_causal", int64_t{1}}});
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = folded(before);
  const ir::Node* a = only_node(after, "StridedAttention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->inputs, (std::vector<std::string>{"qkv", "qkv", "qkv", "mask"}));
  EXPECT_EQ(a->attrs.get_int("is_causal", 0), 1);
  EXPECT_EQ(a->attrs.get_ints("k_view"), (std::vector<int64_t>{E, S * 3 * E, D, 3 * E}));
  EXPECT_EQ(only_node(after, "Split"), nullptr);
  expect_same_outputs(before, after);
}

TEST(FoldAttentionViews, PlainFormAndSymbolicShapesStay) {
  GraphBuilder b;
  b.input("q", {N, H, S, D});
  b.input("k", {N, H, S, D});
  b.input("v", {N, H, S, D});
  b.node("Attention", {"q", "k", "v"}, "y");
  b.output("y");
  ir::Graph g = b.build();
  EXPECT_EQ(passes::fold_attention_views(g), 0) << "nothing to fold: Attention reads its inputs as they are";

  GraphBuilder d;
  d.input("qkv", {ir::Dim::named("N"), S, 3 * E});
  d.node("Split", {"qkv", d.ints("sizes", {E, E, E})}, "q3", {{"axis", int64_t{2}}});
  d.last().outputs = {"q3", "k3", "v3"};
  d.node("Attention", {"q3", "k3", "v3"}, "y", {{"q_num_heads", H}, {"kv_num_heads", H}});
  d.output("y");
  ir::Graph symbolic = d.build();
  EXPECT_EQ(passes::fold_attention_views(symbolic), 0) << "strides need every dimension known";
}

TEST(FoldAttentionViews, OutputChainStopsAtAValueReadElsewhere) {
  // Y's Transpose is also a graph output: the node writes that output, and the Reshape after it
  // stays to read it.
  ir::Graph before = packed_projection_attention().build();
  before.outputs.push_back("y_sbhd");
  ir::Graph after = folded(before);
  const ir::Node* a = only_node(after, "StridedAttention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->outputs[0], "y_sbhd");
  EXPECT_EQ(a->attrs.get_ints("y_view"), (std::vector<int64_t>{0, E, D, N * E}));
  EXPECT_NE(only_node(after, "Reshape"), nullptr);
  expect_same_outputs(before, after);
}

TEST(FoldAttentionViews, ReshapeThatIsNoViewStopsTheChain) {
  // Q's heads come through a Transpose and then a Reshape to rows of 8, which cuts the transposed
  // axes where no stride describes it ([S, N, E] -> [N, S, E] -> [N * S * E / 8, 8] -> heads):
  // the fold starts after the Transpose, which stays, and the result still matches.
  GraphBuilder b;
  b.input("x", {S, N, E});
  b.node("Transpose", {"x"}, "xt", {{"perm", std::vector<int64_t>{1, 0, 2}}});
  b.node("Reshape", {"xt", b.ints("odd_shape", {N * S * E / 8, 8})}, "odd");
  b.node("Reshape", {"odd", b.ints("back", {N, S, H, D})}, "bshd");
  b.node("Transpose", {"bshd"}, "q", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  b.input("k", {N, H, S, D});
  b.input("v", {N, H, S, D});
  b.node("Attention", {"q", "k", "v"}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = folded(before);
  const ir::Node* a = only_node(after, "StridedAttention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->inputs[0], "xt");
  EXPECT_NE(only_node(after, "Transpose"), nullptr);
  EXPECT_EQ(a->attrs.get_ints("q_view"), (std::vector<int64_t>{0, S * E, D, E}));
  expect_same_outputs(before, after);
}

}  // namespace
}  // namespace kiln::testing
