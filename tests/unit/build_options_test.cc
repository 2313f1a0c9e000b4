// The build options' tactic knobs (TacticOptions): how they read back from an engine file's
// header, how the developer environment sets them; and the fused ops' activation (ir::Activation).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "api/developer_environment.h"
#include "engine/header.h"
#include "ir/activation.h"
#include "kiln/error.h"

namespace kiln {
namespace {

engine_file::Header cuda_header(const BuildOptions& options) {
  engine_file::Header h;
  h.kiln_version = KILN_VERSION;
  h.backend = "cuda";
  h.device = {{"gpu", "test"}};
  h.options = options;
  return h;
}

TEST(TacticOptions, DescribeNamesOnlyWhatDiffersFromTheDefaults) {
  TacticOptions t;
  EXPECT_EQ(t.describe(), "");
  t.graph_timing = false;
  t.quantized_conv = "kernel:small-m:64/k4";
  t.int8_k_splits = 4;
  EXPECT_EQ(t.describe(), "graph_timing=0 quantized_conv=kernel:small-m:64/k4 int8_k_splits=4");
}

TEST(TacticOptions, TheEngineFileKeepsThem) {
  BuildOptions options;
  options.tactics.programmatic_launch = false;
  options.tactics.quantized_conv = "cudnn";
  options.tactics.int8_k_splits = 2;
  options.tactics.depthwise_kernel = false;
  options.tactics.generated_kernels = false;
  options.tactics.log_candidates = true;
  const engine_file::Header back = engine_file::header_from_json(engine_file::to_json(cuda_header(options)), "x.engine");
  EXPECT_TRUE(back.options.tactics == options.tactics);
  EXPECT_FALSE(back.options.tactics == TacticOptions{});
}

// Layers pinned to float32 in an fp16 build are part of what the engine is: a loaded engine plans
// new shapes with them too. An engine file written before them has none.
TEST(BuildOptionsHeader, TheEngineFileKeepsTheFloat32Layers) {
  BuildOptions options;
  options.precision = Precision::kFp16;
  options.fp32_layers = {"/layer1/conv", "/head/Gemm"};
  nlohmann::json j = engine_file::to_json(cuda_header(options));
  EXPECT_EQ(engine_file::header_from_json(j, "x.engine").options.fp32_layers, options.fp32_layers);
  j["options"].erase("fp32_layers");
  EXPECT_TRUE(engine_file::header_from_json(j, "x.engine").options.fp32_layers.empty());
}

TEST(TacticOptions, AHeaderWithoutThemMeansTheDefaults) {
  nlohmann::json j = engine_file::to_json(cuda_header(BuildOptions{}));
  j["options"].erase("tactic_options");
  EXPECT_TRUE(engine_file::header_from_json(j, "x.engine").options.tactics == TacticOptions{});
}

TEST(TacticOptions, MalformedOnesAreTheHeadersError) {
  nlohmann::json j = engine_file::to_json(cuda_header(BuildOptions{}));
  j["options"]["tactic_options"]["graph_timing"] = "yes";
  EXPECT_THROW(engine_file::header_from_json(j, "x.engine"), Error);
  j = engine_file::to_json(cuda_header(BuildOptions{}));
  j["options"]["tactic_options"]["int8_k_splits"] = 1 << 20;
  try {
    engine_file::header_from_json(j, "x.engine");
    FAIL() << "an absurd split was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find("int8_k_splits"), std::string::npos) << e.what();
  }
}

// Sets one environment variable for the test's scope.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedVariable() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(DeveloperEnvironment, EachVariableSetsItsField) {
  BuildOptions untouched;
  api::apply_developer_environment(untouched);
  EXPECT_TRUE(untouched.tactics == TacticOptions{});
  EXPECT_FALSE(untouched.poison_outputs);

  ScopedVariable pdl("KILN_PDL", "0"), timing("KILN_GRAPH_TIMING", "0"), only("KILN_INT8_CONV_TACTIC", "kernel:stream1x1:64"),
      splits("KILN_INT8_K_SPLITS", "8"), graphs("KILN_NO_CUDNN_GRAPH", "1"), gemm("KILN_NO_CONV_GEMM", "1"),
      depthwise("KILN_NO_DEPTHWISE_KERNEL", "1"), generated("KILN_NO_GENERATED_KERNELS", "1"), log("KILN_TACTIC_LOG", "1"),
      poison("KILN_POISON_OUTPUTS", "1");
  BuildOptions o;
  api::apply_developer_environment(o);
  EXPECT_FALSE(o.tactics.programmatic_launch);
  EXPECT_FALSE(o.tactics.graph_timing);
  EXPECT_EQ(o.tactics.quantized_conv, "kernel:stream1x1:64");
  EXPECT_EQ(o.tactics.int8_k_splits, 8);
  EXPECT_FALSE(o.tactics.cudnn_graphs);
  EXPECT_FALSE(o.tactics.conv_as_gemm);
  EXPECT_FALSE(o.tactics.depthwise_kernel);
  EXPECT_FALSE(o.tactics.generated_kernels);
  EXPECT_TRUE(o.tactics.log_candidates);
  EXPECT_TRUE(static_cast<bool>(o.log)) << "the candidates' lines need a log to go to";
  EXPECT_TRUE(o.poison_outputs);
}

TEST(DeveloperEnvironment, ACutlassKernelNameIsKeptWhole) {
  ScopedVariable only("KILN_INT8_CONV_TACTIC", "cutlass:64x128x128 pingpong");
  BuildOptions o;
  api::apply_developer_environment(o);
  EXPECT_EQ(o.tactics.quantized_conv, "cutlass:64x128x128 pingpong");
}

TEST(DeveloperEnvironment, AValueItCannotReadIsAnErrorNamingTheVariable) {
  for (auto [name, value] : {std::pair{"KILN_INT8_CONV_TACTIC", "fastest"}, std::pair{"KILN_INT8_K_SPLITS", "3"}}) {
    ScopedVariable v(name, value);
    BuildOptions o;
    try {
      api::apply_developer_environment(o);
      FAIL() << name << "=" << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST(Activation, EveryKindRoundTripsThroughItsAttribute) {
  using K = ir::ActivationKind;
  for (K kind : {K::kNone, K::kRelu, K::kClip, K::kSigmoid, K::kSiLU, K::kHardSwish, K::kHardSigmoid, K::kLeakyRelu,
                 K::kTanh, K::kGelu, K::kGeluTanh}) {
    ir::Node node;
    node.name = "n";
    ir::Activation{kind, 0.25f, 0.75f}.store(node);
    const ir::Activation back = ir::Activation::from_node(node);
    EXPECT_EQ(back.kind, kind) << ir::Activation::name_of(kind);
    EXPECT_EQ(back.alpha, 0.25f);
    EXPECT_EQ(back.beta, 0.75f);
  }
}

TEST(Activation, AnUnknownOneIsRefusedNamingIt) {
  ir::Node node;
  node.name = "fused";
  node.attrs.set("activation", std::string("Mish"));
  try {
    ir::Activation::from_node(node);
    FAIL() << "an unknown activation was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("Mish"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ir::Activation::named("Relu6"), Error);
}

TEST(Activation, TheDefinitions) {
  auto at = [](const char* name, float x, float alpha = 0.f, float beta = 0.f) {
    return ir::Activation::named(name, alpha, beta).apply(x);
  };
  EXPECT_EQ(at("", -3.f), -3.f);
  EXPECT_EQ(at("Relu", -3.f), 0.f);
  EXPECT_EQ(at("Relu", 2.f), 2.f);
  EXPECT_EQ(at("Clip", 5.f, -1.f, 1.f), 1.f);
  EXPECT_EQ(at("Clip", -5.f, -1.f, 1.f), -1.f);
  EXPECT_TRUE(std::isnan(at("Clip", std::numeric_limits<float>::quiet_NaN(), -1.f, 1.f))) << "Clip keeps NaN, as ONNX's";
  EXPECT_NEAR(at("Sigmoid", 0.5f), 1.f / (1.f + std::exp(-0.5f)), 1e-7f);
  EXPECT_NEAR(at("SiLU", 0.5f), 0.5f / (1.f + std::exp(-0.5f)), 1e-7f);
  EXPECT_NEAR(at("HardSwish", 1.f), 1.f * (1.f / 6.f + 0.5f), 1e-7f);
  EXPECT_NEAR(at("HardSigmoid", 1.f, 0.2f, 0.5f), 0.7f, 1e-7f);
  EXPECT_EQ(at("LeakyRelu", -2.f, 0.1f), -0.2f);
  EXPECT_NEAR(at("Tanh", 0.5f), std::tanh(0.5f), 1e-7f);
  EXPECT_NEAR(at("Gelu", 1.f), 0.8413447f, 1e-6f);
  EXPECT_NEAR(at("GeluTanh", 1.f), 0.8411920f, 1e-6f);
}

}  // namespace
}  // namespace kiln
