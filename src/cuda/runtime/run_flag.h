// A flag a layer's kernels raise on the device when they meet a value they cannot use (an index
// outside its dimension), for the host to raise as an error once the run is over: a kernel cannot
// throw, and answering with a made-up value would be a wrong answer.
//
// The flag is a word of mapped, pinned host memory the layer owns (each execution context builds
// its own layers): a kernel that meets a bad value writes it over the bus, and nothing else touches
// it on the device. A run therefore costs no stream operation at all; a memset and a copy per
// flagged layer cost BERT-base 37 us a run (docs/design/gpu-engine.md). The host clears the word
// before a run and reads it after the stream has synchronized (Layer::take_failure).
#pragma once

#include <cuda_runtime.h>

#include "cuda/runtime/check.h"

namespace kiln::cuda {

class RunFlag {
 public:
  RunFlag() {
    KILN_CUDA_CHECK(cudaHostAlloc(&host_, sizeof(int), cudaHostAllocMapped));
    *host_ = 0;
    KILN_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
  }
  ~RunFlag() { cudaFreeHost(host_); }
  RunFlag(const RunFlag&) = delete;
  RunFlag& operator=(const RunFlag&) = delete;

  // The address kernels write a non-zero value to.
  int* device() const { return device_; }
  // Whether a run since the last call raised it (read after the stream has synchronized), and
  // cleared for the next.
  bool take() const {
    volatile int* word = host_;
    const bool raised = *word != 0;
    *word = 0;
    return raised;
  }

 private:
  int* host_ = nullptr;
  int* device_ = nullptr;
};

}  // namespace kiln::cuda
