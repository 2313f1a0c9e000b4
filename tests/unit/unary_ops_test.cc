// The elementwise unary ops' one table (src/ir/unary_ops.h): every stage takes its ops from it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "compute_test_util.h"
#include "cpu/kernel.h"
#include "cpu/sgemm.h"
#include "ir/op_schema.h"
#include "ir/unary_ops.h"
#include "onnx/importer.h"
#if KILN_WITH_CUDA
#include "cuda/runtime/layer.h"
#endif

namespace kiln {
namespace {

TEST(UnaryOps, EveryStageHasEveryOpOfTheTable) {
  std::set<std::string> names;
  for (const ir::UnaryOpInfo& u : ir::kUnaryOps) {
    SCOPED_TRACE(u.name);
    EXPECT_TRUE(names.insert(u.name).second) << "listed twice";
    const onnx_import::OpImporter* importer = onnx_import::ImporterRegistry::instance().find(u.name);
    ASSERT_NE(importer, nullptr);
    EXPECT_EQ(importer->since_opset, u.since_opset);
    EXPECT_NE(ir::OpRegistry::instance().find(u.name), nullptr);
    EXPECT_NE(cpu::KernelRegistry::instance().find(u.name), nullptr);
#if KILN_WITH_CUDA
    // The GPU builder runs Identity as a view of its input (no layer, no copy).
    if (u.op != ir::UnaryOp::kIdentity) EXPECT_NE(cuda::LayerRegistry::instance().find(u.name), nullptr);
#endif
    EXPECT_EQ(ir::find_unary_op(u.name), &u);
  }
  EXPECT_EQ(ir::find_unary_op("GeluTanh"), nullptr) << "kGeluTanh is Gelu's attribute, not a name";
}

TEST(UnaryOps, ANodeReadsItsAttributesWithOnnxDefaults) {
  ir::Node gelu;
  gelu.op = "Gelu";
  gelu.attrs.set("approximate", std::string("tanh"));
  ir::UnaryParams p;
  EXPECT_EQ(ir::float_unary_op_of(gelu, p), ir::UnaryOp::kGeluTanh);
  ir::Node selu;
  selu.op = "Selu";
  EXPECT_EQ(ir::float_unary_op_of(selu, p), ir::UnaryOp::kSelu);
  EXPECT_FLOAT_EQ(p.alpha, 1.67326319217681884765625f);
  EXPECT_FLOAT_EQ(p.beta, 1.05070102214813232421875f);
  ir::Node identity;
  identity.op = "Identity";
  EXPECT_THROW(ir::float_unary_op_of(identity, p), Error);
}

TEST(UnaryOps, TheMathKeepsStdMinAndMaxNanRules) {
  const float nan = std::nanf("");
  const ir::UnaryParams hard_sigmoid{0.2f, 0.5f};
  EXPECT_EQ(ir::unary_float<ir::UnaryOp::kHardSigmoid>(nan, hard_sigmoid), 1.f) << "std::min(1.f, NaN) is 1";
  EXPECT_TRUE(std::isnan(ir::unary_float<ir::UnaryOp::kSoftplus>(nan, {})));
  EXPECT_EQ(ir::unary_float<ir::UnaryOp::kRound>(2.5f, {}), 2.f) << "half to even";
  EXPECT_EQ(ir::with_float_unary_op(ir::UnaryOp::kNeg, [](auto k) { return ir::unary_float<decltype(k)::value>(3.f, {}); }), -3.f);
  EXPECT_THROW(ir::with_float_unary_op(ir::UnaryOp::kNot, [](auto) { return 0.f; }), Error);
}

// The CPU kernels of Sigmoid, Tanh and Exp map 16 values at a time on AVX-512 (cpu/vector_exp.h)
// and one at a time by libm otherwise: both within a few ulp of libm's float math everywhere,
// the same at the ends of the range (overflow, flush to zero, infinities, NaN, signed zero), over
// a tensor long enough to be split among threads, with a tail shorter than a vector.
TEST(UnaryOps, SigmoidTanhAndExpKernelsFollowLibmOnEveryIsa) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> values = {-1e30f, -200.f, -89.f, -88.5f, -87.5f, -87.f, -86.9f, -44.5f, -30.f, -10.f, -1.f,
                               -0.26f, -0.25f, -0.24f, -1e-3f, -1e-30f, -0.f, 0.f, 1e-30f, 1e-3f, 0.24f, 0.25f,
                               0.26f, 1.f, 10.f, 30.f, 44.5f, 86.9f, 87.f, 88.2f, 88.4f, 89.f, 200.f, 1e30f, inf,
                               -inf, nan};
  while (values.size() < 70001) values.push_back(static_cast<float>(static_cast<int64_t>(values.size()) - 35000) * 0.0029f);
  Tensor x(DType::kFloat32, {static_cast<int64_t>(values.size())});
  std::memcpy(x.raw(), values.data(), values.size() * sizeof(float));
  const auto ulps = [](float a, float b) {
    int32_t ia, ib;
    std::memcpy(&ia, &a, 4);
    std::memcpy(&ib, &b, 4);
    return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
  };
  const cpu::SgemmIsa best = cpu::sgemm_best_isa();
  for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kAvx2, cpu::SgemmIsa::kAvx512}) {
    if (best < isa) continue;
    cpu::sgemm_force_isa(isa);
    for (const char* op : {"Sigmoid", "Tanh", "Exp"}) {
      SCOPED_TRACE(std::string(op) + " on " + cpu::sgemm_isa_name(isa));
      ir::Node node;
      node.op = op;
      const Tensor y = testing::run_single_node(node, {{"x", x}});
      ir::UnaryParams p;
      const ir::UnaryOp kind = ir::float_unary_op_of(node, p);
      int failures = 0;
      for (size_t i = 0; i < values.size() && failures < 5; ++i) {
        const float want = ir::with_float_unary_op(kind, [&](auto k) { return ir::unary_float<decltype(k)::value>(values[i], p); });
        const float got = y.data<float>()[i];
        const bool ok = std::isnan(want) ? std::isnan(got)
                        : std::isinf(want) || want == 0.f ? got == want && std::signbit(got) == std::signbit(want)
                        : std::fabs(want) < 1e-37f ? std::fabs(got) < 1e-37f  // e^x below float's normals: 0 or the denormal
                                                   : ulps(got, want) <= 8;
        if (!ok) {
          ++failures;
          ADD_FAILURE() << op << "(" << values[i] << ") = " << got << ", libm's " << want;
        }
      }
    }
  }
  cpu::sgemm_force_isa(best);
}

}  // namespace
}  // namespace kiln
