// Tests of expand_gemm_c: a Gemm's runtime C of a broadcast shape gets an Expand to [M, N] in
// front of it and the Gemm computes what it computed; a whole [M, N] or a constant C stays.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

ir::Graph gemm_with_runtime_c(ir::Dims c_dims, std::vector<std::pair<std::string, ir::AttrValue>> attrs = {}) {
  GraphBuilder b;
  b.input("a", {3, 5});
  b.input("b", {5, 4});
  b.input("c", std::move(c_dims));
  b.node("Gemm", {"a", "b", "c"}, "y", std::move(attrs));
  b.output("y");
  return b.build();
}

TEST(ExpandGemmC, BroadcastShapesAreExpandedToTheProduct) {
  for (const ir::Dims& dims : {ir::Dims{1, 4}, ir::Dims{4}, ir::Dims{}, ir::Dims{3, 1}, ir::Dims{1}}) {
    const ir::Graph before = gemm_with_runtime_c(dims, {{"alpha", 0.5f}, {"beta", 2.f}});
    ir::Graph after = before;
    ASSERT_EQ(passes::expand_gemm_c(after), 1) << dims_to_string(dims);
    ir::infer_shapes(after);
    ASSERT_EQ(count_ops(after, "Expand"), 1);
    for (const ir::Node& n : after.nodes)
      if (n.op == "Gemm") EXPECT_EQ(*after.value(n.inputs[2]).type.shape, (ir::Dims{3, 4}));
    expect_same_outputs(before, after);
  }
}

TEST(ExpandGemmC, AWholeMatrixOrAConstantStays) {
  ir::Graph whole = gemm_with_runtime_c({3, 4});
  EXPECT_EQ(passes::expand_gemm_c(whole), 0);
  GraphBuilder b;
  b.input("a", {3, 5});
  b.node("Gemm", {"a", b.random("b", {5, 4}), b.random("c", {1, 4})}, "y");
  b.output("y");
  ir::Graph constant = b.build();
  EXPECT_EQ(passes::expand_gemm_c(constant), 0);
  ir::Graph unknown = gemm_with_runtime_c({1, 4});
  unknown.value("y").type.shape = ir::Dims{ir::Dim::unknown(), 4};
  EXPECT_EQ(passes::expand_gemm_c(unknown), 0);
}

}  // namespace
}  // namespace kiln::testing
