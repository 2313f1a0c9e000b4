// Tests of optimize(): the passes together on a small ResNet-like graph with a dynamic batch,
// and the options that switch folding and fusion off.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "ir/activation.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "compiler/pipeline.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

using ir::Dim;

std::string batchnorm(GraphBuilder& b, const std::string& x, int64_t c, const std::string& out) {
  return b.node("BatchNormalization",
                {x, b.random(out + "_g", {c}, 0.5f, 1.5f), b.random(out + "_b", {c}), b.random(out + "_m", {c}),
                 b.random(out + "_v", {c}, 0.1f, 2.f)},
                out);
}

// Conv-BN-Relu, Conv-BN + skip -> Relu, then x.view(x.size(0), -1) -> Dropout -> Gemm, with
// a Gemm weight stored transposed through a constant Transpose.
ir::Graph small_resnet() {
  GraphBuilder b;
  b.input("input", {Dim::named("batch"), 4, 6, 6});
  b.node("Identity", {"input"}, "in_copy");
  b.node("Conv", {"in_copy", b.random("w1", {4, 4, 3, 3})}, "c1", {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  batchnorm(b, "c1", 4, "bn1");
  b.node("Relu", {"bn1"}, "r1");
  b.node("Conv", {"r1", b.random("w2", {4, 4, 3, 3})}, "c2", {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  batchnorm(b, "c2", 4, "bn2");
  b.node("Add", {"bn2", "in_copy"}, "sum");
  b.node("Relu", {"sum"}, "r2");
  b.node("Shape", {"r2"}, "shape");
  b.node("Gather", {"shape", b.constant("zero", Tensor::scalar<int64_t>(0))}, "n");
  b.node("Unsqueeze", {"n", b.ints("axes", {0})}, "n1");
  b.node("Concat", {"n1", b.ints("minus_one", {-1})}, "flat_shape", {{"axis", int64_t{0}}});
  b.node("Reshape", {"r2", "flat_shape"}, "flat");
  b.node("Dropout", {"flat", b.scalar("ratio", 0.1f)}, "dropped");
  b.node("Transpose", {b.random("fc_w_t", {144, 10})}, "fc_w", {{"perm", std::vector<int64_t>{1, 0}}});
  b.node("Gemm", {"dropped", "fc_w", b.random("fc_b", {10})}, "logits", {{"transB", int64_t{1}}});
  b.node("Relu", {"logits"}, "output");
  b.output("output");
  return b.build();
}

TEST(Optimize, FoldsFusesAndSimplifiesASmallResNet) {
  ir::Graph before = small_resnet();
  ir::Graph after = before;
  compiler::optimize(after);

  for (const char* gone : {"BatchNormalization", "Identity", "Dropout", "Shape", "Gather", "Concat", "Transpose",
                           "Relu", "Add", "Conv", "Gemm"})
    EXPECT_EQ(count_ops(after, gone), 0) << gone;
  ASSERT_EQ(after.nodes.size(), 4u);
  EXPECT_EQ(after.nodes[0].op, "FusedConv");
  EXPECT_EQ(std::string(ir::Activation::from_node(after.nodes[0]).name()), "Relu");
  EXPECT_EQ(after.nodes[1].op, "FusedConv");
  ASSERT_EQ(after.nodes[1].inputs.size(), 4u);
  EXPECT_EQ(after.nodes[1].inputs[3], "input");  // the residual, after Identity removal
  EXPECT_EQ(after.nodes[2].op, "Reshape");
  ASSERT_NE(after.constant(after.nodes[2].inputs[1]), nullptr);
  EXPECT_EQ(after.constant(after.nodes[2].inputs[1])->to_int_vector(), (std::vector<int64_t>{0, -1}));
  EXPECT_EQ(after.nodes[3].op, "FusedGemm");
  EXPECT_EQ(after.value("output").type.str(), "float32[batchx10]");
  expect_same_outputs(before, after, 1);
  expect_same_outputs(before, after, 3);
}

TEST(Optimize, OptionsSwitchFoldingAndFusionOff) {
  ir::Graph before = small_resnet();
  ir::Graph g = before;
  compiler::PassOptions off;
  off.fold_constants = false;
  off.fuse = false;
  compiler::optimize(g, off);
  EXPECT_EQ(count_ops(g, "BatchNormalization"), 2);
  EXPECT_EQ(count_ops(g, "Transpose"), 1);  // a constant Transpose, not folded
  EXPECT_EQ(count_ops(g, "Conv"), 2);
  EXPECT_EQ(count_ops(g, "FusedConv"), 0);
  // Cleanup still runs: copies and the dynamic-batch shape chain go.
  EXPECT_EQ(count_ops(g, "Identity"), 0);
  EXPECT_EQ(count_ops(g, "Shape"), 0);
  expect_same_outputs(before, g);
}

// What `kiln export --simplify` does: fold without fusing into kiln's ops, write ONNX, and the
// model read back computes what the original did.
TEST(Optimize, FoldedGraphWritesAsOnnxAndReadsBack) {
  ir::Graph before = small_resnet();
  ir::Graph g = before;
  compiler::PassOptions fold_only;
  fold_only.fuse_epilogue = false;
  compiler::optimize(g, fold_only);
  EXPECT_EQ(count_ops(g, "BatchNormalization"), 0);
  EXPECT_EQ(count_ops(g, "FusedConv"), 0);
  EXPECT_EQ(count_ops(g, "Shape"), 0);
  const std::string bytes = onnx_export::export_model(g);
  ir::Graph back = onnx_import::import_bytes(bytes, "simplified.onnx", ".");
  EXPECT_EQ(back.nodes.size(), g.nodes.size());
  EXPECT_EQ(back.value("input").type.str(), before.value("input").type.str());  // the symbolic batch survives
  expect_same_outputs(before, back, 1);
  expect_same_outputs(before, back, 3);

  // Fused graphs hold kiln's own ops: writing one names the node instead of writing bad ONNX.
  compiler::optimize(g);
  ASSERT_GT(count_ops(g, "FusedConv"), 0);
  try {
    onnx_export::export_model(g);
    FAIL() << "a graph with kiln::FusedConv was written as ONNX";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("FusedConv"), std::string::npos) << e.what();
  }
}

TEST(Optimize, IsIdempotent) {
  ir::Graph g = small_resnet();
  compiler::optimize(g);
  ir::Graph again = g;
  compiler::optimize(again);
  ASSERT_EQ(again.nodes.size(), g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    EXPECT_EQ(again.nodes[i].op, g.nodes[i].op);
    EXPECT_EQ(again.nodes[i].inputs, g.nodes[i].inputs);
  }
}

TEST(RemoveIdentityAndDropout, CastsToTheTypeTheyHaveAreCopies) {
  // softmax(x, dtype=float32).to(float32), as transformers exports it for a float32 model: the
  // Cast goes, a Cast that changes the type stays, and a Cast that is a graph output keeps its name.
  GraphBuilder b;
  b.input("x", {2, 5});
  b.node("Softmax", {"x"}, "p");
  b.node("Cast", {"p"}, "p_same", {{"to", int64_t{static_cast<int64_t>(DType::kFloat32)}}});
  b.node("Cast", {"p_same"}, "p_half", {{"to", int64_t{static_cast<int64_t>(DType::kFloat16)}}});
  b.node("CastLike", {"p_half", "p_half"}, "p_half_again");
  b.node("Cast", {"p_half_again"}, "y", {{"to", int64_t{static_cast<int64_t>(DType::kFloat16)}}});
  b.output("y");
  ir::Graph before = b.build();
  ir::Graph g = before;
  EXPECT_EQ(passes::remove_identity_and_dropout(g), 3);
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[0].op, "Softmax");
  EXPECT_EQ(g.nodes[1].op, "Cast");
  EXPECT_EQ(g.nodes[1].inputs[0], g.nodes[0].outputs[0]);
  EXPECT_EQ(g.nodes[1].outputs[0], "y");
  EXPECT_EQ(g.value("y").type.dtype, DType::kFloat16);
}

}  // namespace
}  // namespace kiln::testing
