// What the fuzzers found (fuzz/), one test each: the smallest model that showed it, run as
// it then was. Their inputs are also kept as seeds in fuzz/seeds/ (<name>.onnx for
// fuzz_onnx_import, <name>.graph for fuzz_graph). Several of these failures are undefined
// behaviour that only a sanitizer build sees: the fuzz build runs this file under ASan and
// UBSan too (fuzz_regression_tests, CTest label "fuzz").
#include <gtest/gtest.h>

#include "cpu/engine.h"
#include "graph_builder.h"

namespace kiln {
namespace {

using testing::GraphBuilder;

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

}  // namespace
}  // namespace kiln
