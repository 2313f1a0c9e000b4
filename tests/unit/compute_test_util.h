// Helpers for the compute-op tests (conv_test.cc, linear_test.cc): random tensors, running
// one node through shape inference and the CPU engine, and a relative comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu/engine.h"
#include "ir/op_schema.h"
#include "kiln/tensor.h"

namespace kiln::testing {

inline Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  Tensor t(DType::kFloat32, std::move(shape));
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

// f rounded to bfloat16 (to nearest even), as a float.
inline float bf16_value(float f) {
  const uint32_t bits = static_cast<uint32_t>(float_to_bfloat16(f)) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// A float32 tensor's elements rounded to bfloat16.
inline Tensor bf16_rounded(const Tensor& t) {
  Tensor r = t.clone();
  for (int64_t i = 0; i < r.numel(); ++i) r.data<float>()[i] = bf16_value(r.data<float>()[i]);
  return r;
}

// One input of a single-node graph: a name ("" = omitted), its data, and whether the graph
// holds it as a constant (weights) or takes it as a runtime input.
struct NodeInput {
  std::string name;
  Tensor data;
  bool constant = false;
};

// A graph of the one node (its inputs renamed to the given names, output "Y").
inline ir::Graph single_node_graph(ir::Node node, const std::vector<NodeInput>& inputs,
                                   const std::vector<ir::Dims>& declared = {}) {
  ir::Graph g;
  g.name = "test";
  g.opset = 21;
  node.inputs.clear();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const NodeInput& in = inputs[i];
    node.inputs.push_back(in.name);
    if (in.name.empty()) continue;
    ir::Value v;
    v.name = in.name;
    v.type.dtype = in.data.dtype();
    v.type.shape = i < declared.size() ? declared[i] : ir::dims_of(in.data.shape());
    if (in.constant) v.constant = in.data;
    else g.inputs.push_back(in.name);
    g.set_value(v);
  }
  node.outputs = {"Y"};
  if (node.name.empty()) node.name = "node0";
  g.nodes.push_back(node);
  g.outputs = {"Y"};
  ir::infer_shapes(g);
  return g;
}

// A graph of one Attention node (opset 23) on runtime inputs of the given names, with their tensors'
// types and shapes, in that order; output "Y".
inline ir::Graph attention_graph(const std::vector<std::pair<std::string, const Tensor*>>& inputs, ir::Node node) {
  ir::Graph g;
  g.name = "attention";
  g.opset = 23;
  node.inputs.clear();
  for (const auto& [name, t] : inputs) {
    ir::Value value;
    value.name = name;
    value.type.dtype = t->dtype();
    value.type.shape = ir::dims_of(t->shape());
    g.set_value(value);
    g.inputs.push_back(name);
    node.inputs.push_back(name);
  }
  node.name = "attention0";
  node.op = "Attention";
  node.outputs = {"Y"};
  g.nodes.push_back(node);
  g.outputs = {"Y"};
  ir::infer_shapes(g);
  return g;
}

inline Tensor run_single_node(const ir::Node& node, const std::vector<NodeInput>& inputs) {
  cpu::CpuEngine engine(single_node_graph(node, inputs));
  std::map<std::string, Tensor> feed;
  for (const NodeInput& in : inputs)
    if (!in.name.empty() && !in.constant) feed[in.name] = in.data;
  return engine.run(feed).at("Y");
}

// Every element within 1e-4 relative (absolute near zero).
inline ::testing::AssertionResult all_close(const Tensor& got, const Tensor& want, float rel = 1e-4f) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shape " << shape_to_string(got.shape()) << " vs expected "
                                         << shape_to_string(want.shape());
  const float* a = got.data<float>();
  const float* b = want.data<float>();
  for (int64_t i = 0; i < got.numel(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= rel * std::max(1.f, std::fabs(b[i]))))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs expected " << b[i];
  return ::testing::AssertionSuccess();
}

// x [N, A, B, C] with its axes permuted by `perm` (float32; the channels-last tests' NCHW <-> NHWC).
inline Tensor permute4(const Tensor& x, const std::vector<int64_t>& perm) {
  std::vector<int64_t> shape(4);
  for (size_t i = 0; i < 4; ++i) shape[i] = x.dim(static_cast<int>(perm[i]));
  Tensor y(DType::kFloat32, shape);
  const float* src = x.data<float>();
  float* dst = y.data<float>();
  int64_t in_stride[4];
  in_stride[3] = 1;
  for (int i = 2; i >= 0; --i) in_stride[i] = in_stride[i + 1] * x.dim(i + 1);
  int64_t idx[4];
  for (idx[0] = 0; idx[0] < shape[0]; ++idx[0])
    for (idx[1] = 0; idx[1] < shape[1]; ++idx[1])
      for (idx[2] = 0; idx[2] < shape[2]; ++idx[2])
        for (idx[3] = 0; idx[3] < shape[3]; ++idx[3]) {
          int64_t off = 0;
          for (int i = 0; i < 4; ++i) off += idx[i] * in_stride[perm[static_cast<size_t>(i)]];
          *dst++ = src[off];
        }
  return y;
}

}  // namespace kiln::testing
