// What the fuzzers found (fuzz/, docs/design/fuzzing.md), one test each with a small model that
// shows it. Their inputs are kept as seeds in fuzz/seeds/ too (<name>.onnx for
// fuzz_onnx_import, <name>.graph for fuzz_graph). Many of these failures are undefined
// behaviour that only a sanitizer build sees: the fuzz build also runs this file under ASan
// and UBSan (fuzz_regression_tests, CTest label "fuzz").
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu/engine.h"
#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln {
namespace {

using testing::GraphBuilder;

// One node of `op` on constant inputs, run by the CPU engine.
Tensor run_node(const std::string& op, const std::vector<Tensor>& inputs,
                std::vector<std::pair<std::string, ir::AttrValue>> attrs = {}) {
  GraphBuilder b;
  std::vector<std::string> names;
  for (size_t i = 0; i < inputs.size(); ++i) names.push_back(b.constant("in" + std::to_string(i), inputs[i]));
  b.node(op, names, "y", std::move(attrs));
  b.output("y");
  cpu::CpuEngine engine(b.build());
  return engine.run({}).at("y");
}

template <class T>
T first(const Tensor& t) { return t.data<T>()[0]; }

// fuzz_graph: GatherND with batch_dims 1 over a [0, 1] input divided the tuple count by the
// batch count, 0 (SIGFPE).
TEST(FuzzRegression, GatherNdWithAnEmptyBatchGathersNothing) {
  GraphBuilder b;
  b.input("x", {0, 1});
  b.constant("i", Tensor(DType::kInt64, {0, 1}));
  b.node("GatherND", {"x", "i"}, "y", {{"batch_dims", int64_t{1}}});
  b.output("y");
  cpu::CpuEngine engine(b.build());
  Tensor y = engine.run({{"x", Tensor(DType::kFloat32, {0, 1})}}).at("y");
  EXPECT_EQ(y.shape(), std::vector<int64_t>{0});
}

// fuzz_graph: OneHot of Sqrt(-1.5) converted the NaN index to int64 (undefined; UBSan). An
// index outside the depth, NaN and huge floats included, sets no element.
TEST(FuzzRegression, OneHotOfNanOrHugeFloatIndicesIsAllOff) {
  GraphBuilder b;
  b.input("x", {5});
  b.constant("depth", Tensor::scalar<int64_t>(3));
  b.constant("values", Tensor::from_vector<float>({2}, {0.f, 1.f}));
  b.node("OneHot", {"x", "depth", "values"}, "y");
  b.output("y");
  cpu::CpuEngine engine(b.build());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector<float>({5}, {nan, 1e30f, -1e30f, -3.5f, 2.9f});
  Tensor y = engine.run({{"x", x}}).at("y");
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{5, 3}));
  // -3.5 truncates to -3, which counts from the end: 0; 2.9 truncates to 2.
  const std::vector<float> want = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y.data<float>()[i], want[i]) << "element " << i;
}

// Found while writing IntegerArithmeticWrapsAround: Add and Mul of small int64 constants propagate their elements as
// dims (shape arithmetic), and INT64_MAX + 2 overflowed there (UBSan), while 2^62 * 4 wrapped
// to a known dim of 0. A sum or product past int64 is no dim.
TEST(FuzzRegression, SymbolicArithmeticPastInt64IsNoDim) {
  for (const char* op : {"Add", "Mul"}) {
    GraphBuilder b;
    b.ints("a", {std::numeric_limits<int64_t>::max(), int64_t{1} << 62, 5});
    b.ints("b", {2, 4, 2});
    b.node(op, {"a", "b"}, "y");
    b.output("y");
    ir::Graph g = b.build();
    const std::optional<ir::Dims>& v = g.value("y").symbolic_value;
    const bool add = std::string(op) == "Add";
    ASSERT_TRUE(v.has_value()) << op;
    EXPECT_FALSE((*v)[0].known()) << op << " gives " << (*v)[0].str();
    EXPECT_EQ((*v)[1].known(), add) << op << " gives " << (*v)[1].str();  // 2^62 * 4 is 2^64
    EXPECT_EQ((*v)[2], ir::Dim(add ? 7 : 10)) << op;
  }
}

// fuzz_graph: Mul of two uint16 constants 65533 (folded at build time) multiplied them as int,
// which overflows (UBSan). Integer Add, Sub, Mul, PRelu, Sum, Neg, Abs, CumSum and the scatters'
// add and mul reductions wrap around in two's complement, as NumPy and ONNX Runtime compute them.
TEST(FuzzRegression, IntegerArithmeticWrapsAround) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  auto u16 = [](uint16_t v) { return Tensor::from_vector<uint16_t>({1}, {v}); };
  auto i64 = [](std::vector<int64_t> v) { return Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v); };
  auto i32 = [](int32_t v) { return Tensor::from_vector<int32_t>({1}, {v}); };
  EXPECT_EQ(first<uint16_t>(run_node("Mul", {u16(65533), u16(65533)})), 9);  // (-3)^2 mod 2^16
  EXPECT_EQ(first<int64_t>(run_node("Add", {i64({kMax}), i64({1})})), kMin);
  EXPECT_EQ(first<int64_t>(run_node("Sub", {i64({kMin}), i64({1})})), kMax);
  EXPECT_EQ(first<int32_t>(run_node("Mul", {i32(std::numeric_limits<int32_t>::max()), i32(2)})), -2);
  EXPECT_EQ(first<int64_t>(run_node("PRelu", {i64({kMin}), i64({2})})), 0);
  EXPECT_EQ(first<int64_t>(run_node("Sum", {i64({kMax}), i64({kMax}), i64({2})})), 0);
  EXPECT_EQ(first<int64_t>(run_node("Neg", {i64({kMin})})), kMin);
  EXPECT_EQ(first<int32_t>(run_node("Abs", {i32(std::numeric_limits<int32_t>::min())})), std::numeric_limits<int32_t>::min());
  Tensor c = run_node("CumSum", {i64({kMax, 1}), Tensor::scalar<int64_t>(0)});
  EXPECT_EQ(c.data<int64_t>()[1], kMin);
  // The scatters' add and mul reductions.
  Tensor zero = Tensor::from_vector<int64_t>({1}, {0});
  EXPECT_EQ(first<int64_t>(run_node("ScatterElements", {i64({kMin}), zero, i64({-3})}, {{"reduction", std::string("add")}})),
            kMax - 2);
  EXPECT_EQ(first<int64_t>(run_node("ScatterND", {i64({kMax}), Tensor::from_vector<int64_t>({1, 1}, {0}), i64({2})},
                                    {{"reduction", std::string("mul")}})),
            -2);
}

// fuzz_graph: EyeLike with k = INT64_MAX - 1 computed the diagonal's column r + k, which
// overflows. A k outside the matrix gives zeros; one inside it the shifted diagonal.
TEST(FuzzRegression, EyeLikeOfAnyKStaysInItsMatrix) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  Tensor shape = Tensor::from_vector<float>({2, 3}, {0, 0, 0, 0, 0, 0});
  for (int64_t k : {kMax - 1, kMax, kMin, int64_t{3}, int64_t{-2}}) {
    Tensor y = run_node("EyeLike", {shape}, {{"k", k}});
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(y.data<float>()[i], 0.f) << "k=" << k << " element " << i;
  }
  Tensor shifted = run_node("EyeLike", {shape}, {{"k", int64_t{1}}});
  EXPECT_EQ(std::vector<float>(shifted.data<float>(), shifted.data<float>() + 6), (std::vector<float>{0, 1, 0, 0, 0, 1}));
  Tensor below = run_node("EyeLike", {shape}, {{"k", int64_t{-1}}});
  EXPECT_EQ(std::vector<float>(below.data<float>(), below.data<float>() + 6), (std::vector<float>{0, 0, 0, 1, 0, 0}));
}

// fuzz_graph: Slice with a step of INT64_MAX over an axis it takes one element of multiplied
// the axis's stride by the step, which overflowed (the kernel never steps there); the length's
// ceil division added the step to the span, and negated INT64_MIN.
TEST(FuzzRegression, SliceOfOneElementIgnoresAHugeStep) {
  std::vector<float> values(30);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  auto i64 = [](int64_t v) { return Tensor::from_vector<int64_t>({1}, {v}); };
  Tensor y = run_node("Slice", {Tensor::from_vector<float>({2, 15}, values), i64(1), i64(2), i64(0),
                                i64(std::numeric_limits<int64_t>::max())});
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{1, 15}));
  for (int64_t c = 0; c < 15; ++c) EXPECT_EQ(y.data<float>()[c], static_cast<float>(15 + c));
  // Backwards by INT64_MIN, whose negation overflows: still the one row.
  Tensor back = run_node("Slice", {Tensor::from_vector<float>({2, 15}, values), i64(1), i64(0), i64(0),
                                   i64(std::numeric_limits<int64_t>::min())});
  ASSERT_EQ(back.shape(), (std::vector<int64_t>{1, 15}));
  EXPECT_EQ(back.data<float>()[0], 15.0f);
}

// fuzz_graph: a float Range whose limit lies behind its start by far more than int64 holds
// ((limit - start) / delta = -1e30) converted the negative length to int64 (UBSan). Such a
// range is empty, as one running the wrong way by a little is.
TEST(FuzzRegression, FloatRangeRunningAwayFromItsLimitIsEmpty) {
  auto f32 = [](float v) { return Tensor::from_vector<float>({}, {v}); };
  EXPECT_EQ(run_node("Range", {f32(0.f), f32(-1e30f), f32(1.f)}).numel(), 0);
  EXPECT_EQ(run_node("Range", {f32(0.f), f32(-2.f), f32(1.f)}).numel(), 0);
  EXPECT_EQ(run_node("Range", {f32(0.f), f32(3.f), f32(1.f)}).numel(), 3);
}

// fuzz smoke (seed 11): ReduceL1 of an empty [2^32, 1, 0] tensor enumerated the offsets of the
// reduced dims one dim at a time and reserved 2^32 of them before reaching the 0 (bad_alloc).
// Every output of a reduction over an empty input is the reduction's identity.
TEST(FuzzRegression, ReductionsOfAHugeEmptyTensorGiveTheirIdentity) {
  Tensor empty(DType::kFloat32, {int64_t{1} << 32, 1, 0});
  const std::vector<int64_t> all = {0, 1, 2};
  EXPECT_EQ(first<float>(run_node("ReduceL1", {empty}, {{"axes", all}})), 0.f);
  EXPECT_EQ(first<float>(run_node("ReduceProd", {empty}, {{"axes", all}})), 1.f);
  EXPECT_EQ(first<float>(run_node("ReduceMax", {empty}, {{"axes", all}})), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(first<float>(run_node("ReduceSum", {empty, Tensor::from_vector<int64_t>({3}, all)})), 0.f);
}

// What building `b` (import's shape inference) refuses with, or "" if it does not.
std::string refusal(GraphBuilder& b) {
  try {
    b.build();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel) << e.what();
    return e.what();
  }
  return "";
}

// fuzz_graph: Tile's output dim, input dim times repeats, overflowed int64 (UBSan); [4] tiled
// 2^62 times wrapped to a dim of 0. It is refused, naming the node and the axis.
TEST(FuzzRegression, TileRepeatsPastInt64AreRefused) {
  GraphBuilder b;
  b.input("x", {4});
  b.ints("r", {int64_t{1} << 62});
  b.node("Tile", {"x", "r"}, "y");
  b.output("y");
  const std::string why = refusal(b);
  EXPECT_NE(why.find("'y_node' (Tile)"), std::string::npos) << why;
  EXPECT_NE(why.find("axis 0: the tiled axis overflows"), std::string::npos) << why;
}

// fuzz_graph: Split's sizes were summed in int64 (UBSan) to compare with the axis. A sum past
// int64 is refused as such.
TEST(FuzzRegression, SplitSizesPastInt64AreRefused) {
  GraphBuilder b;
  b.input("x", {2});
  b.ints("s", {std::numeric_limits<int64_t>::max(), 3});
  b.node("Split", {"x", "s"}, "y0", {{"axis", int64_t{0}}});
  b.last().outputs.push_back("y1");
  b.output("y0");
  const std::string why = refusal(b);
  EXPECT_NE(why.find("the sum of the split sizes overflows"), std::string::npos) << why;
}

// fuzz_graph: Resize by sizes with keep_aspect_ratio_policy not_smaller scales every axis by the
// largest ratio; INT64_MAX / 2 times 2 was converted from double to int64 out of range (UBSan).
TEST(FuzzRegression, ResizeSizesPastInt64AreRefused) {
  GraphBuilder b;
  b.input("x", {1, 1, 2, 2});
  b.ints("sizes", {1, 1, std::numeric_limits<int64_t>::max(), 2});
  b.node("Resize", {"x", "", "", "sizes"}, "y", {{"keep_aspect_ratio_policy", std::string("not_smaller")}});
  b.output("y");
  const std::string why = refusal(b);
  EXPECT_NE(why.find("keep_aspect_ratio_policy not_smaller make axis 0 too large"), std::string::npos) << why;
}

// fuzz_graph: MaxPool's dilated kernel, (kernel - 1) * dilation + 1, overflowed int64 (UBSan) for
// a dilation near INT64_MAX; in a plain build it wrapped to -3 and made an output of 8 from 4.
// Windows, steps and pads past the largest tensor dim are refused where they are read.
TEST(FuzzRegression, PoolWindowsPastTheLargestDimAreRefused) {
  GraphBuilder b;
  b.input("x", {1, 1, 4});
  b.node("MaxPool", {"x"}, "y",
         {{"kernel_shape", std::vector<int64_t>{3}}, {"dilations", std::vector<int64_t>{std::numeric_limits<int64_t>::max() - 1}}});
  b.output("y");
  const std::string why = refusal(b);
  EXPECT_NE(why.find("exceed the largest tensor dim"), std::string::npos) << why;
  // fuzz_graph, later: a kernel of 1 made any dilation pass the window's check, and the CPU
  // kernel's ceil division of LpPool overflowed with a dilation of INT64_MAX. Dilations are
  // bounded as strides and pads are.
  GraphBuilder lp;
  lp.input("x", {1, 1, 4});
  lp.node("LpPool", {"x"}, "y",
          {{"kernel_shape", std::vector<int64_t>{1}}, {"dilations", std::vector<int64_t>{std::numeric_limits<int64_t>::max()}}});
  lp.output("y");
  const std::string lp_why = refusal(lp);
  EXPECT_NE(lp_why.find("exceed the largest tensor dim"), std::string::npos) << lp_why;
}

// Found by review after the pooling finding, the same arithmetic: Conv's padded input (pads near
// INT64_MAX), dilated kernel and SAME padding, and ConvTranspose's stride * input overflowed
// int64 (UBSan). Attribute values past the largest tensor dim, and a ConvTranspose output past
// it, are refused where conv_geometry reads them.
TEST(FuzzRegression, ConvGeometryPastTheLargestDimIsRefused) {
  const int64_t big = int64_t{1} << 62;
  struct Case {
    const char* op;
    std::vector<std::pair<std::string, ir::AttrValue>> attrs;
    const char* says;
  };
  const Case cases[] = {
      {"Conv", {{"pads", std::vector<int64_t>{big, 0}}}, "'pads' = [4611686018427387904, 0] has a value above the largest tensor dim"},
      {"Conv", {{"dilations", std::vector<int64_t>{big}}}, "'dilations' = [4611686018427387904] has a value above"},
      {"Conv", {{"dilations", std::vector<int64_t>{(int64_t{1} << 35) + 1}}, {"kernel_shape", std::vector<int64_t>{3}}},
       "kernel [3] with dilations [34359738369] is larger than the largest tensor dim"},
      {"Conv", {{"strides", std::vector<int64_t>{big}}, {"auto_pad", std::string("SAME_UPPER")}}, "'strides' = [4611686018427387904]"},
      {"ConvTranspose", {{"strides", std::vector<int64_t>{int64_t{1} << 35}}},
       "stride 34359738368 makes the output larger than the largest tensor dim"},
      // fuzz_graph, after the fix above: an output_shape of INT64_MIN overflowed SAME padding.
      {"ConvTranspose", {{"output_shape", std::vector<int64_t>{std::numeric_limits<int64_t>::min()}}, {"auto_pad", std::string("SAME_UPPER")}},
       "has a size below 1 or above the largest tensor dim"},
  };
  for (const Case& c : cases) {
    GraphBuilder b;
    b.input("x", {1, 1, 4});
    b.constant("w", Tensor(DType::kFloat32, {1, 1, 3}));
    b.node(c.op, {"x", "w"}, "y", c.attrs);
    b.output("y");
    const std::string why = refusal(b);
    EXPECT_NE(why.find(c.says), std::string::npos) << c.op << ": " << why;
  }
}

// fuzz_graph: a 1x1 Conv with stride 1 and pads [0, 1] took the CPU kernel's direct path (X
// itself as the matrix product's operand), which checked only the begin pads: the output, one
// wider than X, was packed from past X's end (ASan: heap-buffer-overflow).
TEST(FuzzRegression, PointwiseConvWithEndPadsReadsOnlyItsInput) {
  GraphBuilder b;
  b.input("x", {1, 2, 4});
  b.constant("w", Tensor::from_vector<float>({1, 2, 1}, {1.f, 2.f}));
  b.node("Conv", {"x", "w"}, "y", {{"pads", std::vector<int64_t>{0, 1}}});
  b.output("y");
  cpu::CpuEngine engine(b.build());
  Tensor x = Tensor::from_vector<float>({1, 2, 4}, {1, 2, 3, 4, 10, 20, 30, 40});
  Tensor y = engine.run({{"x", x}}).at("y");
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{1, 1, 5}));
  const std::vector<float> want = {21, 42, 63, 84, 0};  // x0 + 2 x1; the end pad gives 0
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y.data<float>()[i], want[i]) << "element " << i;
}

// fuzz_graph: variadic Min folds its inputs pairwise into an output of the broadcast shape of all
// of them; two inputs of one shape smaller than that took the equal-shapes loop, which ran over
// the output's elements and read both past their end (ASan: heap-buffer-overflow).
TEST(FuzzRegression, VariadicOpsBroadcastEqualShapedInputsToTheOutput) {
  GraphBuilder b;
  b.input("x", {2, 3});
  b.constant("a", Tensor::from_vector<float>({1, 1}, {5.f}));
  b.constant("c", Tensor::from_vector<float>({1, 1}, {4.f}));
  b.node("Min", {"a", "c", "x"}, "y");
  b.output("y");
  cpu::CpuEngine engine(b.build());
  Tensor y = engine.run({{"x", Tensor::from_vector<float>({2, 3}, {1, 9, 3, 9, 5, 2})}}).at("y");
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{2, 3}));
  const std::vector<float> want = {1, 4, 3, 4, 4, 2};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y.data<float>()[i], want[i]) << "element " << i;
}

// fuzz_graph: DepthToSpace and SpaceToDepth multiplied dims by the block size in int64. The case
// it found had a 2^62 dim that import now refuses, but SpaceToDepth's channels times blocksize^2
// is reachable: 2^36 bool channels (64 GiB, the largest tensor) times 2^40 overflowed (UBSan).
TEST(FuzzRegression, SpaceToDepthChannelsPastInt64AreRefused) {
  GraphBuilder b;
  b.input("x", {1, int64_t{1} << 36, 1, 1}, DType::kBool);
  b.node("SpaceToDepth", {"x"}, "y", {{"blocksize", int64_t{1} << 20}});
  b.output("y");
  const std::string why = refusal(b);
  EXPECT_NE(why.find("a dim times the block overflows"), std::string::npos) << why;
}

// fuzz_graph: Resize with tf_crop_and_resize and a roi starting at -inf made every source
// coordinate NaN (-inf + inf), which the nearest tap converted to int64 (UBSan). A NaN
// coordinate is outside the crop: the output is the extrapolation value.
TEST(FuzzRegression, ResizeOfNanCoordinatesIsOutsideTheCrop) {
  const float inf = std::numeric_limits<float>::infinity();
  GraphBuilder b;
  b.input("x", {2, 1});
  b.constant("roi", Tensor::from_vector<float>({4}, {-inf, 1, 1, 1}));
  b.constant("scales", Tensor::from_vector<float>({2}, {3, 1}));
  b.node("Resize", {"x", "roi", "scales"}, "y",
         {{"coordinate_transformation_mode", std::string("tf_crop_and_resize")}, {"extrapolation_value", 0.5f}});
  b.output("y");
  cpu::CpuEngine engine(b.build());
  Tensor y = engine.run({{"x", Tensor::from_vector<float>({2, 1}, {1, 2})}}).at("y");
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{6, 1}));
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.data<float>()[i], 0.5f) << "element " << i;
}

// fuzz_graph: Resize to an empty output [0, 2^31] built interpolation taps for each of the 2^31
// positions of the second axis, 120 GB (ASan: allocator out of memory; a std::bad_alloc in a
// plain build). An empty output needs nothing computed.
TEST(FuzzRegression, ResizeToAnEmptyOutputAllocatesNothing) {
  GraphBuilder b;
  b.input("x", {0, 2});
  b.constant("scales", Tensor::from_vector<float>({2}, {1.f, static_cast<float>(int64_t{1} << 30)}));
  b.node("Resize", {"x", "", "scales"}, "y");
  b.output("y");
  cpu::CpuEngine engine(b.build());
  Tensor y = engine.run({{"x", Tensor(DType::kFloat32, {0, 2})}}).at("y");
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{0, int64_t{1} << 31}));
}

// fuzz_graph: GridSample converted grid positions to int64 where they had no value: NaN, inf and
// 1e38 grid values in the CPU kernel, and the reflection count of a huge position (UBSan); in a
// plain build a huge position under reflection left the reflection's range and indexed past X.
// A NaN position reads as outside, huge ones as far outside, reflected or clamped by the padding.
TEST(FuzzRegression, GridSampleOfNanOrHugePositionsReadsOnlyX) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const char* padding : {"zeros", "border", "reflection"}) {
    GraphBuilder b;
    b.input("x", {1, 1, 1, 4});
    // Points (x, y): NaN, +inf, 1e30 and -1e38 along the row of 4.
    b.constant("grid", Tensor::from_vector<float>({1, 1, 4, 2}, {nan, 0, inf, 0, 1e30f, 0, -1e38f, 0}));
    b.node("GridSample", {"x", "grid"}, "y", {{"padding_mode", std::string(padding)}});
    b.output("y");
    cpu::CpuEngine engine(b.build());
    Tensor y = engine.run({{"x", Tensor::from_vector<float>({1, 1, 1, 4}, {1, 2, 3, 4})}}).at("y");
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{1, 1, 1, 4}));
    for (int64_t i = 0; i < 4; ++i) {
      const float v = y.data<float>()[i];
      if (std::string(padding) == "zeros") EXPECT_EQ(v, 0.f) << padding << " point " << i;
      else EXPECT_TRUE(v >= 1.f && v <= 4.f) << padding << " point " << i << " gives " << v;
    }
  }
}

// fuzz_graph: fold_attention_views described an empty tensor ([2, 0, 8]) as one mode of size 0
// and divided by it when the Reshape to heads split that mode (SIGFPE). Views of empty tensors
// are not folded; the attention runs as it is, on empty Q, K and V. With heads of size 0 the CPU
// kernel copied 0 bytes to a null cache row (undefined; UBSan).
TEST(FuzzRegression, AttentionOverEmptyHeadsIsNotFolded) {
  for (const auto& [in, heads] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{2, 0, 8}, {2, 0, 2, 4}}, {{2, 3, 0}, {2, 3, 2, 0}}}) {
    GraphBuilder b;
    b.input("x", ir::dims_of(in));
    b.node("Reshape", {"x", b.ints("heads", heads)}, "split", {{"allowzero", int64_t{1}}});
    b.node("Transpose", {"split"}, "q", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
    b.node("Attention", {"q", "q", "q"}, "y");
    b.output("y");
    ir::Graph g = b.build();
    EXPECT_EQ(passes::fold_attention_views(g), 0);
    cpu::CpuEngine engine(b.build());
    Tensor y = engine.run({{"x", Tensor(DType::kFloat32, in)}}).at("y");
    EXPECT_EQ(y.shape(), (std::vector<int64_t>{heads[0], heads[2], heads[1], heads[3]}));
  }
}

// The fuzz smoke test (seeds 5 and 7) and MeanVarianceNormalization's first version: an axis
// of a scalar input. normalize_axis accepts axis 0 for rank 0 (ops that add an axis need it);
// Compress and MeanVarianceNormalization then indexed the scalar's empty dims.
TEST(FuzzRegression, AnAxisOfAScalarIsRefused) {
  for (const auto& [op, extra] : std::vector<std::pair<std::string, bool>>{{"Compress", true}, {"MeanVarianceNormalization", false}}) {
    GraphBuilder b;
    b.input("x", {});
    std::vector<std::string> inputs = {"x"};
    if (extra) inputs.push_back(b.constant("c", Tensor::from_vector<bool>({1}, {true})));
    b.node(op, inputs, "y", {{"axis", int64_t{0}}, {"axes", std::vector<int64_t>{0}}});
    b.output("y");
    const std::string why = refusal(b);
    EXPECT_NE(why.find("scalar"), std::string::npos) << op << ": " << why;
  }
}

}  // namespace
}  // namespace kiln
