// The losses, Compress, BitCast and BitShift of signed integers on the CPU engine: a value each
// (their ONNX node cases check the rest, in the conformance tests), and each bad input as an
// error naming the node.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <map>
#include <set>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>

#include "cpu/engine.h"
#include "cpu/int8_gemm.h"
#include "cpu/sgemm.h"
#include "cpu/vector_exp.h"
#include "graph_builder.h"
#include "ops/einsum_params.h"
#include "ops/non_max_suppression_params.h"

namespace kiln {
namespace {

using testing::GraphBuilder;

std::map<std::string, Tensor> run_one(GraphBuilder& b, const std::map<std::string, Tensor>& inputs) {
  cpu::CpuEngine engine(b.build());
  return engine.run(inputs);
}

TEST(Losses, SoftmaxCrossEntropyMeanMatchesItsDefinition) {
  GraphBuilder b;
  b.input("scores", {2, 3});
  b.input("labels", {2}, DType::kInt64);
  b.node("SoftmaxCrossEntropyLoss", {"scores", "labels"}, "loss");
  b.output("loss");
  Tensor scores = Tensor::from_vector<float>({2, 3}, {1.f, 2.f, 3.f, 0.5f, 0.5f, -1.f});
  Tensor labels = Tensor::from_vector<int64_t>({2}, {2, 0});
  const float got = run_one(b, {{"scores", scores}, {"labels", labels}}).at("loss").data<float>()[0];
  auto nll = [](double a, double b2, double c, double pick) { return -(pick - std::log(std::exp(a) + std::exp(b2) + std::exp(c))); };
  const double want = (nll(1, 2, 3, 3) + nll(0.5, 0.5, -1, 0.5)) / 2;
  EXPECT_NEAR(got, want, 1e-6);
}

TEST(Losses, ATargetOutsideTheClassesIsAnErrorNamingTheNode) {
  GraphBuilder b;
  b.input("x", {2, 3});
  b.input("t", {2}, DType::kInt64);
  b.node("NegativeLogLikelihoodLoss", {"x", "t"}, "loss", {{"reduction", std::string("sum")}});
  b.output("loss");
  try {
    run_one(b, {{"x", Tensor(DType::kFloat32, {2, 3})}, {"t", Tensor::from_vector<int64_t>({2}, {0, 7})}});
    FAIL() << "a target of 7 among 3 classes was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.node_name(), "loss_node");
    EXPECT_NE(std::string(e.what()).find("target 7"), std::string::npos) << e.what();
  }
}

TEST(Losses, AnUnknownReductionIsRefused) {
  GraphBuilder b;
  b.input("x", {2, 3});
  b.input("t", {2}, DType::kInt64);
  b.node("NegativeLogLikelihoodLoss", {"x", "t"}, "loss", {{"reduction", std::string("median")}});
  b.output("loss");
  EXPECT_THROW(b.build(), Error);
}

TEST(Compress, TakesTheSlicesItsConditionSelects) {
  GraphBuilder b;
  b.input("x", {3, 2});
  b.input("c", {3}, DType::kBool);
  b.node("Compress", {"x", "c"}, "y", {{"axis", int64_t{0}}});
  b.output("y");
  Tensor c = Tensor::from_vector<bool>({3}, {true, false, true});
  const Tensor y = run_one(b, {{"x", Tensor::from_vector<float>({3, 2}, {1, 2, 3, 4, 5, 6})}, {"c", c}}).at("y");
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{2, 2}));
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(y.value_as_double(i), (std::vector<double>{1, 2, 5, 6})[static_cast<size_t>(i)]);
}

TEST(Compress, AConditionSelectingPastTheAxisIsAnError) {
  GraphBuilder b;
  b.input("x", {2, 2});
  b.input("c", {3}, DType::kBool);
  b.node("Compress", {"x", "c"}, "y", {{"axis", int64_t{0}}});
  b.output("y");
  Tensor c = Tensor::from_vector<bool>({3}, {false, false, true});
  EXPECT_THROW(run_one(b, {{"x", Tensor(DType::kFloat32, {2, 2})}, {"c", c}}), Error);
}

TEST(BitCast, TypesOfDifferentWidthsAreRefused) {
  GraphBuilder b;
  b.input("x", {4});
  b.node("BitCast", {"x"}, "y", {{"to", int64_t{static_cast<int64_t>(DType::kInt64)}}});
  b.output("y");
  EXPECT_THROW(b.build(), Error);
}

TEST(BitShift, SignedIntegersFollowOnnxsReference) {
  GraphBuilder b;
  b.input("x", {4}, DType::kInt8);
  b.input("s", {4}, DType::kInt8);
  b.node("BitShift", {"x", "s"}, "y", {{"direction", std::string("RIGHT")}});
  b.output("y");
  const Tensor y = run_one(b, {{"x", Tensor::from_vector<int8_t>({4}, {-128, -7, 64, 5})},
                               {"s", Tensor::from_vector<int8_t>({4}, {1, 9, -1, 1})}}).at("y");
  // Arithmetic right shift; a shift past the width gives -1 for a negative value; a negative
  // shift gives 0.
  const std::vector<int64_t> want{-64, -1, 0, 2};
  EXPECT_EQ(y.to_int_vector(), want);
}

TEST(Einsum, ParsesImplicitOutputsEllipsesAndRepeatedLabels) {
  ops::EinsumEquation eq;
  ASSERT_EQ(ops::parse_einsum("kj,ji", {2, 2}, eq), "");
  EXPECT_EQ(eq.output, (std::vector<int>{2, 0})) << "implicit: the labels seen once, alphabetically (i, k)";
  ASSERT_EQ(ops::parse_einsum("...ij,jk->...ik", {3, 2}, eq), "");
  EXPECT_EQ(eq.inputs[0], (std::vector<int>{3, 0, 1}));
  EXPECT_EQ(eq.output, (std::vector<int>{3, 0, 2}));
  ASSERT_EQ(ops::parse_einsum("...ii->...i", {4}, eq), "");
  EXPECT_EQ(eq.inputs[0], (std::vector<int>{1, 2, 0, 0}));
  EXPECT_NE(ops::parse_einsum("ij->k", {2}, eq), "");
  EXPECT_NE(ops::parse_einsum("ij,jk", {2}, eq), "");
  EXPECT_NE(ops::parse_einsum("ijk", {2}, eq), "");
}

TEST(Einsum, BroadcastsEllipsisDimsOfOne) {
  GraphBuilder b;
  b.input("a", {2, 1, 3});
  b.input("b", {4, 3});
  b.node("Einsum", {"a", "b"}, "y", {{"equation", std::string("...j,...j->...")}});
  b.output("y");
  Tensor a(DType::kFloat32, {2, 1, 3}), bb(DType::kFloat32, {4, 3});
  for (int64_t i = 0; i < 6; ++i) a.data<float>()[i] = static_cast<float>(i);
  for (int64_t i = 0; i < 12; ++i) bb.data<float>()[i] = static_cast<float>(i % 5);
  const Tensor y = run_one(b, {{"a", a}, {"b", bb}}).at("y");
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{2, 4}));
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t q = 0; q < 4; ++q) {
      double want = 0;
      for (int64_t j = 0; j < 3; ++j) want += a.data<float>()[p * 3 + j] * bb.data<float>()[q * 3 + j];
      EXPECT_EQ(y.data<float>()[p * 4 + q], static_cast<float>(want)) << p << "," << q;
    }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

using testing::GraphBuilder;

// An LSTM over a batch whose second entry is one step shorter: that entry's Y_h is what the
// same entry alone, over its shorter sequence, gives; its Y past its length is zero.
TEST(Recurrent, SequenceLensMaskEachBatchEntry) {
  auto lstm = [](int64_t seq, int64_t batch, bool with_lens) {
    GraphBuilder b;
    b.input("x", {seq, batch, 2});
    b.random("w", {1, 12, 2});
    b.random("r", {1, 12, 3});
    b.random("bias", {1, 24});
    std::vector<std::string> inputs = {"x", "w", "r", "bias"};
    if (with_lens) {
      b.input("lens", {batch}, DType::kInt32);
      inputs.push_back("lens");
    }
    b.node("LSTM", inputs, "y", {{"hidden_size", int64_t{3}}});
    b.last().outputs = {"y", "y_h"};
    b.output("y");
    b.output("y_h");
    return b;
  };
  Tensor x(DType::kFloat32, {3, 2, 2});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  GraphBuilder both = lstm(3, 2, true);
  cpu::CpuEngine engine(both.build());
  const auto out = engine.run({{"x", x}, {"lens", Tensor::from_vector<int32_t>({2}, {3, 2})}});
  // Entry 1 alone, over its first two steps.
  Tensor x1(DType::kFloat32, {2, 1, 2});
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t k = 0; k < 2; ++k) x1.data<float>()[t * 2 + k] = x.data<float>()[(t * 2 + 1) * 2 + k];
  GraphBuilder alone = lstm(2, 1, false);
  cpu::CpuEngine single(alone.build());
  const auto ref = single.run({{"x", x1}});
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_FLOAT_EQ(out.at("y_h").data<float>()[1 * 3 + j], ref.at("y_h").data<float>()[j]);
    EXPECT_EQ(out.at("y").data<float>()[((2 * 1 + 0) * 2 + 1) * 3 + j], 0.f) << "step 2 of entry 1 is past its length";
  }
}

// layout 1 (batch first) is layout 0 with X, initial_h, initial_c, Y, Y_h and Y_c transposed:
// a bidirectional GRU and LSTM over two batch entries with initial states give the same numbers
// either way (initial_h is [batch, directions, hidden] under layout 1).
TEST(Recurrent, BatchFirstLayoutTransposesInputsStatesAndOutputs) {
  constexpr int64_t seq = 3, batch = 2, feat = 2, hidden = 3, dirs = 2;
  for (const std::string op : {"GRU", "LSTM"}) {
    const int64_t gates = op == "LSTM" ? 4 : 3;
    auto model = [&](bool batch_first) {
      GraphBuilder b;
      if (batch_first) b.input("x", {batch, seq, feat});
      else b.input("x", {seq, batch, feat});
      const ir::Dims state = batch_first ? ir::Dims{batch, dirs, hidden} : ir::Dims{dirs, batch, hidden};
      b.input("h0", state);
      b.random("w", {dirs, gates * hidden, feat});
      b.random("r", {dirs, gates * hidden, hidden});
      b.random("bias", {dirs, 2 * gates * hidden});
      std::vector<std::string> inputs = {"x", "w", "r", "bias", "", "h0"};
      if (op == "LSTM") {
        b.input("c0", state);
        inputs.push_back("c0");
      }
      b.node(op, inputs, "y", {{"hidden_size", hidden}, {"direction", std::string("bidirectional")},
                               {"layout", int64_t{batch_first ? 1 : 0}}});
      b.last().outputs = {"y", "y_h"};
      b.output("y");
      b.output("y_h");
      return b;
    };
    auto values = [](std::vector<int64_t> shape, float step) {
      Tensor t(DType::kFloat32, shape);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = step * static_cast<float>(i % 11) - 0.4f;
      return t;
    };
    const Tensor x = values({seq, batch, feat}, 0.13f), h0 = values({dirs, batch, hidden}, 0.07f),
                 c0 = values({dirs, batch, hidden}, -0.05f);
    // The same values, batch first.
    Tensor xt(DType::kFloat32, {batch, seq, feat}), h0t(DType::kFloat32, {batch, dirs, hidden}),
        c0t(DType::kFloat32, {batch, dirs, hidden});
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t k = 0; k < feat; ++k) xt.data<float>()[(n * seq + t) * feat + k] = x.data<float>()[(t * batch + n) * feat + k];
    for (int64_t d = 0; d < dirs; ++d)
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t j = 0; j < hidden; ++j) {
          h0t.data<float>()[(n * dirs + d) * hidden + j] = h0.data<float>()[(d * batch + n) * hidden + j];
          c0t.data<float>()[(n * dirs + d) * hidden + j] = c0.data<float>()[(d * batch + n) * hidden + j];
        }
    GraphBuilder seq_first = model(false), batch_first = model(true);
    std::map<std::string, Tensor> in0 = {{"x", x}, {"h0", h0}}, in1 = {{"x", xt}, {"h0", h0t}};
    if (op == "LSTM") in0.emplace("c0", c0), in1.emplace("c0", c0t);
    const auto a = cpu::CpuEngine(seq_first.build()).run(in0);
    const auto b = cpu::CpuEngine(batch_first.build()).run(in1);
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t d = 0; d < dirs; ++d)
        for (int64_t n = 0; n < batch; ++n)
          for (int64_t j = 0; j < hidden; ++j)
            ASSERT_EQ(a.at("y").data<float>()[((t * dirs + d) * batch + n) * hidden + j],
                      b.at("y").data<float>()[((n * seq + t) * dirs + d) * hidden + j])
                << op << " Y at t " << t << " d " << d << " n " << n << " j " << j;
    for (int64_t d = 0; d < dirs; ++d)
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t j = 0; j < hidden; ++j)
          ASSERT_EQ(a.at("y_h").data<float>()[(d * batch + n) * hidden + j], b.at("y_h").data<float>()[(n * dirs + d) * hidden + j])
              << op << " Y_h at d " << d << " n " << n << " j " << j;
  }
}

__attribute__((target("avx512f"))) void tanh_of_16(const float* x, float* y) {
  _mm512_storeu_ps(y, cpu::tanh16(_mm512_loadu_ps(x)));
}

// The recurrent layers' vector tanh within 4 ulp of tanh in double (at most 2^-24 absolute
// below the smallest normal's neighbourhood), from tiny values, where a form through e^2x
// would cancel, to values past float32's saturation; infinities and NaN as tanh takes them.
TEST(Recurrent, VectorTanhIsWithinFourUlpOfTanh) {
  if (cpu::sgemm_best_isa() != cpu::SgemmIsa::kAvx512) GTEST_SKIP() << "tanh16 needs AVX-512";
  std::vector<float> xs = {0.f, -0.f, 1e-30f, -1e-8f, 1e-4f, 0.2499f, 0.25f, 0.2501f, -0.7f, 3.f, 9.1f, 20.f, -60.f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  for (float v = -12.f; v <= 12.f; v += 0.0371f) xs.push_back(v);
  for (float v = 1e-6f; v < 1.f; v *= 1.37f) xs.push_back(v), xs.push_back(-v);
  while (xs.size() % 16) xs.push_back(0.5f);
  std::vector<float> ys(xs.size());
  for (size_t i = 0; i < xs.size(); i += 16) tanh_of_16(xs.data() + i, ys.data() + i);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = std::tanh(static_cast<double>(xs[i]));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(ys[i])) << xs[i];
      continue;
    }
    const double ulp = std::max(std::fabs(want) * std::pow(2.0, -23), std::pow(2.0, -149));
    EXPECT_LE(std::fabs(ys[i] - want), 4 * ulp) << "tanh(" << xs[i] << ") = " << ys[i] << ", want " << want;
    EXPECT_EQ(std::signbit(ys[i]), std::signbit(xs[i])) << xs[i];
  }
}

// The AVX-512 path (weights packed, products on kiln's sgemm, float32 sums, vector sigmoid and
// tanh) against the reference loops (double sums, libm), which run where AVX-512 is forced off:
// LSTM, GRU and RNN with every input and the attributes that change the arithmetic, entries of
// different lengths (one of none), both directions and layouts.
TEST(Recurrent, PackedPathMatchesTheReferenceLoops) {
  if (cpu::sgemm_best_isa() != cpu::SgemmIsa::kAvx512) GTEST_SKIP() << "the packed path needs AVX-512";
  struct Case {
    std::string op, direction;
    int64_t layout;
    std::vector<std::pair<std::string, ir::AttrValue>> attrs;
    bool peepholes;
  };
  const std::vector<Case> cases = {
      {"LSTM", "bidirectional", 0, {{"clip", 1.5f}}, true},
      {"LSTM", "reverse", 1, {{"input_forget", int64_t{1}}}, false},
      {"LSTM", "forward", 0,
       {{"activations", std::vector<std::string>{"HardSigmoid", "Tanh", "Softsign"}}, {"activation_alpha", std::vector<float>{0.3f}},
        {"activation_beta", std::vector<float>{0.4f}}},
       false},
      {"GRU", "bidirectional", 1, {}, false},
      {"GRU", "bidirectional", 0, {{"linear_before_reset", int64_t{1}}}, false},
      {"RNN", "bidirectional", 0, {{"activations", std::vector<std::string>{"Relu", "Tanh"}}}, false},
  };
  constexpr int64_t seq = 7, batch = 3, feat = 5, hidden = 20;
  for (const Case& c : cases) {
    const int64_t gates = c.op == "LSTM" ? 4 : c.op == "GRU" ? 3 : 1, dirs = c.direction == "bidirectional" ? 2 : 1;
    auto model = [&] {
      GraphBuilder b;
      if (c.layout) b.input("x", {batch, seq, feat});
      else b.input("x", {seq, batch, feat});
      b.input("lens", {batch}, DType::kInt32);
      const ir::Dims state = c.layout ? ir::Dims{batch, dirs, hidden} : ir::Dims{dirs, batch, hidden};
      b.input("h0", state);
      b.random("w", {dirs, gates * hidden, feat}, -0.5f, 0.5f);
      b.random("r", {dirs, gates * hidden, hidden}, -0.5f, 0.5f);
      b.random("bias", {dirs, 2 * gates * hidden}, -0.5f, 0.5f);
      std::vector<std::string> inputs = {"x", "w", "r", "bias", "lens", "h0"};
      if (c.op == "LSTM") {
        b.input("c0", state);
        inputs.push_back("c0");
        if (c.peepholes) {
          b.random("p", {dirs, 3 * hidden}, -0.5f, 0.5f);
          inputs.push_back("p");
        }
      }
      std::vector<std::pair<std::string, ir::AttrValue>> attrs = c.attrs;
      attrs.push_back({"hidden_size", hidden});
      attrs.push_back({"direction", c.direction});
      attrs.push_back({"layout", c.layout});
      b.node(c.op, inputs, "y", attrs);
      b.last().outputs = {"y", "y_h"};
      b.output("y");
      b.output("y_h");
      return b;
    };
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto values = [&](std::vector<int64_t> shape) {
      Tensor t(DType::kFloat32, shape);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
      return t;
    };
    const std::vector<int64_t> state = c.layout ? std::vector<int64_t>{batch, dirs, hidden} : std::vector<int64_t>{dirs, batch, hidden};
    std::map<std::string, Tensor> in = {{"x", values(c.layout ? std::vector<int64_t>{batch, seq, feat} : std::vector<int64_t>{seq, batch, feat})},
                                        {"lens", Tensor::from_vector<int32_t>({batch}, {seq, 3, 0})},
                                        {"h0", values(state)}};
    if (c.op == "LSTM") in.emplace("c0", values(state));
    GraphBuilder packed_model = model();
    const auto packed = cpu::CpuEngine(packed_model.build()).run(in);
    cpu::sgemm_force_isa(cpu::SgemmIsa::kAvx2);
    GraphBuilder reference_model = model();
    const auto reference = cpu::CpuEngine(reference_model.build()).run(in);
    cpu::sgemm_reset_isa();
    for (const std::string name : {"y", "y_h"}) {
      const Tensor& got = packed.at(name);
      const Tensor& want = reference.at(name);
      ASSERT_EQ(got.shape(), want.shape()) << c.op << " " << name;
      for (int64_t i = 0; i < want.numel(); ++i)
        ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 2e-5f + 2e-5f * std::fabs(want.data<float>()[i]))
            << c.op << " " << c.direction << " layout " << c.layout << " " << name << "[" << i << "]";
    }
  }
}

// MatMulInteger and QLinearMatMul by constant weights on the int8 GEMM (zero points applied after
// the sums) against the reference loops, which run where the GEMM is forced off: the same
// integers for int8 and uint8 activations and weights, zero points absent, per tensor, per
// column of B and per row of A, A with batch dims, and K past one GEMM step.
TEST(IntegerMatMul, PackedWeightsGiveTheReferenceIntegers) {
  if (cpu::int8_gemm_best_isa() == cpu::Int8GemmIsa::kNone) GTEST_SKIP() << "no int8 GEMM on this CPU";
  std::mt19937 rng(11);
  auto bytes = [&](DType type, std::vector<int64_t> shape) {
    Tensor t(type, shape);
    std::uniform_int_distribution<int> value(type == DType::kInt8 ? -128 : 0, type == DType::kInt8 ? 127 : 255);
    for (int64_t i = 0; i < t.numel(); ++i) static_cast<uint8_t*>(t.raw())[i] = static_cast<uint8_t>(value(rng));
    return t;
  };
  struct Case {
    DType a, b;
    std::string zeros;  // "none", "tensor", "rows_columns"
    bool qlinear;
  };
  const std::vector<Case> cases = {{DType::kUInt8, DType::kInt8, "tensor", false}, {DType::kInt8, DType::kInt8, "none", false},
                                   {DType::kUInt8, DType::kUInt8, "rows_columns", false},
                                   {DType::kInt8, DType::kUInt8, "tensor", false}, {DType::kUInt8, DType::kInt8, "tensor", true},
                                   {DType::kInt8, DType::kInt8, "tensor", true}};
  constexpr int64_t batch = 3, M = 37, K = 70, N = 45;
  for (const Case& c : cases) {
    const Tensor a = bytes(c.a, {batch, M, K}), w = bytes(c.b, {K, N});
    const Tensor a_zero = bytes(c.a, c.zeros == "rows_columns" ? std::vector<int64_t>{M} : std::vector<int64_t>{});
    const Tensor b_zero = bytes(c.b, c.zeros == "rows_columns" ? std::vector<int64_t>{N} : std::vector<int64_t>{});
    const Tensor y_zero = bytes(c.a, {});
    auto model = [&] {
      GraphBuilder g;
      g.input("a", {batch, M, K}, c.a);
      g.constant("w", w);
      if (c.qlinear) {
        g.input("a_zero", {}, c.a);
        g.constant("a_scale", Tensor::scalar<float>(0.02f));
        g.constant("w_scale", Tensor::scalar<float>(0.01f));
        g.constant("w_zero", b_zero);
        g.constant("y_scale", Tensor::scalar<float>(1.7f));
        g.constant("y_zero", y_zero);
        g.node("QLinearMatMul", {"a", "a_scale", "a_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero"}, "y");
      } else if (c.zeros == "none") {
        g.node("MatMulInteger", {"a", "w"}, "y");
      } else {
        g.input("a_zero", c.zeros == "rows_columns" ? ir::Dims{M} : ir::Dims{}, c.a);
        g.constant("w_zero", b_zero);
        g.node("MatMulInteger", {"a", "w", "a_zero", "w_zero"}, "y");
      }
      g.output("y");
      return g;
    };
    std::map<std::string, Tensor> in = {{"a", a}};
    if (c.qlinear || c.zeros != "none") in.emplace("a_zero", a_zero);
    cpu::int8_gemm_force_isa(cpu::Int8GemmIsa::kNone);
    GraphBuilder reference_model = model();
    const Tensor reference = cpu::CpuEngine(reference_model.build()).run(in).at("y");
    for (cpu::Int8GemmIsa isa : {cpu::Int8GemmIsa::kAvx2, cpu::Int8GemmIsa::kAvxVnni, cpu::Int8GemmIsa::kAvx512Vnni, cpu::Int8GemmIsa::kAmx}) {
      if (isa > cpu::int8_gemm_best_isa()) continue;
      cpu::int8_gemm_force_isa(isa);
      GraphBuilder packed_model = model();
      const Tensor packed = cpu::CpuEngine(packed_model.build()).run(in).at("y");
      ASSERT_EQ(packed.shape(), reference.shape());
      ASSERT_EQ(packed.dtype(), reference.dtype());
      EXPECT_EQ(std::memcmp(packed.raw(), reference.raw(), static_cast<size_t>(packed.nbytes())), 0)
          << "zeros " << c.zeros << (c.qlinear ? " QLinearMatMul" : " MatMulInteger") << " on " << cpu::int8_gemm_isa_name(isa);
      if (c.qlinear) {  // a spread of values, not all saturated
        std::set<int64_t> distinct;
        for (int64_t i = 0; i < packed.numel(); ++i) distinct.insert(packed.value_as_int(i));
        EXPECT_GT(distinct.size(), 20u);
      }
    }
    cpu::int8_gemm_reset_isa();
  }
}

// DynamicQuantizeLinear's vector range and quantization against ONNX's formulas evaluated one
// value at a time: the same scale, zero point and bytes, NaN (left out of the range, quantized
// to 0), values past the range's rounding and a tail past the last vector.
TEST(DynamicQuantizeLinear, VectorPassesGiveTheReferenceBytes) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.5f, 3.f);
  for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{1003}}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    x[0] = n > 1 ? std::numeric_limits<float>::quiet_NaN() : x[0];
    if (n > 10) x[7] = -1e30f, x[9] = 2.5f;
    GraphBuilder b;
    b.input("x", {n});
    b.node("DynamicQuantizeLinear", {"x"}, "y");
    b.last().outputs = {"y", "scale", "zero"};
    b.output("y");
    b.output("scale");
    b.output("zero");
    const auto out = cpu::CpuEngine(b.build()).run({{"x", Tensor::from_vector<float>({n}, x)}});
    float hi = 0.f, lo = 0.f;
    for (float v : x) hi = std::max(hi, v), lo = std::min(lo, v);
    const float scale = (hi == lo ? 1.f : hi - lo) / 255.f;
    const float zero = std::nearbyint(std::min(255.f, std::max(0.f, 0.f - lo / scale)));
    ASSERT_EQ(out.at("scale").data<float>()[0], scale);
    ASSERT_EQ(out.at("zero").data<uint8_t>()[0], static_cast<uint8_t>(zero));
    for (int64_t i = 0; i < n; ++i) {
      const auto want = static_cast<uint8_t>(std::min(255.f, std::max(0.f, std::nearbyint(x[static_cast<size_t>(i)] / scale) + zero)));
      ASSERT_EQ(out.at("y").data<uint8_t>()[i], want) << "x[" << i << "] = " << x[static_cast<size_t>(i)];
    }
  }
}

// NonMaxSuppression tests a candidate against the kept boxes a block at a time: the same answer
// as the definition (nms_suppresses against each kept box), on random boxes of every kind: corners
// in either order, boxes of no area, NaN corners, and counts around the block size.
TEST(NonMaxSuppression, BlockTestAgreesWithThePairTest) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> coord(0.f, 40.f);
  std::uniform_int_distribution<int> kind(0, 19);
  auto random_box = [&] {
    std::array<float, 4> b{coord(rng), coord(rng), coord(rng), coord(rng)};
    const int k = kind(rng);
    if (k == 0) b[2] = b[0];                                      // no height
    if (k == 1) b[1] = std::numeric_limits<float>::quiet_NaN();  // a NaN corner
    return ir::nms_corners(b.data(), false);
  };
  int suppressed = 0, kept_count = 0;
  for (int trial = 0; trial < 300; ++trial) {
    ir::NmsKept kept;
    std::vector<std::array<float, 4>> boxes;
    const int n = trial % 40;
    for (int i = 0; i < n; ++i) {
      boxes.push_back(random_box());
      kept.add(boxes.back());
    }
    ASSERT_EQ(kept.size(), static_cast<size_t>(n));
    const float threshold = trial % 3 == 0 ? 0.f : 0.5f;
    for (int c = 0; c < 20; ++c) {
      const std::array<float, 4> candidate = random_box();
      const bool want = std::any_of(boxes.begin(), boxes.end(),
                                    [&](const auto& k) { return ir::nms_suppresses(k, candidate, threshold); });
      ASSERT_EQ(kept.suppress(candidate, threshold), want) << "trial " << trial << ", candidate " << c;
      (want ? suppressed : kept_count) += 1;
    }
  }
  EXPECT_GT(suppressed, 500);  // both answers are common
  EXPECT_GT(kept_count, 500);
}

// The selection as the definition says (every candidate against every kept box), to check the
// binned one against.
std::vector<std::array<int64_t, 3>> nms_by_definition(const std::vector<float>& boxes, const std::vector<float>& scores,
                                                      int64_t classes, int64_t spatial, const ir::NmsParams& p) {
  std::vector<std::array<int64_t, 3>> selected;
  for (int64_t c = 0; c < classes; ++c) {
    std::vector<int64_t> order;
    for (int64_t i = 0; i < spatial; ++i)
      if (!p.score_threshold || scores[static_cast<size_t>(c * spatial + i)] > *p.score_threshold) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
      return scores[static_cast<size_t>(c * spatial + i)] > scores[static_cast<size_t>(c * spatial + j)];
    });
    std::vector<std::array<float, 4>> kept;
    for (int64_t i : order) {
      if (static_cast<int64_t>(kept.size()) >= p.max_per_class) break;
      const std::array<float, 4> box = ir::nms_corners(boxes.data() + i * 4, false);
      if (std::any_of(kept.begin(), kept.end(), [&](const auto& k) { return ir::nms_suppresses(k, box, p.iou_threshold); }))
        continue;
      kept.push_back(box);
      selected.push_back({0, c, i});
    }
  }
  return selected;
}

// Enough candidates that NmsKept bins them along x: batched NMS's layout (each of 12 classes'
// boxes offset by 1000 along x, as torchvision's coordinate trick does), boxes overlapping within
// a class, some wide enough to cross many bins or the whole range, some of no area or with NaN
// or infinite corners, touching edges (an intersection of no width); and one class of boxes of
// every size. The selection must be the definition's, box for box, and most boxes must be kept
// and many suppressed (the test would pass vacuously otherwise).
TEST(NonMaxSuppression, BinnedSelectionIsTheDefinitions) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::string layout : {"batched", "one_class_mixed_sizes"}) {
    SCOPED_TRACE(layout);
    const int64_t spatial = 3000;
    std::vector<float> boxes(static_cast<size_t>(spatial * 4)), scores(static_cast<size_t>(spatial));
    for (int64_t i = 0; i < spatial; ++i) {
      float* b = boxes.data() + i * 4;
      const float offset = layout == "batched" ? 1000.f * static_cast<float>(i % 12) : 0.f;
      const float size = layout == "batched" ? 10.f + 80.f * unit(rng) : 2.f + 400.f * unit(rng) * unit(rng);
      const float y = 500.f * unit(rng), x = offset + 500.f * unit(rng);
      b[0] = y, b[1] = x, b[2] = y + size, b[3] = x + size * (0.5f + unit(rng));
      const int64_t kind = i % 97;
      if (kind == 1) b[3] = x + 9000.f;      // across many bins
      if (kind == 2) b[1] = -inf;            // to the left end
      if (kind == 3) b[3] = inf;             // to the right end
      if (kind == 4) b[2] = b[0];            // no area
      if (kind == 5) b[1] = nan;             // a NaN corner
      if (kind == 6 && i > 0) b[1] = boxes[static_cast<size_t>((i - 1) * 4 + 3)];  // touching the previous box
      if (kind == 7) std::swap(b[1], b[3]);  // corners in the other order
      scores[static_cast<size_t>(i)] = unit(rng);
    }
    for (float threshold : {0.f, 0.3f, 0.7f}) {
      ir::NmsParams p;
      p.max_per_class = spatial;
      p.iou_threshold = threshold;
      const auto want = nms_by_definition(boxes, scores, 1, spatial, p);
      const auto got = ir::non_max_suppression(boxes.data(), scores.data(), 1, 1, spatial, p);
      ASSERT_EQ(got, want) << "IoU threshold " << threshold;
      std::cout << layout << ", IoU threshold " << threshold << ": " << got.size() << " of " << spatial << " kept\n";
      EXPECT_GT(got.size(), static_cast<size_t>(spatial / 10));
      if (threshold < 0.5f) EXPECT_LT(got.size(), static_cast<size_t>(spatial * 9 / 10));
    }
  }
}

}  // namespace
}  // namespace kiln
