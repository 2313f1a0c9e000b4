// The CPU engine's buffer recycling must never hand out memory that a caller still holds.
#include <gtest/gtest.h>

#include "cpu/engine.h"
#include "graph_builder.h"

namespace kiln::testing {
namespace {

TEST(CpuEngine, OutputsHeldByTheCallerSurviveLaterRuns) {
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 64});
  b.node("Relu", {"x"}, "r");
  b.node("Neg", {"r"}, "n");
  b.node("Abs", {"n"}, "y");
  b.output("y");
  cpu::CpuEngine engine(b.build());

  auto run = [&](float value, int64_t batch) {
    Tensor x(DType::kFloat32, {batch, 64});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = value;
    return engine.run({{"x", x}}).at("y");
  };
  Tensor first = run(3.f, 4);
  Tensor input_kept(DType::kFloat32, {4, 64});
  for (int pass = 0; pass < 3; ++pass) {  // later runs recycle the intermediates' buffers
    Tensor later = run(5.f + static_cast<float>(pass), pass == 1 ? 8 : 4);
    EXPECT_EQ(later.data<float>()[0], 5.f + static_cast<float>(pass));
  }
  for (int64_t i = 0; i < first.numel(); ++i) ASSERT_EQ(first.data<float>()[i], 3.f) << i;
}

TEST(CpuEngine, CallerInputsAreNeitherRecycledNorChanged) {
  GraphBuilder b;
  b.input("x", {2, 8});
  b.node("Relu", {"x"}, "r");
  b.node("Neg", {"r"}, "y");
  b.output("y");
  cpu::CpuEngine engine(b.build());
  Tensor x(DType::kFloat32, {2, 8});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i);
  Tensor y1 = engine.run({{"x", x}}).at("y");
  Tensor y2 = engine.run({{"x", x}}).at("y");
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(x.data<float>()[i], static_cast<float>(i));
    ASSERT_EQ(y1.data<float>()[i], -static_cast<float>(i));
    ASSERT_EQ(y2.data<float>()[i], -static_cast<float>(i));
  }
}

}  // namespace
}  // namespace kiln::testing
