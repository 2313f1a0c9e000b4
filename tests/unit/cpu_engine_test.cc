// The CPU engine: its buffer recycling never hands out memory a caller still holds; a
// convolution written into its residual's buffer computes what it computes into a fresh one, and
// leaves alone a residual something else still reads; runs from several threads match serial
// runs; memory stays flat run after run; output types inferred once per input signature still
// follow the values that decide them, and timed runs count the same work each run.
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <map>
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

// Output types are inferred once per input signature: each run here changes only values that
// decide a shape (NonZero's count of nonzeros in a large input, a Reshape's computed shape, a
// Resize's runtime scales) or the batch, and every run must still get the shapes it computes.
TEST(CpuEngine, ShapesDecidedByValuesAreInferredForEachRun) {
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 100});
  b.input("shape", {2}, DType::kInt64);
  b.input("scales", {4});
  b.node("NonZero", {"x"}, "nz");
  b.node("Reshape", {"x", "shape"}, "reshaped");
  b.node("Unsqueeze", {"x", b.ints("axes", {0, 1})}, "x4");
  b.node("Resize", {"x4", "", "scales"}, "resized", {{"mode", std::string("nearest")}});
  for (const char* y : {"nz", "reshaped", "resized"}) b.output(y);
  cpu::CpuEngine engine(b.build());
  auto run = [&](int64_t batch, int64_t nonzeros, std::vector<int64_t> shape, float scale) {
    Tensor x(DType::kFloat32, {batch, 100});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = i < nonzeros ? 1.f : 0.f;
    Tensor s = Tensor::from_vector<int64_t>({2}, shape);
    Tensor scales = Tensor::from_vector<float>({4}, {1.f, 1.f, 1.f, scale});
    return engine.run({{"x", x}, {"shape", s}, {"scales", scales}});
  };
  for (int pass = 0; pass < 2; ++pass) {  // the second pass meets every signature again
    std::map<std::string, Tensor> a = run(2, 7, {4, 50}, 1.f);
    EXPECT_EQ(a.at("nz").shape(), (std::vector<int64_t>{2, 7}));
    EXPECT_EQ(a.at("reshaped").shape(), (std::vector<int64_t>{4, 50}));
    EXPECT_EQ(a.at("resized").shape(), (std::vector<int64_t>{1, 1, 2, 100}));
    std::map<std::string, Tensor> c = run(2, 150, {50, 4}, 2.f);
    EXPECT_EQ(c.at("nz").shape(), (std::vector<int64_t>{2, 150}));
    EXPECT_EQ(c.at("reshaped").shape(), (std::vector<int64_t>{50, 4}));
    EXPECT_EQ(c.at("resized").shape(), (std::vector<int64_t>{1, 1, 2, 200}));
    std::map<std::string, Tensor> d = run(3, 0, {3, 100}, 2.f);
    EXPECT_EQ(d.at("nz").shape(), (std::vector<int64_t>{2, 0}));
    EXPECT_EQ(d.at("reshaped").shape(), (std::vector<int64_t>{3, 100}));
    EXPECT_EQ(d.at("resized").shape(), (std::vector<int64_t>{1, 1, 3, 200}));
  }
}

// A run that reuses its steps' output types counts their FLOPs and bytes as the first run did.
TEST(CpuEngine, TimedRunsCountTheSameWorkEachRun) {
  GraphBuilder b;
  b.input("x", {6, 20});
  b.node("Relu", {"x"}, "r");
  b.node("MatMul", {"r", b.random("w", {20, 12})}, "y");  // r's last reader: its buffer goes back to the pool
  b.output("y");
  cpu::CpuEngine engine(b.build());
  const std::map<std::string, Tensor> inputs = random_inputs(engine.graph(), 5);
  cpu::CpuEngine::StepTimes first, second;
  engine.run(inputs, first);
  engine.run(inputs, second);
  ASSERT_EQ(first.flops.size(), 2u);
  EXPECT_EQ(first.flops.back(), 2.0 * 6 * 20 * 12);  // the product: 2 x M x K x N
  EXPECT_EQ(first.flops, second.flops);
  EXPECT_EQ(first.bytes, second.bytes);
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

// Same shape and the same bytes.
bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// y = ChannelsLastConv(x, w, b, z) with z = Relu(r): z is the engine's own buffer and dies at
// the convolution, which may then write y into it. With z also a graph output it stays, and y
// goes to a fresh buffer: both graphs give the same y, and z keeps its values.
ir::Graph residual_conv(const std::vector<int64_t>& w_shape, int64_t k, int64_t group, bool z_is_output) {
  const int64_t m = w_shape[0], c = w_shape[1] * group;
  GraphBuilder b;
  b.input("x", {1, 9, 10, c});
  b.input("r", {1, 9, 10, m});
  b.node("Relu", {"r"}, "z");
  b.node("ChannelsLastConv", {"x", b.random("w", w_shape), b.random("b", {m}), "z"}, "y",
         {{"kernel_shape", std::vector<int64_t>{k, k}}, {"pads", std::vector<int64_t>(4, k / 2)}, {"group", group},
          {"activation", std::string("Relu")}});
  b.last().domain = "kiln";
  b.output("y");
  if (z_is_output) b.output("z");
  return b.build();
}

TEST(CpuEngine, AConvolutionWrittenIntoItsResidualsBufferComputesTheSame) {
  struct Case {
    const char* name;
    std::vector<int64_t> w;
    int64_t k, group;
  };
  // Pointwise and 3x3 (one K block), depthwise, and K = 600 (blocks: never in place).
  for (const Case& c : {Case{"pointwise", {24, 16, 1, 1}, 1, 1}, Case{"3x3", {20, 16, 3, 3}, 3, 1},
                        Case{"depthwise", {32, 1, 3, 3}, 3, 32}, Case{"K of 600", {24, 600, 1, 1}, 1, 1}}) {
    SCOPED_TRACE(c.name);
    const int64_t m = c.w[0], channels = c.w[1] * c.group;
    cpu::CpuEngine in_place(residual_conv(c.w, c.k, c.group, false), 0, /*poison_outputs=*/true);
    cpu::CpuEngine kept(residual_conv(c.w, c.k, c.group, true), 0, /*poison_outputs=*/true);
    const Tensor x = random_image({1, 9, 10, channels}, 1), r = random_image({1, 9, 10, m}, 2);
    for (int run = 0; run < 2; ++run) {  // the second run recycles the first's buffers
      const std::map<std::string, Tensor> a = in_place.run({{"x", x}, {"r", r}});
      const std::map<std::string, Tensor> b = kept.run({{"x", x}, {"r", r}});
      EXPECT_TRUE(same_bytes(a.at("y"), b.at("y")));
      const Tensor& z = b.at("z");
      for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.data<float>()[i], std::max(r.data<float>()[i], 0.f)) << i;
    }
  }
}

// y = Unsqueeze(a), a = Relu(x): the Unsqueeze is handed a's buffer where no one reads a after
// it, and copies nothing; where a is also a graph output, or read again by a later node, it copies
// into a buffer of its own. Every variant gives the same values, run after run (a fresh buffer is
// poisoned, so a copy left out would show), and while y lives the engine handed over holds that
// one buffer, where copying would hold a's too (back in its pool).
ir::Graph reshape_chain(bool a_is_output, bool a_read_again) {
  GraphBuilder b;
  b.input("x", {4, 64, 64});
  b.node("Relu", {"x"}, "a");
  b.node("Unsqueeze", {"a", b.ints("axes", {1})}, "y");
  b.output("y");
  if (a_read_again) {
    b.node("Neg", {"a"}, "n");
    b.output("n");
  }
  if (a_is_output) b.output("a");
  return b.build();
}

TEST(CpuEngine, AReshapeOfADeadValueTakesItsBuffer) {
  const Tensor x = random_image({4, 64, 64}, 5);
  const size_t bytes = static_cast<size_t>(x.nbytes());
  cpu::CpuEngine handed(reshape_chain(false, false), 0, /*poison_outputs=*/true);
  cpu::CpuEngine kept(reshape_chain(true, false), 0, /*poison_outputs=*/true);
  cpu::CpuEngine read_again(reshape_chain(false, true), 0, /*poison_outputs=*/true);
  for (int run = 0; run < 3; ++run) {
    const std::map<std::string, Tensor> a = handed.run({{"x", x}});
    const std::map<std::string, Tensor> b = kept.run({{"x", x}});
    const std::map<std::string, Tensor> c = read_again.run({{"x", x}});
    ASSERT_EQ(a.at("y").shape(), (std::vector<int64_t>{4, 1, 64, 64}));
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float want = std::max(x.data<float>()[i], 0.f);
      ASSERT_EQ(a.at("y").data<float>()[i], want) << i;
      ASSERT_EQ(b.at("y").data<float>()[i], want) << i;
      ASSERT_EQ(b.at("a").data<float>()[i], want) << i;
      ASSERT_EQ(c.at("y").data<float>()[i], want) << i;
      ASSERT_EQ(c.at("n").data<float>()[i], -want) << i;
    }
    EXPECT_EQ(handed.memory_held(), bytes);
    EXPECT_EQ(kept.memory_held(), 2 * bytes);  // a and y, both the caller's
  }
  // The caller's own input is copied, never taken: y does not follow x when x changes.
  GraphBuilder g;
  g.input("x", {4, 64, 64});
  g.node("Unsqueeze", {"x", g.ints("axes", {0})}, "y");
  g.output("y");
  cpu::CpuEngine of_input(g.build());
  Tensor x_copy(DType::kFloat32, x.shape());
  std::memcpy(x_copy.raw(), x.raw(), x.nbytes());
  const Tensor y = of_input.run({{"x", x_copy}}).at("y");
  EXPECT_NE(y.raw(), x_copy.raw());
  x_copy.data<float>()[0] += 1.f;
  EXPECT_EQ(y.data<float>()[0], x.data<float>()[0]);
}

// A residual the caller gave (a graph input) is never written.
TEST(CpuEngine, ACallersResidualIsNotWrittenInto) {
  GraphBuilder b;
  b.input("x", {1, 4, 5, 8});
  b.input("z", {1, 4, 5, 8});
  b.node("ChannelsLastConv", {"x", b.random("w", {8, 8, 1, 1}), b.random("b", {8}), "z"}, "y",
         {{"kernel_shape", std::vector<int64_t>{1, 1}}});
  b.last().domain = "kiln";
  b.output("y");
  cpu::CpuEngine engine(b.build());
  const Tensor x = random_image({1, 4, 5, 8}, 3), z = random_image({1, 4, 5, 8}, 4);
  Tensor z_before(DType::kFloat32, z.shape());
  std::memcpy(z_before.raw(), z.raw(), z.nbytes());
  engine.run({{"x", x}, {"z", z}});
  EXPECT_TRUE(same_bytes(z, z_before));
}

// Runs differs(thread, run) for `runs` runs on each of `threads` threads at once; how many
// returned true.
template <class Differs>
int mismatches_on_threads(int threads, int runs, Differs differs) {
  std::atomic<int> mismatches{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      for (int r = 0; r < runs; ++r)
        if (differs(t, r)) ++mismatches;
    });
  for (std::thread& w : workers) w.join();
  return mismatches.load();
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
  const int mismatches = mismatches_on_threads(kThreads, kRuns, [&](int t, int r) {
    const size_t i = static_cast<size_t>((t * 7 + r * 3) % 16);
    return !same_bytes(engine.run({{"x", inputs[i]}}).at("y"), expected[i]);
  });
  EXPECT_EQ(mismatches, 0) << "of " << kThreads * kRuns << " concurrent runs";
}

// The kernels that keep scratch buffers per calling thread (thread_local): the int8 GEMM's
// convolutions (unrolled input, packed panels, and the rows form of a 1x1 image batch), the
// MatMul by packed constant weights, and Attention's transposed keys.
ir::Graph int8_and_products() {
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 16, ir::Dim::named("H"), ir::Dim::named("W")});
  b.scalar("x_scale", 0.02f);
  b.constant("x_zero", Tensor(DType::kInt8, {}));
  b.node("QuantizeLinear", {"x", "x_scale", "x_zero"}, "xq");
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> dist(-100, 100);
  auto int8_weights = [&](std::vector<int64_t> shape) {
    Tensor t(DType::kInt8, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int8_t>()[i] = static_cast<int8_t>(dist(rng));
    return t;
  };
  b.constant("w1", int8_weights({24, 16, 3, 3}));
  b.random("b1", {24}, -0.1f, 0.1f);
  b.node("QConv", {"xq", "w1", "b1"}, "y1",
         {{"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"kernel_shape", std::vector<int64_t>{3, 3}},
          {"x_scale", 0.02f}, {"w_scales", std::vector<float>(24, 0.004f)}, {"y_scale", 0.05f},
          {"activation", std::string("Relu")}});
  b.last().domain = "kiln";
  b.constant("w2", int8_weights({16, 24, 1, 1}));
  b.node("QConv", {"y1", "w2"}, "y2",
         {{"x_scale", 0.05f}, {"w_scales", std::vector<float>(16, 0.003f)}, {"activation", std::string("")}});
  b.last().domain = "kiln";
  b.node("GlobalAveragePool", {"y2"}, "pooled");
  b.node("Flatten", {"pooled"}, "flat");
  b.random("w3", {16, 10});
  b.random("b3", {10});
  b.node("FusedMatMul", {"flat", "w3", "b3"}, "y", {{"activation", std::string("Gelu")}});
  b.last().domain = "kiln";
  b.output("y");
  return b.build();
}

ir::Graph attention_block() {
  GraphBuilder b;
  for (const char* name : {"q", "k", "v"}) b.input(name, {ir::Dim::named("B"), 2, ir::Dim::named("S"), 8});
  b.node("Attention", {"q", "k", "v"}, "y", {{"is_causal", int64_t{1}}});
  b.output("y");
  return b.build();
}

TEST(CpuEngine, ThreadsSharingInt8ProductAndAttentionEnginesMatchSerialRuns) {
  cpu::CpuEngine int8_engine(int8_and_products()), attention(attention_block());
  const std::vector<std::vector<int64_t>> images = {{1, 16, 8, 8}, {3, 16, 5, 7}, {2, 16, 12, 12}, {3, 16, 1, 1}};
  const std::vector<std::vector<int64_t>> heads = {{1, 2, 5, 8}, {2, 2, 40, 8}, {3, 2, 17, 8}};
  struct Case {
    cpu::CpuEngine* engine;
    std::map<std::string, Tensor> feeds;
    Tensor expected;
  };
  std::vector<Case> cases;
  for (unsigned i = 0; i < 12; ++i) {
    if (i % 2 == 0) {
      std::map<std::string, Tensor> feeds{{"x", random_image(images[(i / 2) % images.size()], i)}};
      Tensor y = int8_engine.run(feeds).at("y");
      cases.push_back({&int8_engine, std::move(feeds), std::move(y)});
    } else {
      const std::vector<int64_t>& shape = heads[(i / 2) % heads.size()];
      std::map<std::string, Tensor> feeds{
          {"q", random_image(shape, 100 + i)}, {"k", random_image(shape, 200 + i)}, {"v", random_image(shape, 300 + i)}};
      Tensor y = attention.run(feeds).at("y");
      cases.push_back({&attention, std::move(feeds), std::move(y)});
    }
  }
  constexpr int kThreads = 6, kRuns = 40;
  const int mismatches = mismatches_on_threads(kThreads, kRuns, [&](int t, int r) {
    const Case& c = cases[static_cast<size_t>((t * 5 + r * 7) % 12)];
    return !same_bytes(c.engine->run(c.feeds).at("y"), c.expected);
  });
  EXPECT_EQ(mismatches, 0) << "of " << kThreads * kRuns << " concurrent runs";
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
