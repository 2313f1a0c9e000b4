// Tests of fuse_attention: the written-out attention chain becomes one ONNX Attention node with
// the product of the scale factors, K untransposed, the mask as attn_mask, and computes what the
// chain computes; a chain that must stay says why.
#include <gtest/gtest.h>

#include <cmath>

#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

using ir::Dim;

// Q [N,2,5,8], K [N,2,7,8] transposed by `perm` from `keys`, V [N,2,7,4]; scores / sqrt(8),
// + mask [N,1,1,7], Softmax, P.V.
GraphBuilder attention_chain(const std::vector<int64_t>& perm, ir::Dims keys) {
  GraphBuilder b;
  b.input("q", {Dim::named("N"), 2, 5, 8});
  b.input("k", keys);
  b.input("v", {Dim::named("N"), 2, 7, 4});
  b.input("mask", {Dim::named("N"), 1, 1, 7});
  b.node("Transpose", {"k"}, "kt", {{"perm", perm}});
  b.node("MatMul", {"q", "kt"}, "scores");
  b.node("Div", {"scores", b.scalar("root", std::sqrt(8.f))}, "scaled");
  b.node("Add", {"scaled", "mask"}, "masked");
  b.node("Softmax", {"masked"}, "p", {{"axis", int64_t{-1}}});
  b.node("MatMul", {"p", "v"}, "y");
  b.output("y");
  return b;
}

const ir::Node* only_attention(const ir::Graph& g) {
  const ir::Node* found = nullptr;
  for (const ir::Node& n : g.nodes) {
    EXPECT_NE(n.op, "Softmax");
    if (n.op == "Attention") {
      EXPECT_EQ(found, nullptr);
      found = &n;
    }
  }
  return found;
}

TEST(FuseAttention, ScaledMaskedChainBecomesOneNode) {
  ir::Graph before = attention_chain({0, 1, 3, 2}, {Dim::named("N"), 2, 7, 8}).build();
  ir::Graph after = before;
  std::vector<std::string> notes;
  EXPECT_EQ(passes::fuse_attention(after, notes), 1);
  EXPECT_TRUE(notes.empty());
  const ir::Node* a = only_attention(after);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->inputs, (std::vector<std::string>{"q", "k", "v", "mask"}));  // K read before its transpose
  EXPECT_NEAR(a->attrs.get_float("scale", 0.f), 1.f / std::sqrt(8.f), 1e-7);
  EXPECT_EQ(a->outputs[0], "y");
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseAttention, KeysTransposedFromTheirOwnLayoutGetOneTranspose) {
  // K given as [N, 7, 2, 8] and turned into K^T [N, 2, 8, 7] by perm (0, 2, 3, 1), as BERT's
  // TorchScript export writes it: K is a Transpose (0, 2, 1, 3) of the input.
  ir::Graph before = attention_chain({0, 2, 3, 1}, {Dim::named("N"), 7, 2, 8}).build();
  ir::Graph after = before;
  std::vector<std::string> notes;
  EXPECT_EQ(passes::fuse_attention(after, notes), 1);
  const ir::Node* a = only_attention(after);
  ASSERT_NE(a, nullptr);
  const int k = after.producer(a->inputs[1]);
  ASSERT_GE(k, 0);
  EXPECT_EQ(after.nodes[static_cast<size_t>(k)].op, "Transpose");
  EXPECT_EQ(after.nodes[static_cast<size_t>(k)].attrs.get_ints("perm"), (std::vector<int64_t>{0, 2, 1, 3}));
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseAttention, HeadsSplitFromProjectionsUseTheThreeDimensionalForm) {
  // BERT's TorchScript export: Q, K, V [N, 5, 3 * 8] split into 3 heads by Reshape and Transpose
  // (K straight to K^T by perm (0, 2, 3, 1)), Y merged back by Transpose and Reshape.
  GraphBuilder b;
  for (const char* x : {"q3", "k3", "v3"}) b.input(x, {Dim::named("N"), 5, 24});
  b.input("mask", {Dim::named("N"), 1, 1, 5});
  const std::string split = b.ints("split", {0, 0, 3, 8}), merge = b.ints("merge", {0, 0, 24});
  for (const char* x : {"q", "k", "v"}) b.node("Reshape", {std::string(x) + "3", split}, std::string(x) + "s");
  b.node("Transpose", {"qs"}, "q", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  b.node("Transpose", {"ks"}, "kt", {{"perm", std::vector<int64_t>{0, 2, 3, 1}}});
  b.node("Transpose", {"vs"}, "v", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  b.node("MatMul", {"q", "kt"}, "scores");
  b.node("Mul", {"scores", b.scalar("scale", 0.125f)}, "scaled");
  b.node("Add", {"scaled", "mask"}, "masked");
  b.node("Softmax", {"masked"}, "p", {{"axis", int64_t{-1}}});
  b.node("MatMul", {"p", "v"}, "y4");
  b.node("Transpose", {"y4"}, "yt", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  b.node("Reshape", {"yt", merge}, "y");
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph after = before;
  std::vector<std::string> notes;
  EXPECT_EQ(passes::fuse_attention(after, notes), 1);
  const ir::Node* a = only_attention(after);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->inputs, (std::vector<std::string>{"q3", "k3", "v3", "mask"}));
  EXPECT_EQ(a->attrs.get_int("q_num_heads", 0), 3);
  EXPECT_EQ(a->attrs.get_int("kv_num_heads", 0), 3);
  EXPECT_EQ(a->outputs[0], "y");
  EXPECT_EQ(count_ops(after, "Transpose"), 0);
  EXPECT_EQ(count_ops(after, "Reshape"), 0);
  ir::infer_shapes(after);
  expect_same_outputs(before, after);
}

TEST(FuseAttention, ProbabilitiesReadElsewhereStayAndSayWhy) {
  GraphBuilder b = attention_chain({0, 1, 3, 2}, {Dim::named("N"), 2, 7, 8});
  b.output("p");
  ir::Graph g = b.build();
  std::vector<std::string> notes;
  EXPECT_EQ(passes::fuse_attention(g, notes), 0);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("probabilities are also read elsewhere"), std::string::npos) << notes[0];
}

TEST(FuseAttention, MaskBroadcastAlongTheKeysStays) {
  // A [N, 1, 1, 1] mask adds one value to every key; Attention would mask the keys past it.
  GraphBuilder b;
  b.input("q", {2, 2, 5, 8});
  b.input("k", {2, 2, 7, 8});
  b.input("v", {2, 2, 7, 4});
  b.input("mask", {2, 1, 1, 1});
  b.node("Transpose", {"k"}, "kt", {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
  b.node("MatMul", {"q", "kt"}, "scores");
  b.node("Add", {"scores", "mask"}, "masked");
  b.node("Softmax", {"masked"}, "p", {{"axis", int64_t{-1}}});
  b.node("MatMul", {"p", "v"}, "y");
  b.output("y");
  ir::Graph g = b.build();
  std::vector<std::string> notes;
  EXPECT_EQ(passes::fuse_attention(g, notes), 0);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("broadcast along the keys"), std::string::npos) << notes[0];
}

}  // namespace
}  // namespace kiln::testing
