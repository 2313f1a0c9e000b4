// Tests of reduce_mean_to_global_pool: ReduceMean over the spatial axes of a rank-4 float32 value
// becomes GlobalAveragePool (with Flatten where keepdims is 0) and computes the same, its constant
// axes negative or not; other reductions stay.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

TEST(ReduceMeanToGlobalPool, SpatialMeansBecomePools) {
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 6, 5, 7});
  b.node("ReduceMean", {"x", b.ints("axes23", {2, 3})}, "kept");  // keepdims 1 by default
  b.node("ReduceMean", {"x", b.ints("axes_negative", {-1, -2})}, "flat", {{"keepdims", int64_t{0}}});
  b.output("kept");
  b.output("flat");
  const ir::Graph before = b.build();
  ir::Graph after = before;
  EXPECT_EQ(passes::reduce_mean_to_global_pool(after), 2);
  ir::infer_shapes(after);
  EXPECT_EQ(count_ops(after, "ReduceMean"), 0);
  EXPECT_EQ(count_ops(after, "GlobalAveragePool"), 2);
  EXPECT_EQ(count_ops(after, "Flatten"), 1);
  EXPECT_EQ(after.value("flat").type.rank(), 2);
  EXPECT_EQ(after.value("kept").type.rank(), 4);
  expect_same_outputs(before, after);
  EXPECT_EQ(passes::reduce_mean_to_global_pool(after), 0);
}

TEST(ReduceMeanToGlobalPool, OtherReductionsStay) {
  GraphBuilder b;
  b.input("x", {2, 6, 5, 7});
  b.input("t", {2, 5, 7});
  b.input("axes", {2}, DType::kInt64);
  b.node("ReduceMean", {"x", b.ints("axes12", {1, 2})}, "channels");
  b.node("ReduceMean", {"x", b.ints("axes3", {3})}, "width");
  b.node("ReduceMean", {"t", "axes12"}, "rank3");
  b.node("ReduceMean", {"x"}, "everything");  // no axes: every axis
  b.node("ReduceMean", {"x", "axes"}, "runtime_axes");  // axes known only at run time
  b.node("ReduceSum", {"x", b.ints("sum_axes", {2, 3})}, "sum");
  for (const char* y : {"channels", "width", "rank3", "everything", "runtime_axes", "sum"}) b.output(y);
  ir::Graph g = b.build();
  EXPECT_EQ(passes::reduce_mean_to_global_pool(g), 0);
  EXPECT_EQ(count_ops(g, "GlobalAveragePool"), 0);
}

}  // namespace
}  // namespace kiln::testing
