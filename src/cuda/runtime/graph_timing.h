// Timing GPU work as an engine runs it: captured in a CUDA graph and replayed.
//
// At small shapes a kernel runs a few microseconds, about what the host needs to launch it
// (cuDNN's execute more), so launches timed on a stream measure the host as much as the kernel,
// and the engine (one CUDA graph) does not pay that. Timed from the stream, tactics and layers
// ranked differently from how the engine ran them (docs/design/tactic-timing.md, "Tactics timed
// in a CUDA graph").
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace kiln::cuda {

// The median over five samples of `launch` (which enqueues `per_sample` runs on `stream`), per
// run, in ms.
float median_sample_ms(cudaStream_t stream, const std::function<void()>& launch, int per_sample);

// The median over five replays of a CUDA graph of `per_sample` calls of `run` (captured from
// `stream`), per call, in ms; -1 when the calls cannot be captured (then time them otherwise).
float graph_replay_ms(cudaStream_t stream, const std::function<void(cudaStream_t)>& run, int per_sample);

}  // namespace kiln::cuda
