// GPU builds of models whose shapes depend on their data (compiler/data_dependent_split.h): where
// the graph splits, what the head hands the tail, and the engine of the two parts
// (compiler/host_tail_engine.h), here with the CPU engine on both sides so that no GPU is needed:
// it answers what the whole graph answers, also when the data leaves nothing to select.
#include <gtest/gtest.h>

#include <memory>

#include "compiler/data_dependent_split.h"
#include "compiler/host_tail_engine.h"
#include "compiler/pipeline.h"
#include "cpu/backend.h"
#include "graph_builder.h"

namespace kiln {
namespace {

using testing::GraphBuilder;

// y = 2 Relu(x) needs no data; g = the positive elements of Relu(x) (NonZero, Transpose,
// GatherND) and z = sum(g) * w do. w is read by the tail alone.
ir::Graph select_positive() {
  GraphBuilder b;
  b.input("x", {4, 6});
  b.input("w", {5});
  b.node("Relu", {"x"}, "r");
  b.scalar("two", 2.f);
  b.node("Mul", {"r", "two"}, "y");
  b.node("NonZero", {"r"}, "nz");
  b.node("Transpose", {"nz"}, "t", {{"perm", std::vector<int64_t>{1, 0}}});
  b.node("GatherND", {"r", "t"}, "g");
  b.node("ReduceSum", {"g"}, "s", {{"keepdims", int64_t{0}}});
  b.node("Mul", {"s", "w"}, "z");
  for (const char* out : {"y", "g", "z"}) b.output(out);
  return b.build();
}

ir::Graph at_shapes(const ir::Graph& g, compiler::Shapes shapes) {
  return compiler::specializer(std::make_shared<const ir::Graph>(g), true, "test")(shapes, {});
}

std::vector<std::string> node_names(const ir::Graph& g) {
  std::vector<std::string> names;
  for (const ir::Node& n : g.nodes) names.push_back(n.name);
  return names;
}

TEST(DataDependentSplit, TheTailBeginsAtTheFirstNodeWhoseShapesTheDataDecides) {
  const ir::Graph g = select_positive();
  ASSERT_TRUE(compiler::may_have_data_dependent_shapes(g));
  std::optional<compiler::DataDependentSplit> split =
      compiler::split_at_data_dependent_shapes(g, at_shapes(g, {{"x", {4, 6}}, {"w", {5}}}));
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->starts, std::vector<std::string>{"nz_node (NonZero)"});
  EXPECT_EQ(node_names(split->head), (std::vector<std::string>{"r_node", "y_node"}));
  EXPECT_EQ(node_names(split->tail), (std::vector<std::string>{"nz_node", "t_node", "g_node", "s_node", "z_node"}));
  EXPECT_EQ(split->handed, std::vector<std::string>{"r"});
  EXPECT_EQ(split->head.inputs, std::vector<std::string>{"x"});
  EXPECT_EQ(split->head.outputs, (std::vector<std::string>{"y", "r"}));
  EXPECT_EQ(split->tail.inputs, (std::vector<std::string>{"w", "r"}));
  EXPECT_EQ(split->tail.outputs, (std::vector<std::string>{"g", "z"}));
  EXPECT_FALSE(split->head.has_value("w")) << "the head keeps an input only the tail reads";
  EXPECT_FALSE(split->tail.has_value("two")) << "the tail keeps a constant only the head reads";
}

TEST(DataDependentSplit, ConstantsBehindIdentityNodesAreTheTailsOwnNotHanded) {
  GraphBuilder b;
  b.input("x", {4, 6});
  b.random("w", {6});
  b.node("Identity", {"w"}, "shared_w");  // as exporters write a weight two modules share
  b.node("Mul", {"x", "shared_w"}, "y");
  b.node("NonZero", {"x"}, "nz");
  b.node("Transpose", {"nz"}, "t", {{"perm", std::vector<int64_t>{1, 0}}});
  b.node("GatherND", {"x", "t"}, "g");
  b.node("Mul", {"g", "shared_w"}, "z");
  b.output("y");
  b.output("z");
  const ir::Graph g = b.build();
  std::optional<compiler::DataDependentSplit> split = compiler::split_at_data_dependent_shapes(g, at_shapes(g, {{"x", {4, 6}}}));
  ASSERT_TRUE(split.has_value());
  EXPECT_TRUE(split->handed.empty()) << "a constant is handed as data: " << split->handed.front();
  EXPECT_EQ(split->tail.inputs, std::vector<std::string>{"x"});
  const Tensor* in_tail = split->tail.constant("shared_w");
  ASSERT_NE(in_tail, nullptr);
  ASSERT_EQ(in_tail->numel(), 6);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(in_tail->value_as_double(i), g.constant("w")->value_as_double(i));
}

TEST(DataDependentSplit, NothingToSplitWhenTheInputShapesDecideEveryShape) {
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 6});
  b.node("Relu", {"x"}, "r");
  b.node("Shape", {"r"}, "shape");
  b.node("Reshape", {"r", "shape"}, "y");
  b.output("y");
  const ir::Graph g = b.build();
  EXPECT_FALSE(compiler::split_at_data_dependent_shapes(g, at_shapes(g, {{"x", {3, 6}}})).has_value());
  EXPECT_FALSE(compiler::may_have_data_dependent_shapes(g)) << "a dimension named after an input's is planned";
}

TEST(DataDependentSplit, AModelThatStartsWithSuchANodeIsRefusedNamingIt) {
  GraphBuilder b;
  b.input("x", {4, 6});
  b.node("NonZero", {"x"}, "nz");
  b.output("nz");
  const ir::Graph g = b.build();
  try {
    compiler::split_at_data_dependent_shapes(g, at_shapes(g, {{"x", {4, 6}}}));
    FAIL() << "a model whose first node depends on its data was split";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("nz_node (NonZero)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--device cpu"), std::string::npos) << e.what();
  }
}

TEST(HostTailEngine, RunsBothPartsAndAnswersAsTheWholeGraph) {
  const ir::Graph g = select_positive();
  compiler::DataDependentSplit split = *compiler::split_at_data_dependent_shapes(g, at_shapes(g, {{"x", {4, 6}}, {"w", {5}}}));
  std::unique_ptr<backend::Engine> head = cpu::build_backend_engine(split.head, 0);
  std::unique_ptr<backend::Engine> tail = cpu::build_backend_engine(split.tail, 0);
  std::unique_ptr<backend::Engine> engine = compiler::make_host_tail_engine(
      std::make_shared<const ir::Graph>(g), std::move(split), std::move(head), std::move(tail));
  cpu::CpuEngine whole(g);
  EXPECT_EQ(engine->graph().nodes.size(), g.nodes.size()) << "an engine file keeps the whole graph";

  for (unsigned seed : {1u, 2u, 3u}) {
    std::map<std::string, Tensor> inputs = testing::random_inputs(g, seed);
    if (seed == 3)  // nothing positive: NonZero selects nothing
      for (int64_t i = 0; i < inputs["x"].numel(); ++i) inputs["x"].data<float>()[i] = -1.f - static_cast<float>(i);
    std::map<std::string, Tensor> want = whole.run(inputs), got = engine->run(inputs);
    ASSERT_EQ(got.size(), 3u);
    for (const std::string& name : g.outputs) {
      ASSERT_EQ(got.at(name).shape(), want.at(name).shape()) << name << ", seed " << seed;
      for (int64_t i = 0; i < want.at(name).numel(); ++i)
        EXPECT_EQ(got.at(name).value_as_double(i), want.at(name).value_as_double(i)) << name << "[" << i << "]";
    }
    if (seed == 3) EXPECT_EQ(got.at("g").shape(), std::vector<int64_t>{0});
  }

  EngineInfo info;
  engine->describe(info);
  EXPECT_TRUE(info.has_cpu_fallback);
  EXPECT_EQ(info.data_dependent_nodes, std::vector<std::string>{"nz_node (NonZero)"});
  ASSERT_EQ(info.layers.size(), 7u);
  EXPECT_EQ(info.layers.back().name, "z_node");
  EXPECT_TRUE(info.layers.back().cpu_fallback);

  std::map<std::string, Tensor> wrong = testing::random_inputs(g, 1);
  wrong["extra"] = Tensor(DType::kFloat32, {1});
  try {
    engine->run(wrong);
    FAIL() << "an input the model does not have was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'extra'"), std::string::npos) << e.what();
  }
  std::map<std::string, Tensor> missing = testing::random_inputs(g, 1);
  missing.erase("w");
  EXPECT_THROW(engine->run(missing), Error);
}

}  // namespace
}  // namespace kiln
