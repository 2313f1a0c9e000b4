// Helpers for the elementwise, pooling and reduction tests: random tensors, running one node
// through shape inference and the CPU engine, and naive multi-index helpers for references.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu/engine.h"
#include "ir/op_schema.h"
#include "kiln/tensor.h"

namespace kiln::ew_test {

// Path of a file in tests/data/. From KILN_SOURCE_DIR (tests/CMakeLists.txt), not __FILE__:
// a build through ccache with CCACHE_BASEDIR (scripts/setup.sh) compiles with relative paths.
inline std::string test_data(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/tests/data/" + name;
}

inline Tensor random_floats(std::vector<int64_t> shape, uint32_t seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t(DType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// Inputs of a one-node graph: runtime inputs unless `constant`. An undefined tensor means
// an omitted optional input.
struct In {
  Tensor data;
  bool constant = false;
};

inline ir::Graph one_node_graph(ir::Node node, const std::vector<In>& inputs, size_t num_outputs = 1) {
  ir::Graph g;
  g.name = "test";
  g.opset = 18;
  node.name = node.name.empty() ? "n0" : node.name;
  node.inputs.clear();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].data.defined()) {
      node.inputs.push_back("");
      continue;
    }
    std::string name = "x" + std::to_string(i);
    ir::Value v;
    v.name = name;
    v.type.dtype = inputs[i].data.dtype();
    v.type.shape = ir::dims_of(inputs[i].data.shape());
    if (inputs[i].constant) v.constant = inputs[i].data;
    else g.inputs.push_back(name);
    g.set_value(std::move(v));
    node.inputs.push_back(name);
  }
  node.outputs.clear();
  for (size_t o = 0; o < num_outputs; ++o) {
    node.outputs.push_back("y" + std::to_string(o));
    g.outputs.push_back(node.outputs.back());
  }
  g.nodes.push_back(std::move(node));
  ir::infer_shapes(g);
  return g;
}

// Builds, infers and runs one node on the CPU engine; returns its outputs in order.
inline std::vector<Tensor> run_node(ir::Node node, const std::vector<In>& inputs, size_t num_outputs = 1) {
  ir::Graph g = one_node_graph(std::move(node), inputs, num_outputs);
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].data.defined() && !inputs[i].constant) feeds["x" + std::to_string(i)] = inputs[i].data;
  cpu::CpuEngine engine(std::move(g));
  auto result = engine.run(feeds);
  std::vector<Tensor> out;
  for (size_t o = 0; o < num_outputs; ++o) out.push_back(result.at("y" + std::to_string(o)));
  return out;
}

inline ir::Node make_node(const std::string& op) {
  ir::Node n;
  n.op = op;
  return n;
}

// Row-major multi-index of flat index i.
inline std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? i % shape[d] : 0;
    if (shape[d]) i /= shape[d];
  }
  return idx;
}

// Flat index into `shape` of a multi-index of the (broadcast) output: numpy broadcasting,
// with `shape` right-aligned and size-1 dims read at 0.
inline int64_t broadcast_index(const std::vector<int64_t>& out_idx, const std::vector<int64_t>& shape) {
  int64_t flat = 0;
  size_t lead = out_idx.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + (shape[d] == 1 ? 0 : out_idx[lead + d]);
  return flat;
}

inline void expect_close(const Tensor& got, const std::vector<float>& want, float tol = 1e-5f) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got.data<float>()[i], want[i], tol * (1.f + std::fabs(want[i]))) << "element " << i;
}

}  // namespace kiln::ew_test
