// The elementwise unary ops' one table (src/ir/unary_ops.h): every stage takes its ops from it.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "cpu/kernel.h"
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

}  // namespace
}  // namespace kiln
