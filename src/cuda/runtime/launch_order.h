// Layers of a plan never overlap on the GPU, except where kiln's own kernels allow it. Within
// one stream, a kernel launched with programmatic dependent launch may start while the kernel
// before it still runs. cuDNN's and cuBLASLt's Hopper kernels are launched so, and some write
// before they wait for the previous kernel: harmless within a library call, but kiln's
// activation arena gives a layer's output the memory of a buffer that an earlier layer has just
// finished reading, which may then still be read (docs/design/gpu-engine.md, "Layers never
// overlap"). Both ways a plan runs keep each layer after the ones before it:
//   - in a captured CUDA graph, every programmatic edge into a kernel that is not one of kiln's
//     waiting kernels (below) becomes a full edge (drop_programmatic_edges);
//   - an eager run puts an empty kernel before each layer (launch_layer_barrier): the layer's
//     first kernel then follows a kernel that starts only when all before it have ended.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace kiln::cuda {

// Notes a kernel of kiln's own that, launched with programmatic dependent launch, waits for the
// previous kernel before it reads or writes anything that kernel may use (kiln's INT8
// convolutions): the edges into it stay programmatic. Thread-safe.
void note_waiting_kernel(const void* function);

// Turns every programmatic edge of `graph` into a full one, except those into noted kernels;
// returns how many it turned.
size_t drop_programmatic_edges(cudaGraph_t graph);

// An empty kernel on `stream`.
void launch_layer_barrier(cudaStream_t stream);

}  // namespace kiln::cuda
