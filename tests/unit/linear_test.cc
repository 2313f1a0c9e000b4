// Gemm, MatMul, BatchNormalization and kiln::FusedGemm / kiln::FusedMatMul: CPU kernels
// against naive loops on random inputs, shape inference and bad-input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "compute_test_util.h"
#include "cpu/gemm_util.h"
#include "cpu/sgemm.h"
#include "ir/activation.h"

namespace kiln {
namespace {

using testing::all_close;
using testing::NodeInput;
using testing::random_tensor;
using testing::run_single_node;

ir::Node make_node(const std::string& op, const std::string& domain = "") {
  ir::Node n;
  n.name = "node0";
  n.op = op;
  n.domain = domain;
  return n;
}

// alpha * op(A) @ op(B) + beta * C with C broadcast by numpy rules.
Tensor reference_gemm(const Tensor& a, const Tensor& b, const Tensor* c, bool ta, bool tb, float alpha, float beta) {
  int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1), n = tb ? b.dim(0) : b.dim(1);
  Tensor y(DType::kFloat32, {m, n});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        float av = ta ? a.data<float>()[p * m + i] : a.data<float>()[i * k + p];
        float bv = tb ? b.data<float>()[j * k + p] : b.data<float>()[p * n + j];
        acc += static_cast<double>(av) * bv;
      }
      double cv = 0;
      if (c) {
        int64_t ci = c->rank() == 2 && c->dim(0) != 1 ? i : 0;
        int64_t cj = c->rank() >= 1 && c->shape().back() != 1 ? j : 0;
        cv = c->data<float>()[ci * (c->rank() == 2 ? c->dim(1) : 0) + cj];
      }
      y.data<float>()[i * n + j] = static_cast<float>(alpha * acc + beta * cv);
    }
  return y;
}

TEST(Gemm, MatchesReference) {
  struct Case {
    int64_t m, k, n;
    bool ta, tb;
    float alpha, beta;
    std::vector<int64_t> c;  // empty: no C; {0}: omitted input
  };
  std::vector<Case> cases{
      {3, 4, 5, false, false, 1.f, 1.f, {3, 5}},    {7, 3, 2, true, false, 0.5f, 2.f, {2}},
      {6, 5, 4, false, true, 1.f, 1.f, {1, 4}},     {4, 6, 3, true, true, -1.f, 0.25f, {4, 1}},
      {5, 8, 9, false, true, 1.f, 1.f, {}},          {2, 3, 4, false, false, 1.f, 0.5f, {1}},
      {64, 300, 129, false, true, 1.f, 1.f, {129}}, {200, 64, 40, true, false, 2.f, 1.f, {200, 40}},
      {1, 2048, 1000, false, true, 1.f, 1.f, {1000}},
  };
  uint32_t seed = 500;
  for (const Case& c : cases) {
    SCOPED_TRACE("m " + std::to_string(c.m) + " k " + std::to_string(c.k) + " n " + std::to_string(c.n) +
                 " transA " + std::to_string(c.ta) + " transB " + std::to_string(c.tb));
    Tensor a = random_tensor(c.ta ? std::vector<int64_t>{c.k, c.m} : std::vector<int64_t>{c.m, c.k}, seed++);
    Tensor b = random_tensor(c.tb ? std::vector<int64_t>{c.n, c.k} : std::vector<int64_t>{c.k, c.n}, seed++);
    ir::Node node = make_node("Gemm");
    node.attrs.set("transA", int64_t{c.ta});
    node.attrs.set("transB", int64_t{c.tb});
    node.attrs.set("alpha", c.alpha);
    node.attrs.set("beta", c.beta);
    std::vector<NodeInput> in{{"A", a}, {"B", b, true}};
    Tensor ct;
    if (!c.c.empty()) {
      ct = random_tensor(c.c, seed++);
      in.push_back({"C", ct, true});
    }
    Tensor want = reference_gemm(a, b, c.c.empty() ? nullptr : &ct, c.ta, c.tb, c.alpha, c.beta);
    EXPECT_TRUE(all_close(run_single_node(node, in), want));

    // FusedGemm: the same plus an activation.
    ir::Node fused = node;
    fused.op = "FusedGemm";
    fused.domain = "kiln";
    ir::Activation act = ir::Activation::named("Relu");
    act.store(fused);
    for (int64_t i = 0; i < want.numel(); ++i) want.data<float>()[i] = act.apply(want.data<float>()[i]);
    EXPECT_TRUE(all_close(run_single_node(fused, in), want));
  }
}

// A layer's product by constant weights (B constant, transA 0, alpha 1) runs on rows_sgemm with
// beta * C as the column bias (AVX-512), FusedGemm's residual and activation in the same pass;
// the general path (forced by another ISA, by C varying along the rows) gives the same values.
TEST(Gemm, ConstantWeightsWithColumnBiasResidualAndActivation) {
  uint32_t seed = 1500;
  for (bool trans_b : {false, true})
    for (std::vector<int64_t> c_shape : {std::vector<int64_t>{70}, std::vector<int64_t>{1, 70}, std::vector<int64_t>{},
                                         std::vector<int64_t>{9, 1}}) {
      SCOPED_TRACE(std::string("transB ") + (trans_b ? "1" : "0") + " C " + shape_to_string(c_shape));
      Tensor a = random_tensor({9, 130}, seed++);
      Tensor b = random_tensor(trans_b ? std::vector<int64_t>{70, 130} : std::vector<int64_t>{130, 70}, seed++);
      Tensor c = random_tensor(c_shape, seed++);
      Tensor z = random_tensor({9, 70}, seed++);
      ir::Node node = make_node("FusedGemm", "kiln");
      node.attrs.set("transB", int64_t{trans_b});
      node.attrs.set("beta", 0.5f);
      ir::Activation act = ir::Activation::named("Relu");
      act.store(node);
      Tensor want = reference_gemm(a, b, &c, false, trans_b, 1.f, 0.5f);
      for (int64_t i = 0; i < want.numel(); ++i)
        want.data<float>()[i] = act.apply(want.data<float>()[i] + z.data<float>()[i]);
      std::vector<Tensor> results;
      for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kAvx512, cpu::SgemmIsa::kAvx2}) {
        if (isa > cpu::sgemm_best_isa()) continue;
        cpu::sgemm_force_isa(isa);
        results.push_back(run_single_node(node, {{"A", a}, {"B", b, true}, {"C", c, true}, {"Z", z}}));
        EXPECT_TRUE(all_close(results.back(), want)) << cpu::sgemm_isa_name(isa);
      }
      cpu::sgemm_reset_isa();
    }
}

TEST(Gemm, ShapeErrorsNameTheNode) {
  ir::Node node = make_node("Gemm");
  node.name = "fc";
  try {
    testing::single_node_graph(node, {{"A", Tensor(DType::kFloat32, {2, 3})}, {"B", Tensor(DType::kFloat32, {4, 5}), true}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.node_name(), "fc");
    EXPECT_NE(std::string(e.what()).find("inner dims"), std::string::npos) << e.what();
  }
  EXPECT_THROW(testing::single_node_graph(node, {{"A", Tensor(DType::kFloat32, {2, 3})},
                                                  {"B", Tensor(DType::kFloat32, {3, 5}), true},
                                                  {"C", Tensor(DType::kFloat32, {3, 5}), true}}),
               Error);
}

// numpy matmul on [batch..., m, k] x [batch..., k, n] with broadcasting, plus 1-D operands.
Tensor reference_matmul(const Tensor& a, const Tensor& b, const std::vector<int64_t>& out_shape) {
  std::vector<int64_t> as = a.shape(), bs = b.shape();
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  size_t rank = std::max(as.size(), bs.size()) - 2;
  std::vector<int64_t> ab(rank, 1), bb(rank, 1), ob(rank);
  for (size_t i = 0; i < as.size() - 2; ++i) ab[rank - (as.size() - 2) + i] = as[i];
  for (size_t i = 0; i < bs.size() - 2; ++i) bb[rank - (bs.size() - 2) + i] = bs[i];
  int64_t batch = 1;
  for (size_t i = 0; i < rank; ++i) batch *= (ob[i] = std::max(ab[i], bb[i]));
  Tensor y(DType::kFloat32, out_shape);
  for (int64_t bi = 0; bi < batch; ++bi) {
    // Decompose the batch index and map it into A and B (index 0 where they broadcast).
    int64_t rem = bi, ai = 0, bj = 0, amul = 1, bmul = 1;
    for (size_t i = rank; i-- > 0;) {
      int64_t d = rem % ob[i];
      rem /= ob[i];
      ai += (ab[i] == 1 ? 0 : d) * amul;
      bj += (bb[i] == 1 ? 0 : d) * bmul;
      amul *= ab[i];
      bmul *= bb[i];
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc += static_cast<double>(a.data<float>()[ai * m * k + i * k + p]) * b.data<float>()[bj * k * n + p * n + j];
        y.data<float>()[(bi * m + i) * n + j] = static_cast<float>(acc);
      }
  }
  return y;
}

TEST(MatMul, MatchesReferenceWithBroadcasting) {
  struct Case {
    std::vector<int64_t> a, b, y;
  };
  std::vector<Case> cases{
      {{3, 4}, {4, 5}, {3, 5}},
      {{2, 3, 4}, {4, 5}, {2, 3, 5}},             // B shared: one tall GEMM
      {{2, 3, 4}, {2, 4, 5}, {2, 3, 5}},          // batched
      {{3, 4}, {2, 4, 5}, {2, 3, 5}},             // A broadcast
      {{2, 1, 3, 4}, {1, 3, 4, 6}, {2, 3, 3, 6}}, // both broadcast
      {{4}, {4, 5}, {5}},                         // 1-D A
      {{2, 3, 4}, {4}, {2, 3}},                   // 1-D B
      {{4}, {4}, {}},                             // dot product
      {{5}, {3, 5, 2}, {3, 2}},                   // 1-D A against a batch
      {{1, 196, 768}, {768, 256}, {1, 196, 256}}, // transformer-sized
      {{12, 50, 64}, {12, 64, 50}, {12, 50, 50}}, // attention-sized, batch >= threads
  };
  uint32_t seed = 700;
  for (const Case& c : cases) {
    SCOPED_TRACE("A " + shape_to_string(c.a) + " B " + shape_to_string(c.b));
    Tensor a = random_tensor(c.a, seed++), b = random_tensor(c.b, seed++);
    Tensor got = run_single_node(make_node("MatMul"), {{"A", a}, {"B", b}});
    EXPECT_TRUE(all_close(got, reference_matmul(a, b, c.y)));
  }
}

TEST(MatMul, FusedMatMulAddsBiasAndActivation) {
  uint32_t seed = 800;
  for (auto [as, bs] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{2, 7, 16}, {16, 9}}, {{3, 5, 8}, {3, 8, 6}}, {{300, 64}, {64, 100}}}) {
    SCOPED_TRACE("A " + shape_to_string(as) + " B " + shape_to_string(bs));
    Tensor a = random_tensor(as, seed++), b = random_tensor(bs, seed++);
    Tensor bias = random_tensor({bs.back()}, seed++);
    ir::Node node = make_node("FusedMatMul", "kiln");
    ir::Activation act = ir::Activation::named("Gelu");
    act.store(node);
    Tensor got = run_single_node(node, {{"A", a}, {"B", b, true}, {"bias", bias, true}});
    Tensor want = reference_matmul(a, b, got.shape());
    int64_t n = bs.back();
    for (int64_t i = 0; i < want.numel(); ++i)
      want.data<float>()[i] = act.apply(want.data<float>()[i] + bias.data<float>()[i % n]);
    EXPECT_TRUE(all_close(got, want));
  }
}

// Constant 2-D weights run on kiln's sgemm, packed when the kernel is made: sizes off the
// kernel's 8 x 32 tiles, a residual, an activation in and after the micro-kernel, A with batch
// dims, one, two and four rows (rows_sgemm's 1-, 2- and 4-row kernels; K over two blocks). On every kernel the CPU has: AVX-512's rows_sgemm (Y row-major) and the others'
// transposed product (Y^T = B^T A^T). All give the same bytes: each sum starts from the bias
// and adds the products in the order of k.
TEST(MatMul, ConstantWeightsWithResidualAndActivation) {
  std::map<std::string, Tensor> first_result;
  for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kAvx512, cpu::SgemmIsa::kAvx2, cpu::SgemmIsa::kPlain}) {
    if (isa > cpu::sgemm_best_isa()) continue;
    cpu::sgemm_force_isa(isa);
    uint32_t seed = 900;
    for (auto [as, bs] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
             {{1, 37, 50}, {50, 23}}, {{2, 130, 96}, {96, 200}}, {{5, 8}, {8, 1}}, {{3, 1, 300}, {300, 33}},
             {{16, 64}, {64, 64}}, {{9, 700}, {700, 40}}, {{1, 700}, {700, 90}}, {{2, 33}, {33, 65}},
             {{4, 130}, {130, 40}}}) {
      for (const char* activation : {"Relu", "Gelu"}) {
        const std::string label = std::string(cpu::sgemm_isa_name(isa)) + " A " + shape_to_string(as) + " B " +
                                  shape_to_string(bs) + " " + activation;
        SCOPED_TRACE(label);
        Tensor a = random_tensor(as, seed++), b = random_tensor(bs, seed++);
        Tensor bias = random_tensor({bs.back()}, seed++);
        std::vector<int64_t> ys = as;
        ys.back() = bs.back();
        Tensor z = random_tensor(ys, seed++);
        ir::Node node = make_node("FusedMatMul", "kiln");
        ir::Activation act = ir::Activation::named(activation);
        act.store(node);
        Tensor got = run_single_node(node, {{"A", a}, {"B", b, true}, {"bias", bias, true}, {"Z", z}});
        Tensor want = reference_matmul(a, b, ys);
        const int64_t n = bs.back();
        for (int64_t i = 0; i < want.numel(); ++i)
          want.data<float>()[i] = act.apply(want.data<float>()[i] + bias.data<float>()[i % n] + z.data<float>()[i]);
        EXPECT_TRUE(all_close(got, want));
        Tensor plain = run_single_node(make_node("MatMul"), {{"A", a}, {"B", b, true}});
        EXPECT_TRUE(all_close(plain, reference_matmul(a, b, ys)));
        const std::string key = label.substr(label.find(" A "));
        if (!first_result.count(key)) first_result[key] = got;
        else EXPECT_EQ(std::memcmp(got.raw(), first_result[key].raw(), got.nbytes()), 0) << "differs from another kernel's";
      }
    }
  }
  cpu::sgemm_reset_isa();
}

TEST(TransposeFloats, AnySize) {
  // Three rows (a 3-channel image to channels-last) interleave 16 columns a step on AVX-512: runs
  // of whole steps, a tail, and more columns than one task's run of 1024.
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {8, 8}, {13, 29}, {64, 7}, {300, 260}, {3, 16}, {3, 37}, {3, 3000}, {3, 5}}) {
    Tensor a = random_tensor({rows, cols}, static_cast<uint32_t>(rows * 1000 + cols));
    std::vector<float> t(static_cast<size_t>(rows * cols));
    cpu::transpose_floats(a.data<float>(), rows, cols, t.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(t[static_cast<size_t>(c * rows + r)], a.data<float>()[r * cols + c]) << rows << "x" << cols;
  }
}

// The Epilogue's vectorized Gelu against erf in double: within 4e-7 of |x| (erf's fit error,
// carried by 0.5 x) plus an ulp; special values as the formula with erff gives them; every
// length, so the tail takes the same arithmetic as the body.
TEST(GeluErf, MatchesErfInDouble) {
  std::vector<float> xs;
  for (float x = -12.f; x <= 12.f; x += 1.f / 1024) xs.push_back(x);
  for (float x : {1e-30f, -1e-30f, 1e-7f, -3e-5f, 5.5437f, 5.5438f, -5.5438f, 80.f, -80.f, 3.4e38f, -3.4e38f})
    xs.push_back(x);
  std::vector<float> got = xs;
  cpu::gelu_erf_in_place(got.data(), static_cast<int64_t>(got.size()));
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    const double want = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    const double error = std::abs(got[i] - want);
    worst = std::max(worst, error / std::abs(x));
    ASSERT_LE(error, 4e-7 * std::abs(x) + std::abs(want) * 1.2e-7 + 1e-38) << "x = " << xs[i] << ": " << got[i] << " vs " << want;
  }
  EXPECT_LT(worst, 4e-7);
  ir::Activation gelu = ir::Activation::named("Gelu");
  const float inf = std::numeric_limits<float>::infinity();
  for (float special : {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.f}) {
    for (int64_t n = 1; n <= 17; ++n) {
      std::vector<float> v(static_cast<size_t>(n), 0.25f);
      v.back() = special;
      cpu::gelu_erf_in_place(v.data(), n);
      const float want = gelu.apply(special);
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(v.back())) << special << " at length " << n;
      else EXPECT_EQ(v.back(), want) << special << " at length " << n;
      if (n > 1) EXPECT_NEAR(v[0], gelu.apply(0.25f), 1e-7f) << "length " << n;
    }
  }
}

TEST(MatMul, ShapeInference) {
  ir::Node node = make_node("MatMul");
  ir::Graph g = testing::single_node_graph(
      node, {{"A", Tensor(DType::kFloat32, {1, 4, 8})}, {"B", Tensor(DType::kFloat32, {8, 3}), true}},
      {ir::Dims{ir::Dim::named("batch"), ir::Dim::named("seq"), 8}});
  EXPECT_EQ(ir::dims_to_string(*g.value("Y").type.shape), "batchxseqx3");
  try {
    testing::single_node_graph(node, {{"A", Tensor(DType::kFloat32, {2, 4, 8})}, {"B", Tensor(DType::kFloat32, {3, 8, 3})}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.node_name(), "node0");
    EXPECT_NE(std::string(e.what()).find("broadcast"), std::string::npos) << e.what();
  }
  EXPECT_THROW(testing::single_node_graph(node, {{"A", Tensor(DType::kFloat32, {2, 4})}, {"B", Tensor(DType::kFloat32, {5, 3})}}),
               Error);
  ir::Node fused = make_node("FusedMatMul", "kiln");
  EXPECT_THROW(testing::single_node_graph(fused, {{"A", Tensor(DType::kFloat32, {2, 4})},
                                                   {"B", Tensor(DType::kFloat32, {4, 3})},
                                                   {"bias", Tensor(DType::kFloat32, {4})}}),
               Error);
}

TEST(BatchNormalization, MatchesFormula) {
  uint32_t seed = 900;
  for (bool constant : {true, false})
    for (auto shape : std::vector<std::vector<int64_t>>{{2, 3, 4, 5}, {1, 16, 64, 64}, {4, 6}, {2, 3, 7}}) {
      SCOPED_TRACE(shape_to_string(shape) + (constant ? " constant params" : " runtime params"));
      int64_t c = shape[1];
      Tensor x = random_tensor(shape, seed++), scale = random_tensor({c}, seed++), bias = random_tensor({c}, seed++);
      Tensor mean = random_tensor({c}, seed++), var = random_tensor({c}, seed++);
      for (int64_t i = 0; i < c; ++i) var.data<float>()[i] = std::fabs(var.data<float>()[i]) + 0.1f;
      ir::Node node = make_node("BatchNormalization");
      node.attrs.set("epsilon", 1e-3f);
      Tensor got = run_single_node(node, {{"X", x}, {"s", scale, constant}, {"b", bias, constant},
                                          {"m", mean, constant}, {"v", var, constant}});
      Tensor want(DType::kFloat32, shape);
      int64_t inner = x.numel() / (shape[0] * c);
      for (int64_t i = 0; i < x.numel(); ++i) {
        int64_t ch = (i / inner) % c;
        want.data<float>()[i] = (x.data<float>()[i] - mean.data<float>()[ch]) /
                                    std::sqrt(var.data<float>()[ch] + 1e-3f) * scale.data<float>()[ch] +
                                bias.data<float>()[ch];
      }
      EXPECT_TRUE(all_close(got, want));
    }
}

TEST(BatchNormalization, RejectsTrainingModeAndWrongParameterShapes) {
  ir::Node node = make_node("BatchNormalization");
  node.name = "bn1";
  node.attrs.set("training_mode", int64_t{1});
  std::vector<NodeInput> in{{"X", Tensor(DType::kFloat32, {1, 3, 4, 4})}, {"s", Tensor(DType::kFloat32, {3}), true},
                            {"b", Tensor(DType::kFloat32, {3}), true}, {"m", Tensor(DType::kFloat32, {3}), true},
                            {"v", Tensor(DType::kFloat32, {3}), true}};
  try {
    testing::single_node_graph(node, in);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_EQ(e.node_name(), "bn1");
    EXPECT_NE(std::string(e.what()).find("training_mode"), std::string::npos) << e.what();
  }
  node.attrs.erase("training_mode");
  in[3].data = Tensor(DType::kFloat32, {4});
  try {
    testing::single_node_graph(node, in);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input_mean"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
