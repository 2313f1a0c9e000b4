// The CPU engine: its buffer recycling never hands out memory a caller still holds; runs from
// several threads match serial runs; memory stays flat run after run.
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

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

namespace kiln::testing {
namespace {

// A residual block with symbolic batch and spatial dims: convolutions keep scratch buffers in
// their kernels, which concurrent runs would share if the engine did not serialize them.
ir::Graph residual_block() {
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 4, ir::Dim::named("H"), ir::Dim::named("W")});
  b.random("w1", {4, 4, 3, 3});
  b.random("b1", {4});
  b.random("w2", {4, 4, 3, 3});
  std::vector<std::pair<std::string, ir::AttrValue>> conv = {{"pads", std::vector<int64_t>{1, 1, 1, 1}},
                                                            {"kernel_shape", std::vector<int64_t>{3, 3}}};
  b.node("Conv", {"x", "w1", "b1"}, "c1", conv);
  b.node("Relu", {"c1"}, "r1");
  b.node("Conv", {"r1", "w2"}, "c2", conv);
  b.node("Add", {"c2", "x"}, "s");
  b.node("Relu", {"s"}, "y");
  b.output("y");
  return b.build();
}

Tensor random_image(const std::vector<int64_t>& shape, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  Tensor x(DType::kFloat32, shape);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
  return x;
}

const std::vector<std::vector<int64_t>> kShapes = {{1, 4, 8, 8}, {3, 4, 5, 7}, {2, 4, 16, 16}, {1, 4, 1, 1}};

TEST(CpuEngine, ThreadsSharingOneEngineAtMixedShapesMatchSerialRunsBitForBit) {
  cpu::CpuEngine engine(residual_block());
  std::vector<Tensor> inputs, expected;
  for (unsigned i = 0; i < 16; ++i) {
    inputs.push_back(random_image(kShapes[i % kShapes.size()], i));
    expected.push_back(engine.run({{"x", inputs.back()}}).at("y"));
  }
  constexpr int kThreads = 8, kRuns = 60;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRuns; ++r) {
        const size_t i = static_cast<size_t>((t * 7 + r * 3) % 16);
        const Tensor y = engine.run({{"x", inputs[i]}}).at("y");
        if (y.shape() != expected[i].shape() || std::memcmp(y.raw(), expected[i].raw(), y.nbytes()) != 0) ++mismatches;
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0) << "of " << kThreads * kRuns << " concurrent runs";
}

TEST(CpuEngine, MemoryStaysFlatAcrossTenThousandRuns) {
  cpu::CpuEngine engine(residual_block());
  std::vector<Tensor> inputs;
  for (unsigned i = 0; i < kShapes.size(); ++i) inputs.push_back(random_image(kShapes[i], i));
  auto run_all = [&](int rounds) {
    for (int r = 0; r < rounds; ++r)
      for (const Tensor& x : inputs) engine.run({{"x", x}});
  };
  run_all(25);  // every shape's buffers made once
  const size_t held = engine.memory_held();
  const size_t heap = mallinfo2().uordblks;
  run_all(2500);  // 10,000 runs
  EXPECT_EQ(engine.memory_held(), held);
  // Nothing else accumulates either (a leak of even a few bytes a run would show here).
  EXPECT_LE(mallinfo2().uordblks, heap + (64 << 10));
}

}  // namespace
}  // namespace kiln::testing
