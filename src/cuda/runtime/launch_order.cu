#include "cuda/runtime/launch_order.h"

#include <mutex>
#include <set>
#include <vector>

#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

__global__ void layer_barrier_kernel() {}

std::mutex waiting_mutex;
std::set<const void*>& waiting_kernels() {
  static std::set<const void*> kernels;
  return kernels;
}

bool is_waiting_kernel(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  KILN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
  if (type != cudaGraphNodeTypeKernel) return false;
  cudaKernelNodeParams params = {};
  if (cudaGraphKernelNodeGetParams(node, &params) != cudaSuccess) {
    cudaGetLastError();  // a library's kernel the runtime cannot describe: not one of kiln's
    return false;
  }
  std::lock_guard<std::mutex> lock(waiting_mutex);
  return waiting_kernels().count(params.func) > 0;
}

}  // namespace

void note_waiting_kernel(const void* function) {
  std::lock_guard<std::mutex> lock(waiting_mutex);
  waiting_kernels().insert(function);
}

size_t drop_programmatic_edges(cudaGraph_t graph) {
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  KILN_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n));
  size_t dropped = 0;
  const cudaGraphEdgeData full{};  // a full dependency: the default type and ports
  for (size_t i = 0; i < n; ++i) {
    if (data[i].type != cudaGraphDependencyTypeProgrammatic || is_waiting_kernel(to[i])) continue;
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
