// A flag a layer's kernels raise on the device when they meet a value they cannot use (an index
// outside its dimension), for the host to raise as an error once the run is over: a kernel cannot
// throw, and answering with a made-up value would be a wrong answer.
//
// The flag lives in the first bytes of the layer's workspace (per execution context), is cleared
// before the kernels and copied after them to pinned host memory the layer owns (each context
// builds its own layers); all three are stream operations, so CUDA graphs capture them.
// Layer::take_failure reads the host copy after CudaContext::run has synchronized.
#pragma once

#include <cuda_runtime.h>

#include "cuda/runtime/check.h"

namespace kiln::cuda {

class RunFlag {
 public:
  RunFlag() {
    KILN_CUDA_CHECK(cudaMallocHost(&host_, sizeof(int)));
    *host_ = 0;
  }
  ~RunFlag() { cudaFreeHost(host_); }
  RunFlag(const RunFlag&) = delete;
  RunFlag& operator=(const RunFlag&) = delete;

  static constexpr size_t kWorkspaceBytes = 256;  // the flag's share of the workspace, aligned

  // Clears the flag at the start of `workspace` on `stream`; the kernels raise it there.
  int* clear(void* workspace, cudaStream_t stream) const {
    int* device = static_cast<int*>(workspace);
    KILN_CUDA_CHECK(cudaMemsetAsync(device, 0, sizeof(int), stream));
    return device;
  }
  // After the kernels: the flag to the host copy.
  void report(const int* device, cudaStream_t stream) const {
    KILN_CUDA_CHECK(cudaMemcpyAsync(host_, device, sizeof(int), cudaMemcpyDeviceToHost, stream));
  }
  // Whether a run since the last call raised it (read after the stream has synchronized).
  bool take() const {
    const bool raised = *host_ != 0;
    *host_ = 0;
    return raised;
  }

 private:
  int* host_ = nullptr;
};

}  // namespace kiln::cuda
