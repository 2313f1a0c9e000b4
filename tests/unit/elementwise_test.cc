// Broadcasting binary ops, Where, Cast, Clip, Softmax and normalization against naive
// references; symbolic shape arithmetic; importer rewrites of old opsets.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/sgemm.h"
#include "elementwise_util.h"
#include "onnx/importer.h"

namespace kiln {
namespace {

using ew_test::In;
using ew_test::make_node;
using ew_test::run_node;

// Add and Mul over a broadcast pair, checked element by element against numpy's rule.
void check_broadcast(const std::string& op, std::vector<int64_t> sa, std::vector<int64_t> sb, uint32_t seed) {
  Tensor a = ew_test::random_floats(sa, seed), b = ew_test::random_floats(sb, seed + 1);
  Tensor y = run_node(make_node(op), {{a}, {b}})[0];
  std::vector<int64_t> out = y.shape();
  for (int64_t i = 0; i < y.numel(); ++i) {
    std::vector<int64_t> idx = ew_test::unravel(i, out);
    float va = a.data<float>()[ew_test::broadcast_index(idx, sa)];
    float vb = b.data<float>()[ew_test::broadcast_index(idx, sb)];
    float want = op == "Add" ? va + vb : op == "Sub" ? va - vb : va * vb;
    ASSERT_FLOAT_EQ(y.data<float>()[i], want) << op << " element " << i;
  }
}

TEST(Elementwise, BroadcastMatchesNumpyRule) {
  check_broadcast("Add", {2, 3, 4, 5}, {3, 1, 5}, 1);
  check_broadcast("Mul", {2, 8, 3, 3}, {2, 8, 1, 1}, 2);  // SE block
  check_broadcast("Sub", {4, 1, 6}, {1, 5, 1}, 3);         // both sides broadcast
  check_broadcast("Add", {2, 3}, {}, 4);                   // scalar
  check_broadcast("Mul", {}, {7}, 5);
  check_broadcast("Add", {300, 300}, {300, 300}, 6);       // equal shapes, parallel path
  check_broadcast("Mul", {1, 1, 1}, {1}, 7);
}

TEST(Elementwise, BroadcastShapeAndErrors) {
  ir::Graph g = ew_test::one_node_graph(make_node("Add"), {{Tensor(DType::kFloat32, {5, 1, 3})}, {Tensor(DType::kFloat32, {4, 1})}});
  EXPECT_EQ(ir::known_values(*g.value("y0").type.shape), (std::vector<int64_t>{5, 4, 3}));
  try {
    ew_test::one_node_graph(make_node("Add"), {{Tensor(DType::kFloat32, {2, 3})}, {Tensor(DType::kFloat32, {4})}});
    FAIL() << "incompatible shapes accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_EQ(e.node_name(), "n0");
    EXPECT_NE(std::string(e.what()).find("broadcast"), std::string::npos);
  }
  EXPECT_THROW(ew_test::one_node_graph(make_node("Add"), {{Tensor(DType::kFloat32, {2})}, {Tensor(DType::kInt64, {2})}}), Error);
}

TEST(Elementwise, IntegerDivTruncatesAndRefusesZero) {
  Tensor a = Tensor::from_vector<int64_t>({4}, {-7, 7, -7, INT64_MIN});
  Tensor b = Tensor::from_vector<int64_t>({4}, {2, -2, -2, -1});
  Tensor y = run_node(make_node("Div"), {{a}, {b}})[0];
  EXPECT_EQ(y.to_int_vector(), (std::vector<int64_t>{-3, -3, 3, INT64_MIN}));  // wraps, no crash
  Tensor zero = Tensor::from_vector<int32_t>({2}, {1, 0});
  Tensor x = Tensor::from_vector<int32_t>({2}, {5, 6});
  try {
    run_node(make_node("Div"), {{x}, {zero}});
    FAIL() << "integer division by zero accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(e.node_name(), "n0");
  }
}

TEST(Elementwise, ModFollowsDivisorOrDividendSign) {
  Tensor a = Tensor::from_vector<int32_t>({4}, {-7, 7, -7, 7});
  Tensor b = Tensor::from_vector<int32_t>({4}, {3, -3, -3, 3});
  EXPECT_EQ(run_node(make_node("Mod"), {{a}, {b}})[0].to_int_vector(), (std::vector<int64_t>{2, -2, -1, 1}));
  ir::Node c_style = make_node("Mod");
  c_style.attrs.set("fmod", int64_t{1});
  EXPECT_EQ(run_node(c_style, {{a}, {b}})[0].to_int_vector(), (std::vector<int64_t>{-1, 1, -1, 1}));
}

TEST(Elementwise, ComparisonsLogicAndVariadic) {
  Tensor a = Tensor::from_vector<float>({3}, {1, 2, 3});
  Tensor b = Tensor::from_vector<float>({1}, {2});
  EXPECT_EQ(run_node(make_node("Less"), {{a}, {b}})[0].to_int_vector(), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(run_node(make_node("GreaterOrEqual"), {{a}, {b}})[0].to_int_vector(), (std::vector<int64_t>{0, 1, 1}));
  Tensor p = Tensor::from_vector<bool>({4}, {true, true, false, false});
  Tensor q = Tensor::from_vector<bool>({4}, {true, false, true, false});
  EXPECT_EQ(run_node(make_node("Xor"), {{p}, {q}})[0].to_int_vector(), (std::vector<int64_t>{0, 1, 1, 0}));
  Tensor c = Tensor::from_vector<float>({2, 1}, {10, -10});
  Tensor mx = run_node(make_node("Max"), {{a}, {b}, {c}})[0];
  ew_test::expect_close(mx, {10, 10, 10, 2, 2, 3});
  Tensor mean = run_node(make_node("Mean"), {{a}, {b}, {c}})[0];
  ew_test::expect_close(mean, {13.f / 3, 14.f / 3, 15.f / 3, -7.f / 3, -6.f / 3, -5.f / 3});
  ew_test::expect_close(run_node(make_node("Sum"), {{a}})[0], {1, 2, 3});
}

TEST(Elementwise, PReluPowAndBitShift) {
  Tensor x = Tensor::from_vector<float>({2, 2}, {-1, 2, -3, 4});
  Tensor slope = Tensor::from_vector<float>({2}, {0.5f, 0.25f});
  ew_test::expect_close(run_node(make_node("PRelu"), {{x}, {slope, true}})[0], {-0.5f, 2, -1.5f, 4});
  Tensor e = Tensor::from_vector<int64_t>({1}, {2});
  ew_test::expect_close(run_node(make_node("Pow"), {{x}, {e}})[0], {1, 4, 9, 16});
  ir::Node shift = make_node("BitShift");
  shift.attrs.set("direction", std::string("LEFT"));
  Tensor u = Tensor::from_vector<uint32_t>({3}, {1, 3, 1});
  Tensor s = Tensor::from_vector<uint32_t>({3}, {4, 1, 40});
  EXPECT_EQ(run_node(shift, {{u}, {s}})[0].to_int_vector(), (std::vector<int64_t>{16, 6, 0}));
}

TEST(Elementwise, WhereBroadcastsThreeWays) {
  Tensor cond = Tensor::from_vector<bool>({2, 1}, {true, false});
  Tensor x = Tensor::from_vector<int64_t>({3}, {1, 2, 3});
  Tensor y = Tensor::from_vector<int64_t>({}, {-1});
  Tensor z = run_node(make_node("Where"), {{cond}, {x}, {y}})[0];
  EXPECT_EQ(z.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(z.to_int_vector(), (std::vector<int64_t>{1, 2, 3, -1, -1, -1}));
}

TEST(Elementwise, CastTruncatesAndConverts) {
  Tensor x = Tensor::from_vector<float>({5}, {1.9f, -1.9f, 0.f, 2.5f, -0.2f});
  ir::Node to_int = make_node("Cast");
  to_int.attrs.set("to", int64_t{static_cast<int64_t>(DType::kInt32)});
  EXPECT_EQ(run_node(to_int, {{x}})[0].to_int_vector(), (std::vector<int64_t>{1, -1, 0, 2, 0}));
  ir::Node to_bool = make_node("Cast");
  to_bool.attrs.set("to", int64_t{static_cast<int64_t>(DType::kBool)});
  EXPECT_EQ(run_node(to_bool, {{x}})[0].to_int_vector(), (std::vector<int64_t>{1, 1, 0, 1, 1}));
  ir::Node to_half = make_node("Cast");
  to_half.attrs.set("to", int64_t{static_cast<int64_t>(DType::kFloat16)});
  Tensor h = run_node(to_half, {{x}})[0];
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_FLOAT_EQ(half_to_float(static_cast<const uint16_t*>(h.raw())[3]), 2.5f);
  Tensor like = Tensor::from_vector<int64_t>({1}, {0});
  EXPECT_EQ(run_node(make_node("CastLike"), {{x}, {like}})[0].dtype(), DType::kInt64);
}

TEST(Elementwise, ClipWithOptionalBounds) {
  Tensor x = Tensor::from_vector<float>({4}, {-2, -0.5f, 0.5f, 8});
  ew_test::expect_close(run_node(make_node("Clip"), {{x}, {Tensor()}, {Tensor::scalar<float>(6.f), true}})[0], {-2, -0.5f, 0.5f, 6});
  ew_test::expect_close(run_node(make_node("Clip"), {{x}, {Tensor::scalar<float>(0.f)}, {Tensor::scalar<float>(1.f)}})[0], {0, 0, 0.5f, 1});
  Tensor bad = Tensor::from_vector<float>({2}, {0, 1});
  EXPECT_THROW(run_node(make_node("Clip"), {{x}, {bad, true}}), Error);
}

TEST(Elementwise, DropoutIsIdentityWithTrueMask) {
  Tensor x = ew_test::random_floats({3, 4}, 9);
  std::vector<Tensor> out = run_node(make_node("Dropout"), {{x}}, 2);
  ew_test::expect_close(out[0], std::vector<float>(x.data<float>(), x.data<float>() + 12));
  EXPECT_EQ(out[1].to_int_vector(), std::vector<int64_t>(12, 1));
  EXPECT_THROW(run_node(make_node("Dropout"), {{x}, {Tensor::scalar<float>(0.5f), true}, {Tensor::scalar<bool>(true), true}}), Error);
}

// Symbolic values: a shape [N, 6] divided by [1, 3] stays [N, 2]; x*1 and x+0 keep N.
TEST(Elementwise, SymbolicShapeArithmetic) {
  ir::Graph g;
  ir::Value s;
  s.name = "s";
  s.type.dtype = DType::kInt64;
  s.type.shape = ir::Dims{2};
  s.symbolic_value = ir::Dims{ir::Dim::named("N"), ir::Dim(6)};
  g.set_value(s);
  g.inputs.push_back("s");
  std::string d = g.add_constant("d", Tensor::from_vector<int64_t>({2}, {1, 3}));
  std::string z = g.add_constant("z", Tensor::from_vector<int64_t>({2}, {0, 4}));
  std::string k = g.add_constant("k", Tensor::from_vector<int64_t>({1}, {2}));
  auto add = [&](const char* op, std::string a, std::string b, std::string out) {
    ir::Node n;
    n.name = out;
    n.op = op;
    n.inputs = {a, b};
    n.outputs = {out};
    g.nodes.push_back(n);
  };
  add("Div", "s", d, "div");    // [N, 2]
  add("Add", "div", z, "add");  // [N, 6]
  add("Mul", "add", d, "mul");  // [N, 18]
  add("Mul", "s", k, "mul2");   // [unknown, 12]
  add("Sub", "add", d, "sub");  // [unknown (N - 1), 3]
  ir::infer_shapes(g);
  auto sym = [&](const std::string& v) { return ir::dims_to_string(*g.value(v).symbolic_value); };
  EXPECT_EQ(sym("div"), "Nx2");
  EXPECT_EQ(sym("add"), "Nx6");
  EXPECT_EQ(sym("mul"), "Nx18");
  EXPECT_EQ(sym("mul2"), "?x12");
  EXPECT_EQ(sym("sub"), "?x3");
}

TEST(Elementwise, LegacyShapeChainKeepsBatchSymbolic) {
  ir::Graph g = onnx_import::import_file(ew_test::test_data("symbolic_div_reshape.onnx"));
  EXPECT_EQ(ir::dims_to_string(*g.value("Y").type.shape), "Nx2x3");
}

// Reference softmax over `axis` of a [outer, n, inner] view.
std::vector<float> softmax_ref(const Tensor& x, int64_t outer, int64_t n, int64_t inner, bool log) {
  std::vector<float> y(static_cast<size_t>(x.numel()));
  const float* p = x.data<float>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double m = -1e30, s = 0;
      for (int64_t k = 0; k < n; ++k) m = std::max(m, double(p[(o * n + k) * inner + i]));
      for (int64_t k = 0; k < n; ++k) s += std::exp(p[(o * n + k) * inner + i] - m);
      for (int64_t k = 0; k < n; ++k) {
        size_t at = static_cast<size_t>((o * n + k) * inner + i);
        y[at] = log ? float(p[at] - m - std::log(s)) : float(std::exp(p[at] - m) / s);
      }
    }
  return y;
}

TEST(Normalization, SoftmaxPerAxis) {
  Tensor x = ew_test::random_floats({2, 3, 4}, 11, -5.f, 5.f);
  ir::Node mid = make_node("Softmax");
  mid.attrs.set("axis", int64_t{1});
  ew_test::expect_close(run_node(mid, {{x}})[0], softmax_ref(x, 2, 3, 4, false));
  ew_test::expect_close(run_node(make_node("Softmax"), {{x}})[0], softmax_ref(x, 6, 4, 1, false));
  ir::Node log = make_node("LogSoftmax");
  log.attrs.set("axis", int64_t{0});
  ew_test::expect_close(run_node(log, {{x}})[0], softmax_ref(x, 1, 2, 12, true), 1e-4f);
}

// Opset 11 Softmax(axis=1) on [2,3,4] normalizes each batch row of 12 values together.
TEST(Normalization, Opset11SoftmaxFlattensAtAxis) {
  ir::Graph g = onnx_import::import_file(ew_test::test_data("softmax_opset11_axis1.onnx"));
  Tensor x = ew_test::random_floats({2, 3, 4}, 12, -3.f, 3.f);
  cpu::CpuEngine engine(g);
  Tensor y = engine.run({{"X", x}}).at("Y");
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{2, 3, 4}));
  ew_test::expect_close(y, softmax_ref(x, 2, 12, 1, false));
}

TEST(Normalization, LayerNormalizationWithStats) {
  Tensor x = ew_test::random_floats({2, 3, 8}, 13);
  Tensor scale = ew_test::random_floats({8}, 14), bias = ew_test::random_floats({8}, 15);
  ir::Node n = make_node("LayerNormalization");
  n.attrs.set("epsilon", 1e-3f);
  std::vector<Tensor> out = run_node(n, {{x}, {scale, true}, {bias, true}}, 3);
  std::vector<float> want, means, invs;
  for (int64_t r = 0; r < 6; ++r) {
    const float* row = x.data<float>() + r * 8;
    double m = 0, v = 0;
    for (int i = 0; i < 8; ++i) m += row[i] / 8.0;
    for (int i = 0; i < 8; ++i) v += (row[i] - m) * (row[i] - m) / 8.0;
    double inv = 1.0 / std::sqrt(v + 1e-3);
    means.push_back(float(m));
    invs.push_back(float(inv));
    for (int i = 0; i < 8; ++i) want.push_back(float((row[i] - m) * inv * scale.data<float>()[i] + bias.data<float>()[i]));
  }
  ew_test::expect_close(out[0], want, 1e-4f);
  EXPECT_EQ(out[1].shape(), (std::vector<int64_t>{2, 3, 1}));
  ew_test::expect_close(out[1], means, 1e-4f);
  ew_test::expect_close(out[2], invs, 1e-4f);
}

// On AVX-512 a row's sum and squared deviations are summed 16 floats a step into partial double
// sums; elsewhere in one chain. Both against the exact statistics in double, on rows of every
// tail length around the vector's 16 and 32, a transformer's 768 and 1000, with a mean far from
// zero (where a variance from sums of squares would lose its digits).
TEST(Normalization, LayerNormalizationRowStatisticsOnEveryIsa) {
  for (const int64_t cols : {1, 7, 15, 16, 17, 31, 32, 33, 768, 1000}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    Tensor x = ew_test::random_floats({3, cols}, static_cast<uint32_t>(40 + cols));
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 1000.f + 0.5f * x.data<float>()[i];
    Tensor scale = ew_test::random_floats({cols}, 41), bias = ew_test::random_floats({cols}, 42);
    ir::Node n = make_node("LayerNormalization");
    std::vector<float> want, means;
    for (int64_t r = 0; r < 3; ++r) {
      const float* row = x.data<float>() + r * cols;
      double m = 0, v = 0;
      for (int64_t i = 0; i < cols; ++i) m += row[i];
      m /= double(cols);
      for (int64_t i = 0; i < cols; ++i) v += (row[i] - m) * (row[i] - m);
      const double inv = 1.0 / std::sqrt(v / double(cols) + 1e-5);
      means.push_back(float(m));
      for (int64_t i = 0; i < cols; ++i)
        want.push_back(float((row[i] - m) * inv * scale.data<float>()[i] + bias.data<float>()[i]));
    }
    for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kPlain, cpu::SgemmIsa::kAvx512}) {
      if (cpu::sgemm_best_isa() < isa) continue;
      cpu::sgemm_force_isa(isa);
      std::vector<Tensor> out = run_node(n, {{x}, {scale, true}, {bias, true}}, 2);
      cpu::sgemm_reset_isa();
      ew_test::expect_close(out[0], want, 2e-4f);
      ew_test::expect_close(out[1], means, 1e-4f);
    }
  }
}

// GroupNormalization (opset 21) on AVX-512 (statistics in partial double sums, the
// normalization 8 values a step, the activation as a vector pass) and in the plain loop, both
// against the formula in double: channels' spatial sizes around the vector's 8 (tails),
// groups of one and several channels, a mean far from zero, with and without SiLU (kiln's fused
// form, FusedGroupNorm).
TEST(Normalization, GroupNormalizationOnEveryIsa) {
  struct Case {
    std::vector<int64_t> shape;
    int64_t groups;
    const char* op;
  };
  const Case cases[] = {{{2, 6, 5, 3}, 3, "GroupNormalization"}, {{1, 8, 4, 4}, 2, "GroupNormalization"},
                        {{1, 4, 9}, 4, "GroupNormalization"}, {{2, 12, 7, 9}, 4, "FusedGroupNorm"},
                        {{1, 64, 17}, 32, "FusedGroupNorm"}};
  uint32_t seed = 300;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.op) + " " + std::to_string(c.shape[1]) + " channels, " + std::to_string(c.groups) +
                 " groups");
    Tensor x = ew_test::random_floats(c.shape, seed++);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 500.f + 2.f * x.data<float>()[i];
    const int64_t C = c.shape[1];
    Tensor scale = ew_test::random_floats({C}, seed++), bias = ew_test::random_floats({C}, seed++);
    const bool fused = std::string(c.op) == "FusedGroupNorm";
    ir::Node n = make_node(c.op);
    if (fused) n.domain = "kiln";
    n.attrs.set("num_groups", c.groups);
    if (fused) ir::Activation::named("SiLU").store(n);
    const int64_t inner = x.numel() / (c.shape[0] * C), per_group = C / c.groups * inner;
    std::vector<float> want;
    for (int64_t row = 0; row < c.shape[0] * c.groups; ++row) {
      const float* xr = x.data<float>() + row * per_group;
      double m = 0, v = 0;
      for (int64_t i = 0; i < per_group; ++i) m += xr[i];
      m /= double(per_group);
      for (int64_t i = 0; i < per_group; ++i) v += (xr[i] - m) * (xr[i] - m);
      const double inv = 1.0 / std::sqrt(v / double(per_group) + 1e-5);
      for (int64_t i = 0; i < per_group; ++i) {
        const int64_t ch = row % c.groups * (C / c.groups) + i / inner;
        double y = (xr[i] - m) * inv * scale.data<float>()[ch] + bias.data<float>()[ch];
        if (fused) y = y / (1.0 + std::exp(-y));
        want.push_back(float(y));
      }
    }
    for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kPlain, cpu::SgemmIsa::kAvx512}) {
      if (cpu::sgemm_best_isa() < isa) continue;
      cpu::sgemm_force_isa(isa);
      Tensor y = run_node(n, {{x}, {scale, true}, {bias, true}})[0];
      cpu::sgemm_reset_isa();
      ew_test::expect_close(y, want, 1e-4f);
    }
  }
}

// RMSNormalization's sum of squares on AVX-512 (partial double sums) and in the plain loop, both
// against the formula in double, on rows of every tail length around 16 and 32.
TEST(Normalization, RmsNormalizationOnEveryIsa) {
  for (const int64_t cols : {1, 15, 16, 17, 33, 768}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    Tensor x = ew_test::random_floats({3, cols}, static_cast<uint32_t>(90 + cols));
    Tensor scale = ew_test::random_floats({cols}, 91);
    ir::Node n = make_node("RMSNormalization");
    std::vector<float> want;
    for (int64_t r = 0; r < 3; ++r) {
      const float* row = x.data<float>() + r * cols;
      double sq = 0;
      for (int64_t i = 0; i < cols; ++i) sq += double(row[i]) * row[i];
      const double inv = 1.0 / std::sqrt(sq / double(cols) + 1e-5);
      for (int64_t i = 0; i < cols; ++i) want.push_back(float(row[i] * inv * scale.data<float>()[i]));
    }
    for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kPlain, cpu::SgemmIsa::kAvx512}) {
      if (cpu::sgemm_best_isa() < isa) continue;
      cpu::sgemm_force_isa(isa);
      Tensor y = run_node(n, {{x}, {scale, true}})[0];
      cpu::sgemm_reset_isa();
      ew_test::expect_close(y, want, 1e-5f);
    }
  }
}

TEST(Normalization, InstanceNormalization) {
  Tensor x = ew_test::random_floats({2, 3, 5}, 16);
  Tensor scale = Tensor::from_vector<float>({3}, {1, 2, 3}), bias = Tensor::from_vector<float>({3}, {0, 1, -1});
  Tensor y = run_node(make_node("InstanceNormalization"), {{x}, {scale, true}, {bias, true}})[0];
  std::vector<float> want;
  for (int64_t r = 0; r < 6; ++r) {
    const float* row = x.data<float>() + r * 5;
    double m = 0, v = 0;
    for (int i = 0; i < 5; ++i) m += row[i] / 5.0;
    for (int i = 0; i < 5; ++i) v += (row[i] - m) * (row[i] - m) / 5.0;
    for (int i = 0; i < 5; ++i)
      want.push_back(float((row[i] - m) / std::sqrt(v + 1e-5) * scale.data<float>()[r % 3] + bias.data<float>()[r % 3]));
  }
  ew_test::expect_close(y, want, 1e-4f);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(Normalization, LayerNormRejectsScaleThatWidens) {
  ir::Node n = ew_test::make_node("LayerNormalization");
  Tensor x(DType::kFloat32, {2, 1});
  Tensor scale(DType::kFloat32, {5});
  EXPECT_THROW(ew_test::one_node_graph(n, {{x}, {scale, true}}), Error);
}

}  // namespace
}  // namespace kiln
