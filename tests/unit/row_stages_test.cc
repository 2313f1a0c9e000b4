// Row stages of a GPU build's CPU tail (compiler/row_stages.h): which nodes compute each row of a
// data-sized value on their own, and the engine that runs the tail in parts with each stage a fixed
// number of rows at a time (compiler/staged_tail_engine.h), here with CPU engines for the stages
// so that no GPU is needed: it answers what the whole tail answers, for no rows, fewer rows than
// one run takes, and more than one run's, whole and padded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "compiler/row_stages.h"
#include "compiler/staged_tail_engine.h"
#include "cpu/backend.h"
#include "graph_builder.h"

namespace kiln {
namespace {

using testing::GraphBuilder;

// A detection model's tail in small: `keep` selects rows by score (NonZero), then a mask head
// (Conv, Relu, ConvTranspose, Sigmoid) reads the selected feature maps and a box head (Flatten,
// Gemm, Relu, then two Gemms) the selected feature vectors; a Softmax over the class scores runs
// after it. Nodes that are not row stages: a lone Sigmoid of the selected scores (no product), a
// MatMul whose B is not constant.
ir::Graph detection_tail() {
  GraphBuilder b;
  b.input("maps", {8, 3, 4, 4});
  b.input("vectors", {8, 10});
  b.input("score", {8});
  b.scalar("zero", 0.f);
  b.node("Greater", {"score", "zero"}, "positive");
  b.node("NonZero", {"positive"}, "nz");
  b.ints("flat_shape", {-1});
  b.node("Reshape", {"nz", "flat_shape"}, "keep");
  b.node("Gather", {"maps", "keep"}, "sel_maps", {{"axis", int64_t{0}}});
  b.node("Gather", {"vectors", "keep"}, "sel_vectors", {{"axis", int64_t{0}}});
  b.node("Gather", {"score", "keep"}, "sel_score", {{"axis", int64_t{0}}});

  b.random("w1", {5, 3, 3, 3});
  b.random("b1", {5});
  b.node("Conv", {"sel_maps", "w1", "b1"}, "c1", testing::conv_attrs(3));
  b.node("Relu", {"c1"}, "r1");
  b.random("w2", {5, 2, 2, 2});
  b.node("ConvTranspose", {"r1", "w2"}, "up",
         {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}});
  b.node("Sigmoid", {"up"}, "masks");

  b.node("Flatten", {"sel_vectors"}, "flat", {{"axis", int64_t{1}}});
  b.random("w3", {10, 8});
  b.random("b3", {8});
  b.node("Gemm", {"flat", "w3", "b3"}, "h");
  b.node("Relu", {"h"}, "hr");
  b.random("w4", {3, 8});
  b.random("b4", {1, 3});
  b.node("Gemm", {"hr", "w4", "b4"}, "cls", {{"transB", int64_t{1}}});
  b.random("w5", {8, 4});
  b.node("Gemm", {"hr", "w5"}, "box");
  b.node("Softmax", {"cls"}, "prob", {{"axis", int64_t{1}}});

  b.node("Sigmoid", {"sel_score"}, "sel_prob");
  b.node("Transpose", {"sel_vectors"}, "sel_t", {{"perm", std::vector<int64_t>{1, 0}}});
  b.node("MatMul", {"sel_vectors", "sel_t"}, "gram");
  for (const char* out : {"masks", "box", "prob", "sel_prob", "gram"}) b.output(out);
  return b.build();
}

std::vector<std::string> names_of(const ir::Graph& g, const std::vector<size_t>& nodes) {
  std::vector<std::string> names;
  for (size_t i : nodes) names.push_back(g.nodes[i].name);
  return names;
}

TEST(RowStages, FindsEachHeadThatComputesRowsOnTheirOwn) {
  const ir::Graph g = detection_tail();
  std::vector<compiler::RowStage> stages = compiler::find_row_stages(g);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].rows, "sel_maps");
  EXPECT_EQ(names_of(g, stages[0].nodes), (std::vector<std::string>{"c1_node", "r1_node", "up_node", "masks_node"}));
  EXPECT_EQ(stages[0].outputs, std::vector<std::string>{"masks"});
  EXPECT_EQ(stages[1].rows, "sel_vectors");
  EXPECT_EQ(names_of(g, stages[1].nodes), (std::vector<std::string>{"flat_node", "h_node", "hr_node", "cls_node", "box_node"}));
  EXPECT_EQ(stages[1].outputs, (std::vector<std::string>{"cls", "box"}));

  const ir::Graph stage = compiler::row_stage_graph(g, stages[1]);
  EXPECT_EQ(stage.inputs, std::vector<std::string>{"sel_vectors"});
  EXPECT_EQ(stage.outputs, (std::vector<std::string>{"cls", "box"}));
  EXPECT_EQ(ir::dims_to_string(*stage.value("cls").type.shape), "rowsx3");
  EXPECT_EQ(ir::dims_to_string(*stage.value("box").type.shape), "rowsx4");
  EXPECT_FALSE(stage.has_value("w1")) << "a stage keeps constants only another stage reads";
}

TEST(RowStages, NoStageWithoutAConstantWeightOrAMatrixProduct) {
  GraphBuilder b;
  b.input("x", {ir::Dim::unknown(), 8});
  b.input("w", {8, 8});
  b.node("Relu", {"x"}, "r");
  b.node("MatMul", {"r", "w"}, "y");   // B is an input
  b.random("c", {8, 8});
  b.node("Gemm", {"r", "c"}, "z", {{"transA", int64_t{1}}});  // A transposed: its rows are columns
  b.input("row_bias", {ir::Dim::unknown(), 8});
  b.node("Gemm", {"r", "c", "row_bias"}, "v");  // a bias of its own for each row
  for (const char* out : {"y", "z", "v"}) b.output(out);
  EXPECT_TRUE(compiler::find_row_stages(b.build()).empty());
}

// The tail run in parts, its stages on engines of `rows_per_run` rows (CPU engines here).
std::unique_ptr<backend::Engine> staged(const ir::Graph& g, int64_t rows_per_run) {
  std::vector<compiler::TailPart> parts = compiler::tail_parts(g, compiler::find_row_stages(g), rows_per_run);
  for (compiler::TailPart& p : parts) p.engine = cpu::build_backend_engine(p.graph, 0);
  return compiler::make_staged_tail_engine(g, std::move(parts));
}

TEST(StagedTailEngine, RunsStagesInRunsOfFixedRowsAndAnswersAsTheWholeTail) {
  const ir::Graph g = detection_tail();
  std::vector<compiler::TailPart> parts = compiler::tail_parts(g, compiler::find_row_stages(g), 4);
  ASSERT_EQ(parts.size(), 4u) << "selection, mask head, box head, what reads the heads";
  EXPECT_FALSE(parts[0].stage.has_value());
  EXPECT_TRUE(parts[1].stage.has_value() && parts[2].stage.has_value());
  EXPECT_FALSE(parts[3].stage.has_value());
  EXPECT_EQ(parts[3].graph.inputs, (std::vector<std::string>{"cls", "sel_score", "sel_vectors"}));
  EXPECT_TRUE(std::find(parts[0].graph.outputs.begin(), parts[0].graph.outputs.end(), "sel_maps") != parts[0].graph.outputs.end());

  std::unique_ptr<backend::Engine> engine = staged(g, 4);
  cpu::CpuEngine whole(g);
  // None; fewer than one run's 4 rows (padded to 4); one run and 3 rows padded to 4 (the second
  // run's maps a view of the selection, its vectors, 160 bytes in, a copy); two whole runs.
  for (int selected : {0, 3, 7, 8}) {
    std::map<std::string, Tensor> inputs = testing::random_inputs(g, 7u + static_cast<unsigned>(selected));
    float* score = inputs["score"].data<float>();
    for (int i = 0; i < 8; ++i) score[i] = i < selected ? 0.5f + static_cast<float>(i) : -1.f;
    std::map<std::string, Tensor> want = whole.run(inputs), got = engine->run(inputs);
    ASSERT_EQ(got.size(), g.outputs.size());
    for (const std::string& name : g.outputs) {
      const Tensor &a = want.at(name), &b = got.at(name);
      ASSERT_EQ(b.shape(), a.shape()) << name << ", " << selected << " selected";
      if (name != "gram") EXPECT_EQ(b.dim(0), selected) << name;
      for (int64_t i = 0; i < a.numel(); ++i)
        EXPECT_NEAR(b.value_as_double(i), a.value_as_double(i), 1e-5 * (1 + std::fabs(a.value_as_double(i))))
            << name << "[" << i << "], " << selected << " selected";
    }
  }
  std::map<std::string, Tensor> missing = testing::random_inputs(g, 1);
  missing.erase("vectors");
  try {
    engine->run(missing);
    FAIL() << "a tail ran without one of its inputs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'vectors'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
