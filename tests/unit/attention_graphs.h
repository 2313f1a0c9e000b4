// Attention graphs as exporters write them, for the tests of the attention passes.
#pragma once

#include <string>

#include "graph_builder.h"

namespace kiln::testing {

// nn.MultiheadAttention as torch.onnx writes it (torchvision's ViT): one projection
// [S, N, 3E] split into Q, K and V by Reshape, Unsqueeze, Transpose, Squeeze and Gathers, heads
// through a merged batch-and-heads axis [S, N * H, D], Y merged back to [S * N, E].
inline void add_packed_attention(GraphBuilder& b, const std::string& qkv, const std::string& y, int64_t s, int64_t n, int64_t h,
                                 int64_t d) {
  const int64_t e = h * d;
  b.node("Reshape", {qkv, b.ints("split3", {s, n, 3, e})}, "split");
  b.node("Unsqueeze", {"split", b.ints("axis0", {0})}, "unsq");
  b.node("Transpose", {"unsq"}, "moved", {{"perm", std::vector<int64_t>{3, 1, 2, 0, 4}}});
  b.node("Squeeze", {"moved", b.ints("axis3", {-2})}, "parts");
  const char* names[3] = {"q", "k", "v"};
  for (int64_t i = 0; i < 3; ++i) {
    const std::string part = names[i];
    b.node("Gather", {"parts", b.constant(part + "_index", Tensor::scalar<int64_t>(i))}, part + "_sbe", {{"axis", int64_t{0}}});
    b.node("Reshape", {part + "_sbe", b.ints(part + "_heads_shape", {s, n * h, d})}, part + "_merged");
    b.node("Transpose", {part + "_merged"}, part + "_t", {{"perm", std::vector<int64_t>{1, 0, 2}}});
    b.node("Reshape", {part + "_t", b.ints(part + "_4d", {n, h, s, d})}, part);
  }
  b.node("Attention", {"q", "k", "v"}, "y4");
  b.node("Transpose", {"y4"}, "y_sbhd", {{"perm", std::vector<int64_t>{2, 0, 1, 3}}});
  b.node("Reshape", {"y_sbhd", b.ints("rows", {s * n, e})}, y);
}

}  // namespace kiln::testing
