// Inputs planned by value (BuildOptions::input_values): which graph inputs set parameters
// (ir::parameter_inputs), binding them as constants (passes::bind_input_values), the build's
// checks and conversions (compiler::resolve_input_values), and the engine file's copy of them.
// No GPU needed.
#include <gtest/gtest.h>

#include "compiler/input_values.h"
#include "engine/header.h"
#include "graph_builder.h"
#include "ir/parameter_inputs.h"
#include "passes/passes.h"

namespace kiln {
namespace {

using testing::GraphBuilder;

// y = ReduceSum(x, axes) with axes a runtime input; z = Pad(x, pads) with pads computed from a
// runtime `extra` through arithmetic; w = Reshape(x, Shape(x)): x reaches a parameter only
// through Shape, which reads its shape alone.
ir::Graph reduce_and_pad() {
  GraphBuilder b;
  b.input("x", {2, 3, 4});
  b.input("axes", {1}, DType::kInt64);
  b.input("extra", {6}, DType::kInt64);
  b.input("big", {5000}, DType::kInt64);
  b.node("ReduceSum", {"x", "axes"}, "y", {{"keepdims", int64_t{0}}});
  b.ints("two", {2});
  b.node("Mul", {"extra", "two"}, "pads");
  b.node("Pad", {"x", "pads"}, "z");
  b.node("Shape", {"x"}, "shape");
  b.node("Reshape", {"x", "shape"}, "w");
  b.node("ReduceMax", {"x", "big"}, "m");
  for (const char* out : {"y", "z", "w", "m"}) b.output(out);
  return b.build();
}

TEST(ParameterInputs, InputsThatReachAParameterSlotAndAreSmall) {
  const ir::Graph g = reduce_and_pad();
  EXPECT_EQ(ir::parameter_inputs(g, 4096), (std::vector<std::string>{"axes", "extra"}));
  EXPECT_EQ(ir::parameter_inputs(g, 8000), (std::vector<std::string>{"axes", "extra", "big"}));
  ir::Node data;
  data.op = "ReduceSum";
  EXPECT_FALSE(ir::is_parameter_slot(data, 0));
  EXPECT_TRUE(ir::is_parameter_slot(data, 1));
}

TEST(BindInputValues, TheValuesBecomeConstantsAndTheShapesFollow) {
  ir::Graph g = reduce_and_pad();
  EXPECT_FALSE(g.value("y").type.shape && ir::all_known(*g.value("y").type.shape));
  passes::bind_input_values(g, {{"axes", Tensor::from_vector<int64_t>({1}, {-1})},
                                {"extra", Tensor::from_vector<int64_t>({6}, {0, 1, 0, 0, 2, 1})}});
  EXPECT_EQ(g.inputs, (std::vector<std::string>{"x", "big"}));
  ASSERT_TRUE(g.value("axes").constant);
  EXPECT_EQ(*g.value("y").type.shape, ir::dims_of({2, 3}));
  EXPECT_EQ(*g.value("z").type.shape, ir::dims_of({2, 9, 6}));
}

TEST(BindInputValues, WrongNamesDtypesAndShapesAreRefusedNamingTheInput) {
  auto error = [](std::map<std::string, Tensor> values) {
    ir::Graph g = reduce_and_pad();
    try {
      passes::bind_input_values(g, values);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({{"nope", Tensor::from_vector<int64_t>({1}, {0})}}).find("'nope', which is not an input"), std::string::npos);
  EXPECT_NE(error({{"axes", Tensor::from_vector<int32_t>({1}, {0})}}).find("are int32, the input is int64"), std::string::npos);
  EXPECT_NE(error({{"axes", Tensor::from_vector<int64_t>({2}, {0, 1})}}).find("have shape 2, the input has"), std::string::npos);
}

std::vector<TensorDesc> declared() {
  return {TensorDesc{"x", DType::kFloat32, {2, 3, 4}, {}}, TensorDesc{"axes", DType::kInt64, {-1}, {"n"}},
          TensorDesc{"scales", DType::kFloat32, {4}, {}}};
}

std::vector<OptimizationProfile> fixed(std::vector<int64_t> axes_shape) {
  return {{{"x", {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}}, {"axes", {axes_shape, axes_shape, axes_shape}},
           {"scales", {{4}, {4}, {4}}}}};
}

std::string resolve_error(const std::vector<OptimizationProfile>& profiles, std::map<std::string, Tensor> given) {
  try {
    compiler::resolve_input_values(declared(), profiles, given);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(ResolveInputValues, ConvertsExactlyToTheInputsDtypeAndShape) {
  const auto out = compiler::resolve_input_values(
      declared(), fixed({2}),
      {{"axes", Tensor::from_vector<double>({2}, {0, -1})}, {"scales", Tensor::from_vector<int64_t>({2, 2}, {1, 1, 2, 3})}});
  ASSERT_EQ(out.at("axes").dtype(), DType::kInt64);
  EXPECT_EQ(out.at("axes").data<int64_t>()[1], -1);
  ASSERT_EQ(out.at("scales").dtype(), DType::kFloat32);
  EXPECT_EQ(out.at("scales").shape(), (std::vector<int64_t>{4}));
  EXPECT_EQ(out.at("scales").data<float>()[3], 3.f);
}

TEST(ResolveInputValues, RefusesWhatCannotBePlannedByValue) {
  EXPECT_NE(resolve_error(fixed({2}), {{"axes", Tensor::from_vector<double>({2}, {0.5, 1})}}).find("is not a int64"),
            std::string::npos);
  EXPECT_NE(resolve_error(fixed({2}), {{"axes", Tensor::from_vector<double>({2}, {1e300, 1})}}).find("is not a int64"),
            std::string::npos);
  EXPECT_NE(resolve_error(fixed({2}), {{"axes", Tensor::from_vector<int64_t>({3}, {0, 1, 2})}}).find("3 value(s) are given"),
            std::string::npos);
  EXPECT_NE(resolve_error(fixed({2}), {{"y", Tensor::from_vector<int64_t>({1}, {0})}}).find("not an input of the model"),
            std::string::npos);
  EXPECT_NE(resolve_error(fixed({5000}), {{"axes", Tensor(DType::kInt64, {5000})}}).find("at most 4096"), std::string::npos);
  auto ranged = fixed({2});
  ranged[0]["axes"] = {{1}, {2}, {3}};
  EXPECT_NE(resolve_error(ranged, {{"axes", Tensor::from_vector<int64_t>({2}, {0, 1})}}).find("must have one fixed shape"),
            std::string::npos);
}

TEST(ResolveInputValues, TypesADoubleCannotHoldAreTakenAsTheyAre) {
  // A float8 zero point planned by value: its own dtype is kept, another is refused.
  const std::vector<TensorDesc> inputs = {TensorDesc{"zp", DType::kFloat8E4M3FN, {}, {}}};
  const std::vector<OptimizationProfile> profiles = {{{"zp", {{}, {}, {}}}}};
  const auto out = compiler::resolve_input_values(inputs, profiles, {{"zp", Tensor(DType::kFloat8E4M3FN, {})}});
  EXPECT_EQ(out.at("zp").dtype(), DType::kFloat8E4M3FN);
  try {
    compiler::resolve_input_values(inputs, profiles, {{"zp", Tensor::scalar<float>(0.f)}});
    ADD_FAILURE() << "float32 values for a float8 input were taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("give them as float8e4m3fn"), std::string::npos) << e.what();
  }
}

TEST(ResolveInputValues, TheEngineFileKeepsThemExactly) {
  engine_file::Header h;
  h.kiln_version = KILN_VERSION;
  h.backend = "cuda";
  h.device = {{"gpu", "test"}};
  h.options.input_values = {{"axes", Tensor::from_vector<int64_t>({2}, {-1, 1})},
                            {"scales", Tensor::from_vector<float>({2}, {0.1f, 3.5f})}};
  const engine_file::Header back = engine_file::header_from_json(engine_file::to_json(h), "x.engine");
  ASSERT_EQ(back.options.input_values.size(), 2u);
  EXPECT_EQ(back.options.input_values.at("axes").data<int64_t>()[0], -1);
  EXPECT_EQ(back.options.input_values.at("scales").data<float>()[0], 0.1f);
  nlohmann::json j = engine_file::to_json(h);
  j["options"]["input_values"]["axes"]["data"] = "zz";
  EXPECT_THROW(engine_file::header_from_json(j, "x.engine"), Error);
  j = engine_file::to_json(h);
  j["options"]["input_values"]["axes"]["shape"] = {int64_t{1} << 40};
  EXPECT_THROW(engine_file::header_from_json(j, "x.engine"), Error);
}

}  // namespace
}  // namespace kiln
