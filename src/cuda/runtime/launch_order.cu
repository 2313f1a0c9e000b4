#include "cuda/runtime/launch_order.h"

#include <vector>

#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {
__global__ void layer_barrier_kernel() {}
}  // namespace

bool needs_full_edges_in(const std::string& tactic) { return tactic.rfind("kernel:", 0) != 0; }

size_t drop_programmatic_edges(cudaGraph_t graph, const std::set<cudaGraphNode_t>& cut_after) {
  if (cut_after.empty()) return 0;
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  KILN_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n));
  size_t dropped = 0;
  const cudaGraphEdgeData full{};  // a full dependency: the default type and ports
  for (size_t i = 0; i < n; ++i) {
    if (data[i].type != cudaGraphDependencyTypeProgrammatic || !cut_after.count(from[i])) continue;
    KILN_CUDA_CHECK(cudaGraphRemoveDependencies(graph, &from[i], &to[i], &data[i], 1));
    KILN_CUDA_CHECK(cudaGraphAddDependencies(graph, &from[i], &to[i], &full, 1));
    ++dropped;
  }
  return dropped;
}

void launch_layer_barrier(cudaStream_t stream) {
  layer_barrier_kernel<<<1, 1, 0, stream>>>();
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
