#include "cuda/runtime/graph_timing.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cuda/runtime/check.h"

namespace kiln::cuda {

float median_sample_ms(cudaStream_t stream, const std::function<void()>& launch, int per_sample) {
  cudaEvent_t start = nullptr, stop = nullptr;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> owned_start(start, cudaEventDestroy);
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> owned_stop(stop, cudaEventDestroy);
  std::vector<float> samples;
  for (int s = 0; s < 5; ++s) {
    KILN_CUDA_CHECK(cudaEventRecord(start, stream));
    launch();
    KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(ms / per_sample);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

float graph_replay_ms(cudaStream_t stream, const std::function<void(cudaStream_t)>& run, int per_sample) {
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  bool ran = true;
  try {
    for (int i = 0; i < per_sample; ++i) run(stream);
  } catch (...) {  // the capture must end; the caller then times `run` another way
    ran = false;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  cudaGraphExec_t exec = nullptr;
  const bool ready = ran && ended == cudaSuccess && graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  if (graph) cudaGraphDestroy(graph);
  if (!ready) {
    cudaGetLastError();
    return -1;
  }
  std::unique_ptr<CUgraphExec_st, cudaError_t (*)(cudaGraphExec_t)> owned(exec, cudaGraphExecDestroy);
  KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up: the graph's first upload
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return median_sample_ms(stream, [&] { KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, per_sample);
}

}  // namespace kiln::cuda
