// Layers of a plan never overlap on the GPU, except where kiln's own kernels allow it. Within
// one stream, a kernel launched with programmatic dependent launch may start while the kernel
// before it still runs. cuDNN's and cuBLASLt's Hopper kernels are launched so, and some write
// before they wait for the previous kernel: harmless within a library call, but kiln's
// activation arena gives a layer's output the memory of a buffer that an earlier layer has just
// finished reading, which may then still be read (docs/design/gpu-engine.md, "Layers never
// overlap"). Both ways a plan runs keep each library layer after the layers before it:
//   - in a captured CUDA graph, the programmatic edges into a layer whose kernels are not kiln's
//     own become full edges (drop_programmatic_edges). kiln's kernels (tactics "kernel:...")
//     keep theirs: those launched with programmatic dependent launch (the INT8 convolutions) wait
//     before they touch activations (docs/design/int8.md, "Programmatic dependent launch"), and
//     the others have none. Edges within a layer are the library's own affair and stay;
//   - an eager run puts an empty kernel before each layer (launch_layer_barrier): the layer's
//     first kernel then follows a kernel that starts only when all before it have ended.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <set>
#include <string>

namespace kiln::cuda {

// Whether the programmatic edges into a layer of this tactic must become full ones: every
// tactic but kiln's own kernels.
bool needs_full_edges_in(const std::string& tactic);

// Turns the programmatic edges of `graph` that leave a node of `cut_after` into full ones;
// returns how many it turned.
size_t drop_programmatic_edges(cudaGraph_t graph, const std::set<cudaGraphNode_t>& cut_after);

// An empty kernel on `stream`.
void launch_layer_barrier(cudaStream_t stream);

}  // namespace kiln::cuda
