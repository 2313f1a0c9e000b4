// One CPU engine shared by threads through the public API, as kiln.h promises: runs at mixed
// shapes from several threads match serial runs bit for bit while other threads call the const
// methods (inputs(), info(), save()) at the same time. The ThreadSanitizer build
// (-DKILN_TSAN=ON, the "tsan" test label) runs this with every access of the core checked.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/kiln.h"
#include "onnx.pb.h"

namespace kiln::testing {
namespace {

void add_dims(onnx::ValueInfoProto* value, const std::vector<std::string>& dims) {
  value->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  auto* shape = value->mutable_type()->mutable_tensor_type()->mutable_shape();
  for (const std::string& d : dims) {
    if (!d.empty() && std::isdigit(static_cast<unsigned char>(d[0])))
      shape->add_dim()->set_dim_value(std::stoll(d));
    else
      shape->add_dim()->set_dim_param(d);
  }
}

void add_weight(onnx::GraphProto* graph, const std::string& name, const std::vector<int64_t>& dims, unsigned seed) {
  onnx::TensorProto* w = graph->add_initializer();
  w->set_name(name);
  w->set_data_type(onnx::TensorProto::FLOAT);
  int64_t count = 1;
  for (int64_t d : dims) w->add_dims(d), count *= d;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-0.3f, 0.3f);
  for (int64_t i = 0; i < count; ++i) w->add_float_data(dist(rng));
}

onnx::NodeProto* add_node(onnx::GraphProto* graph, const std::string& op, const std::vector<std::string>& inputs,
                          const std::string& output) {
  onnx::NodeProto* n = graph->add_node();
  n->set_op_type(op);
  n->set_name(output);
  for (const std::string& in : inputs) n->add_input(in);
  n->add_output(output);
  return n;
}

void add_ints(onnx::NodeProto* node, const std::string& name, const std::vector<int64_t>& values) {
  onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

// Convolutions (ConvTranspose keeps a scratch buffer between runs: what Engine::run's
// serializing is for), a matrix product wide enough for the kernels' parallel paths, a softmax;
// batch and spatial dimensions symbolic, so that runs at different shapes interleave.
std::string write_model(const std::filesystem::path& dir) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  onnx::GraphProto* g = model.mutable_graph();
  g->set_name("threads");
  add_dims(g->add_input(), {"N", "8", "H", "W"});
  g->mutable_input(0)->set_name("x");
  add_weight(g, "w1", {32, 8, 3, 3}, 1);
  add_weight(g, "b1", {32}, 2);
  add_weight(g, "w2", {8, 32, 1, 1}, 3);
  add_weight(g, "wt", {8, 8, 3, 3}, 4);
  add_weight(g, "m", {8, 300}, 5);
  onnx::NodeProto* c1 = add_node(g, "Conv", {"x", "w1", "b1"}, "c1");
  add_ints(c1, "pads", {1, 1, 1, 1});
  add_ints(c1, "kernel_shape", {3, 3});
  add_node(g, "Relu", {"c1"}, "r1");
  add_node(g, "Conv", {"r1", "w2"}, "c2");
  add_node(g, "Add", {"c2", "x"}, "s");
  onnx::NodeProto* ct = add_node(g, "ConvTranspose", {"s", "wt"}, "ct");
  add_ints(ct, "pads", {1, 1, 1, 1});
  add_ints(ct, "kernel_shape", {3, 3});
  onnx::NodeProto* t = add_node(g, "Transpose", {"ct"}, "t");
  add_ints(t, "perm", {0, 2, 3, 1});
  add_node(g, "MatMul", {"t", "m"}, "p");
  add_node(g, "Softmax", {"p"}, "y");
  add_dims(g->add_output(), {"N", "H", "W", "300"});
  g->mutable_output(0)->set_name("y");
  const std::string path = (dir / "threads.onnx").string();
  std::ofstream f(path, std::ios::binary);
  model.SerializeToOstream(&f);
  return path;
}

Tensor random_input(const std::vector<int64_t>& shape, unsigned seed) {
  Tensor x(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
  return x;
}

class EngineThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kiln-engine-threads-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(EngineThreads, RunsAtMixedShapesBesideConstMethodsMatchSerialRunsBitForBit) {
  const Engine engine = Engine::from_onnx(write_model(dir_));
  const std::vector<std::vector<int64_t>> shapes = {{1, 8, 8, 8}, {2, 8, 5, 7}, {3, 8, 16, 16}, {1, 8, 1, 1}};
  std::vector<Tensor> inputs, expected;
  for (unsigned i = 0; i < 8; ++i) {
    inputs.push_back(random_input(shapes[i % shapes.size()], 10 + i));
    expected.push_back(engine.run({{"x", inputs.back()}}).at("y"));
  }
  constexpr int kRunners = 4, kRuns = 12;
  std::atomic<int> mismatches{0}, runners_left{kRunners}, observer_calls{0};
  std::vector<std::string> errors(kRunners + 2);
  std::vector<std::thread> threads;
  for (int t = 0; t < kRunners; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int r = 0; r < kRuns; ++r) {
          const size_t i = static_cast<size_t>((t * 3 + r) % inputs.size());
          const Tensor y = engine.run({{"x", inputs[i]}}).at("y");
          if (y.shape() != expected[i].shape() || std::memcmp(y.raw(), expected[i].raw(), y.nbytes()) != 0)
            ++mismatches;
        }
      } catch (const Error& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
      --runners_left;
    });
  // While the runners run: the const methods, from two more threads.
  threads.emplace_back([&] {
    try {
      while (runners_left > 0) {
        if (engine.inputs().at(0).name != "x" || engine.outputs().at(0).name != "y" || engine.backend() != "cpu")
          errors[kRunners] = "the engine's descriptions changed during runs";
        if (engine.info().layers.empty()) errors[kRunners] = "info() listed no layers";
        ++observer_calls;
      }
    } catch (const Error& e) {
      errors[kRunners] = e.what();
    }
  });
  threads.emplace_back([&] {
    try {
      for (int i = 0; runners_left > 0; ++i) engine.save((dir_ / ("saved" + std::to_string(i % 2) + ".engine")).string());
    } catch (const Error& e) {
      errors[kRunners + 1] = e.what();
    }
  });
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(mismatches.load(), 0) << "of " << kRunners * kRuns << " concurrent runs";
  EXPECT_GT(observer_calls.load(), 0);
  // A file saved during the runs is a whole engine: it loads and computes the same.
  const Engine loaded = Engine::load((dir_ / "saved0.engine").string());
  const Tensor y = loaded.run({{"x", inputs[2]}}).at("y");
  ASSERT_EQ(y.shape(), expected[2].shape());
  EXPECT_EQ(std::memcmp(y.raw(), expected[2].raw(), y.nbytes()), 0);
}

}  // namespace
}  // namespace kiln::testing
