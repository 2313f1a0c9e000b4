// Optimization profiles as the public API resolves them (src/api/profiles.h): every input gets a
// range, fixed inputs min = opt = max, and a malformed profile is an error naming the profile,
// the input and what is wrong. No GPU needed.
#include <gtest/gtest.h>

#include "compiler/profiles.h"

namespace kiln {
namespace {

std::vector<TensorDesc> declared() {
  TensorDesc image{"image", DType::kFloat32, {-1, 3, -1, -1}, {"batch", "", "h", "w"}};
  TensorDesc mask{"mask", DType::kInt64, {-1, 16}, {"batch", ""}};
  return {image, mask};
}

std::string error_of(const BuildOptions& options) {
  try {
    compiler::resolve_profiles(declared(), options);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(ResolveProfiles, FixedShapesMakeOneProfileOfEveryInput) {
  BuildOptions options;
  options.input_shapes["image"] = {8, 3, 64, 64};
  const auto profiles = compiler::resolve_profiles(declared(), options);
  ASSERT_EQ(profiles.size(), 1u);
  EXPECT_EQ(profiles[0].at("image").min, (std::vector<int64_t>{8, 3, 64, 64}));
  EXPECT_EQ(profiles[0].at("image").max, profiles[0].at("image").min);
  EXPECT_EQ(profiles[0].at("mask").opt, (std::vector<int64_t>{1, 16}));  // dynamic dims default to 1
  const auto inputs = compiler::profile_inputs(declared(), profiles);
  EXPECT_EQ(inputs[0].shape, (std::vector<int64_t>{8, 3, 64, 64}));
  EXPECT_EQ(inputs[0].dim_names[0], "");
}

TEST(ResolveProfiles, RangesAndFixedInputsTogether) {
  BuildOptions options;
  options.input_shapes["mask"] = {4, 16};
  options.profiles.push_back({{"image", {{1, 3, 32, 32}, {4, 3, 64, 64}, {8, 3, 128, 128}}}});
  options.profiles.push_back({{"image", {{4, 3, 64, 64}, {4, 3, 64, 64}, {4, 3, 64, 64}}}});
  const auto profiles = compiler::resolve_profiles(declared(), options);
  ASSERT_EQ(profiles.size(), 2u);
  EXPECT_EQ(profiles[1].at("mask").max, (std::vector<int64_t>{4, 16}));
  const auto inputs = compiler::profile_inputs(declared(), profiles);
  EXPECT_EQ(inputs[0].shape, (std::vector<int64_t>{-1, 3, -1, -1}));  // varies in profile 0
  EXPECT_EQ(inputs[0].dim_names[0], "batch");
  EXPECT_EQ(inputs[1].shape, (std::vector<int64_t>{4, 16}));
}

TEST(ResolveProfiles, MalformedProfilesSayWhatAndWhere) {
  const ShapeRange mask{{1, 16}, {1, 16}, {1, 16}};
  auto with = [&mask](OptimizationProfile p) {
    BuildOptions o;
    if (!p.count("mask")) p["mask"] = mask;
    o.profiles = {{{"image", {{1, 3, 8, 8}, {1, 3, 8, 8}, {1, 3, 8, 8}}}, {"mask", mask}}, std::move(p)};
    return o;
  };
  EXPECT_NE(error_of(with({{"imag", {{1, 3, 8, 8}, {1, 3, 8, 8}, {1, 3, 8, 8}}}})).find(
                "optimization profile 1 names input 'imag', which the model does not have"),
            std::string::npos);
  EXPECT_NE(error_of(with({{"image", {{1, 3, 8}, {1, 3, 8, 8}, {1, 3, 8, 8}}}})).find("min shape 1x3x8 has rank 3"),
            std::string::npos);
  EXPECT_NE(error_of(with({{"image", {{1, 4, 8, 8}, {1, 4, 8, 8}, {1, 4, 8, 8}}}})).find("dimension 1 is fixed at 3"),
            std::string::npos);
  EXPECT_NE(error_of(with({{"image", {{2, 3, 8, 8}, {1, 3, 8, 8}, {4, 3, 8, 8}}}})).find(
                "profile 1, input 'image': dimension 0 needs min <= opt <= max"),
            std::string::npos);
  EXPECT_NE(error_of(with({{"image", {{0, 3, 8, 8}, {1, 3, 8, 8}, {4, 3, 8, 8}}}})).find("must be at least 1"),
            std::string::npos);
  BuildOptions both = with({{"image", {{1, 3, 8, 8}, {1, 3, 8, 8}, {4, 3, 8, 8}}}});
  both.input_shapes["image"] = {2, 3, 8, 8};
  EXPECT_NE(error_of(both).find("given both a fixed shape 2x3x8x8 and a range"), std::string::npos);
  BuildOptions unknown;
  unknown.input_shapes["label"] = {1};
  EXPECT_NE(error_of(unknown).find("no input named 'label'"), std::string::npos);
}

TEST(ResolveProfiles, AProfileGivesEveryDynamicInputARange) {
  // `--min-shapes ids:1x16 --min-shapes mask:1x16` is two profiles of one input each: the left-out
  // input is an error naming it, not a range of 1s the engine then builds and runs.
  BuildOptions options;
  options.profiles.push_back({{"image", {{1, 3, 8, 8}, {2, 3, 8, 8}, {4, 3, 8, 8}}}});
  const std::string error = error_of(options);
  EXPECT_NE(error.find("optimization profile 0, input 'mask': no shape range given for this dynamic input (batch x 16)"),
            std::string::npos)
      << error;
  // A fixed shape covers it.
  options.input_shapes["mask"] = {2, 16};
  EXPECT_EQ(compiler::resolve_profiles(declared(), options)[0].at("mask").max, (std::vector<int64_t>{2, 16}));
  // So does a model that fixes every dimension of the input.
  std::vector<TensorDesc> model = declared();
  model[1].shape = {4, 16};
  options.input_shapes.clear();
  EXPECT_EQ(compiler::resolve_profiles(model, options)[0].at("mask").min, (std::vector<int64_t>{4, 16}));
}

TEST(ResolveProfiles, AnEmptyDimensionIsAllowedWhereTheModelDeclaresIt) {
  // onnx's node tests feed empty inputs such as CastLike's 'like' (declared 0): refusing them
  // failed 73 GPU conformance cases (docs/design/dynamic-shapes.md, "Design").
  std::vector<TensorDesc> model = {TensorDesc{"like", DType::kFloat16, {0}, {""}},
                                   TensorDesc{"data", DType::kFloat32, {2, 0, -1}, {"", "", "n"}}};
  BuildOptions options;
  options.input_shapes["like"] = {0};
  options.input_shapes["data"] = {2, 0, 4};
  const auto profiles = compiler::resolve_profiles(model, options);
  EXPECT_EQ(profiles[0].at("like").opt, (std::vector<int64_t>{0}));
  EXPECT_EQ(profiles[0].at("data").max, (std::vector<int64_t>{2, 0, 4}));
  BuildOptions ranged;
  ranged.profiles.push_back({{"data", {{2, 0, 1}, {2, 0, 4}, {2, 0, 8}}}});
  EXPECT_EQ(compiler::resolve_profiles(model, ranged)[0].at("data").min, (std::vector<int64_t>{2, 0, 1}));
  // A 0 where the model's dimension is dynamic is still refused, fixed or as a range.
  BuildOptions dynamic_zero;
  dynamic_zero.input_shapes["data"] = {2, 0, 0};
  EXPECT_THROW(compiler::resolve_profiles(model, dynamic_zero), Error);
  BuildOptions range_zero;
  range_zero.profiles.push_back({{"data", {{2, 0, 0}, {2, 0, 4}, {2, 0, 8}}}});
  EXPECT_THROW(compiler::resolve_profiles(model, range_zero), Error);
}

}  // namespace
}  // namespace kiln
