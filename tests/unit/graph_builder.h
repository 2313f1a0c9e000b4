// Builds small IR graphs tersely for pass and kernel tests, and compares a graph's outputs
// before and after a rewrite on random inputs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/engine.h"
#include "ir/graph.h"
#include "ir/op_schema.h"

namespace kiln::testing {

class GraphBuilder {
 public:
  // A runtime input; dims may be symbolic (ir::Dim::named("N")).
  std::string input(const std::string& name, ir::Dims dims, DType dtype = DType::kFloat32) {
    ir::Value v;
    v.name = name;
    v.type.dtype = dtype;
    v.type.shape = std::move(dims);
    g_.set_value(std::move(v));
    g_.inputs.push_back(name);
    return name;
  }
  // An initializer.
  std::string constant(const std::string& name, Tensor t) {
    ir::Value v;
    v.name = name;
    v.type.dtype = t.dtype();
    v.type.shape = ir::dims_of(t.shape());
    if (t.rank() <= 1 && is_integer(t.dtype()) && t.numel() <= 64) v.symbolic_value = ir::dims_of(t.to_int_vector());
    v.constant = std::move(t);
    g_.set_value(std::move(v));
    return name;
  }
  std::string ints(const std::string& name, std::vector<int64_t> values) {
    int64_t n = static_cast<int64_t>(values.size());
    return constant(name, Tensor::from_vector<int64_t>({n}, values));
  }
  std::string scalar(const std::string& name, float value) { return constant(name, Tensor::scalar<float>(value)); }
  // A float32 constant of uniform random values in [lo, hi).
  std::string random(const std::string& name, std::vector<int64_t> shape, float lo = -1.f, float hi = 1.f) {
    Tensor t(DType::kFloat32, std::move(shape));
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng_);
    return constant(name, std::move(t));
  }

  // A node with one output named `out` (its name is "<out>_node").
  std::string node(const std::string& op, std::vector<std::string> inputs, const std::string& out,
                   std::vector<std::pair<std::string, ir::AttrValue>> attrs = {}) {
    ir::Node n;
    n.name = out + "_node";
    n.op = op;
    n.inputs = std::move(inputs);
    n.outputs = {out};
    for (auto& [k, v] : attrs) n.attrs.set(k, std::move(v));
    g_.nodes.push_back(std::move(n));
    return out;
  }
  ir::Node& last() { return g_.nodes.back(); }
  void output(const std::string& name) { g_.outputs.push_back(name); }

  // The finished graph with shapes inferred (as the importer leaves it).
  ir::Graph build() {
    ir::Graph g = g_;
    g.topological_sort();
    ir::infer_shapes(g);
    return g;
  }

 private:
  ir::Graph g_;
  std::mt19937 rng_{1234};
};

// Random float inputs for every graph input; every symbolic dim takes the value `symbol_value`.
inline std::map<std::string, Tensor> random_inputs(const ir::Graph& g, unsigned seed, int64_t symbol_value = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::map<std::string, Tensor> out;
  for (const std::string& name : g.inputs) {
    const ir::TensorType& t = g.value(name).type;
    std::vector<int64_t> shape;
    for (const ir::Dim& d : *t.shape) shape.push_back(d.known() ? d.value : symbol_value);
    Tensor x(t.dtype, shape);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
    out[name] = x;
  }
  return out;
}

// Runs both graphs on the CPU engine with the same fresh random inputs (three draws) and
// expects every output to agree within 1e-5 relative to the output's magnitude.
inline void expect_same_outputs(const ir::Graph& before, const ir::Graph& after, int64_t symbol_value = 2) {
  ASSERT_EQ(before.outputs, after.outputs) << "a pass changed the graph's output names";
  cpu::CpuEngine ref(before);
  cpu::CpuEngine opt(after);
  for (unsigned seed : {1u, 2u, 3u}) {
    std::map<std::string, Tensor> inputs = random_inputs(before, seed, symbol_value);
    std::map<std::string, Tensor> a = ref.run(inputs);
    std::map<std::string, Tensor> b = opt.run(inputs);
    for (const std::string& name : before.outputs) {
      const Tensor& x = a.at(name);
      const Tensor& y = b.at(name);
      ASSERT_EQ(x.shape(), y.shape()) << name;
      ASSERT_EQ(x.dtype(), y.dtype()) << name;
      double scale = 0;
      for (int64_t i = 0; i < x.numel(); ++i) scale = std::max(scale, std::fabs(x.value_as_double(i)));
      for (int64_t i = 0; i < x.numel(); ++i) {
        double u = x.value_as_double(i), v = y.value_as_double(i);
        ASSERT_LE(std::fabs(u - v), 1e-5 * (std::fabs(u) + scale) + 1e-30)
            << name << "[" << i << "]: before " << u << ", after " << v << " (seed " << seed << ")";
      }
    }
  }
}

// A Conv's attributes: a k x k kernel padded to keep the size at stride 1.
inline std::vector<std::pair<std::string, ir::AttrValue>> conv_attrs(int64_t k, int64_t group = 1, int64_t stride = 1) {
  return {{"kernel_shape", std::vector<int64_t>{k, k}},
          {"pads", std::vector<int64_t>(4, k / 2)},
          {"strides", std::vector<int64_t>{stride, stride}},
          {"group", group}};
}

// A layout query (passes::ConvLayoutQuery) that takes every Conv and kiln::FusedConv.
inline bool any_conv(const ir::Graph&, const ir::Node& n) {
  return (n.op == "Conv" && n.domain.empty()) || (n.op == "FusedConv" && n.domain == "kiln");
}

inline int count_ops(const ir::Graph& g, const std::string& op) {
  return static_cast<int>(std::count_if(g.nodes.begin(), g.nodes.end(), [&](const ir::Node& n) { return n.op == op; }));
}

inline const ir::Node* find_op(const ir::Graph& g, const std::string& op) {
  for (const ir::Node& n : g.nodes)
    if (n.op == op) return &n;
  return nullptr;
}

}  // namespace kiln::testing
